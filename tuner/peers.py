"""The peer decode kernels, timed on kvsplit's own paged cache: one implementation for ``kvsplit bench --backend
gpu``, bench/peers.py and bench/gpu_sweep.py.

The baseline a user would pick instead of kvsplit is a peer's kernel, not its split rule on kvsplit's kernel
(those are the ``fi_rule_tc`` / ``fi_rule_notc`` / ``fa3`` rule baselines of :mod:`kvsplit.tuner.bench`). Each peer
of :data:`PEERS` runs on a :class:`kvsplit.tuner.gpu.GpuTimer`'s cache (NHD ``[num_pages, page_size, H_kv, D]``,
shuffled pages; ``float8_e4m3fn`` when the timer was made with ``kv_dtype``) and batches (q ``[B * q_len, H_q, D]``,
request b's tokens at rows ``b * q_len .. b * q_len + q_len - 1``), called as the engines call it:

- ``flashinfer_decode``: ``BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_cores=True,
  backend="fa2")``, ``plan(..., kv_data_type=<the cache's dtype>)`` (``torch.float8_e4m3fn`` for an fp8 cache, as
  SGLang runs one), ``run(q, (k, v), k_scale=, v_scale=, out=)``; q_len = 1 only;
- ``flashinfer_prefill`` (q_len > 1 only): ``BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")``,
  ``plan(qo_indptr = q_len * arange(B + 1), ..., causal=True)``, ``run(q, (k, v), k_scale=, v_scale=, out=)``: the
  path engines take for speculative-decoding verify steps;
- ``flashinfer_batch_attention``: FlashInfer's persistent ``BatchAttention`` (``plan`` with the same qo_indptr,
  ``causal=True``, then ``run``); where ``run`` takes no ``k_scale`` / ``v_scale`` (FlashInfer 0.7), ``k_scale`` is
  folded into the softmax scale (exact) and ``v_scale`` is applied to the output outside the timed call (one
  multiply; :attr:`PeerKernel.note` says so);
- ``fa3``: FlashAttention-3's ``flash_attn_interface.flash_attn_with_kvcache(q [B, q_len, H_q, D], k_cache,
  v_cache, cache_seqlens=, page_table=, causal=True, num_splits=0)``, its own split heuristic (SGLang's Hopper
  default; its causal mask is aligned to the end of the KV, as kvsplit's). An fp8 cache takes an fp8 q with
  ``q_descale``/``k_descale``/``v_descale`` ``[B, H_kv]``, as SGLang calls it, and only a build with FA3's FP8 flag on
  (../shared/tools/fa3_for_device disables it: NOTES.md there); :func:`failure_note` says so when the call is refused.

Every launch is CUDA-graph capturable and timed as kvsplit's plans are (:func:`kvsplit.tuner.gpu.graph_median_s`).
The peers are optional dependencies (``pip install flashinfer-python``; FA3 from source): :func:`load` returns
``None`` with the reason when one does not import or does not take the timer's q_len, and callers print that the
baseline is missing: no figure is ever made up. :func:`max_rel_error` checks a peer's output against the fp32
reference (:func:`reference_output`) before its time is recorded.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["PEERS", "PeerKernel", "failure_note", "load", "max_rel_error", "reference_output", "unsupported"]

PEERS: dict[str, str] = {
    "flashinfer_decode": "FlashInfer BatchDecodeWithPagedKVCacheWrapper(use_tensor_cores=True, backend='fa2')",
    "flashinfer_prefill": "FlashInfer BatchPrefillWithPagedKVCacheWrapper(causal=True), q_len > 1",
    "flashinfer_batch_attention": "FlashInfer BatchAttention (persistent, causal=True)",
    "fa3": "FlashAttention-3 flash_attn_with_kvcache(causal=True, num_splits=0)",
}
"""Peer name -> what is called."""

Launch = Callable[[], Any]


def unsupported(name: str, q_len: int) -> str | None:
    """None when peer ``name`` runs ``q_len`` query tokens per request, else why not (one line).

    Raises
    ------
    ValueError
        ``name`` is not one of :data:`PEERS`.
    """
    if name not in PEERS:
        raise ValueError(f"peer: expected one of {list(PEERS)}, got {name!r}")
    if name == "flashinfer_decode" and q_len != 1:
        return (
            f"FlashInfer's decode wrapper takes one query token per request, not q_len {q_len} "
            "(flashinfer_prefill and flashinfer_batch_attention run verify steps)"
        )
    if name == "flashinfer_prefill" and q_len == 1:
        return "the prefill wrapper is timed for q_len > 1 (verify steps); q_len 1 is flashinfer_decode"
    return None


def import_peer(name: str) -> tuple[Any, str]:
    """``(module, "package version")`` of peer ``name``, or ``(None, "missing (reason)")`` when it does not import."""
    try:
        if name == "fa3":
            import flash_attn_interface as mod
        else:
            import flashinfer as mod
    except Exception as exc:  # noqa: BLE001 - any import failure means the optional peer is missing here
        return None, f"missing ({type(exc).__name__}: {exc})"
    return mod, f"{mod.__name__} {getattr(mod, '__version__', '?')}"


def _last_page_lens(lens: np.ndarray, page_size: int) -> np.ndarray:
    """Tokens in each request's last page, int32 ``[B]`` (FlashInfer's ``paged_kv_last_page_len``)."""
    return (lens - (-(-lens // page_size) - 1) * page_size).astype(np.int32)


CHECK_LIMIT = 2e-2
"""Max relative error of a peer's output against the fp32 reference that the bench accepts (bf16 outputs, 16-bit
or fp8 K/V read exactly)."""
FP8_PV_CHECK_LIMIT = 5e-2
"""The same for a peer whose fp8 path rounds the probabilities P to e4m3 before P.V (FA3): measured 0.0274 on the
H100 (`uniform` B = 1, T = 262,144, q rounded as FA3 takes it), over :data:`CHECK_LIMIT`."""


class PeerKernel:
    """One peer kernel on a :class:`~kvsplit.tuner.gpu.GpuTimer`'s cache and batches.

    Parameters
    ----------
    name : str
        One of :data:`PEERS`.
    module : module
        The imported peer package (``flashinfer`` or ``flash_attn_interface``; :func:`load` imports it).
    timer : kvsplit.tuner.gpu.GpuTimer
        Owns the paged cache (its ``kv_dtype``) and the batches (its ``q_len``).
    k_scale, v_scale : float
        The cache's per-tensor dequantization scales (an fp8 cache; the timer's own launches use 1.0).

    Raises
    ------
    ValueError
        ``name`` unknown, or the peer does not take the timer's q_len (:func:`unsupported`).
    """

    def __init__(self, name: str, module: Any, timer: Any, *, k_scale: float = 1.0, v_scale: float = 1.0) -> None:
        why = unsupported(name, timer.q_len)
        if why:
            raise ValueError(f"peer {name}: {why}")
        self.name, self.mod, self.timer = name, module, timer
        self.version = getattr(module, "__version__", "?")
        self.fp8 = timer.kv_dtype != timer.dtype
        self.k_scale, self.v_scale = float(k_scale), float(v_scale)
        self.sm_scale = 1.0 / math.sqrt(timer.head_dim)
        self.note = ""
        if name == "fa3" and self.fp8:
            self.note = "q rounded to float8_e4m3fn: FA3's fp8 path takes q, k and v in fp8"
        self._state: dict[str, Any] = {}

    @property
    def check_limit(self) -> float:
        """The largest ``max |output - reference| / max |reference|`` the bench accepts from this peer
        (:func:`max_rel_error`): :data:`CHECK_LIMIT`, or :data:`FP8_PV_CHECK_LIMIT` for FA3 on an fp8 cache, whose fp8
        path also rounds the softmax probabilities to e4m3 for the P.V product (FlashAttention-3, Shah et al.
        2024, section 3.3), which the reference does not model."""
        return FP8_PV_CHECK_LIMIT if self.name == "fa3" and self.fp8 else CHECK_LIMIT

    @property
    def q_dtype(self) -> Any:
        """The dtype the peer's own call rounds q to (``torch.float8_e4m3fn`` for FA3 on an fp8 cache: its fp8 path
        multiplies an fp8 q, as SGLang passes it), or None where q is used as the timer made it. The reference the
        peer's output is checked against (:func:`max_rel_error`) rounds q the same way."""
        if self.name == "fa3" and self.fp8:
            import torch

            return torch.float8_e4m3fn
        return None

    def _scales(self) -> dict[str, float]:
        return {"k_scale": self.k_scale, "v_scale": self.v_scale} if self.fp8 else {}

    def prepare(self, kv_lens: Any) -> tuple[Launch, Callable[[], Any]]:
        """Plan the peer's call for the batch ``kv_lens`` (int ``[B]``, every kv_len >= max(1, q_len)).

        Returns ``(launch, output)``: ``launch()`` runs the peer (CUDA-graph capturable, no host sync) and
        ``output()`` its last output ``[B * q_len, H_q, D]`` (fp32 where the bench applies ``v_scale`` itself).

        Raises
        ------
        ValueError
            A kv_len below max(1, q_len) (the paged layouts need a page per request; the q_len new tokens are
            in the cache).
        """
        lens = np.asarray(kv_lens, dtype=np.int64)
        lo = max(1, self.timer.q_len)
        if lens.size and int(lens.min()) < lo:
            i = int(np.argmin(lens))
            raise ValueError(f"kv_lens[{i}]: {int(lens[i])} tokens; {self.name} needs kv_len >= {lo}")
        return getattr(self, f"_prepare_{self.name}")(lens)

    def time(self, kv_lens: Any, *, warmup_ms: float = 10.0, rep_ms: float = 40.0) -> float:
        """Median seconds of the peer on the batch ``kv_lens`` (:meth:`prepare`, then CUDA-graph replays,
        do_bench median). Raises ValueError as :meth:`prepare`."""
        from .gpu import graph_median_s

        launch, _ = self.prepare(kv_lens)
        return graph_median_s(launch, warmup_ms=warmup_ms, rep_ms=rep_ms)

    # -- the peers ---------------------------------------------------------------------------------
    def _workspace(self) -> Any:
        import torch

        if "ws" not in self._state:
            self._state["ws"] = torch.empty(256 << 20, dtype=torch.uint8, device=self.timer.device)
        return self._state["ws"]

    def _prepare_flashinfer_decode(self, lens: np.ndarray):
        import torch

        t = self.timer
        if "decode" not in self._state:
            self._state["decode"] = self.mod.BatchDecodeWithPagedKVCacheWrapper(
                self._workspace(), "NHD", use_tensor_cores=True, backend="fa2"
            )
        w = self._state["decode"]
        b = t.batch(lens)
        w.plan(
            b["kv_indptr"],
            b["kv_indices"],
            torch.from_numpy(_last_page_lens(lens, t.page_size)).to(t.device),
            t.num_qo_heads,
            t.num_kv_heads,
            t.head_dim,
            t.page_size,
            q_data_type=b["q"].dtype,
            kv_data_type=t.k_cache.dtype,
        )
        out = torch.empty_like(b["q"])
        kv, sc = (t.k_cache, t.v_cache), self._scales()
        return (lambda: w.run(b["q"], kv, out=out, **sc)), (lambda: out)

    def _qo_indptr(self, B: int) -> Any:
        import torch

        return torch.arange(B + 1, dtype=torch.int32, device=self.timer.device) * self.timer.q_len

    def _prepare_flashinfer_prefill(self, lens: np.ndarray):
        import torch

        t = self.timer
        if "prefill" not in self._state:
            self._state["prefill"] = self.mod.BatchPrefillWithPagedKVCacheWrapper(self._workspace(), "NHD")
        w = self._state["prefill"]
        b = t.batch(lens)
        w.plan(
            self._qo_indptr(len(lens)),
            b["kv_indptr"],
            b["kv_indices"],
            torch.from_numpy(_last_page_lens(lens, t.page_size)).to(t.device),
            t.num_qo_heads,
            t.num_kv_heads,
            t.head_dim,
            t.page_size,
            causal=True,
            sm_scale=self.sm_scale,
            q_data_type=b["q"].dtype,
            kv_data_type=t.k_cache.dtype,
        )
        out = torch.empty_like(b["q"])
        kv, sc = (t.k_cache, t.v_cache), self._scales()
        return (lambda: w.run(b["q"], kv, out=out, **sc)), (lambda: out)

    def _prepare_flashinfer_batch_attention(self, lens: np.ndarray):
        import inspect

        import torch

        t = self.timer
        if "ba" not in self._state:
            w = self.mod.BatchAttention(kv_layout="NHD", device=str(t.device))
            params = inspect.signature(w.run).parameters
            self._state["ba"] = (w, params)
            if self.fp8 and "v_scale" not in params:
                self.note = "run() takes no v_scale: timed without it (k_scale in sm_scale, v_scale on the output)"
        w, params = self._state["ba"]
        soft_cap = {"logits_soft_cap": 0.0} if "logits_soft_cap" in params else {}
        sc = {k: v for k, v in self._scales().items() if k in params}
        fold_k = self.fp8 and "k_scale" not in params
        v_out = self.v_scale if self.fp8 and "v_scale" not in params else 1.0
        b = t.batch(lens)
        B = len(lens)
        w.plan(
            self._qo_indptr(B),
            b["kv_indptr"],
            b["kv_indices"],
            b["kv_lens"],
            t.num_qo_heads,
            t.num_kv_heads,
            t.head_dim,
            t.head_dim,
            t.page_size,
            causal=True,
            sm_scale=self.sm_scale * (self.k_scale if fold_k else 1.0),
            q_data_type=b["q"].dtype,
            kv_data_type=t.k_cache.dtype,
        )
        out = torch.empty_like(b["q"])
        lse = torch.empty((B * t.q_len, t.num_qo_heads), dtype=torch.float32, device=t.device)
        kv = (t.k_cache, t.v_cache)
        return (lambda: w.run(b["q"], kv, out=out, lse=lse, **soft_cap, **sc)), (lambda: out.float() * v_out)

    def _prepare_fa3(self, lens: np.ndarray):
        import torch

        t = self.timer
        b = t.batch(lens)
        B, ql = len(lens), t.q_len
        q4 = b["q"].view(B, ql, t.num_qo_heads, t.head_dim)
        indptr = b["kv_indptr"].cpu().numpy()
        indices = b["kv_indices"].cpu().numpy()
        pages = np.diff(indptr)
        pt = np.zeros((B, max(1, int(pages.max()))), dtype=np.int32)
        for i in range(B):
            pt[i, : pages[i]] = indices[indptr[i] : indptr[i + 1]]
        page_table = torch.from_numpy(pt).to(t.device)
        fp8_kw: dict[str, Any] = {}
        if self.fp8:  # FA3's fp8 path: q, k and v in fp8 with their descales [B, H_kv] (SGLang's call)
            q4 = q4.to(self.q_dtype)
            ones = torch.ones((B, t.num_kv_heads), dtype=torch.float32, device=t.device)
            fp8_kw = {"q_descale": ones, "k_descale": ones * self.k_scale, "v_descale": ones * self.v_scale}
        res: dict[str, Any] = {}

        def launch() -> None:
            o = self.mod.flash_attn_with_kvcache(
                q4,
                t.k_cache,
                t.v_cache,
                cache_seqlens=b["kv_lens"],
                page_table=page_table,
                softmax_scale=self.sm_scale,
                causal=True,
                num_splits=0,
                **fp8_kw,
            )
            res["out"] = o[0] if isinstance(o, tuple) else o

        return launch, (lambda: res["out"].reshape(B * ql, t.num_qo_heads, t.head_dim))


