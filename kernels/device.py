"""GPU descriptions used by the planner and the simulator.

A :class:`DeviceSpec` holds vendor figures for one GPU model. Measured figures
(read bandwidth, fitted simulator constants) live in the database, not here.
The planner is pure NumPy, so it cannot query a GPU: it takes a ``DeviceSpec``
or a GPU name as ``torch.cuda.get_device_name()`` reports it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["DeviceSpec", "resolve_device", "known_devices", "device_aliases"]


@dataclass(frozen=True)
class DeviceSpec:
    """Vendor figures of one GPU model.

    Parameters
    ----------
    name : str
        Name as ``torch.cuda.get_device_name()`` reports it, e.g. ``"NVIDIA H200"``.
    num_sms : int
        Streaming multiprocessors (SMs); >= 1.
    hbm_bandwidth_gbps : float
        Peak DRAM bandwidth from the datasheet, GB/s (10^9 bytes/s); > 0.
    l2_bytes : int
        L2 cache size in bytes.
    smem_per_sm_bytes : int
        Shared memory per SM usable by CTAs, bytes.
    smem_per_block_bytes : int
        Largest shared-memory allocation of one CTA (opt-in), bytes.
    regs_per_sm : int
        32-bit registers per SM.
    max_threads_per_sm : int
        Resident threads per SM.
    compute_capability : tuple[int, int]
        (major, minor).
    """

    name: str
    num_sms: int
    hbm_bandwidth_gbps: float
    l2_bytes: int
    smem_per_sm_bytes: int
    smem_per_block_bytes: int
    regs_per_sm: int = 65536
    max_threads_per_sm: int = 2048
    compute_capability: tuple[int, int] = (9, 0)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"DeviceSpec.name: expected a non-empty string, got {self.name!r}")
        for field, lo in (
            ("num_sms", 1),
            ("l2_bytes", 0),
            ("smem_per_sm_bytes", 1),
            ("smem_per_block_bytes", 1),
            ("regs_per_sm", 1),
            ("max_threads_per_sm", 32),
        ):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < lo:
                raise ValueError(f"DeviceSpec.{field}: expected an integer >= {lo}, got {value!r}")
        bw = self.hbm_bandwidth_gbps
        if isinstance(bw, bool) or not isinstance(bw, (int, float)) or not bw > 0 or bw != bw or bw == float("inf"):
            raise ValueError(f"DeviceSpec.hbm_bandwidth_gbps: expected a finite number > 0, got {bw!r}")
        if self.smem_per_block_bytes > self.smem_per_sm_bytes:
            raise ValueError(
                f"DeviceSpec.smem_per_block_bytes: {self.smem_per_block_bytes} exceeds smem_per_sm_bytes "
                f"{self.smem_per_sm_bytes}"
            )
        cc = self.compute_capability
        if (
            not isinstance(cc, tuple)
            or len(cc) != 2
            or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in cc)
        ):
            raise ValueError(f"DeviceSpec.compute_capability: expected (major, minor) ints, got {cc!r}")

    @staticmethod
    def known(name: str) -> DeviceSpec:
        """Return the spec of a known GPU by its reported name or an accepted alias.

        Raises
        ------
        ValueError
            If ``name`` is not in the table; the message lists the known names.
        """
        key = _normalize(name)
        spec = _BY_ALIAS.get(key)
        if spec is None:
            known = ", ".join(sorted(s.name for s in _KNOWN))
            raise ValueError(
                f"device: unknown GPU {name!r}; known: {known}. Pass a DeviceSpec with its numbers for another GPU."
            )
        return spec

    @staticmethod
    def detect(index: int = 0, *, hbm_bandwidth_gbps: float | None = None) -> DeviceSpec:
        """Describe CUDA device ``index`` through torch (needs torch with CUDA).

        A GPU in the table gets the table's vendor figures, with the SM count,
        L2 size, shared-memory and register limits and compute capability the
        driver reports (so a partitioned GPU, e.g. MIG, is described as it is).
        An unknown GPU is built from the driver's figures; its peak bandwidth
        is ``hbm_bandwidth_gbps`` if given, else ``2 * memory_clock_rate *
        bus_width / 8`` when torch exposes those properties.

        Raises
        ------
        RuntimeError
            No CUDA device, or an unknown GPU whose bandwidth is neither given
            nor reported.
        """
        import torch  # local import: the planner must not need torch

        if not torch.cuda.is_available():
            raise RuntimeError("DeviceSpec.detect: CUDA is not available")
        props = torch.cuda.get_device_properties(index)
        reported = {
            "num_sms": int(props.multi_processor_count),
            "l2_bytes": int(getattr(props, "L2_cache_size", 0) or 0),
            "compute_capability": (int(props.major), int(props.minor)),
        }
        for attr, field in (
            ("shared_memory_per_multiprocessor", "smem_per_sm_bytes"),
            ("shared_memory_per_block_optin", "smem_per_block_bytes"),
            ("regs_per_multiprocessor", "regs_per_sm"),
            ("max_threads_per_multi_processor", "max_threads_per_sm"),
        ):
            v = getattr(props, attr, None)
            if isinstance(v, int) and v > 0:
                reported[field] = int(v)
        try:
            base = DeviceSpec.known(props.name)
        except ValueError:
            base = None
        if hbm_bandwidth_gbps is None and base is None:
            clock_khz = getattr(props, "memory_clock_rate", None)
            bus_bits = getattr(props, "memory_bus_width", None)
            if clock_khz and bus_bits:
                hbm_bandwidth_gbps = 2.0 * clock_khz * 1e3 * bus_bits / 8 / 1e9
            else:
                raise RuntimeError(
                    f"DeviceSpec.detect: {props.name!r} is not in the table and torch does not report its memory "
                    "clock; pass hbm_bandwidth_gbps"
                )
        if base is None:
            reported.setdefault("smem_per_sm_bytes", 100 * _KB)
            reported.setdefault("smem_per_block_bytes", 99 * _KB)
            return DeviceSpec(name=props.name, hbm_bandwidth_gbps=float(hbm_bandwidth_gbps), **reported)
        if not reported["l2_bytes"]:
            reported["l2_bytes"] = base.l2_bytes
        if hbm_bandwidth_gbps is not None:
            reported["hbm_bandwidth_gbps"] = float(hbm_bandwidth_gbps)
        return dataclasses.replace(base, name=props.name, **reported)

    def to_dict(self) -> dict:
        """The spec as a JSON-able dict: every field, ``compute_capability`` as a list ``[major, minor]``."""
        d = dataclasses.asdict(self)
        d["compute_capability"] = list(self.compute_capability)
        return d

    @staticmethod
    def from_dict(d: dict) -> DeviceSpec:
        """The inverse of :meth:`to_dict` (a list ``compute_capability`` becomes a tuple).

        Raises
        ------
        ValueError
            ``d`` has a key that is not a field of :class:`DeviceSpec`.
        TypeError
            A required field is missing.
        """
        d = dict(d)
        if "compute_capability" in d and isinstance(d["compute_capability"], list):
            d["compute_capability"] = tuple(d["compute_capability"])
        fields = {f.name for f in dataclasses.fields(DeviceSpec)}
        unknown = set(d) - fields
        if unknown:
            raise ValueError(f"device: unknown fields {sorted(unknown)}")
        return DeviceSpec(**d)


def _normalize(name: str) -> str:
    if not isinstance(name, str):
        raise ValueError(f"device: expected a GPU name string or DeviceSpec, got {type(name).__name__}")
    words = name.lower().replace("_", " ").replace("-", " ").split()
    if words and words[0] == "nvidia":
        words = words[1:]
    return " ".join(words)


_KB = 1024
_MB = 1024 * 1024

# Vendor figures. Sources: NVIDIA H200 datasheet (141 GB HBM3e, 4.8 TB/s);
# NVIDIA H100 datasheet (SXM5 3.35 TB/s, PCIe 2.0 TB/s); Hopper tuning guide
# (228 KB smem per SM, 227 KB per block, 50 MB L2 on H100 SXM; H200 reports 60 MB);
# A100 datasheet (40 GB 1.555 TB/s, 80 GB 2.039 TB/s), Ampere tuning guide
# (164 KB smem per SM, 163 KB per block, 40 MB L2); L40S datasheet (864 GB/s,
# 142 SMs, 96 MB L2, Ada: 100 KB smem per SM, 99 KB per block); H20: 78 SMs,
# 4.0 TB/s (NVIDIA H20 product brief); B200 datasheet (8 TB/s per GPU, 148 SMs).
_KNOWN: tuple[DeviceSpec, ...] = (
    DeviceSpec("NVIDIA H200", 132, 4800.0, 60 * _MB, 228 * _KB, 227 * _KB, 65536, 2048, (9, 0)),
    DeviceSpec("NVIDIA H100 80GB HBM3", 132, 3350.0, 50 * _MB, 228 * _KB, 227 * _KB, 65536, 2048, (9, 0)),
    DeviceSpec("NVIDIA H100 PCIe", 114, 2000.0, 50 * _MB, 228 * _KB, 227 * _KB, 65536, 2048, (9, 0)),
    DeviceSpec("NVIDIA H100 NVL", 132, 3900.0, 50 * _MB, 228 * _KB, 227 * _KB, 65536, 2048, (9, 0)),
    DeviceSpec("NVIDIA H800", 132, 3350.0, 50 * _MB, 228 * _KB, 227 * _KB, 65536, 2048, (9, 0)),
    DeviceSpec("NVIDIA GH200 480GB", 132, 4000.0, 60 * _MB, 228 * _KB, 227 * _KB, 65536, 2048, (9, 0)),
    DeviceSpec("NVIDIA H20", 78, 4000.0, 60 * _MB, 228 * _KB, 227 * _KB, 65536, 2048, (9, 0)),
    DeviceSpec("NVIDIA A100-SXM4-80GB", 108, 2039.0, 40 * _MB, 164 * _KB, 163 * _KB, 65536, 2048, (8, 0)),
    DeviceSpec("NVIDIA A100-SXM4-40GB", 108, 1555.0, 40 * _MB, 164 * _KB, 163 * _KB, 65536, 2048, (8, 0)),
    DeviceSpec("NVIDIA A100 80GB PCIe", 108, 1935.0, 40 * _MB, 164 * _KB, 163 * _KB, 65536, 2048, (8, 0)),
    DeviceSpec("NVIDIA A100-PCIE-40GB", 108, 1555.0, 40 * _MB, 164 * _KB, 163 * _KB, 65536, 2048, (8, 0)),
    DeviceSpec("NVIDIA L40S", 142, 864.0, 96 * _MB, 100 * _KB, 99 * _KB, 65536, 1536, (8, 9)),
    DeviceSpec("NVIDIA L4", 58, 300.0, 48 * _MB, 100 * _KB, 99 * _KB, 65536, 1536, (8, 9)),
    DeviceSpec("NVIDIA B200", 148, 8000.0, 126 * _MB, 228 * _KB, 227 * _KB, 65536, 2048, (10, 0)),
)
"""Known GPUs, under the names ``torch.cuda.get_device_name()`` reports.

