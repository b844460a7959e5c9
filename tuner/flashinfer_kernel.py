"""FlashInfer's own decode kernel as a baseline (``flashinfer_kernel`` in ``kvsplit bench``).

The baseline a user would pick instead of kvsplit is FlashInfer's kernel, not its split rule on
kvsplit's kernel (those are the ``fi_rule_tc`` / ``fi_rule_notc`` baselines). This module times
``flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_cores=True,
backend="fa2")`` on the same paged cache and batches as :class:`kvsplit.tuner.gpu.GpuTimer`, in
the same process, the same way: ``plan()`` once per batch, ``run(..., out=)`` captured in a CUDA
graph and its replays timed with ``triton.testing.do_bench`` (median).

FlashInfer is an optional dependency (``pip install flashinfer-python``; on a machine without
internet, the team tool ``flashinfer_for_device.sh`` packs it and bench/device_env.sh installs the
pack). :func:`load` returns ``None`` with the reason when it does not import, and callers print
that the baseline is missing: no figure is ever made up.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["FlashInferDecode", "load"]


class FlashInferDecode:
    """Times FlashInfer's tensor-core decode on a :class:`~kvsplit.tuner.gpu.GpuTimer`'s cache.

    Parameters
    ----------
    timer : kvsplit.tuner.gpu.GpuTimer
        Owns the paged KV cache (NHD, ``[num_pages, page_size, H_kv, D]``) and the batches.
    flashinfer : module
        The imported ``flashinfer`` package.
    """

    def __init__(self, timer: Any, flashinfer: Any) -> None:
        import torch

        self.timer = timer
        self.version = getattr(flashinfer, "__version__", "?")
        self._ws = torch.empty(256 << 20, dtype=torch.uint8, device=timer.device)
        self._wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            self._ws, "NHD", use_tensor_cores=True, backend="fa2"
        )

    def prepare(self, kv_lens: Any, *, k_scale: float | None = None, v_scale: float | None = None) -> tuple[Any, Any]:
        """Plan FlashInfer's decode of the batch ``kv_lens`` (int ``[B]``, every kv_len >= 1) on the timer's cache.

        Returns ``(launch, out)``: ``launch()`` runs the decode into ``out`` (``[B, H_q, D]``, q's dtype) and is
        CUDA-graph capturable. ``k_scale``/``v_scale``: the cache's dequantization scales, passed to FlashInfer's
        ``run`` (an fp8 cache: the plan's ``kv_data_type`` is the timer's cache dtype).

        Raises
        ------
        ValueError
            A kv_len of 0 (FlashInfer's paged layout needs one page per request).
        """
        import torch

        lens = np.asarray(kv_lens, dtype=np.int64)
        if (lens < 1).any():
            raise ValueError("kv_lens: FlashInfer's decode needs kv_len >= 1 for every request")
        t = self.timer
        b = t.batch(lens)
        ps = t.page_size
        # FlashInfer derives a request's length from its page count and last-page length
        last = (lens - (-(-lens // ps) - 1) * ps).astype(np.int32)
        self._wrapper.plan(
            b["kv_indptr"],
            b["kv_indices"],
            torch.from_numpy(last).to(t.device),
            t.num_qo_heads,
            t.num_kv_heads,
            t.head_dim,
            ps,
            q_data_type=b["q"].dtype,
            kv_data_type=t.k_cache.dtype,
        )
        out = torch.empty_like(b["q"])
        kv = (t.k_cache, t.v_cache)
        scales = {k: v for k, v in (("k_scale", k_scale), ("v_scale", v_scale)) if v is not None}
        return (lambda: self._wrapper.run(b["q"], kv, out=out, **scales)), out

    def time(self, kv_lens: Any, *, warmup_ms: float = 10.0, rep_ms: float = 40.0) -> float:
        """Median time in seconds of FlashInfer's decode of the batch ``kv_lens`` (:meth:`prepare`; CUDA-graph
        replays, do_bench median). Raises ValueError as :meth:`prepare`."""
        from .gpu import graph_median_s

        launch, _ = self.prepare(kv_lens)
        return graph_median_s(launch, warmup_ms=warmup_ms, rep_ms=rep_ms)


def load(timer: Any) -> tuple[FlashInferDecode | None, str]:
    """``(FlashInferDecode, "flashinfer X.Y")`` when FlashInfer imports, else ``(None, "missing: reason")``."""
    try:
        import flashinfer
    except Exception as exc:  # noqa: BLE001 - any import failure means the optional baseline is missing
        return None, f"missing ({type(exc).__name__}: {exc})"
    return FlashInferDecode(timer, flashinfer), f"flashinfer {getattr(flashinfer, '__version__', '?')}"
