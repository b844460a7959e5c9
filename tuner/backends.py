"""Timing backends of the tuner: the GPU kernel or the calibrated simulator.

Both answer the same three questions about a plan of one shape:

- ``time_plan(plan) -> float``: kernel time in seconds;
- ``hbm_floor_s(kv_lens) -> float``: ``sum(kv_len) * H_kv * D * 2 * kv_bytes /
  read bandwidth`` in seconds (DESIGN.md §1; ``kv_bytes`` 1 for an FP8 cache);
- ``software() -> dict`` and ``device_info() -> dict``: what is stored with
  every measurement.

``sim`` calls :func:`kvsplit.tuner.simulate.predict` (``predict(plan, device, *,
calibration=None) -> seconds``) with the newest calibration stored for the
GPU, if any (:class:`SimBackend`). ``gpu`` wraps
:class:`kvsplit.tuner.gpu.GpuTimer` (CUDA-graph replays timed with
``do_bench``, read bandwidth measured in the same process).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import platform
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from ..kernels.device import DeviceSpec, resolve_device
from ..kernels.limits import kv_elt_bytes
from ..kernels.plan import Plan
from ..kernels.shape import Shape

__all__ = ["TimingBackend", "SimBackend", "GpuBackend", "make_backend", "BACKEND_NAMES"]

BACKEND_NAMES = ("sim", "gpu")


class TimingBackend(Protocol):
    name: str

    def time_plan(self, plan: Plan) -> float: ...

    def hbm_floor_s(self, kv_lens: Sequence[int] | np.ndarray) -> float: ...

    def software(self) -> dict[str, Any]: ...

    def device_info(self) -> dict[str, Any]: ...


def _kv_bytes(
    kv_lens: Sequence[int] | np.ndarray, num_kv_heads: int, head_dim: int, dtype: str, kv_dtype: str | None = None
) -> int:
    elt = kv_elt_bytes(dtype, kv_dtype)
    return int(np.asarray(kv_lens, dtype=np.int64).sum()) * num_kv_heads * head_dim * 2 * elt


def _version(pkg: str) -> str:
    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


class SimBackend:
    """The calibrated simulator as a timing backend.

    Parameters
    ----------
    device : DeviceSpec or str
    num_kv_heads, head_dim : int
    dtype : str
    calibration : mapping, optional
        ``{"constants": Calibration.to_dict(), "kernel_config": {...}}`` as
        stored by ``kvsplit calibrate`` (:func:`kvsplit.db.store.latest_calibration`).
        For a plan whose kernel config differs from the calibrated one, the
        fitted constants are kept and only ``slots`` (CTAs per SM, an
        occupancy property of the config) comes from
        :meth:`kvsplit.tuner.simulate.Calibration.default`. None: the
        simulator's defaults for the device.
    read_bandwidth_gbps : float, optional
        Measured read bandwidth (GB/s) used when there is no calibration: the
        default constants are scaled to it.
    kv_dtype, q_len, num_qo_heads
        The KV cache's dtype (None: ``dtype``), query tokens per request and H_q (for the GQA group): the
        simulator's bytes per token, tile math and residency (:func:`kvsplit.tuner.simulate.predict`).

    The HBM floor uses the same read bandwidth as the simulator (the
    calibration's ``hbm_bw``, else the measured figure, else 0.94 x datasheet).
    """

    name = "sim"

    def __init__(
        self,
        device: DeviceSpec | str,
        *,
        num_kv_heads: int,
        head_dim: int,
        dtype: str,
        calibration: Mapping[str, Any] | None = None,
        read_bandwidth_gbps: float | None = None,
        kv_dtype: str | None = None,
        q_len: int = 1,
        num_qo_heads: int | None = None,
    ) -> None:
        from . import simulate

        self._sim = simulate
        self.device = resolve_device(device)
        self.num_kv_heads, self.head_dim, self.dtype = int(num_kv_heads), int(head_dim), str(dtype)
        self.kv_dtype = None if kv_dtype == self.dtype else kv_dtype
        self.q_len = int(q_len)
        self.group_size = int(num_qo_heads) // self.num_kv_heads if num_qo_heads else None
        self._shape_kw = {"kv_dtype": self.kv_dtype, "q_len": self.q_len, "group_size": self.group_size}
        self.calibration = dict(calibration) if calibration is not None else None
        self._fitted = None
        self._fitted_cfg: dict[str, Any] | None = None
        if self.calibration is not None:
            self._fitted = simulate.Calibration.from_dict(self.calibration["constants"])
            self._fitted_cfg = dict(self.calibration.get("kernel_config") or {}) or None
        self._read_bw = float(read_bandwidth_gbps) * 1e9 if read_bandwidth_gbps else None
        self._cache: dict[tuple, Any] = {}

    def _cal(self, plan: Plan):
        cfg = plan.config.to_dict()
        key = tuple(sorted(cfg.items()))
        cal = self._cache.get(key)
        if cal is None:
            base = self._sim.Calibration.default(
                self.device, head_dim=self.head_dim, dtype=self.dtype, config=plan.config, **self._shape_kw
            )
            if self._fitted is not None:
                cal = self._fitted
                if self._fitted_cfg is not None and any(
                    self._fitted_cfg.get(k) != v for k, v in cfg.items() if k in self._fitted_cfg
                ):
                    cal = dataclasses.replace(cal, slots=base.slots)
            elif self._read_bw is not None:
                f = self._read_bw / base.hbm_bw
                cal = dataclasses.replace(base, hbm_bw=base.hbm_bw * f, sm_bw=base.sm_bw * f, cta_bw=base.cta_bw * f)
            else:
                cal = base
            self._cache[key] = cal
        return cal

    @property
    def read_bandwidth(self) -> float:
        """Read bandwidth of the floor, bytes/s."""
        if self._fitted is not None:
            return float(self._fitted.hbm_bw)
        if self._read_bw is not None:
            return self._read_bw
        from ..kernels.plan import default_config

        return float(
            self._sim.Calibration.default(
                self.device, head_dim=self.head_dim, dtype=self.dtype, config=default_config(self.head_dim, self.dtype)
            ).hbm_bw
        )

    def time_plan(self, plan: Plan) -> float:
        t = float(self._sim.predict(plan, self.device, calibration=self._cal(plan), **self._shape_kw))
        if not t > 0:
            raise RuntimeError(f"simulator returned a non-positive time {t!r}")
        return t

    def hbm_floor_s(self, kv_lens: Sequence[int] | np.ndarray) -> float:
        return _kv_bytes(kv_lens, self.num_kv_heads, self.head_dim, self.dtype, self.kv_dtype) / self.read_bandwidth

    def software(self) -> dict[str, Any]:
        return {
            "backend": "sim",
            "kvsplit": _version("kvsplit"),
            "numpy": np.__version__,
            "python": platform.python_version(),
            "calibrated": self.calibration is not None,
            **({"kv_dtype": self.kv_dtype} if self.kv_dtype else {}),
            **({"q_len": self.q_len} if self.q_len != 1 else {}),
        }

    def device_info(self) -> dict[str, Any]:
        return {
            "name": self.device.name,
            "num_sms": self.device.num_sms,
            "hbm_bandwidth_gbps": float(self.device.hbm_bandwidth_gbps),
            "read_bandwidth_gbps": None,
        }


class GpuBackend:
    """The Triton kernel on the local GPU (``kvsplit.tuner.gpu.GpuTimer``).

    Parameters
    ----------
    num_qo_heads, num_kv_heads, head_dim, dtype, page_size, kv_dtype, q_len
        The shape to time (:class:`kvsplit.tuner.gpu.GpuTimer` builds an FP8 cache and q of ``q_len`` rows).
    max_tokens, max_batch : int
        Sizes of the random KV cache (largest ``sum(kv_len)`` and B to time).
    gpu_index : int
        Worker index; the CUDA device used is ``gpu_index % device_count``.
    expect_gpu : str, optional
        The GPU name the bucket is for; a different local GPU raises ValueError.
    """

    name = "gpu"

    def __init__(
        self,
        *,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: str,
        page_size: int,
        max_tokens: int,
        max_batch: int,
        gpu_index: int = 0,
        expect_gpu: str | None = None,
        kv_dtype: str | None = None,
        q_len: int = 1,
    ) -> None:
        import torch

        from .gpu import GpuTimer, software_versions

        if not torch.cuda.is_available():
            raise RuntimeError("backend 'gpu': CUDA is not available here; use --backend sim")
        dev = gpu_index % torch.cuda.device_count()
        torch.cuda.set_device(dev)
        local = torch.cuda.get_device_name(dev)
        if expect_gpu is not None and resolve_device(expect_gpu).name != resolve_device(local).name:
            raise ValueError(f"gpu: the bucket is for {expect_gpu!r} but this machine has {local!r}")
        self.timer = GpuTimer(
            num_qo_heads=num_qo_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            dtype=dtype,
            page_size=page_size,
            max_tokens=max_tokens,
            max_batch=max_batch,
            device=f"cuda:{dev}",
            kv_dtype=kv_dtype,
            q_len=q_len,
        )
        self._software = software_versions()
        self._spec = resolve_device(local)

    def time_plan(self, plan: Plan) -> float:
        return float(self.timer.time_plan(plan))

    def hbm_floor_s(self, kv_lens: Sequence[int] | np.ndarray) -> float:
        return float(self.timer.hbm_floor_s(kv_lens))

    def software(self) -> dict[str, Any]:
        return {"backend": "gpu", "kvsplit": _version("kvsplit"), **self._software}

    def device_info(self) -> dict[str, Any]:
        return {
            "name": self._spec.name,
            "num_sms": self._spec.num_sms,
            "hbm_bandwidth_gbps": float(self._spec.hbm_bandwidth_gbps),
            "read_bandwidth_gbps": self.timer.read_bandwidth() / 1e9,
        }


def make_backend(
    name: str,
    *,
    shape: Shape | None = None,
    gpu: str | None = None,
    num_qo_heads: int | None = None,
    num_kv_heads: int | None = None,
    head_dim: int | None = None,
    dtype: str | None = None,
    page_size: int | None = None,
    max_tokens: int = 1 << 20,
    max_batch: int = 4096,
    calibration: Mapping[str, Any] | None = None,
    read_bandwidth_gbps: float | None = None,
    gpu_index: int = 0,
) -> TimingBackend:
    """Build the timing backend ``name`` (``"sim"`` or ``"gpu"``) for one shape.

    ``shape`` is a :class:`~kvsplit.kernels.shape.Shape`; or give its fields
    (``gpu``, ``num_qo_heads``, ``num_kv_heads``, ``head_dim``, ``dtype``,
    ``page_size``), validated into one.

    Raises
    ------
    ValueError
        Unknown ``name``, an invalid shape; for ``gpu``, a local GPU other than ``gpu``.
    RuntimeError
        ``gpu`` without CUDA.
    """
    if name not in BACKEND_NAMES:
        raise ValueError(f"backend: expected one of {BACKEND_NAMES}, got {name!r}")
    if shape is None:
        shape = Shape.of(
            device=gpu,
            num_qo_heads=num_qo_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            dtype=dtype,
            page_size=page_size,
        )
    kv_dtype = None if shape.kv_dtype == shape.dtype else shape.kv_dtype
    if name == "sim":
        return SimBackend(
            shape.device,
            num_kv_heads=shape.num_kv_heads,
            head_dim=shape.head_dim,
            dtype=shape.dtype,
            calibration=calibration,
            read_bandwidth_gbps=read_bandwidth_gbps,
            kv_dtype=kv_dtype,
            q_len=shape.q_len,
            num_qo_heads=shape.num_qo_heads,
        )
    return GpuBackend(
        num_qo_heads=shape.num_qo_heads,
        num_kv_heads=shape.num_kv_heads,
        head_dim=shape.head_dim,
        dtype=shape.dtype,
        page_size=shape.page_size,
        max_tokens=max_tokens,
        max_batch=max_batch,
        gpu_index=gpu_index,
        expect_gpu=shape.gpu,
        kv_dtype=kv_dtype,
        q_len=shape.q_len,
    )
