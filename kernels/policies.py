"""The NumPy planner: each split rule of a :class:`~kvsplit.kernels.rulespec.RuleSpec` written with whole-array
operations (prefix sums, ``np.repeat``), and :func:`make_plan`, the public entry point, which plans on the
compiled loop-form rules of :mod:`.fastplan` where they apply."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from .device import DeviceSpec
from .limits import MAX_WORK_ITEMS, KernelConfig, cdiv, check_batch_shape, check_kv_lens
from .peer_policies import fa3_num_splits, flashinfer_num_splits
from .rulespec import (  # noqa: F401  (the rule arguments' helpers, with the rules they serve)
    RULE_CONST, RULE_FAIR, RULE_WAVE1, STREAM_K_DEFAULTS, TUNED_PARAM_SPACE, WHOLE_WAVE_HEADS_TILES,
    WHOLE_WAVE_MAX_WAVES, WHOLE_WAVE_TILES, PlanContext, RuleSpec, condition_holds, fit_heads_per_tile, resolve,
    resident_slots, tile_heads, wave_target, wave_tile_cost, whole_wave_tiles,
)
from .workplan import Plan, build_work_list, pack_ctas
from . import fastplan as _fastplan


class WorkList(NamedTuple):
    """A work list a policy builds itself (instead of per-request split counts)."""

    num_splits: np.ndarray
    work_request: np.ndarray
    work_kv_start: np.ndarray
    work_kv_end: np.ndarray
    cta_indptr: np.ndarray

def _tiles(L: np.ndarray, chunk: int) -> int:
    return int(np.maximum(-(-L // chunk), 1).sum())


def wave_aware_chunk(L: np.ndarray, num_kv_heads: int, block_n: int, target_tiles: int, min_chunk: int = 1,
                     tile_cost: int = 0) -> int:
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
    tiles0 = num_kv_heads * _tiles(L, chunk0)
    if num_kv_heads * B > target_tiles or tiles0 <= target_tiles:
        return chunk0
    lo, hi = chunk0 // block_n, max(cdiv(int(L.max()), block_n), chunk0 // block_n)
    limit = target_tiles // num_kv_heads
    while lo < hi:  # smallest chunk (in blocks) with tiles <= limit; hi always fits (one tile per request)
        mid = (lo + hi) // 2
        if _tiles(L, mid * block_n) > limit:
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


def whole_wave_config(L: np.ndarray, ctx: PlanContext, eps: float,
                      tiles: tuple[tuple[int, int, int], ...] = WHOLE_WAVE_TILES,
                      heads: int = 1) -> KernelConfig | None:
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
    partition the table served and 1.0x with one tile per request (docs/results.md, round 6), while B = 96
    batches of the same bucket key fill (128, 4, 2)'s 396 slots instead (DESIGN.md §8: tiles are counted
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


def stream_k_work(L: np.ndarray, ctas: int, block_n: int, item_cost_blocks: int, min_piece_blocks: int,
                  perm: np.ndarray | None = None) -> WorkList:
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
    lo = P + o                      # cost coordinate of each request's first block
    hi = lo + nb
    first_k = lo // share + 1       # first multiple of share strictly after lo
    last_k = -(-hi // share) - 1    # last multiple strictly before hi
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
) -> Plan:
    """Plan one decode batch with a named split policy.

    Parameters
    ----------
    kv_lens : array-like of int, ``[B]``
        Tokens in each request's KV cache (list, NumPy array or CPU tensor);
        0 <= kv_len <= 2^31-1, 1 <= B <= 65,536.
    num_kv_heads : int
        H_kv, >= 1.
    device : DeviceSpec or str
        Target GPU, or its name as ``torch.cuda.get_device_name()`` reports it.
    policy : str
        One of :data:`POLICIES`.
    params : dict, optional
        Policy parameters plus the kernel knobs of :data:`KNOB_PARAMS`; knobs
        not given come from :func:`default_config`.
    head_dim : int
        D, one of 64, 128, 256.
    page_size : int
        Tokens per KV page, 1 to 256.
    dtype : str
        ``"float16"``, ``"bfloat16"`` or ``"float32"``.

    Returns
    -------
    Plan

    Raises
    ------
    ValueError
        On any invalid argument or parameter, naming it.
    """
    return plan_with(kv_lens, resolve(policy, params, num_kv_heads=num_kv_heads, device=device,
                                      head_dim=head_dim, page_size=page_size, dtype=dtype))


def plan_with(kv_lens: Any, spec: RuleSpec) -> Plan:
    """The plan of ``kv_lens`` (as :func:`make_plan`'s) with a resolved spec (:func:`~kvsplit.kernels.rulespec.resolve`):
    on the compiled rules where they apply, else with the NumPy ones. Raises ValueError naming ``kv_lens[i]``."""
    if _fastplan.ENABLED and spec.partition in ("even_chunks", "stream_k"):
        return _fastplan.plan_with_spec(_fastplan.as_kv_lens(kv_lens), spec, True)
    return plan_spec(check_kv_lens(kv_lens), spec)


def make_plan_reference(
    kv_lens: Any,
    *,
    num_kv_heads: int,
    device: DeviceSpec | str,
    policy: str = "balanced",
    params: Mapping[str, Any] | None = None,
    head_dim: int = 128,
    page_size: int = 16,
    dtype: str = "bfloat16",
) -> Plan:
    """:func:`make_plan` with the NumPy code only: the tested reference of the
    compiled core (:mod:`.fastplan`), and the planner where numba is missing."""
    L, num_kv_heads, page_size, dev = check_batch_shape(kv_lens, num_kv_heads, head_dim, page_size, dtype, device)
    return plan_batch(L, PlanContext(dev, num_kv_heads, int(head_dim), page_size, dtype), policy, params)


def plan_batch(L: np.ndarray, ctx: PlanContext, policy: str = "balanced",
               params: Mapping[str, Any] | None = None) -> Plan:
    """:func:`make_plan` with the NumPy rules, for already-validated lengths: ``L`` int64 ``[B]`` from
    :func:`~kvsplit.kernels.limits.check_batch_shape`, ``ctx`` a validated shape. Policy and params are
    resolved (and checked) by :func:`~kvsplit.kernels.rulespec.resolve`."""
    return plan_spec(L, resolve(policy, params, num_kv_heads=ctx.num_kv_heads, device=ctx.device,
                                head_dim=ctx.head_dim, page_size=ctx.page_size, dtype=ctx.dtype))


def plan_spec(L: np.ndarray, sp: RuleSpec) -> Plan:
    """The NumPy plan of validated lengths ``L`` (int64 ``[B]``) with a resolved spec."""
    if sp.whole_wave_specs:
        j = whole_wave_pick(L, sp.whole_wave, sp.whole_wave_slots, sp.whole_wave_tile_heads)
        if j >= 0:
            sp = sp.whole_wave_specs[j]
    cfg = sp.config
    perm = np.argsort(-L, kind="stable") if sp.heavy_first else None
    if sp.partition == "stream_k":
        n, req, start, end, cta_indptr = stream_k_work(L, sp.ctas, cfg.block_n, sp.item_cost_blocks,
                                                       sp.min_piece_blocks, perm)
    else:
        if sp.partition == "flashinfer":
            num_splits = flashinfer_num_splits(L, sp.page_size, sp.num_kv_heads, sp.tensor_cores, sp.max_grid)
        elif sp.partition == "fa3":
            num_splits, perm = fa3_num_splits(L, sp.num_kv_heads, sp.device.num_sms, sp.static_splits,
                                              sp.heavy_first)
        elif sp.chunk_rule == RULE_CONST:
            num_splits = np.full(L.shape, sp.chunk_arg, dtype=np.int64)
        elif sp.chunk_rule == RULE_FAIR:
            fair = cdiv(int(L.sum()) * sp.tile_heads, sp.chunk_arg)
            chunk = cdiv(max(fair, sp.min_chunk, 1), cfg.block_n) * cfg.block_n
            num_splits = np.clip(-(-L // chunk), 1, sp.max_splits)
        else:
            chunk = wave_aware_chunk(L, sp.tile_heads, cfg.block_n, sp.chunk_arg, sp.min_chunk,
                                     cfg.block_n if sp.chunk_rule == RULE_WAVE1 else 0)
            num_splits = np.clip(-(-L // chunk), 1, sp.max_splits)
        W = int(np.minimum(np.maximum(num_splits, 1), np.maximum(L, 1)).sum())
        if W > MAX_WORK_ITEMS:
            raise ValueError(f"params: the plan would have {W} work items, above the limit of {MAX_WORK_ITEMS} "
                             f"(fewer splits per request)")
        n, req, start, end = build_work_list(L, num_splits, cfg.block_n, "natural", perm=perm)
        cta_indptr = pack_ctas(start, end, sp.pack_tokens)
    # the arrays satisfy the Plan's invariants by construction (tests/kernels/test_plan_policies.py checks them
    # for every policy); skipping the O(W) re-check keeps planning fast
    return Plan.from_trusted(kv_lens=L, num_splits=n, work_request=req, work_kv_start=start, work_kv_end=end,
                         cta_indptr=cta_indptr, params=sp.params, **sp.fields)
