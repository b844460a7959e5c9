"""Device-side planning: the work list of a rule computed by a Triton kernel from
kv_lens on the GPU, into preallocated buffers (docs/concepts/design.md §3 "Engine hot path").

The rules were written as prefix sums plus per-item arithmetic, so one program
computes them with ``tl.cumsum`` (blocks of requests and of work items, with the
running sums carried between blocks):

- ``stream_k`` (and ``tuned`` with ``partition="stream_k"``): request ``b``'s
  cost ``n_b + o``, its prefix ``P_b``, the kept cuts ``k * share - lo_b`` as a
  closed-form range of ``k``, each piece's CTA (the host planner's ``_stream_k``, kernels/fastplan.py);
- ``no_split``, ``fixed`` and ``tuned`` with ``wave_aware=False``: per-request
  ``num_splits`` from one chunk (``cdiv(H_kv * sum(kv_len), ceil(ctas_per_sm *
  num_SMs))`` rounded up to ``block_n``), then
  the host work list's chunk boundaries (``_lay_out``, kernels/fastplan.py).

Launch order is the batch order; ``order="heavy_first"``, ``pack_tokens`` and
the wave-aware chunk search (``balanced``, ``tuned`` by default) are host-only:
:func:`check_device_rule` raises ``NotImplementedError`` for them, and
:class:`kvsplit.kernels.wrapper.DecodeWrapper` then plans on the host and
uploads the plan into the same buffers. The outputs are exactly the host plan's
arrays and :meth:`Plan.merge_layout` (tests/kernels/test_device_plan.py), plus a
``counts`` vector ``[num_items, num_ctas, num_tiles, num_merge]`` that the
decode launch reads on the device (no host sync). ``config.heads_per_tile`` > 1
(GQA-packed work tiles of that many adjacent KV heads) is counted as on the
host: ``num_tiles = num_ctas * H_kv / heads_per_tile``, and the partitions'
tile counts use H_kv / heads_per_tile (:func:`kvsplit.kernels.rulespec.tile_heads`). Both planners take the same
:class:`~kvsplit.kernels.rulespec.RuleSpec`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

from .limits import MAX_BATCH, next_pow2
from .rulespec import RULE_CONST, RULE_FAIR, RuleSpec

__all__ = ["LAUNCH_ARRAYS", "DevicePlanBuffers", "check_device_rule", "alloc_device_plan", "device_plan"]

# the int32 plan arrays :func:`kvsplit.kernels.decode.launch_decode` reads, in the order a plan's buffers are laid out
LAUNCH_ARRAYS = (
    "work_request",
    "work_kv_start",
    "work_kv_end",
    "work_slot",
    "cta_indptr",
    "merge_request",
    "merge_slot_start",
    "merge_num",
)
# counts[] slots
NUM_ITEMS, NUM_CTAS, NUM_TILES, NUM_MERGE = 0, 1, 2, 3


def check_device_rule(spec: RuleSpec) -> None:
    """Raise ``NotImplementedError`` naming what the device planner does not run in ``spec`` (module doc):
    the whole-wave rule, ``order="heavy_first"``, ``pack_tokens``, the wave-aware chunk and the peers' rules."""
    if spec.whole_wave_specs:
        raise NotImplementedError(
            "device planning: whole_wave picks the kernel tile per batch (a CUDA graph keeps "
            "one); plan on the host, or leave whole_wave out"
        )
    if spec.heavy_first:
        raise NotImplementedError("device planning: order='heavy_first' needs a sort; plan on the host")
    if spec.pack_tokens:
        raise NotImplementedError("device planning: pack_tokens is host-only; plan on the host")
    if spec.partition == "stream_k" or (spec.partition == "even_chunks" and spec.chunk_rule in (RULE_CONST, RULE_FAIR)):
        return
    raise NotImplementedError(
        f"device planning: policy {spec.policy!r} uses the wave-aware chunk search or a peer's rule (a "
        "data-dependent binary search and a sort); use stream_k, fixed, no_split or tuned with wave_aware=False, "
        "or plan on the host"
    )


