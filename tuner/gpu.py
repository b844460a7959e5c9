"""GPU timing backend: the real kernel, timed as docs/concepts/design.md §7 prescribes.

Each plan is launched once (compile + upload), captured in a CUDA graph, and
its replays are timed with ``triton.testing.do_bench`` (median of event-timed
replays, L2 flushed between repetitions, warmed up). The KV cache holds random
normal data (never zeros), spans at least ``max_tokens`` tokens over shuffled
pages, and is larger than the L2 for the reference workload. The read bandwidth
of the same GPU is measured in the same process with a streaming-read Triton
kernel over a multi-GB buffer; times are reported against the **HBM floor**
``sum(kv_len) * H_kv * D * 2 * kv_bytes / read_bandwidth`` (1 byte per element of an FP8 cache). The **paged read
floor** (:meth:`GpuTimer.paged_read_floor_s`) is what reading the batch's pages
whole, in the shuffled page table's order, costs without any attention math.

Every GPU benchmark of the repository (bench/gpu_sweep.py, bench/peers.py) and
``kvsplit bench --backend gpu`` time through this module: :func:`graph_median_s`
for any callable, :class:`GpuTimer` for kvsplit's plans and the shared cache.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import triton
import triton.language as tl

from ..kernels.decode import decode_attention, make_workspace, reference_decode_attention
from ..kernels.limits import check_kv_dtype, check_q_len, kv_elt_bytes
from ..kernels.plan import Plan

__all__ = ["GpuTimer", "graph_median_s", "measure_read_bandwidth", "software_versions"]

_TORCH = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


@triton.jit
def _stream_read_kernel(X, OUT, n_elements, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    pid = tl.program_id(0)
    base = pid.to(tl.int64) * BLOCK * ITERS
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(ITERS):
        offs = base + i * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(X + offs, mask=offs < n_elements, other=0.0)
        acc += x.to(tl.float32)
    tl.store(OUT + pid, tl.sum(acc, axis=0))


@triton.jit
def _paged_read_kernel(
    K, V, OUT, KV_INDICES, n_pages, stride_kp, stride_vp, PAGE_ELEMS: tl.constexpr, PAGES_PER_PROG: tl.constexpr
):
    # whole pages (all KV heads of a page: K and V each one contiguous box), page ids loaded independently
    pid = tl.program_id(0)
    offs = tl.arange(0, PAGE_ELEMS).to(tl.int64)
    acc = tl.zeros([PAGE_ELEMS], dtype=tl.float32)
    for i in tl.static_range(PAGES_PER_PROG):
        j = pid * PAGES_PER_PROG + i
        ok = j < n_pages
        page = tl.load(KV_INDICES + j, mask=ok, other=0).to(tl.int64)
        k = tl.load(K + page * stride_kp + offs, mask=ok & (offs >= 0), other=0.0)
        v = tl.load(V + page * stride_vp + offs, mask=ok & (offs >= 0), other=0.0)
        acc += k.to(tl.float32) + v.to(tl.float32)
    tl.store(OUT + pid, tl.sum(acc, axis=0))


PAGED_READ_CONFIGS = ((4, 8), (8, 8), (2, 4))
"""(pages per program, warps) of the paged read floor's kernel; the floor is the fastest of them."""


def graph_median_s(fn: Any, *, warmup_ms: float = 10.0, rep_ms: float = 40.0) -> float:
    """Median time in seconds of ``fn()`` (launches only, no host synchronization inside) replayed from a CUDA graph.

    ``fn`` runs twice on a side stream (allocator and compile warm-up), is captured once in a
    ``torch.cuda.CUDAGraph``, and the graph's replays are timed with ``triton.testing.do_bench``
    (event-timed, the 256 MB L2 flush between repetitions, ``return_mode="median"``), the method of
    docs/concepts/design.md §7. ``fn`` must be capturable (fixed pointers, no host sync).

    Raises
    ------
    RuntimeError
        CUDA is not available, or ``fn`` cannot be captured (torch's capture error, chained).
    """
    if not torch.cuda.is_available():
        raise RuntimeError("graph_median_s: CUDA is not available")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            fn()
    except Exception as exc:  # torch raises several types for a refused capture
        raise RuntimeError(f"graph_median_s: capture failed ({type(exc).__name__}: {exc})") from exc
    graph.replay()
    torch.cuda.synchronize()
    ms = triton.testing.do_bench(graph.replay, warmup=warmup_ms, rep=rep_ms, return_mode="median")
    del graph
    return ms * 1e-3