Vendor figures and their sources (HBM bandwidth is the datasheet peak, GB/s):

- H200 SXM: 132 SMs, 4.8 TB/s, 60 MB L2 as the device reports it (NVIDIA H200
  datasheet; 141 GB HBM3e).
- H100 SXM5 80GB: 132 SMs, 3.35 TB/s; H100 PCIe: 114 SMs, 2.0 TB/s; H100 NVL:
  3.9 TB/s (NVIDIA H100 datasheet); H800 SXM: as H100 SXM (3.35 TB/s);
  GH200 480GB: 4.0 TB/s HBM3 (GH200 datasheet); 50 MB L2 (Hopper whitepaper).
- Hopper SM (NVIDIA Hopper tuning guide): 228 KB shared memory per SM, 227 KB
  per block (opt-in), 64K registers, 2,048 threads.
- H20: 78 SMs, 4.0 TB/s (NVIDIA H20 product brief).
- A100 SXM4 80GB 2.039 TB/s, 40GB 1.555 TB/s; A100 PCIe 80GB 1.935 TB/s, 40GB
  1.555 TB/s (A100 datasheet); 108 SMs, 40 MB L2, 164 KB smem per SM, 163 KB
  per block (Ampere tuning guide).
- L40S: 142 SMs, 864 GB/s, 96 MB L2; L4: 58 SMs, 300 GB/s, 48 MB L2 (L40S and L4
  datasheets, Ada tuning guide: 100 KB smem per SM, 99 KB per block, 1,536 threads).
