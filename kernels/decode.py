"""Split-KV GQA decode attention over a paged KV cache (Triton), and its fp32 reference.

Layout (FlashInfer's NHD convention, docs/concepts/design.md §3):

- ``q``: ``[B * q_len, H_q, D]`` (``q_len`` 1 to 8 query tokens per request, the same for all: decode, or a
  speculative-decoding verify step; request b's tokens are rows ``b * q_len ..``); ``k_cache``, ``v_cache``:
  ``[num_pages, page_size, H_kv, D]`` in q's dtype or ``torch.float8_e4m3fn`` (read as fp8 bytes and widened
  to float16 per tile for float16 dots, with FlashInfer's ``k_scale``/``v_scale``: per tensor or per KV head);
- ``kv_indptr`` int32 ``[B+1]``, ``kv_indices`` int32 ``[kv_indptr[-1]]`` (page ids of
  each request in order), ``kv_lens`` int32 ``[B]``; request ``b`` uses its first
  ``ceil(kv_lens[b] / page_size)`` pages; kv_lens count the q_len new tokens, and token j sees the positions
  ``[0, kv_len - q_len + j]`` (causal within the new tokens);
- output ``o`` ``[B * q_len, H_q, D]`` in q's dtype, optional ``lse`` fp32 ``[B * q_len, H_q]`` (natural log).

With ``q_len > 1`` a work tile holds the ``G * q_len`` query rows of its KV head (``G * heads_per_tile *
q_len`` rows, at most :data:`~kvsplit.kernels.limits.MAX_TILE_ROWS`), q/out/LSE/partials viewed as ``[B, q_len * H_q, ...]``; a split
that starts after a row's causal limit gives that row an empty partial (LSE -inf), which the merge weighs 0.
The plan (its KV ranges) is the same for every q_len.

Two launches, both driven by a :class:`~kvsplit.kernels.plan.Plan`:

1. **Stage 1** runs one work tile per (CTA, kv_head) (per (CTA, group of
   ``config.heads_per_tile`` adjacent KV heads) when that knob is above 1: their
   GQA groups share the 16 query rows one group pads, each head's scores and
   probabilities kept on its own rows). A CTA walks the work items
   ``plan.cta_indptr[c]:plan.cta_indptr[c+1]`` (packing of short items); for each
   it streams ``[kv_start, kv_end)`` of the request in ``BLOCK_N``-token tiles
   through the page table with an online softmax (base-2, as FlashAttention-2,
   Dao 2023), the G = H_q / H_kv query heads of the KV head packed into the M
   side of ``tl.dot`` (padded to 16 rows; "PackGQA"). With ``config.prefetch``
   the page ids of the next tile are loaded one iteration ahead, so the K/V
   loads of a tile no longer depend on a load of their own iteration and
   Triton's software pipeliner keeps ``num_stages - 1`` K/V tiles in flight
   (without it the pipeliner single-buffers K/V whatever ``num_stages``). With
   ``config.next_item`` (on top of the prefetch) a CTA also loads its next items'
   work entries, page-table offsets, q and first page ids while the current item
   streams, so an item's first K/V copies do not wait on a chain of dependent
   loads (docs/decisions/look-ahead.md). Items of requests with a
   single split write the final output (and LSE); the others write a partial
   output (fp32, normalized) and its LSE into the workspace. With
   ``schedule="persistent"``, ``num_programs`` CTAs take work tiles in plan order
   from a global atomic counter that the call resets first.
2. **Stage 2** merges the partials of each request with more than one split by
   their LSE (flash-decoding, Dao et al. 2023): ``o = sum_j exp(lse_j - M) o_j /
   sum_j exp(lse_j - M)``. Skipped when no request is split.

Empty items (kv_len = 0) are neutral: o = 0, lse = -inf, never NaN. K/V loads
are masked by the item's range, so garbage (NaN, Inf) in unused slots of a
request's last page or in pages it does not own never reaches the output.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

from .limits import check_covers_q_len, check_q_len, next_pow2, tile_problem, tile_rows, too_big_message
from .plan import Plan
from .reference import check_tensor, reference_decode_attention  # noqa: F401  (public name here, docs/concepts/design.md §3)
from .residency import register_cap

__all__ = [
    "compile_only",
    "decode_attention",
    "launch_decode",
    "launch_rule",
    "LaunchRule",
    "reference_decode_attention",
    "DecodeWorkspace",
    "make_workspace",
]

_LOG2E = 1.4426950408889634
_LN2 = 0.6931471805599453

MERGE_SYNC_CHUNKS = 4
"""Head-dim chunks per (request, query head) that the overlapped merge's counters hold (``merge_dsplit`` <= this)."""
MERGE_POLL_NS = 500
"""The overlapped merge's back-off between polls of its counter under PDL (ns; PTX ``nanosleep``)."""

TORCH_DTYPES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32"}
KV_FP8 = torch.float8_e4m3fn
"""The fp8 KV-cache dtype the kernel reads (FlashInfer's ``kv_data_type=torch.float8_e4m3fn``), with a q of
float16 or bfloat16."""
KV_DTYPES = {**TORCH_DTYPES, KV_FP8: "float8_e4m3fn"}


# ----------------------------------------------------------------------------
# Triton kernels
# ----------------------------------------------------------------------------


@triton.jit
def _widen_fp8(v, KV_FP8: tl.constexpr):
    # float8_e4m3fn -> float16 (q's dtype on an FP8 cache). KV_FP8 == 2: in the layout v was loaded in, four
    # elements per 32-bit register, with two packed cvt.rn.f16x2.e4m3x2 (the instruction Triton's own conversion
    # uses) in inline PTX marked impure so that it stays before the shared-memory copy: Triton moves its own
    # conversion past that copy into the P @ V operand's layout (keys along the MMA's k), which it then reads one
    # byte at a time (LDS.U8) for want of a transposing ldmatrix of bytes; widened first, V is stored as float16
    # and read by ldmatrix.trans as on a 16-bit cache (docs/decisions/fp8-dot-dtype.md). KV_FP8 == 1: Triton's
    # conversion (its interpreter runs no PTX; :func:`_fp8_widen_mode` picks the mode).
    if KV_FP8 == 2:
        return tl.inline_asm_elementwise(
            "{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $2; cvt.rn.f16x2.e4m3x2 $0, lo; cvt.rn.f16x2.e4m3x2 $1, hi; }",
            "=r,=r,r",
            [v.to(tl.uint8, bitcast=True)],
            dtype=tl.float16,
            is_pure=False,
            pack=4,
        )
    else:
        return v.to(tl.float16)