def load(
    timer: Any, name: str = "flashinfer_decode", *, k_scale: float = 1.0, v_scale: float = 1.0
) -> tuple[PeerKernel | None, str]:
    """``(PeerKernel, "package version")`` for peer ``name`` on ``timer``, else ``(None, reason)``: the package does
    not import, or the peer does not take the timer's q_len (:func:`unsupported`). Raises ValueError for an
    unknown ``name``."""
    why = unsupported(name, timer.q_len)
    if why:
        return None, f"not applicable ({why})"
    mod, note = import_peer(name)
    if mod is None:
        return None, note
    return PeerKernel(name, mod, timer, k_scale=k_scale, v_scale=v_scale), note


def failure_note(name: str, exc: BaseException, *, fp8: bool) -> str:
    """One line on why a peer's call failed: the error's type and first line; for FA3 with an fp8 cache, also that a
    build without FA3's FP8 flag refuses the call (the device build turns it off)."""
    first = (str(exc).strip().splitlines() or [""])[0][:200]
    if name == "fa3" and fp8:
        return (
            f"FA3's fp8 call failed ({type(exc).__name__}: {first}); a FlashAttention-3 build without its FP8 flag "
            "refuses it (FLASH_ATTENTION_DISABLE_FP8, ../shared/tools/fa3_for_device/NOTES.md)"
        )
    return f"{type(exc).__name__}: {first}"


