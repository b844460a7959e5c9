"""GPU descriptions used by the planner and the simulator.

A :class:`DeviceSpec` holds vendor figures for one GPU model. Measured figures
(read bandwidth, fitted simulator constants) live in the database, not here.
The planner is pure NumPy, so it cannot query a GPU: it takes a ``DeviceSpec``
or a GPU name as ``torch.cuda.get_device_name()`` reports it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

__all__ = ["DeviceSpec", "resolve_device"]


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
        cc = self.compute_capability
        if (
            not isinstance(cc, tuple)
            or len(cc) != 2
            or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in cc)
        ):
            raise ValueError(f"DeviceSpec.compute_capability: expected (major, minor) ints, got {cc!r}")

    @staticmethod
    def known(name: str) -> "DeviceSpec":
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
                f"device: unknown GPU {name!r}; known: {known}. "
                "Pass a DeviceSpec with its numbers for another GPU."
            )
        return spec

    @staticmethod
    def detect(index: int = 0) -> "DeviceSpec":
        """Describe CUDA device ``index`` through torch (needs torch with CUDA).

        The table entry for the reported name is used when known; otherwise the
        figures torch exposes are used (bandwidth then estimated from the table's
        nearest family is not possible, so a RuntimeError asks for explicit numbers).
        """
        import torch  # local import: the planner must not need torch

        if not torch.cuda.is_available():
            raise RuntimeError("DeviceSpec.detect: CUDA is not available")
        props = torch.cuda.get_device_properties(index)
        try:
            base = DeviceSpec.known(props.name)
        except ValueError as exc:
            raise RuntimeError(
                f"DeviceSpec.detect: {props.name!r} is not in the table; build a DeviceSpec with its numbers"
            ) from exc
        return dataclasses.replace(
            base,
            name=props.name,
            num_sms=int(props.multi_processor_count),
            l2_bytes=int(getattr(props, "L2_cache_size", base.l2_bytes)),
            compute_capability=(int(props.major), int(props.minor)),
        )

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["compute_capability"] = list(self.compute_capability)
        return d

    @staticmethod
    def from_dict(d: dict) -> "DeviceSpec":
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
    return " ".join(name.lower().replace("_", " ").replace("-", " ").split())


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
    DeviceSpec("NVIDIA H20", 78, 4000.0, 60 * _MB, 228 * _KB, 227 * _KB, 65536, 2048, (9, 0)),
    DeviceSpec("NVIDIA A100-SXM4-80GB", 108, 2039.0, 40 * _MB, 164 * _KB, 163 * _KB, 65536, 2048, (8, 0)),
    DeviceSpec("NVIDIA A100-SXM4-40GB", 108, 1555.0, 40 * _MB, 164 * _KB, 163 * _KB, 65536, 2048, (8, 0)),
    DeviceSpec("NVIDIA L40S", 142, 864.0, 96 * _MB, 100 * _KB, 99 * _KB, 65536, 1536, (8, 9)),
    DeviceSpec("NVIDIA B200", 148, 8000.0, 126 * _MB, 228 * _KB, 227 * _KB, 65536, 2048, (10, 0)),
)

_ALIASES: dict[str, str] = {
    "h200": "NVIDIA H200",
    "nvidia h200 141gb hbm3e": "NVIDIA H200",
    "h100": "NVIDIA H100 80GB HBM3",
    "h100 sxm": "NVIDIA H100 80GB HBM3",
    "nvidia h100": "NVIDIA H100 80GB HBM3",
    "h100 pcie": "NVIDIA H100 PCIe",
    "h20": "NVIDIA H20",
    "a100": "NVIDIA A100-SXM4-80GB",
    "a100 80gb": "NVIDIA A100-SXM4-80GB",
    "a100 40gb": "NVIDIA A100-SXM4-40GB",
    "l40s": "NVIDIA L40S",
    "b200": "NVIDIA B200",
}

_BY_ALIAS: dict[str, DeviceSpec] = {_normalize(s.name): s for s in _KNOWN}
for _alias, _target in _ALIASES.items():
    _BY_ALIAS[_normalize(_alias)] = _BY_ALIAS[_normalize(_target)]


def resolve_device(device: "DeviceSpec | str") -> DeviceSpec:
    """Return ``device`` as a :class:`DeviceSpec` (a name is looked up with :meth:`DeviceSpec.known`)."""
    if isinstance(device, DeviceSpec):
        return device
    return DeviceSpec.known(device)