@triton.jit
def _online_softmax_step(
    q,
    k,
    v,
    mask_n,
    m_i,
    l_i,
    acc,
    qk_scale,
    DOT_PRECISION: tl.constexpr,
    t=None,
    lim=None,
    Q_LEN: tl.constexpr = 1,
    KV_FP8: tl.constexpr = 0,
):
    # one BLOCK_N tile of the online softmax (base 2; FlashAttention-2, Dao 2023): scores of the GQA group's
    # queries against the tile's keys, masked past the item's end, running max / sum / output rescaled.
    # KV_FP8 (1 or 2, _widen_fp8): k and v are float8_e4m3fn, widened to q's dtype (float16, converted by the caller)
    # for the dots (their scales are folded into qk_scale and into the output). Q_LEN > 1: row r also masks the keys
    # at positions t >= lim[r] (causal within the request's Q_LEN new tokens); a row with no key in the tile keeps
    # m = -inf, so the exponents are taken against 0 there (no -inf - -inf).
    if KV_FP8:
        k = k.to(q.dtype)
        v = _widen_fp8(v, KV_FP8)
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
    if Q_LEN == 1:
        s = tl.where(mask_n[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(s - m_new[:, None])
    else:
        s = tl.where(mask_n[None, :] & (t[None, :] < lim[:, None]), s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.math.exp2(m_i - m_use)
        p = tl.math.exp2(s - m_use[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return m_new, l_i, acc


@triton.jit
def _online_softmax_step_heads(
    q,
    K,
    V,
    k_row,
    v_row,
    mask_n,
    row_head,
    m_i,
    l_i,
    acc,
    qk_scale,
    offs_d,
    h0,
    stride_kh,
    stride_vh,
    HEADS: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    t=None,
    lim=None,
    Q_LEN: tl.constexpr = 1,
    KV_FP8: tl.constexpr = 0,
):
    # one BLOCK_N tile for HEADS adjacent KV heads at once: the query rows of head j are rows
    # j*G .. j*G+G-1 of q (HEADS*G <= BLOCK_H, so the rows that pad one head's G queries to 16 hold the next
    # head's). Each head's K and V are loaded (adjacent 256 B rows of the same pages), its scores are kept
    # on its own rows, and its probabilities are multiplied with its V only (the other rows zeroed).
    s = tl.zeros([BLOCK_H, BLOCK_N], dtype=tl.float32)
    for j in tl.static_range(HEADS):
        k = tl.load(K + (k_row + (h0 + j) * stride_kh)[:, None] + offs_d[None, :], mask=mask_n[:, None], other=0.0)
        if KV_FP8:
            k = k.to(q.dtype)
        s = tl.where((row_head == j)[:, None], tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION), s)
    if Q_LEN == 1:
        s = tl.where(mask_n[None, :], s * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(s - m_new[:, None])
    else:  # as in _online_softmax_step
        s = tl.where(mask_n[None, :] & (t[None, :] < lim[:, None]), s * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.math.exp2(m_i - m_use)
        p = tl.math.exp2(s - m_use[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None]
    for j in tl.static_range(HEADS):
        v = tl.load(V + (v_row + (h0 + j) * stride_vh)[:, None] + offs_d[None, :], mask=mask_n[:, None], other=0.0)
        if KV_FP8:
            v = _widen_fp8(v, KV_FP8)
        acc += tl.dot(tl.where((row_head == j)[:, None], p, 0.0).to(v.dtype), v, input_precision=DOT_PRECISION)
    return m_new, l_i, acc


@triton.jit
def _stage1_tile(
    tile,
    Q,
    K,
    V,
    O,
    LSE,
    PART_O,
    PART_LSE,
    KV_INDPTR,
    KV_INDICES,
    WORK_REQ,
    WORK_START,
    WORK_END,
    WORK_SLOT,
    CTA_INDPTR,
    qk_scale,
    PAGE_SIZE: tl.constexpr,
    stride_qb,
    stride_qh,
    stride_kp,
    stride_ks,
    stride_kh,
    stride_vp,
    stride_vs,
    stride_vh,
    stride_ob,
    stride_oh,
    H_Q: tl.constexpr,
    H_KV: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_H: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    RETURN_LSE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    PREFETCH: tl.constexpr,
    HEADS: tl.constexpr = 1,
    NEXT: tl.constexpr = False,
    SYNC=None,
    SIGNAL: tl.constexpr = False,
    MERGE_DS: tl.constexpr = 1,
    PDL_LAST: tl.constexpr = False,
    KV_LENS=None,
    K_SCALE=None,
    V_SCALE=None,
    v_scale=None,
    Q_LEN: tl.constexpr = 1,
    KV_FP8: tl.constexpr = 0,
    SCALE: tl.constexpr = 0,
):
    # tile -> (cta, kv_head); the tiles of one CTA's items for all KV heads are adjacent. With HEADS > 1 a
    # tile is (cta, group of HEADS adjacent KV heads starting at h).
    c = tile // (H_KV // HEADS)
    h = (tile % (H_KV // HEADS)) * HEADS
    item_lo = tl.load(CTA_INDPTR + c)
    item_hi = tl.load(CTA_INDPTR + c + 1)

    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, BLOCK_N)
    mask_h = offs_h < GROUP * HEADS * Q_LEN
    if Q_LEN == 1:
        q_head = h * GROUP + offs_h
    else:
        # Q_LEN query tokens per request: q, out and the LSE are viewed as [B, Q_LEN * H_q, ...] (H_Q is
        # Q_LEN * H_q), token j of query head x at "head" j * H_q + x. Row r of the tile is token r % Q_LEN
        # of query head h * G + r // Q_LEN.
        q_head = (offs_h % Q_LEN) * (H_Q // Q_LEN) + h * GROUP + offs_h // Q_LEN
    row_head = offs_h // (GROUP * Q_LEN)
    qk = qk_scale
    if SCALE == 2:  # per-KV-head scales (fp32 [H_kv]): k's into the score scale, v's into the output
        if HEADS == 1:
            qk = qk_scale * tl.load(K_SCALE + h)
            v_sc = tl.load(V_SCALE + h)
        else:
            in_tile = row_head < HEADS
            qk = (qk_scale * tl.load(K_SCALE + h + row_head, mask=in_tile, other=1.0))[:, None]
            v_sc = tl.load(V_SCALE + h + row_head, mask=in_tile, other=1.0)[:, None]

    if NEXT:
        # Look-ahead over the tile's items (config.next_item): items it and it + 1 are carried in registers with
        # their page-table offset, item it + 2 without it; item it's q and the page ids of its first tile are
        # loaded during item it - 1. So at an item's start no load waits on another load of that item, and its
        # first K/V copies are issued at once (docs/decisions/look-ahead.md).
        has = item_lo < item_hi
        req0 = tl.load(WORK_REQ + item_lo, mask=has, other=0).to(tl.int64)
        st0 = tl.load(WORK_START + item_lo, mask=has, other=0)
        en0 = tl.load(WORK_END + item_lo, mask=has, other=0)
        sl0 = tl.load(WORK_SLOT + item_lo, mask=has, other=0)
        base0 = tl.load(KV_INDPTR + req0)
        has = item_lo + 1 < item_hi
        req1 = tl.load(WORK_REQ + item_lo + 1, mask=has, other=0).to(tl.int64)
        st1 = tl.load(WORK_START + item_lo + 1, mask=has, other=0)
        en1 = tl.load(WORK_END + item_lo + 1, mask=has, other=0)
        sl1 = tl.load(WORK_SLOT + item_lo + 1, mask=has, other=0)
        base1 = tl.load(KV_INDPTR + req1)
        has = item_lo + 2 < item_hi
        req2 = tl.load(WORK_REQ + item_lo + 2, mask=has, other=0).to(tl.int64)
        st2 = tl.load(WORK_START + item_lo + 2, mask=has, other=0)
        en2 = tl.load(WORK_END + item_lo + 2, mask=has, other=0)
        sl2 = tl.load(WORK_SLOT + item_lo + 2, mask=has, other=0)
        q_nx = tl.load(
            Q + req0 * stride_qb + q_head[:, None] * stride_qh + offs_d[None, :], mask=mask_h[:, None], other=0.0
        )
        t = st0 + offs_n
        pg_nx = tl.load(KV_INDICES + base0 + t // PAGE_SIZE, mask=t < en0, other=0)

    for it in range(item_lo, item_hi):
        if PDL_LAST:
            # the merge grid may be scheduled once every stage-1 CTA has reached its last item (or exited)
            if it == item_hi - 1:
                tl.extra.cuda.gdc_launch_dependents()
        if NEXT:
            req = req0
            start = st0
            end = en0
            slot = sl0
            page_base = base0
            q = q_nx
            page_nx = pg_nx
            # loaded now, used one or two items later (masked past the tile's last item)
            base2 = tl.load(KV_INDPTR + req2)
            has = it + 3 < item_hi
            req3 = tl.load(WORK_REQ + it + 3, mask=has, other=0).to(tl.int64)
            st3 = tl.load(WORK_START + it + 3, mask=has, other=0)
            en3 = tl.load(WORK_END + it + 3, mask=has, other=0)
            sl3 = tl.load(WORK_SLOT + it + 3, mask=has, other=0)
            q_nx = tl.load(
                Q + req1 * stride_qb + q_head[:, None] * stride_qh + offs_d[None, :], mask=mask_h[:, None], other=0.0
            )
            t = st1 + offs_n
            pg_nx = tl.load(KV_INDICES + base1 + t // PAGE_SIZE, mask=t < en1, other=0)
        else:
            req = tl.load(WORK_REQ + it).to(tl.int64)
            start = tl.load(WORK_START + it)
            end = tl.load(WORK_END + it)
            slot = tl.load(WORK_SLOT + it)
            page_base = tl.load(KV_INDPTR + req)
            q = tl.load(
                Q + req * stride_qb + q_head[:, None] * stride_qh + offs_d[None, :],
                mask=mask_h[:, None],
                other=0.0,
            )
        if KV_FP8:
            # an FP8 cache is dotted in float16: e4m3 widens to f16 with one packed conversion per two elements
            # (cvt.rn.f16x2.e4m3x2), to bf16 only through a second, scalar one per element (F2F.BF16.F16), which
            # made the bf16 kernel conversion-bound; q is converted once per work item
            # (docs/decisions/fp8-dot-dtype.md)
            q = q.to(tl.float16)
        m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
        acc = tl.zeros([BLOCK_H, HEAD_DIM], dtype=tl.float32)
        if Q_LEN == 1:
            lim = None
        else:
            # causal within the request's Q_LEN new tokens (the last Q_LEN of its kv_len L): token j sees
            # positions [0, L - Q_LEN + j], i.e. t < L - Q_LEN + 1 + j
            lim = tl.load(KV_LENS + req) - (Q_LEN - 1) + offs_h % Q_LEN

        if PREFETCH:
            # The page ids of tile i + 1 are loaded during tile i (a loop-carried value), so no K/V address
            # depends on a load of its own iteration: Triton's software pipeliner then multi-buffers K/V
            # (num_stages - 1 tiles in flight) instead of issuing each tile's loads after the previous
            # tile's math.
            if not NEXT:  # (the look-ahead loaded them during the previous item)
                t = start + offs_n
                page_nx = tl.load(KV_INDICES + page_base + t // PAGE_SIZE, mask=t < end, other=0)
            for n0 in range(start, end, BLOCK_N):
                page = page_nx.to(tl.int64)
                t = n0 + offs_n
                mask_n = t < end
                t1 = t + BLOCK_N
                page_nx = tl.load(KV_INDICES + page_base + t1 // PAGE_SIZE, mask=t1 < end, other=0)
                in_page = (t % PAGE_SIZE).to(tl.int64)
                if HEADS == 1:
                    k = tl.load(
                        K + (page * stride_kp + in_page * stride_ks + h * stride_kh)[:, None] + offs_d[None, :],
                        mask=mask_n[:, None],
                        other=0.0,
                    )
                    v = tl.load(
                        V + (page * stride_vp + in_page * stride_vs + h * stride_vh)[:, None] + offs_d[None, :],
                        mask=mask_n[:, None],
                        other=0.0,
                    )
                    m_i, l_i, acc = _online_softmax_step(
                        q, k, v, mask_n, m_i, l_i, acc, qk, DOT_PRECISION, t, lim, Q_LEN, KV_FP8
                    )
                else:
                    m_i, l_i, acc = _online_softmax_step_heads(
                        q,
                        K,
                        V,
                        page * stride_kp + in_page * stride_ks,
                        page * stride_vp + in_page * stride_vs,
                        mask_n,
                        row_head,
                        m_i,
                        l_i,
                        acc,
                        qk,
                        offs_d,
                        h,
                        stride_kh,
                        stride_vh,
                        HEADS,
                        BLOCK_H,
                        BLOCK_N,
                        DOT_PRECISION,
                        t,
                        lim,
                        Q_LEN,
                        KV_FP8,
                    )
        else:
            for n0 in range(start, end, BLOCK_N):
                t = n0 + offs_n
                mask_n = t < end
                # PAGE_SIZE is a compile-time constant: // and % by a power of two are shifts and masks
                page = tl.load(KV_INDICES + page_base + t // PAGE_SIZE, mask=mask_n, other=0).to(tl.int64)
                in_page = (t % PAGE_SIZE).to(tl.int64)
                if HEADS == 1:
                    k_off = page * stride_kp + in_page * stride_ks + h * stride_kh
                    v_off = page * stride_vp + in_page * stride_vs + h * stride_vh
                    # V is loaded with K, before the softmax math, so both loads are in flight together
                    k = tl.load(K + k_off[:, None] + offs_d[None, :], mask=mask_n[:, None], other=0.0)
                    v = tl.load(V + v_off[:, None] + offs_d[None, :], mask=mask_n[:, None], other=0.0)
                    m_i, l_i, acc = _online_softmax_step(
                        q, k, v, mask_n, m_i, l_i, acc, qk, DOT_PRECISION, t, lim, Q_LEN, KV_FP8
                    )
                else:
                    m_i, l_i, acc = _online_softmax_step_heads(
                        q,
                        K,
                        V,
                        page * stride_kp + in_page * stride_ks,
                        page * stride_vp + in_page * stride_vs,
                        mask_n,
                        row_head,
                        m_i,
                        l_i,
                        acc,
                        qk,
                        offs_d,
                        h,
                        stride_kh,
                        stride_vh,
                        HEADS,
                        BLOCK_H,
                        BLOCK_N,
                        DOT_PRECISION,
                        t,
                        lim,
                        Q_LEN,
                        KV_FP8,
                    )

        nonempty = l_i > 0.0
        l_safe = tl.where(nonempty, l_i, 1.0)
        out = acc / l_safe[:, None]
        if SCALE == 1:  # per-tensor v_scale (k_scale is folded into qk_scale by the launcher)
            out = out * v_scale
        elif SCALE == 2:
            out = out * v_sc
        lse2 = tl.where(nonempty, m_i + tl.math.log2(l_safe), float("-inf"))
        if slot < 0:
            o_ptr = O + req * stride_ob + q_head[:, None] * stride_oh + offs_d[None, :]
            tl.store(o_ptr, out.to(O.dtype.element_ty), mask=mask_h[:, None])
            if RETURN_LSE:
                tl.store(LSE + req * H_Q + q_head, lse2 * 0.6931471805599453, mask=mask_h)
        else:
            base = slot.to(tl.int64) * H_Q
            tl.store(PART_O + (base + q_head[:, None]) * HEAD_DIM + offs_d[None, :], out, mask=mask_h[:, None])
            tl.store(PART_LSE + base + q_head, lse2, mask=mask_h)
            if SIGNAL:
                # the overlapped merge (LaunchRule.merge_overlap): publish this split to the merge programs of its
                # (request, query head, head-dim chunk), which may already be running (PDL). All threads' partial stores,
                # then a CTA barrier, then a release add at GPU scope (cumulative over what the barrier ordered:
                # the semaphore pattern of CUTLASS's GenericBarrier, PTX ISA "memory consistency model").
                tl.debug_barrier()
                offs_c = tl.arange(0, MERGE_DS)
                sync_idx = (req * H_Q + q_head[:, None]) * MERGE_DS + offs_c[None, :]
                tl.atomic_add(SYNC + sync_idx, 1, mask=mask_h[:, None], sem="release", scope="gpu")
        if NEXT:
            req0, st0, en0, sl0, base0 = req1, st1, en1, sl1, base1
            req1, st1, en1, sl1, base1 = req2, st2, en2, sl2, base2
            req2, st2, en2, sl2 = req3, st3, en3, sl3


# num_tiles changes with every plan: specialized, its value classes (1, a multiple of 16, other) make up to three
# compiled variants of one configuration (a JIT compile in the middle of serving; 117 of the 417 stage-1 variants
# of an H200 campaign). It only bounds the persistent loop: the sm_90 PTX and SASS are the same without it
# (docs/decisions/lean-launcher.md)
@triton.jit(do_not_specialize=["num_tiles"])
def _decode_stage1_kernel(
    Q,
    K,
    V,
    O,
    LSE,
    PART_O,
    PART_LSE,
    KV_INDPTR,
    KV_INDICES,
    WORK_REQ,
    WORK_START,
    WORK_END,
    WORK_SLOT,
    CTA_INDPTR,
    COUNTER,
    COUNTS,
    qk_scale,
    PAGE_SIZE: tl.constexpr,
    num_tiles,
    stride_qb,
    stride_qh,
    stride_kp,
    stride_ks,
    stride_kh,
    stride_vp,
    stride_vs,
    stride_vh,
    stride_ob,
    stride_oh,
    SYNC,
    H_Q: tl.constexpr,
    H_KV: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_H: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    RETURN_LSE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    PERSISTENT: tl.constexpr,
    DEVICE_COUNTS: tl.constexpr,
    PREFETCH: tl.constexpr,
    HEADS: tl.constexpr = 1,
    NEXT: tl.constexpr = False,
    SIGNAL: tl.constexpr = False,
    MERGE_DS: tl.constexpr = 1,
    PDL: tl.constexpr = False,
    PDL_LAST: tl.constexpr = False,
    KV_LENS=None,
    K_SCALE=None,
    V_SCALE=None,
    v_scale=None,
    Q_LEN: tl.constexpr = 1,
    KV_FP8: tl.constexpr = 0,
    SCALE: tl.constexpr = 0,
):
    if PDL:
        # programmatic dependent launch: the merge grid may start once every stage-1 CTA has started (so a
        # spinning merge program never holds an SM that a stage-1 CTA still waits for); it waits on SYNC.
        # PDL_LAST: the trigger is at the start of each tile's last item instead.
        tl.extra.cuda.gdc_launch_dependents()
    if DEVICE_COUNTS:  # a device-resident plan (kernels/device_plan.py): its tile count is COUNTS[2]
        num_tiles = tl.load(COUNTS + 2)
    if PERSISTENT:
        tile = tl.atomic_add(COUNTER, 1)
        while tile < num_tiles:
            _stage1_tile(
                tile,
                Q,
                K,
                V,
                O,
                LSE,
                PART_O,
                PART_LSE,
                KV_INDPTR,
                KV_INDICES,
                WORK_REQ,
                WORK_START,
                WORK_END,
                WORK_SLOT,
                CTA_INDPTR,
                qk_scale,
                PAGE_SIZE,
                stride_qb,
                stride_qh,
                stride_kp,
                stride_ks,
                stride_kh,
                stride_vp,
                stride_vs,
                stride_vh,
                stride_ob,
                stride_oh,
                H_Q,
                H_KV,
                GROUP,
                BLOCK_H,
                HEAD_DIM,
                BLOCK_N,
                RETURN_LSE,
                DOT_PRECISION,
                PREFETCH,
                HEADS,
                NEXT,
                SYNC,
                SIGNAL,
                MERGE_DS,
                PDL_LAST,
                KV_LENS,
                K_SCALE,
                V_SCALE,
                v_scale,
                Q_LEN,
                KV_FP8,
                SCALE,
            )
            tile = tl.atomic_add(COUNTER, 1)
    else:
        _stage1_tile(
            tl.program_id(0),
            Q,
            K,
            V,
            O,
            LSE,
            PART_O,
            PART_LSE,
            KV_INDPTR,
            KV_INDICES,
            WORK_REQ,
            WORK_START,
            WORK_END,
            WORK_SLOT,
            CTA_INDPTR,
            qk_scale,
            PAGE_SIZE,
            stride_qb,
            stride_qh,
            stride_kp,
            stride_ks,
            stride_kh,
            stride_vp,
            stride_vs,
            stride_vh,
            stride_ob,
            stride_oh,
            H_Q,
            H_KV,
            GROUP,
            BLOCK_H,
            HEAD_DIM,
            BLOCK_N,
            RETURN_LSE,
            DOT_PRECISION,
            PREFETCH,
            HEADS,
            NEXT,
            SYNC,
            SIGNAL,
            MERGE_DS,
            PDL_LAST,
            KV_LENS,
            K_SCALE,
            V_SCALE,
            v_scale,
            Q_LEN,
            KV_FP8,
            SCALE,
        )


@triton.jit
def _decode_merge_kernel(
    PART_O,
    PART_LSE,
    O,
    LSE,
    MERGE_REQ,
    MERGE_SLOT,
    MERGE_NUM,
    COUNTS,
    stride_ob,
    stride_oh,
    SYNC,
    H_Q: tl.constexpr,
    BLOCK_S: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    RETURN_LSE: tl.constexpr,
    DEVICE_COUNTS: tl.constexpr,
    WAIT: tl.constexpr = False,
    POLL_NS: tl.constexpr = 0,
    POLL_RELAXED: tl.constexpr = False,
):
    # One program per (merged request, query head, BLOCK_D chunk of the head dim): the partials of up to BLOCK_S
    # splits are loaded at once (independent loads in flight), chunks of BLOCK_S
    # are folded with a running max.
    mid = tl.program_id(0)
    hq = tl.program_id(1)
    d0 = tl.program_id(2) * BLOCK_D  # the head dimension is cut into HEAD_DIM // BLOCK_D chunks
    active = mid >= 0
    if DEVICE_COUNTS:  # grid sized by max_batch; programs past COUNTS[3] merged requests do nothing
        active = mid < tl.load(COUNTS + 3)
    req = tl.load(MERGE_REQ + mid, mask=active, other=0).to(tl.int64)
    slot0 = tl.load(MERGE_SLOT + mid, mask=active, other=0).to(tl.int64)
    n = tl.load(MERGE_NUM + mid, mask=active, other=0)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = d0 + tl.arange(0, BLOCK_D)
    if WAIT:
        # the overlapped merge (LaunchRule.merge_overlap): this grid may run beside stage 1 (PDL). Wait until the n
        # splits of (request, query head) have published their partials (one release add each on its counter);
        # then reset the counter for the next call: this program is its only reader.
        sync_ptr = SYNC + (req * H_Q + hq) * tl.num_programs(2) + tl.program_id(2)
        seen = tl.atomic_add(sync_ptr, 0, mask=active, sem="acquire", scope="gpu")
        seen = tl.where(active, seen, n)
        if seen < n:
            while seen < n:
                if POLL_NS > 0:  # back off between polls (PTX nanosleep; CUDA only), sparing L2 and issue slots
                    seen = tl.inline_asm_elementwise(
                        f"nanosleep.u32 {POLL_NS}; mov.b32 $0, $1;",
                        "=r,r",
                        [seen],
                        dtype=tl.int32,
                        is_pure=False,
                        pack=1,
                    )
                if POLL_RELAXED:  # volatile polls (L2), then one acquire read once the count is there
                    seen = tl.load(sync_ptr, volatile=True)
                else:
                    seen = tl.atomic_add(sync_ptr, 0, sem="acquire", scope="gpu")
            if POLL_RELAXED:
                seen = tl.atomic_add(sync_ptr, 0, sem="acquire", scope="gpu")
                # (used, so that the acquire read is not dropped: Triton turns an add of 0 into a load)
                n = tl.minimum(n, seen)
        tl.store(sync_ptr, 0, mask=active)

    m_run = float("-inf")
    l_run = 0.0
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for s0 in range(0, n, BLOCK_S):
        mask_s = (s0 + offs_s) < n
        row = (slot0 + s0 + offs_s) * H_Q + hq
        if WAIT:  # past L1 (written by other SMs during this grid)
            lse = tl.load(PART_LSE + row, mask=mask_s, other=float("-inf"), cache_modifier=".cg")
            o = tl.load(
                PART_O + row[:, None] * HEAD_DIM + offs_d[None, :],
                mask=mask_s[:, None],
                other=0.0,
                cache_modifier=".cg",
            )
        else:
            lse = tl.load(PART_LSE + row, mask=mask_s, other=float("-inf"))
            o = tl.load(PART_O + row[:, None] * HEAD_DIM + offs_d[None, :], mask=mask_s[:, None], other=0.0)
        m_new = tl.maximum(m_run, tl.max(lse, axis=0))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.math.exp2(m_run - m_safe)
        w = tl.math.exp2(lse - m_safe)
        acc = acc * alpha + tl.sum(w[:, None] * o, axis=0)
        l_run = l_run * alpha + tl.sum(w, axis=0)
        m_run = m_new
    nonempty = l_run > 0.0
    l_safe = tl.where(nonempty, l_run, 1.0)
    out = acc / l_safe
    tl.store(O + req * stride_ob + hq * stride_oh + offs_d, out.to(O.dtype.element_ty), mask=active)
    if RETURN_LSE:
        lse_out = tl.where(nonempty, (m_run + tl.math.log2(l_safe)) * 0.6931471805599453, float("-inf"))
        tl.store(LSE + req * H_Q + hq, lse_out, mask=active & (d0 == 0))


try:  # Triton's interpreter (TRITON_INTERPRET=1, read when the kernels above were decorated)
    from triton.runtime.interpreter import InterpretedFunction as _Interpreted

    _INTERPRETED = isinstance(_decode_stage1_kernel, _Interpreted)
except ImportError:  # pragma: no cover - other Triton versions
    import os as _os

    _INTERPRETED = _os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def check_kernel_device(name: str, device: torch.device) -> None:
    """Raise ``ValueError`` naming ``name`` when the Triton kernel cannot run on ``device``: CPU tensors
    need Triton's interpreter (``TRITON_INTERPRET=1`` in the environment before kvsplit is imported);
    without it Triton fails later with "0 active drivers"."""
    if device.type == "cpu" and not _INTERPRETED:
        raise ValueError(
            f"{name}: tensors on the CPU run the Triton kernel only under Triton's interpreter: set "
            "TRITON_INTERPRET=1 in the environment before importing kvsplit, or use a CUDA device"
        )


def check_kv_scales(k_scale: Any, v_scale: Any, num_kv_heads: int, device: torch.device) -> tuple[int, float, float]:
    """Check the KV-cache scales as FlashInfer's ``run(..., k_scale=, v_scale=)`` takes them and say how the
    launch applies them: ``(mode, qk_mult, v_mult)``.

    Each of ``k_scale``, ``v_scale`` is ``None`` (1.0), a finite float > 0 (per tensor), or a float32 tensor
    ``[H_kv]`` on ``device`` (per KV head; both must then be tensors, read on the device, so a CUDA graph
    replays with their current values; their values are checked by :func:`check_kv_scale_values`). Dequantized
    ``k = k_scale * k_stored``, ``v = v_scale * v_stored``, so ``scores = (q . k_stored) * k_scale * sm_scale`` and
    ``o = (softmax(scores) . v_stored) * v_scale``. Mode 0: no scaling; 1: per tensor (``qk_mult`` is folded into
    the score scale, ``v_mult`` multiplies the output); 2: per-KV-head tensors.

    Raises
    ------
    ValueError
        Naming ``k_scale`` or ``v_scale``: not a float or tensor, not finite or not > 0, a tensor of another
        dtype, shape or device, a tensor beside a float.
    """
    tensors = [isinstance(x, torch.Tensor) for x in (k_scale, v_scale)]
    if any(tensors):
        for name, x in (("k_scale", k_scale), ("v_scale", v_scale)):
            if not isinstance(x, torch.Tensor):
                raise ValueError(
                    f"{name}: expected a float32 tensor [{num_kv_heads}] like the other scale (per KV head), got "
                    f"{type(x).__name__}"
                )
            if x.dtype != torch.float32 or tuple(x.shape) != (num_kv_heads,) or x.device != device:
                raise ValueError(
                    f"{name}: expected a float32 tensor of shape ({num_kv_heads},) (one scale per KV head) on "
                    f"{device}, got {x.dtype} {tuple(x.shape)} on {x.device}"
                )
            if not x.is_contiguous():
                raise ValueError(f"{name}: expected a contiguous tensor")
        return 2, 1.0, 1.0
    vals = []
    for name, x in (("k_scale", k_scale), ("v_scale", v_scale)):
        if x is None:
            vals.append(1.0)
            continue
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            raise ValueError(f"{name}: expected a float or a float32 tensor [H_kv], got {type(x).__name__}")
        if not math.isfinite(x) or x <= 0:
            raise ValueError(f"{name}: expected a finite scale > 0, got {x!r}")
        vals.append(float(x))
    return (0 if vals[1] == 1.0 else 1), vals[0], vals[1]


def check_kv_scale_values(k_scale: Any, v_scale: Any) -> None:
    """Raise ``ValueError`` naming ``k_scale``/``v_scale`` when a per-KV-head scale tensor holds a value that
    is not finite or not > 0 (reads the tensors: a host sync; floats are checked by :func:`check_kv_scales`)."""
    for name, x in (("k_scale", k_scale), ("v_scale", v_scale)):
        if isinstance(x, torch.Tensor):
            bad = ~(torch.isfinite(x) & (x > 0))
            if bool(bad.any()):
                i = int(torch.nonzero(bad)[0, 0])
                raise ValueError(f"{name}[{i}]: expected a finite scale > 0, got {float(x[i])}")


def check_heads_per_tile(
    heads_per_tile: int,
    num_qo_heads: int,
    num_kv_heads: int,
    *,
    name: str = "plan.config.heads_per_tile",
    q_len: int = 1,
) -> None:
    """Raise ``ValueError`` unless the launch takes a work tile of ``heads_per_tile`` KV heads at ``q_len`` query
    tokens per request (:func:`kvsplit.kernels.limits.tile_problem`, the one rule: ``heads_per_tile * G * q_len``
    query rows at most :data:`~kvsplit.kernels.limits.MAX_TILE_ROWS`, ``heads_per_tile`` a divisor of H_kv, and
    ``heads_per_tile * G <= 16`` when it packs several heads). The message names ``q_len`` for too many rows, else
    ``name`` (the argument that holds ``heads_per_tile``)."""
    problem = tile_problem(heads_per_tile, num_qo_heads, num_kv_heads, q_len)
    if problem is not None:
        arg, why = problem
        raise ValueError(f"{'q_len' if arg == 'q_len' else name}: {why}")


def check_interpreter_dtype(name: str, dtype: torch.dtype) -> None:
    """Raise ``ValueError`` naming ``name`` for bfloat16 under Triton's interpreter: Triton 3.6's
    interpreter computes ``tl.dot`` on bfloat16 wrongly (NumPy has no bfloat16; the output is off by
    orders of magnitude, silently), so CPU runs take float16 or float32 and bfloat16 runs on a GPU."""
    if _INTERPRETED and dtype == torch.bfloat16:
        raise ValueError(
            f"{name}: bfloat16 under Triton's interpreter (TRITON_INTERPRET=1) gives wrong results "
            "(Triton 3.6 computes tl.dot on bfloat16 incorrectly there); use float16 or float32 on "
            "the CPU, bfloat16 on a CUDA device"
        )


# ----------------------------------------------------------------------------
# Workspace
# ----------------------------------------------------------------------------


@dataclass
class DecodeWorkspace:
    """Preallocated device buffers of :func:`decode_attention`.

    Attributes
    ----------
    part_o : torch.Tensor, fp32 ``[max_partials, H_q, D]``
        Partial outputs of split work items (normalized).
    part_lse : torch.Tensor, fp32 ``[max_partials, H_q]``
        Their LSE, base 2.
    lse : torch.Tensor, fp32 ``[max_batch, H_q]``
        LSE output buffer (natural log) used when ``return_lse=True``.
    counter : torch.Tensor, int32 ``[1]``
        Work counter of the persistent schedule (reset by every call).
    sync : torch.Tensor, int32 ``[max_batch * H_q * MERGE_SYNC_CHUNKS]`` or None
        Arrival counters of the overlapped merge (:attr:`LaunchRule.merge_overlap`), one per (request,
        query head, head-dim chunk of the merge); zero between calls (each merge program resets its own).
        ``None`` (or too few): the merge runs after stage 1.
    """

    part_o: torch.Tensor
    part_lse: torch.Tensor
    lse: torch.Tensor
    counter: torch.Tensor
    sync: torch.Tensor | None = None

    @property
    def max_partials(self) -> int:
        """Capacity in partial outputs (``part_o.shape[0]``): the most split work items a plan run on this
        workspace may have."""
        return int(self.part_o.shape[0])

    @property
    def max_batch(self) -> int:
        """Capacity in requests (``lse.shape[0]``; with q_len > 1 each row holds the request's ``q_len * H_q``
        query rows): the largest batch a plan run on this workspace may have."""
        return int(self.lse.shape[0])


def make_workspace(
    num_qo_heads: int,
    head_dim: int,
    *,
    max_partials: int,
    max_batch: int,
    device: Any,
    q_len: int = 1,
) -> DecodeWorkspace:
    """Allocate a :class:`DecodeWorkspace` for plans with at most ``max_partials``
    partial slots (``plan.num_partials``) and ``max_batch`` requests of ``q_len`` query tokens each (its
    per-request rows are ``q_len * num_qo_heads``: ``part_o`` ``[max_partials, q_len * H_q, D]``, ``lse``
    ``[max_batch, q_len * H_q]``)."""
    num_qo_heads *= check_q_len(q_len)
    dev = torch.device(device)
    return DecodeWorkspace(
        part_o=torch.empty((max(max_partials, 1), num_qo_heads, head_dim), dtype=torch.float32, device=dev),
        part_lse=torch.empty((max(max_partials, 1), num_qo_heads), dtype=torch.float32, device=dev),
        lse=torch.empty((max(max_batch, 1), num_qo_heads), dtype=torch.float32, device=dev),
        counter=torch.zeros((1,), dtype=torch.int32, device=dev),
        sync=torch.zeros((max(max_batch, 1) * num_qo_heads * MERGE_SYNC_CHUNKS,), dtype=torch.int32, device=dev),
    )


# ----------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------


def check_cache_dtype(name: str, kv_dtype: torch.dtype, q_dtype: torch.dtype) -> None:
    """Raise ``ValueError`` naming ``name`` unless a KV cache of ``kv_dtype`` can be read with a q of ``q_dtype``:
    q's own dtype, or ``torch.float8_e4m3fn`` with a float16 / bfloat16 q."""
    if kv_dtype == q_dtype:
        return
    if kv_dtype == KV_FP8:
        if q_dtype not in (torch.float16, torch.bfloat16):
            raise ValueError(f"{name}: a float8_e4m3fn KV cache needs a float16 or bfloat16 q, got q of {q_dtype}")
        return
    raise ValueError(f"{name}: expected dtype {q_dtype} (q's) or torch.float8_e4m3fn, got {kv_dtype}")


FP16_MAX = 65504.0
"""The largest finite float16: an FP8 cache's dots run in float16 (q converted in the kernel)."""


def check_fp8_q_range(q: torch.Tensor, kv_dtype: torch.dtype) -> None:
    """Raise ``ValueError`` naming ``q`` when a bfloat16 q read against a ``float8_e4m3fn`` cache holds a finite
    value beyond float16's range (:data:`FP16_MAX`), which the kernel's float16 dots would turn into inf. A host
    sync (the reduction's result is read); NaN and inf pass, as they do with 16-bit K/V."""
    if kv_dtype != KV_FP8 or q.dtype != torch.bfloat16 or not q.numel():
        return
    amax = float(q.abs().amax())
    if FP16_MAX < amax < float("inf"):
        raise ValueError(
            f"q: holds |q| = {amax:g}, beyond float16's range ({FP16_MAX:g}); with a float8_e4m3fn KV cache the "
            "kernel dots q and K/V in float16 (keep q within it, or the cache in q's dtype)"
        )


def _check_inputs(
    q,
    k_cache,
    v_cache,
    kv_indptr,
    kv_indices,
    kv_lens,
    plan,
    out,
    workspace,
    return_lse,
    validate,
    q_len=1,
    k_scale=None,
    v_scale=None,
):
    q = check_tensor("q", q, ndim=3)
    dev = q.device
    check_kernel_device("q", dev)
    if q.dtype not in TORCH_DTYPES:
        raise ValueError(f"q: expected dtype float16, bfloat16 or float32, got {q.dtype}")
    check_interpreter_dtype("q", q.dtype)
    q_len = check_q_len(q_len)
    k_cache = check_tensor("k_cache", k_cache, ndim=4, device=dev)
    v_cache = check_tensor("v_cache", v_cache, ndim=4, device=dev)
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        check_cache_dtype(name, t.dtype, q.dtype)
        if t.stride(-1) != 1:
            raise ValueError(f"{name}: the last (head_dim) dimension must be contiguous")
    if v_cache.dtype != k_cache.dtype:
        raise ValueError(f"v_cache: expected dtype {k_cache.dtype} (k_cache's), got {v_cache.dtype}")
    if tuple(k_cache.shape) != tuple(v_cache.shape):
        raise ValueError(f"v_cache: expected shape {tuple(k_cache.shape)} (k_cache's), got {tuple(v_cache.shape)}")
    rows, H_q, D = q.shape
    if rows % q_len:
        raise ValueError(f"q: expected [B * q_len, H_q, D] with q_len={q_len}, got {rows} rows")
    B = rows // q_len
    if q_len > 1 and rows > 1 and q.stride(0) != H_q * q.stride(1):
        raise ValueError("q: with q_len > 1 the first two dimensions must be contiguous ([B * q_len, H_q, D] rows)")
    num_pages, page_size, H_kv, Dk = k_cache.shape
    if Dk != D:
        raise ValueError(f"k_cache: expected head_dim {D} (q's), got {Dk}")
    if D not in (64, 128, 256):
        raise ValueError(f"q: expected head_dim 64, 128 or 256, got {D}")
    if H_kv < 1 or H_q % H_kv != 0:
        raise ValueError(f"q: H_q={H_q} must be a multiple of the cache's H_kv={H_kv}")
    if H_q // H_kv > 64:
        raise ValueError(f"q: GQA group H_q/H_kv={H_q // H_kv} above the supported 64")
    if q.stride(-1) != 1:
        raise ValueError("q: the last (head_dim) dimension must be contiguous")
    check_kv_scales(k_scale, v_scale, H_kv, dev)
    for name, t, n in (("kv_indptr", kv_indptr, B + 1), ("kv_lens", kv_lens, B)):
        check_tensor(name, t, ndim=1, device=dev)
        if t.dtype != torch.int32:
            raise ValueError(f"{name}: expected dtype torch.int32, got {t.dtype}")
        if t.shape[0] != n:
            raise ValueError(f"{name}: expected shape ({n},), got {tuple(t.shape)}")
    check_tensor("kv_indices", kv_indices, ndim=1, device=dev)
    if kv_indices.dtype != torch.int32:
        raise ValueError(f"kv_indices: expected dtype torch.int32, got {kv_indices.dtype}")
    if not kv_indptr.is_contiguous() or not kv_indices.is_contiguous() or not kv_lens.is_contiguous():
        raise ValueError("kv_indptr/kv_indices/kv_lens: expected contiguous tensors")
    if not isinstance(plan, Plan):
        raise TypeError(f"plan: expected a kvsplit.kernels.plan.Plan, got {type(plan).__name__}")
    if plan.batch_size != B:
        raise ValueError(f"plan: made for B={plan.batch_size} requests, got q with B={B}")
    for what, got, want in (
        ("num_kv_heads", H_kv, plan.num_kv_heads),
        ("head_dim", D, plan.head_dim),
        ("page_size", page_size, plan.page_size),
    ):
        if got != want:
            raise ValueError(f"plan: made for {what}={want}, got {what}={got}")
    if TORCH_DTYPES[q.dtype] != plan.dtype:
        raise ValueError(f"plan: made for dtype {plan.dtype}, got q of dtype {TORCH_DTYPES[q.dtype]}")
    if out is not None:
        check_tensor("out", out, ndim=3, device=dev)
        if tuple(out.shape) != (rows, H_q, D) or out.dtype != q.dtype:
            raise ValueError(
                f"out: expected shape {(rows, H_q, D)} dtype {q.dtype}, got {tuple(out.shape)} {out.dtype}"
            )
        if out.stride(-1) != 1:
            raise ValueError("out: the last dimension must be contiguous")
        if q_len > 1 and rows > 1 and out.stride(0) != H_q * out.stride(1):
            raise ValueError("out: with q_len > 1 the first two dimensions must be contiguous")
    if workspace is not None:
        if not isinstance(workspace, DecodeWorkspace):
            raise TypeError(f"workspace: expected a DecodeWorkspace, got {type(workspace).__name__}")
        # the kernels index these buffers as dense arrays: check every one (a caller may build its own)
        for name, t, dtype, tail in (
            ("part_o", workspace.part_o, torch.float32, (H_q * q_len, D)),
            ("part_lse", workspace.part_lse, torch.float32, (H_q * q_len,)),
            ("lse", workspace.lse, torch.float32, (H_q * q_len,)),
            ("counter", workspace.counter, torch.int32, ()),
        ):
            if not isinstance(t, torch.Tensor) or t.device != dev or t.dtype != dtype or not t.is_contiguous():
                raise ValueError(f"workspace.{name}: expected a contiguous {dtype} tensor on {dev}")
            if tuple(t.shape[1:]) != tail or (name == "counter" and tuple(t.shape) != (1,)):
                want = "(1,)" if name == "counter" else f"(n, {', '.join(map(str, tail))})"
                made = f" (make_workspace(..., q_len={q_len}))" if q_len > 1 else ""
                raise ValueError(f"workspace.{name}: expected shape {want}{made}, got {tuple(t.shape)}")
        if workspace.part_lse.shape[0] != workspace.part_o.shape[0]:
            raise ValueError("workspace.part_lse: expected as many rows as workspace.part_o")
        if workspace.max_partials < plan.num_partials:
            raise ValueError(f"workspace: holds {workspace.max_partials} partials, plan needs {plan.num_partials}")
        if return_lse and workspace.max_batch < B:
            raise ValueError(f"workspace: lse buffer holds {workspace.max_batch} requests, got B={B}")
    if validate:
        # checks that read device data (a host sync)
        indptr = kv_indptr.to("cpu", torch.int64)
        lens = kv_lens.to("cpu", torch.int64)
        if int(indptr[0]) != 0:
            raise ValueError(f"kv_indptr: expected kv_indptr[0] == 0, got {int(indptr[0])}")
        d = indptr[1:] - indptr[:-1]
        if bool((d < 0).any()):
            i = int(torch.nonzero(d < 0)[0, 0])
            raise ValueError(
                f"kv_indptr: must be non-decreasing, kv_indptr[{i + 1}]={int(indptr[i + 1])} < "
                f"kv_indptr[{i}]={int(indptr[i])}"
            )
        if int(indptr[-1]) > kv_indices.shape[0]:
            raise ValueError(f"kv_indptr: last entry {int(indptr[-1])} exceeds len(kv_indices)={kv_indices.shape[0]}")
        if kv_indices.numel():
            used = kv_indices[: int(indptr[-1])]
            if used.numel():
                lo, hi = int(used.min()), int(used.max())
                if lo < 0 or hi >= num_pages:
                    raise ValueError(f"kv_indices: page ids must be in [0, {num_pages}), got range [{lo}, {hi}]")
        if bool((lens < 0).any()):
            raise ValueError("kv_lens: negative kv_len")
        check_covers_q_len(lens.numpy(), q_len)
        check_kv_scale_values(k_scale, v_scale)
        check_fp8_q_range(q, k_cache.dtype)
        cap = d * page_size
        over = lens > cap
        if bool(over.any()):
            i = int(torch.nonzero(over)[0, 0])
            raise ValueError(
                f"kv_lens[{i}]: {int(lens[i])} tokens exceed its {int(d[i])} pages x page_size {page_size}"
            )
        plan_lens = torch.tensor(plan.kv_lens, dtype=torch.int64)
        if not torch.equal(lens, plan_lens):
            i = int(torch.nonzero(lens != plan_lens)[0, 0])
            raise ValueError(f"plan: made for kv_lens[{i}]={int(plan.kv_lens[i])}, got kv_lens[{i}]={int(lens[i])}")
    return B, H_q, D, H_kv, page_size


# ----------------------------------------------------------------------------
# Launcher
# ----------------------------------------------------------------------------


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    kv_lens: torch.Tensor,
    plan: Plan,
    *,
    sm_scale: float | None = None,
    return_lse: bool = False,
    out: torch.Tensor | None = None,
    workspace: DecodeWorkspace | None = None,
    validate: bool = True,
    q_len: int = 1,
    k_scale: float | torch.Tensor | None = None,
    v_scale: float | torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """GQA decode attention (q_len 1 to 8 query tokens per request) over a paged NHD KV cache, launched from a plan.

    Parameters
    ----------
    q : torch.Tensor ``[B * q_len, H_q, D]``
        Queries, float16 / bfloat16 (float32 for CPU tests); request b's q_len tokens are rows
        ``b * q_len .. b * q_len + q_len - 1`` (FlashInfer's ragged layout with ``qo_indptr = arange(B + 1) *
        q_len``), the first two dimensions contiguous when ``q_len > 1``.
    k_cache, v_cache : torch.Tensor ``[num_pages, page_size, H_kv, D]``
        Paged KV cache, q's dtype or ``torch.float8_e4m3fn`` (q float16 / bfloat16: read as fp8 bytes, no
        dequantized copy, and dotted in float16, so a bfloat16 q must lie within float16's range, ``|q| <= 65504``;
        ``validate`` checks it); H_q must be a multiple of H_kv.
    kv_indptr : torch.Tensor int32 ``[B + 1]``
        Offsets of each request's page list in ``kv_indices``.
    kv_indices : torch.Tensor int32 ``[kv_indptr[-1]]``
        Page ids, in order, of every request.
    kv_lens : torch.Tensor int32 ``[B]``
        Tokens of each request (uses its first ``ceil(kv_len / page_size)`` pages), counting its q_len new
        tokens (already written to the cache): token j of request b sees the KV positions
        ``[0, kv_lens[b] - q_len + j]`` (causal within the new tokens). ``kv_lens >= q_len``.
    plan : Plan
        Made for exactly these kv_lens, H_kv, D, page_size and dtype. Its arrays
        are uploaded on first use and cached on the plan (``plan.to(device)``).
    sm_scale : float, optional
        Softmax scale, default ``1 / sqrt(D)``.
    return_lse : bool
        Also return the LSE (fp32 ``[B * q_len, H_q]``, natural log of the scaled scores' sum of exponentials;
        -inf for kv_len = 0). With a workspace, the LSE is a view of ``workspace.lse``.
    out : torch.Tensor ``[B * q_len, H_q, D]``, optional
        Output buffer (q's dtype).
    workspace : DecodeWorkspace, optional
        Preallocated buffers (:func:`make_workspace` with this ``q_len``); with ``out`` and ``workspace`` given
        (and the plan uploaded), a call allocates nothing and copies nothing between host and
        device, so it can be captured in a CUDA graph.
    validate : bool
        Run the checks that read device data (a host sync); ``False`` for the
        serving hot path (shape, dtype and plan-shape checks still run).
    q_len : int
        Query tokens per request, 1 to :data:`~kvsplit.kernels.limits.MAX_Q_LEN` (speculative-decoding verify steps), the same for
        every request. The plan (its KV ranges) does not depend on it.
    k_scale, v_scale : float or torch.Tensor, optional
        Dequantization scales of the cache, as FlashInfer's ``run`` takes them: a float (per tensor) or
        float32 tensors ``[H_kv]`` (per KV head, both): ``scores = (q . k) * k_scale * sm_scale``,
        ``o = (p . v) * v_scale`` (:func:`check_kv_scales`). Default 1.

    Returns
    -------
    torch.Tensor or (torch.Tensor, torch.Tensor)
        ``o`` ``[B * q_len, H_q, D]``, and ``lse`` ``[B * q_len, H_q]`` if ``return_lse``.

    Raises
    ------
    TypeError, ValueError
        On bad inputs, naming the argument, before any launch.
    """
    B, H_q, D, H_kv, page_size = _check_inputs(
        q,
        k_cache,
        v_cache,
        kv_indptr,
        kv_indices,
        kv_lens,
        plan,
        out,
        workspace,
        return_lse,
        validate,
        q_len,
        k_scale,
        v_scale,
    )
    dev = q.device
    if out is None:
        out = torch.empty(tuple(q.shape), dtype=q.dtype, device=dev)
    if workspace is None:
        workspace = make_workspace(H_q, D, max_partials=plan.num_partials, max_batch=B, device=dev, q_len=q_len)
    return launch_decode(
        q,
        k_cache,
        v_cache,
        kv_indptr,
        kv_indices,
        plan.to(dev),
        plan.config,
        out=out,
        workspace=workspace,
        **plan.launch_sizes(),
        sm_scale=sm_scale,
        return_lse=return_lse,
        q_len=q_len,
        kv_lens=kv_lens,
        k_scale=k_scale,
        v_scale=v_scale,
    )


@functools.lru_cache(maxsize=64)
def _pdl_available(device: torch.device) -> bool:
    """Whether a launch on ``device`` can use programmatic dependent launch (compiled CUDA, sm_90+); cached per
    device (``torch.cuda.get_device_capability`` costs microseconds, and every launch asks)."""
    return not _INTERPRETED and device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


@functools.lru_cache(maxsize=64)
def _fp8_widen_mode(device: torch.device) -> int:
    """``KV_FP8`` of a launch over an FP8 cache on ``device`` (:func:`_widen_fp8`): 2, V widened by inline PTX
    (``cvt.rn.f16x2.e4m3x2``, PTX ISA 7.8, compute capability 8.9+), on a compiled CUDA launch that has it; else 1,
    Triton's conversion (the interpreter). Cached per device, as :func:`_pdl_available`."""
    if _INTERPRETED or device.type != "cuda":
        return 1
    return 2 if torch.cuda.get_device_capability(device) >= (8, 9) else 1


@dataclass(frozen=True)
class LaunchRule:
    """The launch parameters :func:`launch_decode` runs a plan with, as :func:`launch_rule` picks them.

    Attributes
    ----------
    maxnreg : int or None
        Register cap of the stage-1 launch (Triton's ``maxnreg``); None: no cap.
    merge_dsplit : int
        Merge programs per (merged request, query head), each over ``head_dim / merge_dsplit`` of the head dim.
    merge_warps : int
        Warps of each merge program.
    merge_overlap : bool
        The overlapped merge: each split work item, after storing its partial, adds one (a release at GPU
        scope) to the counter of every (request, query head, head-dim chunk) it feeds (``workspace.sync``);
        each merge program waits for its count (volatile polls, then one acquire read), merges, and resets the
        counter to zero for the next call (so CUDA-graph replays stay correct).
    pdl : bool
        The merge grid is launched with programmatic dependent launch (sm_90+), beside stage 1; polls back off
        :data:`MERGE_POLL_NS` between reads.
    pdl_last : bool
        Stage 1 triggers the merge grid at the start of each tile's last work item (grid schedule); else (the
        persistent schedule, whose CTAs do not know their last tile) at each CTA's start.
    """

    maxnreg: int | None
    merge_dsplit: int
    merge_warps: int
    merge_overlap: bool
    pdl: bool
    pdl_last: bool

    @property
    def poll_ns(self) -> int:
        """The merge's back-off between polls of its counter (ns; 0: none, the merge runs after stage 1)."""
        return MERGE_POLL_NS if self.pdl else 0


class _CompileOnly:
    """Stands for a Triton kernel: ``kernel[grid](*args, **kw)`` compiles (``JITFunction.warmup``), launches nothing."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel

    def __getitem__(self, grid: Any):
        return functools.partial(self.kernel.warmup, grid=grid)


@contextlib.contextmanager
def compile_only(pdl: bool) -> Iterator[None]:
    """Within the block, :func:`launch_decode` compiles its kernels (Triton's ``JITFunction.warmup``: the
    specialization and on-disk cache key of a real launch on the same dtypes, strides and alignment) without
    launching them, and decides programmatic dependent launch as on a device where ``pdl`` is available (its
    tensors may be on the CPU). For the tuner's compile-ahead helpers (:mod:`kvsplit.tuner.precompile`). Not
    thread-safe: for a process of its own."""
    global _decode_stage1_kernel, _decode_merge_kernel, _pdl_available
    saved = (_decode_stage1_kernel, _decode_merge_kernel, _pdl_available)
    _decode_stage1_kernel = _CompileOnly(saved[0])
    _decode_merge_kernel = _CompileOnly(saved[1])
    _pdl_available = lambda device: pdl  # noqa: E731
    try:
        yield
    finally:
        _decode_stage1_kernel, _decode_merge_kernel, _pdl_available = saved


def launch_rule(
    config: Any,
    *,
    num_qo_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype_bytes: int,
    num_merge: int | None,
    max_splits: int | None,
    merges: bool,
    device_resident: bool,
    pdl_available: bool,
    sync_ok: bool,
    compiled: bool,
    q_len: int = 1,
) -> LaunchRule:
    """The launch parameters of a plan: a pure function of the plan's shape and sizes and of the machine, the
    rule measured on the H200 (docs/decisions/overlapped-merge.md, docs/decisions/register-cap-residency.md).

    Parameters
    ----------
    config : KernelConfig
        The plan's kernel config (``block_n``, ``num_warps``, ``num_stages``, ``prefetch``, ``heads_per_tile``,
        ``schedule``).
    num_qo_heads, num_kv_heads, head_dim : int
        H_q, H_kv, D.
    dtype_bytes : int
        Bytes per K/V element (2 for fp16/bf16).
    num_merge, max_splits : int or None
        Host-known sizes of the plan (merged requests; most splits of a request); None for a device-resident plan.
    merges : bool
        Whether the call launches a merge grid (some request is split, or a device-resident plan).
    device_resident : bool
        The plan's sizes live on the device (``launch_decode(counts=...)``, DecodeWrapper's CUDA-graph path).
    pdl_available : bool
        Programmatic dependent launch is available (a compiled CUDA launch on compute capability 9.0+).
    sync_ok : bool
        The workspace holds the overlapped merge's counters for this batch.
    compiled : bool
        The kernel is compiled (not Triton's interpreter): register caps apply.
    q_len : int
        Query tokens per request (``num_qo_heads`` then counts the rows ``q_len * H_q`` of the merge).

    Returns
    -------
    LaunchRule
        - ``maxnreg``: :func:`kvsplit.kernels.residency.register_cap` (the cap that keeps the residency the
          planner counts for every GQA group; measured on one KV head and one query token per tile, so none with
          ``heads_per_tile`` or ``q_len`` above 1 or under the interpreter).
        - ``merge_dsplit``: 4 when the host knows the sizes, at most 1024 (merged request, query head) pairs are
          merged, ``max_splits`` exceeds the splits one full-D program folds at once (``4096 / D``) and D is a
          multiple of 64; else 1. The merge is latency-bound when few programs each fold many splits: a quarter
          of D per program gives 4x the programs with a quarter of the serial chunks; with more than 1024 pairs
          it lost 1-2 %.
        - ``merge_warps``: 1 from 256 merged (request, query head) pairs on, or for a device-resident plan (the
          merge then cost a median 3.8 us over stage 1 instead of 4.5); else 4.
        - ``merge_overlap``: on in the same regime as the one-warp merge where PDL is available, the workspace
          holds the counters and ``merge_dsplit <= MERGE_SYNC_CHUNKS`` (0.5-1 % faster on held-out trace
          batches; with fewer pairs it lost up to 2.7 %; a device-resident plan ran at 0.935x the merge after
          stage 1); ``pdl`` with it, ``pdl_last`` with it on the grid schedule.
    """
    D, H_q = head_dim, num_qo_heads
    G = num_qo_heads // num_kv_heads
    heads = int(getattr(config, "heads_per_tile", 1))
    maxnreg = (
        None
        if not compiled or heads != 1 or q_len != 1
        else register_cap(D, G, config.block_n, config.num_warps, config.num_stages, bool(config.prefetch), dtype_bytes)
    )
    if not merges:
        return LaunchRule(maxnreg, 1, 4, False, False, False)
    splits = max_splits if max_splits is not None else 4096
    # a device-resident plan's sizes are not known here: its grid of max_batch programs, most of them idle, keeps
    # one program per (request, head)
    few = max_splits is not None and num_merge is not None and num_merge * H_q <= 1024
    dsplit = 4 if few and splits > 4096 // D and D % 64 == 0 else 1
    many = device_resident or (num_merge is not None and num_merge * H_q >= 256)
    overlap = pdl_available and many and dsplit <= MERGE_SYNC_CHUNKS and sync_ok
    return LaunchRule(
        maxnreg=maxnreg,
        merge_dsplit=dsplit,
        merge_warps=1 if many else 4,
        merge_overlap=overlap,
        pdl=overlap,
        pdl_last=overlap and config.schedule != "persistent",
    )


def _too_big(cfg: Any, q_len: int, head_dim: int, group: int, exc: OutOfResources) -> ValueError:
    """The ValueError of a bad ``params`` for a launch whose compiled kernel needs more of a per-CTA resource than the
    GPU has (Triton's ``OutOfResources``, raised while the kernel is loaded, before anything runs): the knobs, the
    shape and the figures the compiler reported. The planner refuses the configs whose compiled shared memory its
    tables know to be too large (:func:`kvsplit.kernels.rulespec.shared_memory_refused`); this names the others (a
    config the tables lack, or a plan made for another q_len: (64, 4, 4) with the prefetch and two heads per tile,
    planned at q_len 1 and launched at q_len 4, needs 278,528 B on sm_90 where 232,448 B are allowed), for which a
    tuner's trial is pruned instead of the campaign stopping."""
    return ValueError(
        too_big_message(
            cfg,
            q_len,
            f", head_dim={head_dim}, GQA group {group}: the compiled kernel needs {exc.required} of {exc.name} per CTA",
            f"this GPU's {exc.limit}",
        )
    )


def launch_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    arrays: dict[str, torch.Tensor],
    config: Any,
    *,
    out: torch.Tensor,
    workspace: DecodeWorkspace,
    num_tiles: int | None = None,
    num_merge: int | None = None,
    max_splits: int | None = None,
    counts: torch.Tensor | None = None,
    max_merge: int | None = None,
    sm_scale: float | None = None,
    return_lse: bool = False,
    q_len: int = 1,
    kv_lens: torch.Tensor | None = None,
    k_scale: float | torch.Tensor | None = None,
    v_scale: float | torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The one launcher of stage 1 + merge, from a plan's device arrays (no allocation; the only checks are the
    ones a plan cannot make, before any launch: ``config.heads_per_tile`` against H_q, the persistent schedule of
    a device-resident plan).

    ``arrays``: int32 device tensors ``work_request``, ``work_kv_start``,
    ``work_kv_end``, ``work_slot``, ``cta_indptr``, ``merge_request``,
    ``merge_slot_start``, ``merge_num`` (:meth:`Plan.to` or
    :class:`kvsplit.kernels.device_plan.DevicePlanBuffers`). Either the host
    knows the sizes (``num_tiles``: :attr:`Plan.num_work_tiles`, i.e. ``num_ctas
    * H_kv / config.heads_per_tile``; ``num_merge``, ``max_splits``: a host
    :class:`Plan`), or ``counts`` (int32 ``[4]`` on the device: num_items,
    num_ctas, num_tiles, num_merge) holds them: then ``config.schedule`` must be
    ``"persistent"`` (``config.num_programs`` programs; idle ones exit) and the
    merge grid is ``max_merge`` (the max batch) programs per query head, those
    past ``counts[3]`` doing nothing, so the launch shapes never depend on the
    batch and the call can be replayed by a CUDA graph (the merge grid is held to
    B = q.shape[0] programs per query head when ``max_merge`` is larger). The caller validated
    the inputs (:func:`decode_attention` or
    :class:`kvsplit.kernels.wrapper.DecodeWrapper`).

    The stage-1 loop is the plan's (``config.prefetch``, ``config.next_item``: the latter needs the former, else
    ``ValueError``). The register cap, the merge's grid and warps and the overlapped merge are
    :func:`launch_rule`'s pick for the plan's sizes and the machine; the overlapped merge needs a workspace from
    :func:`make_workspace` (one without ``sync`` counters, or with too few, runs the merge after stage 1).

    ``q_len``: query tokens per request (1 to :data:`~kvsplit.kernels.limits.MAX_Q_LEN`, the same for every request): ``q`` and ``out``
    are ``[B * q_len, H_q, D]`` (request b's tokens at rows ``b * q_len .. b * q_len + q_len - 1``, contiguous in
    their first two dimensions), the LSE ``[B * q_len, H_q]``, the workspace made with ``q_len``
    (:func:`make_workspace`), and ``kv_lens`` (int32 ``[B]`` on q's device, which the plan was made for) is
    required when ``q_len > 1``: token j sees the KV positions ``[0, kv_len - q_len + j]`` (causal within the
    request's q_len new tokens, already in the cache). A work tile holds ``G * heads_per_tile * q_len`` query
    rows, at most :data:`~kvsplit.kernels.limits.MAX_TILE_ROWS` (else ``ValueError``). ``k_cache``/``v_cache`` may be
    ``torch.float8_e4m3fn`` (q float16 / bfloat16): the kernel reads the fp8 bytes and widens them to float16
    per tile (q converted to float16 once per work item: float16 dots); ``k_scale``/``v_scale`` (:func:`check_kv_scales`: a float, or fp32 ``[H_kv]`` tensors, both of
    one kind) multiply the scores (before the softmax, so the LSE is the scaled scores') and the output.
    """
    B, H_q, D = q.shape
    _, page_size, H_kv, _ = k_cache.shape
    G = H_q // H_kv
    out_in = out
    scale_mode, qk_mult, v_float = check_kv_scales(k_scale, v_scale, H_kv, q.device)
    if check_q_len(q_len) != 1:
        if not isinstance(kv_lens, torch.Tensor) or kv_lens.dtype != torch.int32 or kv_lens.device != q.device:
            raise ValueError(f"kv_lens: required with q_len={q_len}, as an int32 tensor [B] on {q.device}")
        # q and out [B * q_len, H_q, D] viewed as [B, q_len * H_q, D] (token j of query head x at "head" j * H_q + x):
        # the rows that every index below counts (LSE, partials, merge programs, arrival counters)
        if B % q_len:
            raise ValueError(f"q: expected [B * q_len, H_q, D] rows, got {B} rows for q_len={q_len}")
        B, H_q = B // q_len, H_q * q_len
        q, out = q.view(B, H_q, D), out.view(B, H_q, D)
    heads = int(getattr(config, "heads_per_tile", 1))
    check_heads_per_tile(heads, G * H_kv, H_kv, q_len=q_len)  # rows (naming q_len), divisor, packed heads
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(D)
    lse = workspace.lse[:B] if return_lse else workspace.lse
    device_counts = counts is not None
    cfg = config
    persistent = cfg.schedule == "persistent"
    if device_counts:
        if not persistent:
            raise ValueError("config.schedule: a device-resident plan needs the persistent schedule")
        grid = (cfg.num_programs,)
        num_tiles = 0
        workspace.counter.zero_()
    elif persistent:
        workspace.counter.zero_()
        grid = (min(cfg.num_programs, num_tiles),)
    else:
        grid = (num_tiles,)
    counts_arg = counts if device_counts else workspace.counter
    block_h = max(16, next_pow2(tile_rows(heads, G, q_len)))
    prefetch = bool(getattr(cfg, "prefetch", False))
    next_item = bool(getattr(cfg, "next_item", False))
    if next_item and not prefetch:
        raise ValueError("config.next_item: needs the prefetching loop (config.prefetch)")
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    # a device-resident plan merges at most B requests (q's batch, fixed for a captured graph): no program past B
    merge_grid = (min(max_merge or 0, B) if device_counts else num_merge) or 0
    sync = workspace.sync
    sync_ok = (
        sync is not None
        and sync.dtype == torch.int32
        and sync.device == q.device
        and sync.is_contiguous()
        and sync.dim() == 1
        and sync.shape[0] >= B * H_q * MERGE_SYNC_CHUNKS
    )
    rule = launch_rule(
        cfg,
        num_qo_heads=H_q,
        num_kv_heads=H_kv,
        head_dim=D,
        dtype_bytes=k_cache.element_size(),
        num_merge=num_merge,
        max_splits=max_splits,
        merges=bool(merge_grid),
        device_resident=device_counts,
        pdl_available=_pdl_available(q.device),
        sync_ok=sync_ok,
        compiled=not _INTERPRETED,
        q_len=q_len,
    )
    maxnreg, merge_dsplit, merge_warps, merge_overlap = (
        rule.maxnreg,
        rule.merge_dsplit,
        rule.merge_warps,
        rule.merge_overlap,
    )
    block_d = D // merge_dsplit
    block_s = max(2, min(next_pow2(max_splits if max_splits is not None else 4096), 4096 // block_d))
    # with PDL (sm_90+) the merge grid starts while stage 1 runs; without it (a rule forced in the CPU tests) the
    # same arrival protocol runs with the merge after stage 1
    pdl, pdl_last = rule.pdl, rule.pdl_last
    sync_arg = workspace.sync if merge_overlap else workspace.counter
    try:  # no cost on the hot path unless raised
        _decode_stage1_kernel[grid](
            q,
            k_cache,
            v_cache,
            out,
            lse,
            workspace.part_o,
            workspace.part_lse,
            kv_indptr,
            kv_indices,
            arrays["work_request"],
            arrays["work_kv_start"],
            arrays["work_kv_end"],
            arrays["work_slot"],
            arrays["cta_indptr"],
            workspace.counter,
            counts_arg,
            sm_scale * _LOG2E * qk_mult,
            page_size,
            num_tiles,
            q.stride(0),
            q.stride(1),
            k_cache.stride(0),
            k_cache.stride(1),
            k_cache.stride(2),
            v_cache.stride(0),
            v_cache.stride(1),
            v_cache.stride(2),
            out.stride(0),
            out.stride(1),
            sync_arg,
            H_Q=H_q,
            H_KV=H_kv,
            GROUP=G,
            BLOCK_H=block_h,
            HEAD_DIM=D,
            BLOCK_N=cfg.block_n,
            RETURN_LSE=return_lse,
            DOT_PRECISION=precision,
            PERSISTENT=persistent,
            DEVICE_COUNTS=device_counts,
            PREFETCH=bool(prefetch),
            HEADS=heads,
            NEXT=bool(next_item),
            SIGNAL=bool(merge_overlap),
            MERGE_DS=merge_dsplit if merge_overlap else 1,
            PDL=pdl and not pdl_last,
            PDL_LAST=pdl_last,
            KV_LENS=kv_lens if q_len != 1 else None,
            K_SCALE=k_scale if scale_mode == 2 else None,
            V_SCALE=v_scale if scale_mode == 2 else None,
            v_scale=v_float if scale_mode == 1 else None,
            Q_LEN=q_len,
            KV_FP8=_fp8_widen_mode(q.device) if k_cache.dtype == torch.float8_e4m3fn else 0,
            SCALE=scale_mode,
            num_warps=cfg.num_warps,
            num_stages=cfg.num_stages,
            **({"maxnreg": maxnreg} if maxnreg else {}),
        )
    except OutOfResources as exc:
        raise _too_big(cfg, q_len, D, G, exc) from None
    if merge_grid:
        _decode_merge_kernel[(merge_grid, H_q, merge_dsplit)](
            workspace.part_o,
            workspace.part_lse,
            out,
            lse,
            arrays["merge_request"],
            arrays["merge_slot_start"],
            arrays["merge_num"],
            counts_arg,
            out.stride(0),
            out.stride(1),
            sync_arg,
            H_Q=H_q,
            BLOCK_S=block_s,
            HEAD_DIM=D,
            BLOCK_D=block_d,
            RETURN_LSE=return_lse,
            DEVICE_COUNTS=device_counts,
            WAIT=bool(merge_overlap),
            POLL_NS=rule.poll_ns,
            POLL_RELAXED=bool(merge_overlap),
            num_warps=merge_warps,
            **({"launch_pdl": True} if pdl else {}),
        )
    if q_len != 1:
        out = out_in
        if return_lse:
            lse = lse.reshape(B * q_len, H_q // q_len)
    if return_lse:
        return out, lse
    return out
