"""The test oracle of the planner: every split rule written with whole-array NumPy operations, as readable as
the rules' docstrings (prefix sums, ``np.repeat``, ``np.argsort``), independently of the loop-form rules the
planner runs (kernels/fastplan.py, compiled by numba or run as plain Python) and of the device planner
(kernels/device_plan.py). tests/kernels/test_planner_contract.py checks every planner against it.

It plans from the same :class:`~kvsplit.kernels.rulespec.RuleSpec` (the policies' parameters are parsed once,
by :func:`~kvsplit.kernels.rulespec.resolve`); what it computes from a batch is its own.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from kvsplit.kernels.buckets import BINS_PER_OCTAVE, CLASS_WEIGHT, HIST_UNITS, NUM_BINS, BucketKey
from kvsplit.kernels.device import DeviceSpec
from kvsplit.kernels.limits import MAX_WORK_ITEMS, KernelConfig, cdiv, check_batch_shape
from kvsplit.kernels.rulespec import (
    RULE_CONST,
    RULE_FAIR,
    RULE_WAVE1,
    RULE_WAVE2,
    WHOLE_WAVE_MAX_WAVES,
    WHOLE_WAVE_TILES,
    PlanContext,
    RuleSpec,
    resident_slots,
    resolve,
    tile_heads,
    whole_wave_tiles,
)
from kvsplit.kernels.shape import gpu_slug
from kvsplit.kernels.workplan import Plan


def log2_class(x: int) -> int:
    """``round(log2(x))`` for an integer ``x >= 1``, halves up: ``floor(log2 x) + [x^2 >= 2^(2 floor(log2 x) + 1)]``."""
    k = int(x).bit_length() - 1
    return k + (int(x) * int(x) >= 1 << (2 * k + 1))


def make_plan(
    kv_lens: Any,
    *,
    num_kv_heads: int,
    device: DeviceSpec | str,
    policy: str = "balanced",
    params: Mapping[str, Any] | None = None,
    head_dim: int = 128,
    page_size: int = 16,
    dtype: str = "bfloat16",
    kv_dtype: str | None = None,
    q_len: int = 1,
    num_qo_heads: int | None = None,
) -> Plan:
    """:func:`kvsplit.kernels.plan.make_plan` on the NumPy rules."""
    L, num_kv_heads, page_size, dev = check_batch_shape(kv_lens, num_kv_heads, head_dim, page_size, dtype, device)
    return plan_spec(
        L,
        resolve(
            policy,
            params,
            num_kv_heads=num_kv_heads,
            device=dev,
            head_dim=head_dim,
            page_size=page_size,
            dtype=dtype,
            kv_dtype=kv_dtype,
            q_len=q_len,
            num_qo_heads=num_qo_heads,
        ),
    )


class WorkList(NamedTuple):
    """A work list a policy builds itself (instead of per-request split counts)."""

    num_splits: np.ndarray
    work_request: np.ndarray
    work_kv_start: np.ndarray
    work_kv_end: np.ndarray
    cta_indptr: np.ndarray


def tiles_of(L: np.ndarray, chunk: int) -> int:
    return int(np.maximum(-(-L // chunk), 1).sum())


def wave_aware_chunk(
    L: np.ndarray, num_kv_heads: int, block_n: int, target_tiles: int, min_chunk: int = 1, tile_cost: int = 0
) -> int:
    """Chunk (tokens, a multiple of ``block_n``) of an even-chunk split.

    Starts from ``chunk0 = roundup(max(min_chunk, block_n, ceil(H_kv * sum(kv_len) / target_tiles)), block_n)``.
    Rounding splits up per request (``num_splits[b] = ceil(kv_len[b] / chunk)``)
    can give more than ``target_tiles`` tiles (``H_kv * sum(num_splits)``), e.g.
    17 x 8 x 4 = 544 tiles for 528 slots: a second wave of 16 tiles. When one
    tile per request fits (``H_kv * B <= target_tiles``), ``chunk_fit``, the
    smallest multiple of ``block_n`` whose tile count fits, is found by binary
    search (as FlashInfer's ``PrefillBinarySearchKVChunkSize`` searches its
    chunk), and replaces ``chunk0`` when one wave of ``chunk_fit`` is shorter
    than ``chunk0``'s estimated makespan (one wave plus overflow tiles placed on
    the slots that free first; ``chunk0`` stays above two waves). Both estimates
    are in tokens and charge every tile ``tile_cost`` tokens of fixed cost
    (:func:`wave_tile_cost`: one ``block_n`` block, its q load and output or
    partial write, as ``stream_k``'s ``item_cost_blocks`` default, when the target
    is one resident wave), so a tie goes to fewer tiles: one tile per request of
    a near-even batch, not two waves of halves and a merge (measured on the
    H200, B = 128 of ~2,572 tokens, H_kv 4, BLOCK_N 64: 1.248x the floor split in
    two, docs/data/h200_r4/train_even.log).
    (Growing the chunk is wrong when few tiles are left for the long requests,
    e.g. B = 128 at H_kv = 4 leaves 16 of 528 tiles: measured 6-11x the floor,
    docs/data/h200_r2/sweep1.log.)
    """
    total = int(L.sum()) * num_kv_heads
    chunk0 = cdiv(max(cdiv(total, target_tiles), block_n, min_chunk), block_n) * block_n
    B = int(L.shape[0])
    tiles0 = num_kv_heads * tiles_of(L, chunk0)
    if num_kv_heads * B > target_tiles or tiles0 <= target_tiles:
        return chunk0
    lo, hi = chunk0 // block_n, max(cdiv(int(L.max()), block_n), chunk0 // block_n)
    limit = target_tiles // num_kv_heads
    while lo < hi:  # smallest chunk (in blocks) with tiles <= limit; hi always fits (one tile per request)
        mid = (lo + hi) // 2
        if tiles_of(L, mid * block_n) > limit:
            lo = mid + 1
        else:
            hi = mid
    chunk_fit = lo * block_n
    if tiles0 > 2 * target_tiles:
        return chunk0
    # chunk0's makespan in tokens, with build_work_list's even spread (items of request b ~ kv_len[b] / n_b),
    # tiles in launch order (CTA-major, KV heads adjacent): the first wave fills the target, each overflow tile
    # follows on the slot whose first tile ends first (list scheduling, as the hardware block scheduler places
    # a grid in order)
    n = np.maximum(-(-L // chunk0), 1)
    size = np.repeat(np.repeat(L / n + tile_cost, n), num_kv_heads)
    first, over = size[:target_tiles], size[target_tiles:]
    est0 = max(float(first.max()), float((np.sort(first)[: over.shape[0]] + over).max()))
    if tile_cost:  # one wave: chunk_fit's largest tile (even spread) plus its fixed cost
        est_fit = float((L / np.maximum(-(-L // chunk_fit), 1)).max()) + tile_cost
    else:  # below one resident wave: the chunk itself (measured: fewer, longer tiles lose there)
        est_fit = float(chunk_fit)
    return chunk_fit if est_fit <= est0 else chunk0


def whole_wave_config(
    L: np.ndarray,
    ctx: PlanContext,
    eps: float,
    tiles: tuple[tuple[int, int, int], ...] = WHOLE_WAVE_TILES,
    heads: int = 1,
) -> KernelConfig | None:
    """The tile on which one work tile per request (no split-KV) fills whole resident waves, or None.

    The tiles are ``(block_n, num_warps, num_stages)`` of ``tiles`` (one KV head per work tile), then those of
    :data:`WHOLE_WAVE_HEADS_TILES` whose ``heads_per_tile`` h is at most ``heads`` and divides H_kv. For each,
    with ``slots = resident_slots(ctx, cfg)`` (resident CTAs per SM x SMs, :mod:`.residency`) and
    ``n = (H_kv / h) * B`` work tiles of whole requests, the plan needs ``k = ceil(n / slots)`` waves, each as
    long as the longest request, so its makespan against an even share of the same slots is

        ``excess = k * max(kv_len) * slots / ((H_kv / h) * sum(kv_len))``   (1 for equal lengths filling k waves).

    The tile with the smallest ``excess`` is returned when ``k <= WHOLE_WAVE_MAX_WAVES`` and
    ``excess <= 1 + eps``: then no request is split, there is no merge launch and no per-piece fixed cost,
    and at most a fraction ``eps`` of the slot-time idles. Ties go to the earlier tile. Near-even batches
    (requests started together, fixed-length benchmarks) meet it; measured on the H200, exact-uniform B = 128
    at T = 262,144 (512 tiles for the 528 slots of (64, 4, 2)) ran 1.059x its best plan under the even
    partition the table served and 1.0x with one tile per request (docs/decisions/whole-wave-rule.md), while B = 96
    batches of the same bucket key fill (128, 4, 2)'s 396 slots instead (docs/concepts/design.md §8: tiles are counted
    against the plan's own config's slots). A tile the kernel refuses for ``ctx``'s head_dim and dtype is
    skipped; residency is the measured one where known, else :func:`.residency.estimate`'s.

    Parameters
    ----------
    L : np.ndarray int64 ``[B]``
        kv_len per request (validated).
    ctx : PlanContext
    eps : float
        Allowed excess, >= 0; 0 disables the rule (returns None).
    heads : int
        The most KV heads per work tile the rule may run (a policy's ``whole_wave_heads``, default 1: the
        one-head tiles only). The caller vouches that ``heads`` GQA groups fit one tile's query rows
        (:func:`fit_heads_per_tile`; the launch checks it again).

    Returns
    -------
    KernelConfig or None
        The chosen tile: ``KernelConfig(block_n, num_warps, num_stages)`` (grid schedule, no prefetch) of
        ``tiles``, or a :data:`WHOLE_WAVE_HEADS_TILES` config.
    """
    tiles_ = whole_wave_tiles(ctx, heads, tiles)
    j = whole_wave_pick(L, eps, [resident_slots(ctx, c) for c in tiles_], [tile_heads(ctx, c) for c in tiles_])
    return None if j < 0 else tiles_[j]


def whole_wave_pick(L: np.ndarray, eps: float, slots, heads) -> int:
    """Index of the tile :func:`whole_wave_config` picks among tiles of ``slots`` resident work tiles and
    ``heads`` work tiles per request (in order), or -1."""
    total = int(L.sum())
    if eps <= 0 or total <= 0:
        return -1
    lmax = int(L.max())
    best, best_j = None, -1
    for j, (sl, ht) in enumerate(zip(slots, heads)):
        sl, ht = int(sl), int(ht)
        k = -(-(ht * int(L.shape[0])) // sl)
        if k > WHOLE_WAVE_MAX_WAVES:
            continue
        excess = float(k * lmax * sl) / float(ht * total)
        if excess <= 1.0 + eps and (best is None or excess < best):
            best, best_j = excess, j
    return best_j


def pieces_at_cuts(L: np.ndarray, nb: np.ndarray, ncut: np.ndarray, cut: np.ndarray, block_n: int):
    """The work items of requests cut inside at block offsets: request ``b`` (``L[b]`` tokens, ``nb[b]`` blocks of
    ``block_n``) has ``ncut[b]`` cuts, ``cut`` holds every request's cuts in request order (block offsets within
    it, increasing, strictly inside ``(0, nb[b])``); cut c of request b ends item (b, c) and starts item (b, c + 1).

    Returns ``(n, req, j, start_blk, start, end)``: items per request ``[B]``; per item ``[W]`` its request, its
    index within the request, its first block and its token range ``[start, end)`` (clipped to ``L``)."""
    n = (ncut + 1).astype(np.int64)
    W = int(n.sum())
    item_first = np.cumsum(n) - n
    req = np.repeat(np.arange(L.shape[0]), n)
    j = np.arange(W) - item_first[req]
    cut_first = np.cumsum(ncut) - ncut
    start_blk = np.zeros(W, dtype=np.int64)
    end_blk = nb[req].astype(np.int64)
    has_prev = j > 0
    start_blk[has_prev] = cut[cut_first[req[has_prev]] + j[has_prev] - 1]
    has_next = j < n[req] - 1
    end_blk[has_next] = cut[cut_first[req[has_next]] + j[has_next]]
    Lw = L[req]
    return n, req, j, start_blk, np.minimum(start_blk * block_n, Lw), np.minimum(end_blk * block_n, Lw)


def indptr_of_runs(cta: np.ndarray) -> np.ndarray:
    """``cta_indptr`` int32 ``[C + 1]`` of a work list whose items' CTAs ``cta`` ``[W]`` come in runs (non-decreasing
    over the list): CTA c takes the c-th run."""
    boundary = np.ones(cta.shape[0], dtype=bool)
    boundary[1:] = cta[1:] != cta[:-1]
    return np.append(np.flatnonzero(boundary), cta.shape[0]).astype(np.int32)


def stream_k_work(
    L: np.ndarray, ctas: int, block_n: int, item_cost_blocks: int, min_piece_blocks: int, perm: np.ndarray | None = None
) -> WorkList:
    """Even partition of the concatenated KV stream over a fixed number of CTAs.

    Units are blocks of ``block_n`` tokens; request ``b`` costs
    ``n_b + o`` (``n_b = ceil(kv_len[b] / block_n)``, ``o = item_cost_blocks``,
    the fixed cost of starting a request: q load, output or partial write). The
    stream of all requests (in launch order) is cut into ``C = max(1,
    floor(ctas_per_sm * num_SMs) // H_kv)`` CTAs per KV head of ``share =
    ceil(sum_b (n_b + o) / C)`` cost units each; CTA ``c`` walks its consecutive
    pieces, which cross request boundaries. A cut falls at ``k * share`` inside
    request ``b``'s blocks ``[P_b + o, P_b + o + n_b)`` (``P_b`` its prefix cost),
    so every piece starts on a ``block_n`` boundary and shares differ by less
    than one block; a cut closer than ``min_piece_blocks`` to either end of its
    request is dropped (that CTA runs a little over), so requests of fewer than
    ``2 * min_piece_blocks`` blocks are never split. Everything is prefix sums
    and per-item arithmetic, so a GPU planner can compute it.

    Sources: FlashMLA's ``get_mla_metadata`` (``csrc/.../get_mla_metadata.cu``:
    ``payload = cdiv(total_blocks + B * fixed_overhead, num_sm_parts) +
    fixed_overhead`` with ``fixed_overhead_num_blocks = 5``, consecutive blocks
    per SM part crossing request boundaries); FlashInfer's SM90 persistent
    scheduler (``scheduler.cuh::PrefillSM90Plan``, work balanced over CTAs by
    cost); CUTLASS stream-K (Osama et al. 2023, "Stream-K: Work-centric
    Parallel Decomposition for Dense Matrix-Matrix Multiplication on the GPU");
    Lean Attention (Sanovar et al. 2024) applies stream-K to decode attention.

    Returns
    -------
    WorkList
        ``num_splits [B]``, items (request, start, end) and ``cta_indptr``.
    """
    B = int(L.shape[0])
    if perm is None:
        order = np.arange(B)
        Lp = L
    else:
        order = np.asarray(perm, dtype=np.int64)
        Lp = L[order]
    o = int(item_cost_blocks)
    nb = -(-Lp // block_n)
    cost = nb + o
    P = np.cumsum(cost) - cost
    C = ctas
    share = max(1, cdiv(int(cost.sum()), C))
    lo = P + o  # cost coordinate of each request's first block
    hi = lo + nb
    first_k = lo // share + 1  # first multiple of share strictly after lo
    last_k = -(-hi // share) - 1  # last multiple strictly before hi
    ncut = np.maximum(last_k - first_k + 1, 0)
    mp = int(min_piece_blocks)
    if mp > 1 and int(ncut.sum()):
        # drop cuts closer than mp blocks to either end of their request
        creq = np.repeat(np.arange(B), ncut)
        k = np.arange(int(ncut.sum())) - np.repeat(np.cumsum(ncut) - ncut, ncut) + first_k[creq]
        cut = k * share - lo[creq]
        keep = (cut >= mp) & (nb[creq] - cut >= mp)
        cut, creq, k = cut[keep], creq[keep], k[keep]
        ncut = np.bincount(creq, minlength=B)
    else:
        creq = np.repeat(np.arange(B), ncut)
        k = np.arange(int(ncut.sum())) - np.repeat(np.cumsum(ncut) - ncut, ncut) + first_k[creq]
        cut = k * share - lo[creq]
    n, req_p, j, start_blk, start, end = pieces_at_cuts(Lp, nb, ncut, cut, block_n)
    # CTA of each item: where its first block falls; a request's first piece whose
    # cut near its start was dropped (the next share boundary within its first
    # min_piece_blocks - 1 blocks) starts in the CTA after that boundary
    push = np.where(j == 0, np.minimum(mp - 1, np.maximum(nb[req_p] - 1, 0)), 0)
    cta = np.minimum((lo[req_p] + start_blk + push) // share, C - 1)
    cta_indptr = indptr_of_runs(cta)
    num_splits = np.empty(B, dtype=np.int64)
    num_splits[order] = n
    return WorkList(num_splits.astype(np.int32), order[req_p].astype(np.int32), start, end, cta_indptr)


def build_work_list(
    kv_lens: np.ndarray, num_splits: np.ndarray, block_n: int, order: str, *, perm: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Cut each request into ``num_splits`` contiguous chunks and lay them out.

    Chunk boundaries fall on multiples of ``block_n`` when the request has at
    least as many KV tiles as splits (``start_j = block_n * floor(j * n_tiles /
    n)``, as FlashAttention-3's ``BlockMN::get_n_block_min_max`` spreads blocks),
    otherwise on token boundaries ``floor(j * kv_len / n)``. ``num_splits`` is
    clamped to ``max(kv_len, 1)`` so no chunk is empty.

    Returns ``(num_splits, work_request, work_kv_start, work_kv_end)``; the
    requests appear in ``order`` (``natural``: batch order; ``heavy_first``:
    kv_len descending, stable), or in the order of ``perm`` (a permutation of
    ``range(B)``, used by policies with their own sort key, e.g. ``fa3``).
    """
    L = kv_lens
    n = np.minimum(np.maximum(num_splits.astype(np.int64), 1), np.maximum(L, 1))
    if perm is not None:
        perm = np.asarray(perm, dtype=np.int64)
    elif order == "heavy_first":
        perm = np.argsort(-L, kind="stable")
    else:
        perm = np.arange(L.shape[0])
    n_perm = n[perm]
    W = int(n_perm.sum())
    req = np.repeat(perm, n_perm)
    item_first = np.repeat(np.cumsum(n_perm) - n_perm, n_perm)
    j = np.arange(W, dtype=np.int64) - item_first
    Lw = L[req]
    nw = n[req]
    tiles = -(-Lw // block_n)
    aligned = tiles >= nw
    start_a = block_n * ((j * tiles) // nw)
    end_a = np.minimum(block_n * (((j + 1) * tiles) // nw), Lw)
    start_t = (j * Lw) // nw
    end_t = ((j + 1) * Lw) // nw
    start = np.where(aligned, start_a, start_t)
    end = np.where(aligned, end_a, end_t)
    return n.astype(np.int32), req.astype(np.int32), start, end


def pack_ctas(work_kv_start: np.ndarray, work_kv_end: np.ndarray, pack_tokens: int) -> np.ndarray:
    """Group consecutive short work items into CTAs; return ``cta_indptr``.

    An item of fewer than ``pack_tokens`` tokens shares its CTA with its short
    neighbours in launch order until their running token count crosses a
    multiple of ``pack_tokens``; longer items get a CTA each. ``pack_tokens=0``
    gives one item per CTA. (The lever of DESIGN.md §7: thousands of tiny tiles
    each pay a fixed per-CTA cost.)
    """
    W = work_kv_start.shape[0]
    if pack_tokens <= 0 or W <= 1:
        return np.arange(W + 1, dtype=np.int32)
    length = work_kv_end - work_kv_start
    short = length < pack_tokens
    # running token count of short items; a long item resets nothing but breaks runs
    cum_before = np.cumsum(np.where(short, length, 0)) - np.where(short, length, 0)
    bucket = cum_before // pack_tokens
    boundary = np.ones(W, dtype=bool)
    boundary[1:] = ~short[1:] | ~short[:-1] | (bucket[1:] != bucket[:-1])
    starts = np.flatnonzero(boundary)
    return np.append(starts, W).astype(np.int32)


def smallest_chunk(pages: np.ndarray, lo: int, hi: int, limit: int) -> int:
    """Smallest ``c`` in ``[lo, hi]`` with ``sum(cdiv(max(pages, 1), c)) <= limit``.

    FlashInfer's binary search (``PartitionPagedKVCacheBinarySearchMinNumPagePerBatch``,
    ``PrefillBinarySearchKVChunkSize``): ``low = lo, high = hi``; while
    ``low < high``: ``mid = (low + high) // 2``; too many chunks -> ``low = mid + 1``
    else ``high = mid``. It returns ``hi`` when no chunk fits, and ``lo`` when
    ``lo >= hi``. The bracket is first narrowed with exact bounds on the count
    (``sum(p) / c <= count(c) <= sum(p) / c + B``), which does not change the result.
    """
    p = np.maximum(pages, 1)
    low, high = lo, hi
    if low >= high:
        return low
    total = int(p.sum())
    B = int(p.shape[0])
    if limit >= 1:
        # any c < total / limit has count > limit
        low = max(low, min(high, cdiv(total, limit)))
        if limit > B:
            # count(c) <= total / c + B <= limit for c >= total / (limit - B)
            high = min(high, max(low, cdiv(total, limit - B)))
    else:
        return hi
    while low < high:
        mid = (low + high) // 2
        if int((-(-p // mid)).sum()) > limit:
            low = mid + 1
        else:
            high = mid
    return low


def flashinfer_num_splits(
    L: np.ndarray, page_size: int, num_kv_heads: int, tensor_cores: bool, max_grid: int
) -> np.ndarray:
    """FlashInfer's batch-decode split rule (its SM80 paths), batch order.

    Restates docs/policies.md §1a/§1b (flashinfer-ai/flashinfer @ fb28d724):

    - ``tensor_cores=True`` (default; ``scheduler.cuh::PrefillPlanImpl`` with
      ``PrefillBinarySearchKVChunkSize``): ``max_grid = 2 * num_SMs``,
      ``max_batch = max_grid // H_kv``; the chunk ``c`` (pages) is the smallest in
      ``[max(128 // page_size, 1), max_pages]`` with
      ``sum_b cdiv(max(pages_b, 1), c) <= max_batch`` (one q tile per request:
      ``cta_tile_q = 16 >= G`` for G <= 16, ``64``/``128`` above, so one tile for
      G <= 128), else ``max_pages``; split-KV is on iff ``c < max_pages``.
    - ``tensor_cores=False`` (``BatchDecodeWithPagedKVCacheWorkEstimationDispatched``,
      ``PartitionPagedKVCacheBinarySearchMinNumPagePerBatch``):
      ``max_grid = resident_ctas_per_sm * num_SMs``; if ``B * H_kv >= max_grid``
      split-KV is off; else the smallest ``c`` with
      ``H_kv * sum_b cdiv(max(pages_b, 1), c) <= max_grid``, and split-KV is on iff
      that gives more chunks than requests.

    With split-KV on, ``num_splits[b] = cdiv(max(pages_b, 1), c)``; off, 1.
    Constants: minimum chunk 128 tokens (``128 / page_size`` pages), 2 CTAs per SM
    on the tensor-core path. ``pages_b = cdiv(kv_len[b], page_size)``.
    Chunk boundaries are then spread evenly by :func:`build_work_list` (FlashInfer
    cuts whole ``c``-page chunks, the last one shorter); the counts are FlashInfer's.

    Parameters (``params``)
    -----------------------
    tensor_cores : bool, default True
    resident_ctas_per_sm : int in [1, 64], CUDA-core path only
        Default :func:`flashinfer_decode_occupancy` for ``group_size``.
    group_size : int in [1, 128], default 8
        G = H_q / H_kv, used only for that default (a plan never depends on H_q
        otherwise; 8 is the reference shape, Qwen3-30B-A3B's 32/4).
    """
    pages = -(-L // page_size)
    max_pages = int(pages.max())
    lo = max(128 // page_size, 1)
    H = num_kv_heads
    if tensor_cores:
        c = smallest_chunk(pages, lo, max_pages, max_grid // H)
        split = c < max_pages
    elif L.shape[0] * H >= max_grid:
        split = False
        c = max_pages
    else:
        c = smallest_chunk(pages, lo, max_pages, max_grid // H)
        split = int((-(-np.maximum(pages, 1) // c)).sum()) != L.shape[0]
    if not split:
        return np.ones_like(L)
    return -(-np.maximum(pages, 1) // c)


# ---------------------------------------------------------------------------
# FlashAttention-3
# ---------------------------------------------------------------------------

FA3_BLOCK_N = 128
"""kBlockN of FA3's Hopper kernel for paged (non-TMA) decode, hdim 128
(``hopper/tile_size.h::tile_size_fwd_sm90``; policies.md §2c)."""
FA3_BLOCK_M = 128
"""kBlockM for hdim 128 on sm90: with PackGQA a decode step has one m-block for G <= 128."""
FA3_PREPARE_CTA_REQUESTS = 992
"""Requests one prepare CTA handles (31 per warp x 32 warps); above it no split."""
FA3_MAX_SPLITS = 128


def fa3_static_num_splits(num_kv_heads: int, num_n_blocks: int, num_sms: int) -> int:
    """FA3's static split heuristic for a varlen / paged decode batch.

    Restates ``hopper/heuristics.h::num_splits_heuristic`` as called by
    ``hopper/flash_api.cpp::get_num_splits`` (policies.md §2a), with the batch
    treated as 1 (varlen), one m-block (decode with PackGQA) and
    ``num_n_blocks = cdiv(max kv_len, 128)`` (FA3 uses the page table's
    capacity; the live maximum is what a planner knows):
    ``total_mblocks = H_kv``; if ``total_mblocks >= 0.8 * S`` -> 1; if
    ``num_n_blocks <= 4`` -> 1; else with ``max_s = min(128, S, num_n_blocks)``,
    ``eff(s) = w / ceil(w)``, ``w = total_mblocks * s / S``, the smallest ``s`` with
    ``eff(s) >= 0.85 * max eff``. (The L2-motivated branch needs ``num_m_blocks >=
    2 S``, never true for decode.) Examples for S = 132: H_kv 1/2/4/8/16/32 ->
    109/57/29/15/8/4.
    """
    S = num_sms
    total_mblocks = num_kv_heads
    if total_mblocks >= 0.8 * S or num_n_blocks <= 4:
        return 1
    max_s = min(FA3_MAX_SPLITS, S, num_n_blocks)
    s = np.arange(1, max_s + 1, dtype=np.float64)
    w = total_mblocks * s / S
    eff = w / np.ceil(w)
    ok = eff >= 0.85 * eff.max()
    return int(np.argmax(ok)) + 1


def fa3_num_splits(
    L: np.ndarray, num_kv_heads: int, num_sms: int, static_splits: int, heavy_first: bool
) -> tuple[np.ndarray, np.ndarray | None]:
    """FlashAttention-3's Hopper varlen split rule, heaviest first, persistent.

    Restates ``hopper/flash_prepare_scheduler.cu::prepare_varlen_num_blocks_kernel``
    (Dao-AILab/flash-attention @ 0251105a, docs/policies.md §2b):
    ``n_b = cdiv(kv_len[b], kBlockN)`` with kBlockN = 128 (:data:`FA3_BLOCK_N`),
    ``blocks_per_sm = ceil(1.1 * H_kv * sum_b n_b / num_SMs)`` (PackGQA: one
    m-block per request), ``num_splits[b] = clamp(cdiv(n_b, blocks_per_sm), 1,
    num_splits_static)`` with the static cap of :func:`fa3_static_num_splits`
    (or the ``num_splits_static`` param, as FA3's ``num_splits`` argument);
    above 992 requests (more than one prepare CTA) every request gets 1 split.
    Order (``order="heavy_first"``, the default): requests sorted by
    ``cdiv(n_b, num_splits[b])`` descending within each chunk of 992 (stable),
    as the prepare kernel sorts its 992 items. Schedule: persistent with
    ``num_programs = num_SMs`` (``hopper/tile_scheduler.hpp::
    VarlenDynamicPersistentTileScheduler``, grid = S) unless given.
    Example (H_kv = 8, S = 132, lens = [65536] + 15 x [2048]):
    blocks_per_sm = 51, num_splits = [11] + 15 x [1].
    """
    S, H = num_sms, num_kv_heads
    n_b = -(-L // FA3_BLOCK_N)
    B = L.shape[0]
    static = static_splits if static_splits else fa3_static_num_splits(H, int(n_b.max()), S)
    if B > FA3_PREPARE_CTA_REQUESTS or static == 1:
        splits = np.ones_like(L)
    else:
        total = int(n_b.sum())
        # ceil(total * 1.1 * H / S) in exact integer arithmetic
        blocks_per_sm = max(1, cdiv(total * 11 * H, 10 * S))
        splits = np.clip(-(-n_b // blocks_per_sm), 1, static)
    if not heavy_first:
        return splits, None
    key = -(-np.maximum(n_b, 0) // splits)
    if B <= FA3_PREPARE_CTA_REQUESTS:
        return splits, np.argsort(-key, kind="stable")
    chunk_id = np.arange(B) // FA3_PREPARE_CTA_REQUESTS
    return splits, np.lexsort((np.arange(B), -key, chunk_id))


def plan_spec(L: np.ndarray, sp: RuleSpec) -> Plan:
    """The NumPy plan of validated lengths ``L`` (int64 ``[B]``) with a resolved spec."""
    if sp.whole_wave_specs:
        j = whole_wave_pick(L, sp.whole_wave, sp.whole_wave_slots, sp.whole_wave_tile_heads)
        if j >= 0:
            sp = sp.whole_wave_specs[j]
    cfg = sp.config
    perm = np.argsort(-L, kind="stable") if sp.heavy_first else None
    if sp.partition == "stream_k":
        n, req, start, end, cta_indptr = stream_k_work(
            L, sp.ctas, cfg.block_n, sp.item_cost_blocks, sp.min_piece_blocks, perm
        )
    else:
        if sp.partition == "flashinfer":
            num_splits = flashinfer_num_splits(L, sp.page_size, sp.num_kv_heads, sp.tensor_cores, sp.max_grid)
        elif sp.partition == "fa3":
            num_splits, perm = fa3_num_splits(L, sp.num_kv_heads, sp.device.num_sms, sp.static_splits, sp.heavy_first)
        elif sp.chunk_rule == RULE_CONST:
            num_splits = np.full(L.shape, sp.chunk_arg, dtype=np.int64)
        elif sp.chunk_rule == RULE_FAIR:
            fair = cdiv(int(L.sum()) * sp.tile_heads, sp.chunk_arg)
            chunk = cdiv(max(fair, sp.min_chunk, 1), cfg.block_n) * cfg.block_n
            num_splits = np.clip(-(-L // chunk), 1, sp.max_splits)
        else:
            chunk = wave_aware_chunk(
                L,
                sp.tile_heads,
                cfg.block_n,
                sp.chunk_arg,
                sp.min_chunk,
                {RULE_WAVE1: cfg.block_n, RULE_WAVE2: 2 * cfg.block_n}.get(sp.chunk_rule, 0),
            )
            num_splits = np.clip(-(-L // chunk), 1, sp.max_splits)
        W = int(np.minimum(np.maximum(num_splits, 1), np.maximum(L, 1)).sum())
        if W > MAX_WORK_ITEMS:
            raise ValueError(
                f"params: the plan would have {W} work items, above the limit of {MAX_WORK_ITEMS} "
                f"(fewer splits per request)"
            )
        n, req, start, end = build_work_list(L, num_splits, cfg.block_n, "natural", perm=perm)
        cta_indptr = pack_ctas(start, end, sp.pack_tokens)
    # the arrays satisfy the Plan's invariants by construction (tests/kernels/test_plan_policies.py checks them
    # for every policy); skipping the O(W) re-check keeps planning fast
    return Plan.from_trusted(
        kv_lens=L,
        num_splits=n,
        work_request=req,
        work_kv_start=start,
        work_kv_end=end,
        cta_indptr=cta_indptr,
        params=sp.params,
        **sp.fields,
    )


# ----------------------------------------------------------------------------
# Bucket keys and their distance
# ----------------------------------------------------------------------------


def length_bins(L: np.ndarray) -> np.ndarray:
    """``floor(2 * log2(L))`` exactly, for int64 ``L >= 1``."""
    k = np.frexp(L.astype(np.float64))[1].astype(np.int64) - 1  # floor(log2 L), exact below 2^53
    half = (L * L) >= np.left_shift(np.int64(1), 2 * k + 1)
    return 2 * k + half


def quantize(weights: np.ndarray, units: int) -> np.ndarray:
    """Largest-remainder rounding of ``weights`` (summing to > 0) to integers summing to ``units``."""
    total = weights.sum()
    exact = weights * (units / total)
    q = np.floor(exact).astype(np.int64)
    short = units - int(q.sum())
    if short > 0:
        rem = exact - q
        # larger remainder first, lower bin first among equals (stable sort)
        order = np.argsort(-rem, kind="stable")
        q[order[:short]] += 1
    return q


def bucket_key(
    kv_lens: Any,
    *,
    num_kv_heads: int,
    head_dim: int,
    dtype: str,
    device: Any,
    page_size: int = 16,
    kv_dtype: str | None = None,
    q_len: int = 1,
) -> BucketKey:
    """:func:`kvsplit.kernels.buckets.bucket_key` with NumPy: the token-weighted histogram of
    ``floor(2 * log2 kv_len)`` bins, quantized by largest remainders to HIST_UNITS units."""
    L, num_kv_heads, page_size, dev = check_batch_shape(kv_lens, num_kv_heads, head_dim, page_size, dtype, device)
    B = L.shape[0]
    total = int(L.sum())
    nz = L[L > 0]
    if nz.shape[0]:
        w = np.bincount(length_bins(nz), weights=nz.astype(np.float64), minlength=NUM_BINS)
        q = quantize(w, HIST_UNITS)
        idx = np.flatnonzero(q)
        hist = tuple(zip(idx.tolist(), q[idx].tolist()))
        tokens_class = log2_class(total)
    else:
        hist = ()
        tokens_class = -1
    return BucketKey(
        gpu=gpu_slug(dev.name),
        num_kv_heads=num_kv_heads,
        head_dim=int(head_dim),
        dtype=dtype,
        page_size=page_size,
        batch_class=log2_class(B),
        tokens_class=tokens_class,
        hist=hist,  # type: ignore[arg-type]
        kv_dtype=kv_dtype,
        q_len=q_len,
    )


def distance(a: BucketKey, b: BucketKey) -> float:
    """:func:`kvsplit.kernels.buckets.distance` as its module doc states it: the L1 distance of the cumulative
    histograms over HIST_UNITS * BINS_PER_OCTAVE, plus CLASS_WEIGHT per class step; inf across families or
    when exactly one histogram is empty."""
    if a.family != b.family:
        return float("inf")
    classes = CLASS_WEIGHT * (abs(a.batch_class - b.batch_class) + abs(a.tokens_class - b.tokens_class))
    if not a.hist or not b.hist:
        return classes if (not a.hist and not b.hist) else math.inf
    diff = [0] * NUM_BINS
    for bin_, u in a.hist:
        diff[bin_] += u
    for bin_, u in b.hist:
        diff[bin_] -= u
    cum = 0
    l1 = 0
    for d in diff:
        cum += d
        l1 += abs(cum)
    return l1 / HIST_UNITS / BINS_PER_OCTAVE + classes