def measure_read_bandwidth(nbytes: int = 4 << 30, device: Any = "cuda") -> float:
    """Streaming-read bandwidth in bytes/s (median of ``do_bench``) over ``nbytes``
    of random bf16 data; each byte is read once per repetition."""
    n = nbytes // 2
    x = torch.randn(n, dtype=torch.bfloat16, device=device)
    BLOCK, ITERS = 4096, 8
    grid = (triton.cdiv(n, BLOCK * ITERS),)
    out = torch.empty(grid[0], dtype=torch.float32, device=device)

    bufs = {"x": x, "out": out}

    def run() -> None:
        _stream_read_kernel[grid](bufs["x"], bufs["out"], n, BLOCK=BLOCK, ITERS=ITERS, num_warps=8)

    run()
    torch.cuda.synchronize()
    ms = triton.testing.do_bench(run, warmup=50, rep=300, return_mode="median")
    bufs.clear()  # free the multi-GB buffer before the caller allocates its KV cache
    del x, out
    torch.cuda.empty_cache()
    return n * 2 / (ms * 1e-3)


def kernel_supports(fp8: bool, q_len: int) -> str | None:
    """None when :func:`~kvsplit.kernels.decode.decode_attention` takes an FP8 cache (its ``k_scale`` /
    ``v_scale`` arguments) where ``fp8`` and ``q_len > 1`` (a ``q_len`` argument), else what it lacks."""
    params = inspect.signature(decode_attention).parameters
    if fp8 and not {"k_scale", "v_scale"} <= set(params):
        return "this kvsplit's decode kernel takes no FP8 K/V yet (no k_scale / v_scale arguments)"
    if q_len > 1 and "q_len" not in params:
        return f"this kvsplit's decode kernel takes q_len = 1 only (got q_len {q_len})"
    return None


def software_versions() -> dict[str, str]:
    """torch, triton, CUDA and GPU name of this process (recorded with measurements)."""
    v = {"torch": torch.__version__, "triton": triton.__version__, "cuda": str(torch.version.cuda)}
    if torch.cuda.is_available():
        v["gpu"] = torch.cuda.get_device_name()
    return v


def timing_kwargs(dtype: str, kv_dtype: str, q_len: int) -> dict[str, Any]:
    """The keyword arguments :class:`GpuTimer` launches ``decode_attention`` with for a shape: the KV scales
    (1.0) of an FP8 cache (``kv_dtype`` other than ``dtype``), ``q_len`` above 1. The compile-ahead helpers
    (:func:`kvsplit.tuner.precompile.compile_plan`) launch with the same, so their kernels are the timer's."""
    kw: dict[str, Any] = {}
    if kv_dtype != dtype:
        kw.update(k_scale=1.0, v_scale=1.0)
    if q_len > 1:
        kw["q_len"] = int(q_len)
    return kw