@dataclass
class DevicePlanBuffers:
    """Preallocated int32 device buffers of a plan (host- or device-made).

    ``work_*``, ``work_slot`` ``[max_items]``; ``cta_indptr`` ``[max_items + 1]``;
    ``merge_*`` ``[max_batch]``; ``req_end``, ``req_p`` scratch ``[max_batch]``; ``counts``
    ``[4]`` = num_items, num_ctas, num_tiles (num_ctas * H_kv / heads_per_tile), num_merge.
    """

    work_request: torch.Tensor
    work_kv_start: torch.Tensor
    work_kv_end: torch.Tensor
    work_slot: torch.Tensor
    cta_indptr: torch.Tensor
    merge_request: torch.Tensor
    merge_slot_start: torch.Tensor
    merge_num: torch.Tensor
    req_end: torch.Tensor
    req_p: torch.Tensor
    counts: torch.Tensor

    @property
    def max_items(self) -> int:
        """Capacity in work items (``work_request.shape[0]``): the most items a plan written here may have."""
        return int(self.work_request.shape[0])

    @property
    def max_batch(self) -> int:
        """Capacity in requests (``merge_request.shape[0]``): the largest batch a plan written here may have."""
        return int(self.merge_request.shape[0])

    def arrays(self) -> dict[str, torch.Tensor]:
        """The dict :func:`kvsplit.kernels.decode.launch_decode` takes."""
        return {k: getattr(self, k) for k in LAUNCH_ARRAYS}


def alloc_device_plan(max_batch: int, max_items: int, device: Any) -> DevicePlanBuffers:
    """Allocate :class:`DevicePlanBuffers` for batches of up to ``max_batch`` requests
    and plans of up to ``max_items`` work items."""
    if not 1 <= max_batch <= MAX_BATCH:
        raise ValueError(f"max_batch_size: expected 1 <= max_batch_size <= {MAX_BATCH}, got {max_batch}")
    if max_items < max_batch:
        raise ValueError(f"max_work_items: expected >= max_batch_size ({max_batch}), got {max_items}")
    e = dict(dtype=torch.int32, device=device)
    return DevicePlanBuffers(
        work_request=torch.zeros(max_items, **e),
        work_kv_start=torch.zeros(max_items, **e),
        work_kv_end=torch.zeros(max_items, **e),
        work_slot=torch.zeros(max_items, **e),
        cta_indptr=torch.zeros(max_items + 1, **e),
        merge_request=torch.zeros(max_batch, **e),
        merge_slot_start=torch.zeros(max_batch, **e),
        merge_num=torch.zeros(max_batch, **e),
        req_end=torch.zeros(max_batch, **e),
        req_p=torch.zeros(max_batch, **e),
        counts=torch.zeros(4, **e),
    )


@triton.jit
def _cdiv(a, b):
    return (a + b - 1) // b


@triton.jit
def _find_request(REQ_END, w, B, LOG2B: tl.constexpr):
    """Request of each item index ``w``: the first b with req_end[b] > w (binary search)."""
    lo = tl.zeros_like(w)
    hi = tl.zeros_like(w) + B
    for _ in range(LOG2B + 1):
        active = lo < hi
        mid = (lo + hi) // 2
        e = tl.load(REQ_END + mid, mask=active & (mid < B), other=0)
        go_right = active & (e <= w)
        lo = tl.where(go_right, mid + 1, lo)
        hi = tl.where(active & ~go_right, mid, hi)
    return lo