def reference_output(
    timer: Any, kv_lens: Any, *, k_scale: float = 1.0, v_scale: float = 1.0, q_dtype: Any = None
) -> Any:
    """fp32 reference ``[B * q_len, H_q, D]`` of a batch on the timer's cache: token j of request b is the
    single-token reference (:func:`kvsplit.kernels.reference.reference_decode_attention`, fp32 math) over its first
    ``kv_len - q_len + 1 + j`` positions (causal within the q_len new tokens); an fp8 cache is dequantized by that
    fp32 math with ``k_scale`` in the softmax scale and ``v_scale`` on the output (scales apply to fp8 only).
    ``q_dtype`` (e.g. ``torch.float8_e4m3fn``, :attr:`PeerKernel.q_dtype`): q is first rounded to it, as a peer
    that computes with such a q sees it."""
    import torch

    from ..kernels.reference import reference_decode_attention

    t = timer
    b = t.batch(np.asarray(kv_lens, dtype=np.int64))
    q, ql = b["q"], t.q_len
    if q_dtype is not None:
        q = q.to(q_dtype).to(q.dtype)
    fp8 = t.kv_dtype != t.dtype
    ks, vs = (k_scale, v_scale) if fp8 else (1.0, 1.0)
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    for j in range(ql):
        o = reference_decode_attention(
            q[j::ql],
            t.k_cache,
            t.v_cache,
            b["kv_indptr"],
            b["kv_indices"],
            b["kv_lens"] - (ql - 1 - j),
            sm_scale=ks / math.sqrt(t.head_dim),
        )
        out[j::ql] = o.float() * vs
    return out


def max_rel_error(peer: PeerKernel, kv_lens: Any, output: Any) -> float:
    """``max |output - reference| / max |reference|`` of ``peer``'s output of the batch ``kv_lens``
    (:func:`reference_output` with the peer's scales and its q rounding, :attr:`PeerKernel.q_dtype`)."""
    ref = reference_output(peer.timer, kv_lens, k_scale=peer.k_scale, v_scale=peer.v_scale, q_dtype=peer.q_dtype)
    return float((output.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-6))