class GpuTimer:
    """Times plans of one shape on the current CUDA device.

    Parameters
    ----------
    num_qo_heads, num_kv_heads, head_dim : int
        H_q, H_kv, D.
    dtype : str
        ``"bfloat16"`` or ``"float16"``.
    page_size : int
        Tokens per page.
    max_tokens : int
        Largest ``sum(kv_len)`` of a batch to time; the cache holds
        ``max_tokens / page_size + max_batch`` pages of random data.
    max_batch : int
        Largest B.
    seed : int
        RNG seed of the data and the page shuffle.
    kv_dtype : str, optional
        The KV cache's dtype: None (``dtype``) or ``"float8_e4m3fn"`` (random ``dtype`` data cast to FP8, scales
        ``k_scale = v_scale = 1``).
    q_len : int
        Query tokens per request, 1..8: q is ``[B * q_len, H_q, D]`` (each request's ``q_len`` rows adjacent, as
        FlashInfer's ragged q with ``qo_indptr = q_len * arange(B + 1)``).

    Raises
    ------
    ValueError
        An invalid ``dtype``, ``kv_dtype`` or ``q_len``, naming it; an FP8 cache or q_len > 1 with a decode
        kernel that does not take them (:func:`kernel_supports`).
    """

    def __init__(
        self,
        *,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: str = "bfloat16",
        page_size: int = 16,
        max_tokens: int = 1 << 20,
        max_batch: int = 4096,
        seed: int = 0,
        device: Any = "cuda",
        kv_dtype: str | None = None,
        q_len: int = 1,
    ) -> None:
        if dtype not in _TORCH:
            raise ValueError(f"dtype: expected one of {sorted(_TORCH)}, got {dtype!r}")
        kv_dtype = check_kv_dtype(kv_dtype, dtype)
        q_len = check_q_len(q_len, num_qo_heads // max(1, num_kv_heads))
        missing = kernel_supports(kv_dtype != dtype, q_len)
        if missing:
            raise ValueError(f"GpuTimer: {missing}; time this shape with the simulator backend (--backend sim)")
        if not torch.cuda.is_available():
            raise RuntimeError("GpuTimer: CUDA is not available (use the simulator backend)")
        self.kv_dtype, self.q_len = kv_dtype, q_len
        self.num_qo_heads, self.num_kv_heads, self.head_dim = num_qo_heads, num_kv_heads, head_dim
        self.dtype, self.page_size = dtype, page_size
        self.max_tokens, self.max_batch = int(max_tokens), int(max_batch)
        self.device = torch.device(device)
        g = torch.Generator(device=self.device).manual_seed(seed)
        self.num_pages = self.max_tokens // page_size + self.max_batch + 1
        shape = (self.num_pages, page_size, num_kv_heads, head_dim)
        tdt = _TORCH[dtype]
        self.k_cache = torch.randn(shape, generator=g, dtype=tdt, device=self.device)
        self.v_cache = torch.randn(shape, generator=g, dtype=tdt, device=self.device)
        if kv_dtype != dtype:  # random 16-bit data cast to FP8 (|x| < 448: no saturation), scales 1
            self.k_cache = self.k_cache.to(getattr(torch, kv_dtype))
            self.v_cache = self.v_cache.to(getattr(torch, kv_dtype))
        self._kernel_kw = timing_kwargs(dtype, kv_dtype, q_len)
        self._perm = torch.randperm(self.num_pages, generator=torch.Generator().manual_seed(seed)).to(torch.int32)
        self._batches: dict[bytes, dict[str, torch.Tensor]] = {}
        self._bw: float | None = None
        self._ws = None
        self._ws_capacity = (0, 0)
        self._gen = g

    # -- reference figures ----------------------------------------------------
    def read_bandwidth(self) -> float:
        """Measured streaming-read bandwidth, bytes/s (measured once, cached)."""
        if self._bw is None:
            self._bw = measure_read_bandwidth(device=self.device)
        return self._bw

    def kv_bytes(self, kv_lens: Sequence[int] | np.ndarray) -> int:
        """Bytes of K and V a batch must read: ``sum(kv_len) * H_kv * D * 2 * kv_bytes`` (1 per FP8 element)."""
        elt = kv_elt_bytes(self.dtype, self.kv_dtype)
        return int(np.asarray(kv_lens, dtype=np.int64).sum()) * self.num_kv_heads * self.head_dim * 2 * elt

    def hbm_floor_s(self, kv_lens: Sequence[int] | np.ndarray) -> float:
        """HBM floor of a batch in seconds (KV bytes / measured read bandwidth)."""
        return self.kv_bytes(kv_lens) / self.read_bandwidth()

    # -- batches ----------------------------------------------------------------
    def batch(self, kv_lens: np.ndarray) -> dict[str, torch.Tensor]:
        """Device inputs (q, page table, kv_lens) of one batch, cached by kv_lens."""
        kv_lens = np.asarray(kv_lens, dtype=np.int64)
        key = kv_lens.tobytes()
        b = self._batches.get(key)
        if b is not None:
            return b
        B = kv_lens.shape[0]
        if B > self.max_batch or int(kv_lens.sum()) > self.max_tokens:
            raise ValueError(
                f"kv_lens: batch of B={B}, {int(kv_lens.sum())} tokens exceeds the timer's "
                f"max_batch={self.max_batch} / max_tokens={self.max_tokens}"
            )
        pages = np.maximum(-(-kv_lens // self.page_size), 1)
        indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
        indices = self._perm[: int(indptr[-1])]
        q = torch.randn(
            (B * self.q_len, self.num_qo_heads, self.head_dim),
            generator=self._gen,
            dtype=_TORCH[self.dtype],
            device=self.device,
        )
        b = {
            "q": q,
            "kv_indptr": torch.from_numpy(indptr).to(self.device),
            "kv_indices": indices.to(self.device),
            "kv_lens": torch.from_numpy(kv_lens.astype(np.int32)).to(self.device),
        }
        if len(self._batches) > 64:
            self._batches.clear()
        self._batches[key] = b
        return b

    def run(self, plan: Plan, *, return_lse: bool = False):
        """One validated launch of ``plan`` on its batch (for correctness checks)."""
        b = self.batch(plan.kv_lens)
        return decode_attention(
            b["q"],
            self.k_cache,
            self.v_cache,
            b["kv_indptr"],
            b["kv_indices"],
            b["kv_lens"],
            plan,
            return_lse=return_lse,
            **self._kernel_kw,
        )

    def max_error(self, plan: Plan) -> float:
        """Max |o - reference| / max |reference| of ``plan`` on its batch (fp32 reference)."""
        b = self.batch(plan.kv_lens)
        o = self.run(plan)
        ref = reference_decode_attention(
            b["q"], self.k_cache, self.v_cache, b["kv_indptr"], b["kv_indices"], b["kv_lens"]
        )
        return float((o.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-6))

    def time_plan(self, plan: Plan, *, warmup_ms: float = 10.0, rep_ms: float = 40.0) -> float:
        """Median kernel time of ``plan`` in seconds (CUDA-graph replays, do_bench).

        Raises
        ------
        ValueError
            If the plan was made for another shape or dtype than this timer's, or the GPU cannot load its kernel
            (more shared memory per CTA than the device has: the launch's error names the knobs).
        """
        if (plan.num_kv_heads, plan.head_dim, plan.page_size, plan.dtype) != (
            self.num_kv_heads,
            self.head_dim,
            self.page_size,
            self.dtype,
        ):
            raise ValueError("plan: made for another shape/dtype than this GpuTimer")
        b = self.batch(plan.kv_lens)
        out = torch.empty_like(b["q"])
        ws = self.workspace_for(plan)
        plan.to(self.device)
        args = (b["q"], self.k_cache, self.v_cache, b["kv_indptr"], b["kv_indices"], b["kv_lens"], plan)
        kw = self._kernel_kw
        decode_attention(*args, out=out, workspace=ws, validate=True, **kw)  # compile + checks
        return graph_median_s(
            lambda: decode_attention(*args, out=out, workspace=ws, validate=False, **kw),
            warmup_ms=warmup_ms,
            rep_ms=rep_ms,
        )

    def workspace_for(self, plan: Plan):
        """The decode workspace, reallocated only when ``plan`` needs more partials or a larger batch."""
        have_parts, have_batch = self._ws_capacity
        if self._ws is None or plan.num_partials > have_parts or plan.batch_size > have_batch:
            parts, batch = max(plan.num_partials, have_parts, 1 << 12), max(plan.batch_size, have_batch)
            self._ws = None  # free the old one first
            self._ws = make_workspace(
                self.num_qo_heads,
                self.head_dim,
                max_partials=parts,
                max_batch=batch,
                device=self.device,
                **({"q_len": self.q_len} if self.q_len > 1 else {}),
            )
            self._ws_capacity = (parts, batch)
        return self._ws

    def paged_read_floor_s(
        self, kv_lens: Sequence[int] | np.ndarray, *, warmup_ms: float = 10.0, rep_ms: float = 40.0
    ) -> float:
        """The paged read floor of a batch in seconds: the fastest of :data:`PAGED_READ_CONFIGS` of a read-only
        kernel that reads every page of the batch whole (K and V of all KV heads), in the page table's order,
        and sums them (CUDA-graph replays, do_bench median). What any kernel over this paged cache pays before
        the attention math, the split and the merge; partial last pages are read whole.

        Raises
        ------
        ValueError
            ``page_size * num_kv_heads * head_dim`` is not a power of two (the kernel reads a page as one box).
        """
        elems = self.page_size * self.num_kv_heads * self.head_dim
        if elems & (elems - 1):
            raise ValueError(f"paged read floor: page_size * num_kv_heads * head_dim = {elems} is not a power of two")
        b = self.batch(np.asarray(kv_lens, dtype=np.int64))
        idx = b["kv_indices"]
        n_pages = int(idx.shape[0])
        out = torch.empty(n_pages, dtype=torch.float32, device=self.device)
        best = math.inf
        for ppp, warps in PAGED_READ_CONFIGS:
            grid = (triton.cdiv(n_pages, ppp),)

            def run(ppp=ppp, warps=warps, grid=grid) -> None:
                _paged_read_kernel[grid](
                    self.k_cache,
                    self.v_cache,
                    out,
                    idx,
                    n_pages,
                    self.k_cache.stride(0),
                    self.v_cache.stride(0),
                    PAGE_ELEMS=elems,
                    PAGES_PER_PROG=ppp,
                    num_warps=warps,
                )

            best = min(best, graph_median_s(run, warmup_ms=warmup_ms, rep_ms=rep_ms))
        return best

    def ratio_to_floor(self, plan: Plan, seconds: float) -> float:
        """``seconds`` over the HBM floor of ``plan``'s batch (:meth:`hbm_floor_s`): 1.0 is the read floor; ``inf`` for
        an empty batch (floor 0).
        """
        floor = self.hbm_floor_s(plan.kv_lens)
        return seconds / floor if floor > 0 else math.inf