@triton.jit
def _sk_request(L, block_n, P, o, share, mp):
    """stream_k per request: (nb, lo, k_lo, kept cuts)."""
    nb = _cdiv(L, block_n)
    lo = P + o
    hi = lo + nb
    first_k = lo // share + 1
    last_k = _cdiv(hi, share) - 1
    k_lo = tl.maximum(first_k, _cdiv(lo + mp, share))
    k_hi = tl.minimum(last_k, (hi - mp) // share)
    ncut = tl.maximum(k_hi - k_lo + 1, 0)
    return nb, lo, k_lo, ncut


@triton.jit
def _device_plan_kernel(
    KV_LENS,
    B,
    REQ_END,
    REQ_P,
    WORK_REQ,
    WORK_START,
    WORK_END,
    WORK_SLOT,
    CTA_INDPTR,
    MERGE_REQ,
    MERGE_SLOT,
    MERGE_NUM,
    COUNTS,
    COUNTER,
    H,
    block_n,
    C,
    o,
    mp,
    const_splits,
    ctas_target,
    min_chunk,
    max_splits,
    max_items,
    STREAM_K: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_W: tl.constexpr,
    LOG2B: tl.constexpr,
):
    offs_b = tl.arange(0, BLOCK_B)
    offs_w = tl.arange(0, BLOCK_W)
    # ---- phase 0: totals -------------------------------------------------------
    total = tl.zeros([], dtype=tl.int64)
    for b0 in range(0, B, BLOCK_B):
        m = (b0 + offs_b) < B
        L = tl.load(KV_LENS + b0 + offs_b, mask=m, other=0).to(tl.int64)
        if STREAM_K:
            total += tl.sum(tl.where(m, _cdiv(L, block_n) + o, 0), axis=0)
        else:
            total += tl.sum(L, axis=0)
    if STREAM_K:
        share = tl.maximum(_cdiv(total, C), 1)
        chunk = share  # unused
    else:
        fair = _cdiv(total * H, ctas_target)
        chunk = tl.maximum(tl.maximum(fair, min_chunk), 1)
        chunk = _cdiv(chunk, block_n) * block_n
        share = chunk  # unused
    # ---- phase 1: per-request item counts, prefix sums, merge layout -------------
    items = tl.zeros([], dtype=tl.int64)
    cost = tl.zeros([], dtype=tl.int64)
    slots = tl.zeros([], dtype=tl.int64)
    merges = tl.zeros([], dtype=tl.int64)
    for b0 in range(0, B, BLOCK_B):
        m = (b0 + offs_b) < B
        L = tl.load(KV_LENS + b0 + offs_b, mask=m, other=0).to(tl.int64)
        if STREAM_K:
            c_b = tl.where(m, _cdiv(L, block_n) + o, 0)
            P = cost + tl.cumsum(c_b, axis=0) - c_b
            nb, lo, k_lo, ncut = _sk_request(L, block_n, P, o, share, mp)
            n = ncut + 1
            tl.store(REQ_P + b0 + offs_b, P.to(tl.int32), mask=m)
            cost += tl.sum(c_b, axis=0)
        else:
            if const_splits > 0:
                n = tl.zeros_like(L) + const_splits
            else:
                n = tl.minimum(tl.maximum(_cdiv(L, chunk), 1), max_splits)
            n = tl.maximum(tl.minimum(n, tl.maximum(L, 1)), 1)
        n = tl.where(m, n, 0)
        ends = items + tl.cumsum(n, axis=0)
        tl.store(REQ_END + b0 + offs_b, ends.to(tl.int32), mask=m)
        split = (n > 1) & m
        sl = tl.where(split, n, 0)
        slot_base = slots + tl.cumsum(sl, axis=0) - sl
        mi = merges + tl.cumsum(split.to(tl.int64), axis=0) - 1
        tl.store(MERGE_REQ + mi, (b0 + offs_b).to(tl.int32), mask=split)
        tl.store(MERGE_SLOT + mi, slot_base.to(tl.int32), mask=split)
        tl.store(MERGE_NUM + mi, n.to(tl.int32), mask=split)
        items += tl.sum(n, axis=0)
        slots += tl.sum(sl, axis=0)
        merges += tl.sum(split.to(tl.int64), axis=0)
    tl.debug_barrier()
    W = tl.minimum(items, max_items)  # the wrapper checks num_items <= max_items after the step
    # ---- phase 2: items ---------------------------------------------------------
    ctas = tl.zeros([], dtype=tl.int64)
    for w0 in range(0, W, BLOCK_W):
        w = w0 + offs_w
        mw = w < W
        b = _find_request(REQ_END, w, B, LOG2B)
        bc = tl.minimum(b, B - 1)
        Lb = tl.load(KV_LENS + bc, mask=mw, other=0).to(tl.int64)
        end_b = tl.load(REQ_END + bc, mask=mw, other=0).to(tl.int64)
        first_b = tl.load(REQ_END + bc - 1, mask=mw & (bc > 0), other=0).to(tl.int64)
        nb_items = end_b - first_b
        j = w - first_b
        if STREAM_K:
            P = tl.load(REQ_P + bc, mask=mw, other=0).to(tl.int64)
            nblk, lo, k_lo, ncut = _sk_request(Lb, block_n, P, o, share, mp)
            sblk = tl.where(j > 0, (k_lo + j - 1) * share - lo, 0)
            eblk = tl.where(j < nb_items - 1, (k_lo + j) * share - lo, nblk)
            start = tl.minimum(sblk * block_n, Lb)
            end = tl.minimum(eblk * block_n, Lb)
            push = tl.where(j == 0, tl.minimum(mp - 1, tl.maximum(nblk - 1, 0)), 0)
            cta = tl.minimum((lo + sblk + push) // share, C - 1)
            # the previous item's CTA (item w - 1), by the same arithmetic
            wp = tl.maximum(w - 1, 0)
            bp = tl.minimum(_find_request(REQ_END, wp, B, LOG2B), B - 1)
            Lp = tl.load(KV_LENS + bp, mask=mw, other=0).to(tl.int64)
            Pp = tl.load(REQ_P + bp, mask=mw, other=0).to(tl.int64)
            fp = tl.load(REQ_END + bp - 1, mask=mw & (bp > 0), other=0).to(tl.int64)
            jp = wp - fp
            nblk_p, lo_p, k_lo_p, _nc = _sk_request(Lp, block_n, Pp, o, share, mp)
            sblk_p = tl.where(jp > 0, (k_lo_p + jp - 1) * share - lo_p, 0)
            push_p = tl.where(jp == 0, tl.minimum(mp - 1, tl.maximum(nblk_p - 1, 0)), 0)
            cta_p = tl.minimum((lo_p + sblk_p + push_p) // share, C - 1)
            boundary = mw & ((w == 0) | (cta != cta_p))
        else:
            tiles = _cdiv(Lb, block_n)
            aligned = tiles >= nb_items
            nz = tl.maximum(nb_items, 1)
            start = tl.where(aligned, block_n * ((j * tiles) // nz), (j * Lb) // nz)
            end = tl.where(aligned, tl.minimum(block_n * (((j + 1) * tiles) // nz), Lb), ((j + 1) * Lb) // nz)
            boundary = mw
        split = nb_items > 1
        tl.store(WORK_REQ + w, bc.to(tl.int32), mask=mw)
        tl.store(WORK_START + w, start.to(tl.int32), mask=mw)
        tl.store(WORK_END + w, end.to(tl.int32), mask=mw)
        # -1 for items of single-split requests; split items get their slot in phase 3
        tl.store(WORK_SLOT + w, tl.where(split, j, -1).to(tl.int32), mask=mw)
        pos = ctas + tl.cumsum(boundary.to(tl.int64), axis=0) - 1
        tl.store(CTA_INDPTR + pos, w.to(tl.int32), mask=boundary)
        ctas += tl.sum(boundary.to(tl.int64), axis=0)
    tl.debug_barrier()
    # ---- phase 3: slots of split items (merge_slot_start of their request) -------
    for m0 in range(0, merges, BLOCK_B):
        mi = m0 + offs_b
        mm = mi < merges
        r = tl.load(MERGE_REQ + mi, mask=mm, other=0)
        s0 = tl.load(MERGE_SLOT + mi, mask=mm, other=0)
        nr = tl.load(MERGE_NUM + mi, mask=mm, other=0)
        e = tl.load(REQ_END + r, mask=mm, other=0)
        first = e - nr
        for jj in range(0, tl.max(nr, axis=0)):
            ok = mm & (jj < nr)
            tl.store(WORK_SLOT + first + jj, s0 + jj, mask=ok)
    tl.store(CTA_INDPTR + ctas, W.to(tl.int32))
    tl.store(COUNTS + 0, items.to(tl.int32))
    tl.store(COUNTS + 1, ctas.to(tl.int32))
    tl.store(COUNTS + 2, (ctas * H).to(tl.int32))
    tl.store(COUNTS + 3, merges.to(tl.int32))
    tl.store(COUNTER, 0)


def device_plan(kv_lens: torch.Tensor, spec: RuleSpec, bufs: DevicePlanBuffers, counter: torch.Tensor) -> None:
    """Compute the work list of ``spec`` (a rule :func:`check_device_rule` accepts) for ``kv_lens`` (int32 ``[B]``, on the device)
    into ``bufs`` (one launch, no allocation, no sync: CUDA-graph safe). Also
    resets the persistent schedule's work ``counter``. The kv_lens are the
    caller's contract here (0 <= kv_len <= 2^31-1, as FlashInfer's plan
    trusts its indptr in graph mode); ``bufs.counts[0]`` holds the plan's true
    item count, which the caller may compare with ``bufs.max_items`` off the hot path.
    """
    B = int(kv_lens.shape[0])
    if B > bufs.max_batch:
        raise ValueError(f"kv_lens: batch of {B} requests above max_batch_size={bufs.max_batch}")
    block_b = min(max(next_pow2(B), 16), 1024)
    sk = spec.partition == "stream_k"
    const = 0 if sk or spec.chunk_rule != RULE_CONST else spec.chunk_arg
    fair = not sk and spec.chunk_rule == RULE_FAIR
    _device_plan_kernel[(1,)](
        kv_lens,
        B,
        bufs.req_end,
        bufs.req_p,
        bufs.work_request,
        bufs.work_kv_start,
        bufs.work_kv_end,
        bufs.work_slot,
        bufs.cta_indptr,
        bufs.merge_request,
        bufs.merge_slot_start,
        bufs.merge_num,
        bufs.counts,
        counter,
        spec.tile_heads,
        spec.config.block_n,
        spec.ctas,
        spec.item_cost_blocks,
        spec.min_piece_blocks,
        const,
        spec.chunk_arg if fair else 1,
        spec.min_chunk if fair else 1,
        min(spec.max_splits, 1 << 30) if fair else 1 << 30,
        bufs.max_items,
        STREAM_K=sk,
        BLOCK_B=block_b,
        BLOCK_W=1024 if B > 64 else 256,
        LOG2B=max(1, math.ceil(math.log2(max(bufs.max_batch, 2)))),
        num_warps=4,
    )