- B200: 148 SMs, 8 TB/s, 126 MB L2 (B200 datasheet as reported by the device).
"""

_ALIASES: dict[str, str] = {
    "h200": "NVIDIA H200",
    "h200 sxm": "NVIDIA H200",
    "nvidia h200 141gb hbm3e": "NVIDIA H200",
    "h100": "NVIDIA H100 80GB HBM3",
    "h100 sxm": "NVIDIA H100 80GB HBM3",
    "nvidia h100": "NVIDIA H100 80GB HBM3",
    "h100 pcie": "NVIDIA H100 PCIe",
    "h100 nvl": "NVIDIA H100 NVL",
    "h800": "NVIDIA H800",
    "gh200": "NVIDIA GH200 480GB",
    "h20": "NVIDIA H20",
    "a100": "NVIDIA A100-SXM4-80GB",
    "a100 80gb": "NVIDIA A100-SXM4-80GB",
    "a100 sxm4 80gb": "NVIDIA A100-SXM4-80GB",
    "a100 40gb": "NVIDIA A100-SXM4-40GB",
    "a100 sxm4 40gb": "NVIDIA A100-SXM4-40GB",
    "a100 pcie 80gb": "NVIDIA A100 80GB PCIe",
    "a100 pcie 40gb": "NVIDIA A100-PCIE-40GB",
    "l40s": "NVIDIA L40S",
    "l4": "NVIDIA L4",
    "b200": "NVIDIA B200",
}
"""Accepted aliases (matched case-insensitively, with ``-``/``_`` read as spaces and
an optional leading ``nvidia``) -> the reported name."""

_BY_ALIAS: dict[str, DeviceSpec] = {_normalize(s.name): s for s in _KNOWN}
for _alias, _target in _ALIASES.items():
    _BY_ALIAS[_normalize(_alias)] = _BY_ALIAS[_normalize(_target)]


def resolve_device(device: DeviceSpec | str | Mapping[str, Any]) -> DeviceSpec:
    """Return ``device`` as a :class:`DeviceSpec`.

    Parameters
    ----------
    device : DeviceSpec, str or mapping
        A spec (returned as is); a GPU name or alias (looked up with
        :meth:`DeviceSpec.known`); or a mapping of :class:`DeviceSpec` fields (the
        numbers of a GPU the table does not know, as the HTTP API's ``device``
        object carries them; a mapping with only ``name`` is looked up, and a
        known name with some numbers gives the table entry with those replaced).

    Raises
    ------
    ValueError
        Unknown name without numbers, unknown or invalid fields.
    """
    if isinstance(device, DeviceSpec):
        return device
    if isinstance(device, Mapping):
        d = dict(device)
        if "name" not in d:
            raise ValueError("device.name: required")
        numbers = {k: v for k, v in d.items() if k != "name"}
        try:
            base = DeviceSpec.known(d["name"])
        except ValueError:
            if not numbers:
                raise
            missing = [f for f in _REQUIRED_NUMBERS if f not in numbers]
            if missing:
                raise ValueError(
                    f"device: {d['name']!r} is not a known GPU; give its numbers, missing {missing}"
                ) from None
            return DeviceSpec.from_dict(d)
        if not numbers:
            return base
        merged = base.to_dict()
        unknown = set(numbers) - set(merged)
        if unknown:
            raise ValueError(f"device: unknown fields {sorted(unknown)}")
        merged.update(numbers)
        merged["name"] = str(d["name"])
        return DeviceSpec.from_dict(merged)
    if isinstance(device, str):
        return DeviceSpec.known(device)
    raise ValueError(
        f"device: expected a DeviceSpec, a GPU name or a mapping of its numbers, got {type(device).__name__}"
    )


_REQUIRED_NUMBERS = ("num_sms", "hbm_bandwidth_gbps", "l2_bytes", "smem_per_sm_bytes", "smem_per_block_bytes")


def known_devices() -> tuple[DeviceSpec, ...]:
    """All table entries (one per GPU model)."""
    return _KNOWN


def device_aliases() -> dict[str, str]:
    """Accepted aliases -> reported names (a copy)."""
    return dict(_ALIASES)
