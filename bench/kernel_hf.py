"""Head-fused stage 1 of the split-KV decode (prototype for an A/B on the H200, not the shipped kernel).

Today's stage 1 (kernels/decode.py) runs one work tile per (CTA, KV head): a tile reads, for every token of
its item, one 256-byte fragment (D = 128, bf16) of a cache row whose other H_kv - 1 fragments the other heads'
CTAs read at other times. Here one program per CTA of the plan processes *all* KV heads of its work items, so
every token's ``H_kv x D`` values -- contiguous in the NHD cache ``[num_pages, page_size, H_kv, D]`` -- are
read together, and a page is read whole (``page_size x H_kv x D``: 16 KB of K and 16 KB of V at H_kv 4,
page 16, D 128, bf16).

The online softmax (base 2, FlashAttention-2) runs for every KV head at once on 3-D tensors:

- ``q3`` ``[H_KV, BLOCK_H, D]``: the G = H_q / H_kv query heads of each KV head, padded to
  ``BLOCK_H = max(16, next_pow2(G))`` rows (masked);
- K / V tiles ``[H_KV, BLOCK_N, D]`` loaded through the page table
  (``page * stride_kp + in_page * stride_ks + h * stride_kh + d``);
- scores ``tl.dot(q3, trans(k3))`` ``[H_KV, BLOCK_H, BLOCK_N]`` (a batched dot), running max / sum
  ``[H_KV, BLOCK_H]``, accumulator ``[H_KV, BLOCK_H, D]`` (fp32).

Work items, slots and masking are today's: items of unsplit requests (``work_slot < 0``) write the final
output ``[B, H_q, D]`` (and the LSE, natural log, when asked); split ones write a normalized fp32 partial and
its base-2 LSE into the workspace at row ``slot * H_q + q_head``, which today's ``_decode_merge_kernel``
merges unchanged. Empty items are neutral (o = 0, lse = -inf); K/V loads are masked by the item's range, so
garbage in unused cache slots never reaches the output.

A second layout, :func:`_hf2d_stage1_kernel` (``hf_decode(..., layout="2d")``), does the same work with 2-D
dots: the H_q query heads are the M rows, a tile's rows are (token, KV head) pairs in the cache's own order
(``[BLOCK_N * H_kv, D]``), the scores of a query head against another KV head's rows are masked to -inf, so P is
block-diagonal: H_kv times the MMA work, but no per-head padding of the G query rows to 16 (fp32 accumulator
``[H_q, D]`` instead of ``[H_kv, 16, D]``).

sm_90 compile without a GPU (``bench/compile_hf_sm90.py``, docs/data/hf7/compile_hf_sm90.log; Triton 3.6, H_q 32,
H_kv 4, D 128, bf16): both layouts compile; the dots are MMA v2 (``mma.sync``; the 3-D dot has no wgmma path and
the 2-D one has M = 32). The 3-D layout needs 163-255 registers (spills at 4 warps: 44-272 bytes) and fits 2 CTAs
per SM at 4 warps, 1 at 8; the 2-D layout 128-232 registers without spills (3 CTAs per SM at BLOCK_N 16, 4 warps;
2 at 16 / 8 warps). As in today's kernel, K/V are multi-buffered (num_stages - 1 tiles in flight) only with
``prefetch`` and ``num_stages >= 3``.

Plans come from the normal planner: a plan made with ``ctas_per_sm = c * H_kv`` has as many CTAs
(``plan.num_ctas``) as today's kernel has work tiles (``num_ctas * H_kv``) at ``ctas_per_sm = c``; each CTA
then holds ``1 / H_kv`` of the tokens, for all heads. Only the plan's work list is used: the kernel config
(BLOCK_N, warps, stages, prefetch) is passed to :func:`hf_decode`.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kvsplit.kernels import decode as dec
from kvsplit.kernels.plan import Plan

__all__ = ["hf_decode", "hf_launch", "launch_merge"]


@triton.jit
def _hf_stage1_kernel(
    Q, K, V, O, LSE, PART_O, PART_LSE,
    KV_INDPTR, KV_INDICES,
    WORK_REQ, WORK_START, WORK_END, WORK_SLOT, CTA_INDPTR,
    qk_scale,
    stride_qb, stride_qh,
    stride_kp, stride_ks, stride_kh,
    stride_vp, stride_vs, stride_vh,
    stride_ob, stride_oh,
    PAGE_SIZE: tl.constexpr, H_Q: tl.constexpr, H_KV: tl.constexpr, GROUP: tl.constexpr,
    BLOCK_H: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, RETURN_LSE: tl.constexpr,
    DOT_PRECISION: tl.constexpr, PREFETCH: tl.constexpr,
):
    # one program per CTA of the plan; H_KV is a power of two (checked by the launcher)
    c = tl.program_id(0)
    item_lo = tl.load(CTA_INDPTR + c)
    item_hi = tl.load(CTA_INDPTR + c + 1)

    offs_kh = tl.arange(0, H_KV)
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, BLOCK_N)
    mask_h = offs_h < GROUP
    q_head = offs_kh[:, None] * GROUP + offs_h[None, :]  # [H_KV, BLOCK_H]
    # offsets of (head, d) inside one token's row of the cache: H_KV * D contiguous values
    k_hd = offs_kh[:, None, None] * stride_kh + offs_d[None, None, :]  # [H_KV, 1, D]
    v_hd = offs_kh[:, None, None] * stride_vh + offs_d[None, None, :]

    for it in range(item_lo, item_hi):
        req = tl.load(WORK_REQ + it).to(tl.int64)
        start = tl.load(WORK_START + it)
        end = tl.load(WORK_END + it)
        slot = tl.load(WORK_SLOT + it)
        page_base = tl.load(KV_INDPTR + req)

        q = tl.load(
            Q + req * stride_qb + q_head[:, :, None] * stride_qh + offs_d[None, None, :],
            mask=mask_h[None, :, None],
            other=0.0,
        )  # [H_KV, BLOCK_H, D]
        m_i = tl.full([H_KV, BLOCK_H], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([H_KV, BLOCK_H], dtype=tl.float32)
        acc = tl.zeros([H_KV, BLOCK_H, HEAD_DIM], dtype=tl.float32)

        if PREFETCH:
            # page ids of tile i + 1 loaded during tile i (loop-carried), so no K/V address depends on a load of
            # its own iteration and the software pipeliner can keep num_stages - 1 K/V tiles in flight
            # (kernels/decode.py, same loop)
            t = start + offs_n
            page_nx = tl.load(KV_INDICES + page_base + t // PAGE_SIZE, mask=t < end, other=0)
        for n0 in range(start, end, BLOCK_N):
            t = n0 + offs_n
            mask_n = t < end
            if PREFETCH:
                page = page_nx.to(tl.int64)
                t1 = t + BLOCK_N
                page_nx = tl.load(KV_INDICES + page_base + t1 // PAGE_SIZE, mask=t1 < end, other=0)
            else:
                page = tl.load(KV_INDICES + page_base + t // PAGE_SIZE, mask=mask_n, other=0).to(tl.int64)
            in_page = (t % PAGE_SIZE).to(tl.int64)
            k_row = page * stride_kp + in_page * stride_ks  # [BLOCK_N]
            v_row = page * stride_vp + in_page * stride_vs
            mask3 = mask_n[None, :, None]
            k = tl.load(K + k_row[None, :, None] + k_hd, mask=mask3, other=0.0)  # [H_KV, BLOCK_N, D]
            v = tl.load(V + v_row[None, :, None] + v_hd, mask=mask3, other=0.0)
            s = tl.dot(q, tl.trans(k, (0, 2, 1)), input_precision=DOT_PRECISION) * qk_scale  # [H_KV, BLOCK_H, BLOCK_N]
            s = tl.where(mask_n[None, None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=2))
            alpha = tl.math.exp2(m_i - m_new)
            p = tl.math.exp2(s - m_new[:, :, None])
            l_i = l_i * alpha + tl.sum(p, axis=2)
            acc = acc * alpha[:, :, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
            m_i = m_new

        nonempty = l_i > 0.0
        l_safe = tl.where(nonempty, l_i, 1.0)
        out = acc / l_safe[:, :, None]
        lse2 = tl.where(nonempty, m_i + tl.math.log2(l_safe), float("-inf"))
        mask_o = mask_h[None, :, None]
        if slot < 0:
            o_ptr = O + req * stride_ob + q_head[:, :, None] * stride_oh + offs_d[None, None, :]
            tl.store(o_ptr, out.to(O.dtype.element_ty), mask=mask_o)
            if RETURN_LSE:
                tl.store(LSE + req * H_Q + q_head, lse2 * 0.6931471805599453, mask=mask_h[None, :])
        else:
            row = slot.to(tl.int64) * H_Q + q_head  # [H_KV, BLOCK_H]
            tl.store(PART_O + row[:, :, None] * HEAD_DIM + offs_d[None, None, :], out, mask=mask_o)
            tl.store(PART_LSE + row, lse2, mask=mask_h[None, :])


@triton.jit
def _hf2d_stage1_kernel(
    Q, K, V, O, LSE, PART_O, PART_LSE,
    KV_INDPTR, KV_INDICES,
    WORK_REQ, WORK_START, WORK_END, WORK_SLOT, CTA_INDPTR,
    qk_scale,
    stride_qb, stride_qh,
    stride_kp, stride_ks, stride_kh,
    stride_vp, stride_vs, stride_vh,
    stride_ob, stride_oh,
    PAGE_SIZE: tl.constexpr, H_Q: tl.constexpr, H_KV: tl.constexpr, GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, RETURN_LSE: tl.constexpr,
    DOT_PRECISION: tl.constexpr, PREFETCH: tl.constexpr,
):
    # The same work as _hf_stage1_kernel with 2-D dots: all H_q query heads are the M rows (BLOCK_M >= H_q) and a
    # tile's rows are (token, KV head) pairs, r = n * H_KV + h, i.e. the cache's own order (a page's K is one
    # contiguous [page_size * H_kv, D] block). Scores of a query row against another KV head's rows are masked
    # to -inf, so P is block-diagonal and P @ V sums each query head's own KV head only: H_kv times the MMA work
    # of the per-head dots, no per-head row padding (fp32 accumulator [H_q, D] instead of [H_kv, 16, D] at G < 16).
    c = tl.program_id(0)
    item_lo = tl.load(CTA_INDPTR + c)
    item_hi = tl.load(CTA_INDPTR + c + 1)

    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_r = tl.arange(0, BLOCK_N * H_KV)
    mask_m = offs_m < H_Q
    r_n = offs_r // H_KV  # token of each tile row
    r_h = offs_r % H_KV  # KV head of each tile row
    # KV head of each query row; padded rows (q = 0) take the last head, so every row has a finite score
    m_head = tl.minimum(offs_m // GROUP, H_KV - 1)
    same = m_head[:, None] == r_h[None, :]  # [BLOCK_M, BLOCK_N * H_KV]
    k_h = r_h.to(tl.int64) * stride_kh
    v_h = r_h.to(tl.int64) * stride_vh

    for it in range(item_lo, item_hi):
        req = tl.load(WORK_REQ + it).to(tl.int64)
        start = tl.load(WORK_START + it)
        end = tl.load(WORK_END + it)
        slot = tl.load(WORK_SLOT + it)
        page_base = tl.load(KV_INDPTR + req)

        q = tl.load(Q + req * stride_qb + offs_m[:, None] * stride_qh + offs_d[None, :], mask=mask_m[:, None],
                    other=0.0)
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

        if PREFETCH:
            t = start + r_n
            page_nx = tl.load(KV_INDICES + page_base + t // PAGE_SIZE, mask=t < end, other=0)
        for n0 in range(start, end, BLOCK_N):
            t = n0 + r_n
            mask_r = t < end
            if PREFETCH:
                page = page_nx.to(tl.int64)
                t1 = t + BLOCK_N
                page_nx = tl.load(KV_INDICES + page_base + t1 // PAGE_SIZE, mask=t1 < end, other=0)
            else:
                page = tl.load(KV_INDICES + page_base + t // PAGE_SIZE, mask=mask_r, other=0).to(tl.int64)
            in_page = (t % PAGE_SIZE).to(tl.int64)
            k = tl.load(K + (page * stride_kp + in_page * stride_ks + k_h)[:, None] + offs_d[None, :],
                        mask=mask_r[:, None], other=0.0)
            v = tl.load(V + (page * stride_vp + in_page * stride_vs + v_h)[:, None] + offs_d[None, :],
                        mask=mask_r[:, None], other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
            s = tl.where(same & mask_r[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            alpha = tl.math.exp2(m_i - m_new)
            p = tl.math.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
            m_i = m_new

        nonempty = l_i > 0.0
        l_safe = tl.where(nonempty, l_i, 1.0)
        out = acc / l_safe[:, None]
        lse2 = tl.where(nonempty, m_i + tl.math.log2(l_safe), float("-inf"))
        if slot < 0:
            o_ptr = O + req * stride_ob + offs_m[:, None] * stride_oh + offs_d[None, :]
            tl.store(o_ptr, out.to(O.dtype.element_ty), mask=mask_m[:, None])
            if RETURN_LSE:
                tl.store(LSE + req * H_Q + offs_m, lse2 * 0.6931471805599453, mask=mask_m)
        else:
            row = slot.to(tl.int64) * H_Q + offs_m
            tl.store(PART_O + row[:, None] * HEAD_DIM + offs_d[None, :], out, mask=mask_m[:, None])
            tl.store(PART_LSE + row, lse2, mask=mask_m)


def launch_merge(out: torch.Tensor, lse: torch.Tensor, workspace: dec.DecodeWorkspace, arrays: dict, *,
                 num_merge: int, max_splits: int, return_lse: bool) -> None:
    """Today's stage 2 (``kvsplit.kernels.decode._decode_merge_kernel``) on a host plan's sizes, with
    ``launch_decode``'s grid and default ``merge_dsplit`` rule (host-known sizes). ``out`` ``[B, H_q, D]``,
    ``lse`` fp32 ``[>= B, H_q]``; nothing is launched when ``num_merge`` is 0."""
    if not num_merge:
        return
    _, H_q, D = out.shape
    few = num_merge * H_q <= 1024
    dsplit = 4 if few and max_splits > 4096 // D and D % 64 == 0 else 1
    block_d = D // dsplit
    block_s = max(2, min(triton.next_power_of_2(max_splits), 4096 // block_d))
    dec._decode_merge_kernel[(num_merge, H_q, dsplit)](
        workspace.part_o, workspace.part_lse, out, lse,
        arrays["merge_request"], arrays["merge_slot_start"], arrays["merge_num"], workspace.counter,
        out.stride(0), out.stride(1),
        H_Q=H_q, BLOCK_S=block_s, HEAD_DIM=D, BLOCK_D=block_d, RETURN_LSE=return_lse,
        DEVICE_COUNTS=False, num_warps=4,
    )


def hf_launch(q, k_cache, v_cache, kv_indptr, kv_indices, arrays: dict, *, num_ctas: int, num_merge: int,
              max_splits: int, out: torch.Tensor, workspace: dec.DecodeWorkspace, block_n: int, num_warps: int,
              num_stages: int, prefetch: bool = False, sm_scale: float | None = None, return_lse: bool = False,
              merge: bool = True, layout: str = "3d"):
    """Fused stage 1 (grid ``num_ctas``) + today's merge, from a plan's device arrays (no checks, no allocation:
    CUDA-graph capturable). ``layout``: ``"3d"`` (:func:`_hf_stage1_kernel`, batched per-head dots) or ``"2d"``
    (:func:`_hf2d_stage1_kernel`, block-diagonal 2-D dots). ``merge=False`` launches stage 1 alone (A/B of the
    merge share). Returns ``(out, kernel)`` or ``(out, lse, kernel)``, ``kernel`` the launched CompiledKernel
    (None under the interpreter)."""
    if layout not in ("3d", "2d"):
        raise ValueError(f"layout: expected '3d' or '2d', got {layout!r}")
    B, H_q, D = q.shape
    _, page_size, H_kv, _ = k_cache.shape
    G = H_q // H_kv
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(D)
    lse = workspace.lse[:B] if return_lse else workspace.lse
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    if layout == "2d":
        fn, rows = _hf2d_stage1_kernel, {"BLOCK_M": max(16, triton.next_power_of_2(H_q))}
    else:
        fn, rows = _hf_stage1_kernel, {"BLOCK_H": max(16, triton.next_power_of_2(G))}
    kernel = fn[(num_ctas,)](
        q, k_cache, v_cache, out, lse, workspace.part_o, workspace.part_lse,
        kv_indptr, kv_indices,
        arrays["work_request"], arrays["work_kv_start"], arrays["work_kv_end"], arrays["work_slot"],
        arrays["cta_indptr"],
        sm_scale * dec._LOG2E,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        out.stride(0), out.stride(1),
        PAGE_SIZE=page_size, H_Q=H_q, H_KV=H_kv, GROUP=G, HEAD_DIM=D, **rows,
        BLOCK_N=block_n, RETURN_LSE=return_lse, DOT_PRECISION=precision, PREFETCH=bool(prefetch),
        num_warps=num_warps, num_stages=num_stages,
    )
    if merge:
        launch_merge(out, lse, workspace, arrays, num_merge=num_merge, max_splits=max_splits, return_lse=return_lse)
    return (out, lse, kernel) if return_lse else (out, kernel)


def hf_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    kv_lens: torch.Tensor,
    plan: Plan,
    *,
    out: torch.Tensor | None = None,
    workspace: dec.DecodeWorkspace | None = None,
    block_n: int = 32,
    num_warps: int = 4,
    num_stages: int = 2,
    prefetch: bool = False,
    sm_scale: float | None = None,
    return_lse: bool = False,
    validate: bool = True,
    layout: str = "3d",
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """GQA decode attention with the head-fused stage 1 (one program per plan CTA, all KV heads) + today's merge.

    Parameters
    ----------
    q : torch.Tensor ``[B, H_q, D]``
        Queries, float16 / bfloat16 (float16 / float32 under the interpreter).
    k_cache, v_cache : torch.Tensor ``[num_pages, page_size, H_kv, D]``
        Paged NHD cache in q's dtype; H_kv a power of two, H_q a multiple of it.
    kv_indptr, kv_indices, kv_lens : torch.Tensor int32 ``[B + 1]``, ``[kv_indptr[-1]]``, ``[B]``
        Page table and tokens per request, as :func:`kvsplit.kernels.decode.decode_attention`.
    plan : Plan
        A normal kvsplit plan for these kv_lens (its work list is used; its kernel config is ignored).
        ``plan.num_ctas`` programs are launched.
    out : torch.Tensor ``[B, H_q, D]``, optional
        Output buffer (q's dtype).
    workspace : DecodeWorkspace, optional
        Partials and LSE buffers (``kvsplit.kernels.decode.make_workspace``).
    block_n : int
        Tokens per tile (a power of two >= 16); each tile is ``[H_kv, block_n, D]`` of K and of V.
    num_warps, num_stages : int
        Triton launch options of stage 1.
    prefetch : bool
        Load the next tile's page ids one iteration ahead (use with ``num_stages >= 3``).
    sm_scale : float, optional
        Softmax scale, default ``1 / sqrt(D)``.
    return_lse : bool
        Also return the LSE (fp32 ``[B, H_q]``, natural log; -inf for kv_len = 0).
    validate : bool
        Run the checks that read device data (a host sync), as ``decode_attention``.
    layout : str
        ``"3d"``: per-KV-head batched dots (``[H_kv, BLOCK_H, D]`` x ``[H_kv, D, block_n]``); ``"2d"``: one
        ``[H_q, D]`` x ``[D, block_n * H_kv]`` dot with the other heads' scores masked (block-diagonal P).

    Returns
    -------
    torch.Tensor or (torch.Tensor, torch.Tensor)
        ``o`` ``[B, H_q, D]`` (and ``lse`` ``[B, H_q]``).
    """
    B, H_q, D, H_kv, _ = dec._check_inputs(q, k_cache, v_cache, kv_indptr, kv_indices, kv_lens, plan, out,
                                            workspace, return_lse, validate)
    if H_kv & (H_kv - 1):
        raise ValueError(f"k_cache: the head-fused kernel needs a power-of-two H_kv, got {H_kv}")
    if block_n < 16 or block_n & (block_n - 1):
        raise ValueError(f"block_n: expected a power of two >= 16, got {block_n}")
    dev = q.device
    if out is None:
        out = torch.empty_like(q)
    if workspace is None:
        workspace = dec.make_workspace(H_q, D, max_partials=plan.num_partials, max_batch=B, device=dev)
    res = hf_launch(q, k_cache, v_cache, kv_indptr, kv_indices, plan.to(dev), num_ctas=plan.num_ctas,
                    num_merge=int(plan.merge_layout()[1].shape[0]), max_splits=int(plan.num_splits.max()),
                    out=out, workspace=workspace, block_n=block_n, num_warps=num_warps, num_stages=num_stages,
                    prefetch=prefetch, sm_scale=sm_scale, return_lse=return_lse, layout=layout)
    return (res[0], res[1]) if return_lse else res[0]
