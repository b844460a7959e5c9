"""kvsplit's own split policies (``no_split``, ``fixed``, ``balanced``, ``tuned``),
the tuned family's search space as data (:data:`TUNED_PARAM_SPACE`) and
:func:`make_plan`. Importing this module registers the peer rules too
(:mod:`.peer_policies`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from typing import NamedTuple

from .device import DeviceSpec
from .limits import MAX_WORK_ITEMS, BLOCK_N_CHOICES, DTYPES, NUM_WARPS_CHOICES, NUM_STAGES_CHOICES, ORDERS, \
    SCHEDULES, MAX_NUM_PROGRAMS, HEADS_PER_TILE_CHOICES, TILE_QUERY_ROWS, KernelConfig, _check_config, _pos_int, cdiv, \
    check_batch_shape
from .registry import _POLICY_PARAMS, POLICIES, PlanContext, _knobs, _num, _register
from .residency import resident_ctas_per_sm
from .workplan import Plan, _jsonable, build_work_list, pack_ctas
from . import fastplan as _fastplan


class WorkList(NamedTuple):
    """A work list a policy builds itself (instead of per-request split counts)."""

    num_splits: np.ndarray
    work_request: np.ndarray
    work_kv_start: np.ndarray
    work_kv_end: np.ndarray
    cta_indptr: np.ndarray

from . import peer_policies  # noqa: F401  (registers flashinfer, fa3)

@_register("no_split", ())
def _policy_no_split(L: np.ndarray, ctx: PlanContext, params: Mapping[str, Any]):
    """One work item per request (no split-KV), batch order."""
    cfg, order, pack = _knobs(params, ctx, "natural")
    return np.ones_like(L, dtype=np.int64), cfg, order, pack


@_register("fixed", ("num_splits",))
def _policy_fixed(L: np.ndarray, ctx: PlanContext, params: Mapping[str, Any]):
    """The same ``num_splits`` for every request (clamped to kv_len), batch order.

    The fixed count of SGLang's static mode and vLLM's Triton decode kernel
    (``num_kv_splits``; docs/policies.md §4a, §5a).
    """
    if "num_splits" not in params:
        raise ValueError("params.num_splits: required by policy 'fixed'")
    n = _pos_int("params.num_splits", params["num_splits"], 1, 65536)
    cfg, order, pack = _knobs(params, ctx, "natural")
    return np.full(L.shape, n, dtype=np.int64), cfg, order, pack


def _ctas_per_sm(params: Mapping[str, Any], default: float) -> float:
    target = params.get("ctas_per_sm", default)
    if isinstance(target, bool) or not isinstance(target, (int, float, np.number)) or not (0.25 <= float(target) <= 64):
        raise ValueError(f"params.ctas_per_sm: expected a number in [0.25, 64], got {target!r}")
    return float(target)


def resident_slots(ctx: PlanContext, cfg: KernelConfig) -> int:
    """Work tiles of one resident wave: ``resident_ctas_per_sm(cfg) * num_SMs``
    (:mod:`.residency`; measured data where known)."""
    r = resident_ctas_per_sm(ctx.device, ctx.head_dim, ctx.dtype, DTYPES[ctx.dtype], cfg.block_n, cfg.num_warps,
                             cfg.num_stages, prefetch=cfg.prefetch, heads_per_tile=cfg.heads_per_tile,
                             next_item=cfg.next_item)
    return r * ctx.device.num_sms


def tile_heads(ctx: PlanContext, cfg: KernelConfig) -> int:
    """Work tiles per work item: ``H_kv / cfg.heads_per_tile`` (one tile per group of ``heads_per_tile`` KV
    heads). The partitions count a batch's tiles with it wherever DESIGN.md §4 writes H_kv."""
    return ctx.num_kv_heads // cfg.heads_per_tile


def wave_target(ctx: PlanContext, cfg: KernelConfig, ctas_per_sm: float) -> int:
    """Work tiles a plan aims at: ``floor(ctas_per_sm * num_SMs)``, cut down to a
    whole number of resident waves when that is more than one wave (so no
    partial last wave), at least one tile."""
    want = max(1, int(math.floor(ctas_per_sm * ctx.device.num_sms)))
    slots = resident_slots(ctx, cfg)
    if want > slots:
        want = (want // slots) * slots
    return want


def _tiles(L: np.ndarray, chunk: int) -> int:
    return int(np.maximum(-(-L // chunk), 1).sum())


def wave_tile_cost(ctx: PlanContext, cfg: KernelConfig, target_tiles: int) -> int:
    """Fixed cost per work tile, in tokens, that :func:`wave_aware_chunk` charges: one ``block_n``
    block when ``target_tiles`` is exactly one resident wave of ``cfg`` (:func:`resident_slots`),
    where a tile more waits for a slot; 0 otherwise (a target below the residency leaves slots free,
    and more tiles run side by side: measured 1.2-1.7x slower with the charge at ``ctas_per_sm`` 1,
    docs/data/h200_r4/rebalanced_eval.log)."""
    return cfg.block_n if target_tiles == resident_slots(ctx, cfg) else 0


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


WHOLE_WAVE_TILES: tuple[tuple[int, int, int], ...] = ((64, 4, 2), (128, 4, 2))
"""(block_n, num_warps, num_stages) tiles the whole-wave rule (:func:`whole_wave_config`) may run: the two
multi-resident tiles that stream fastest on the H200 (4 and 3 CTAs per SM at D = 128, 16-bit K/V; the best
single plans of docs/perf.md's round-6 table, 1.064-1.079x the read floor at T = 1,048,576)."""
WHOLE_WAVE_HEADS_TILES: tuple[KernelConfig, ...] = (
    KernelConfig(64, 4, 3, prefetch=True, heads_per_tile=2),)
"""Tiles of several KV heads the whole-wave rule also considers when the policy's ``whole_wave_heads`` allows
their ``heads_per_tile`` (after :data:`WHOLE_WAVE_TILES`, so ties keep the one-head tiles): (64, 4, 3) with the
page-id prefetch and two heads per tile, one resident CTA per SM (218 registers, 134 KB of shared memory at
D = 128, :data:`.residency.COMPILED_HEADS`). Measured on the H200 (docs/perf.md, round 9): on every batch where
the rule takes it (near-even B = 64 at H_kv = 4 and B = 32 at H_kv = 8: 128 work tiles on 132 SMs), its one tile
per request was the fastest of the 20 timed plans -- 7 of 7 training batches (train9_h2), 3 of 3 evaluation
batches (eval9_h2: exact-uniform B = 64 at T = 262,144 1.170x the read floor against 1.251x for the plan the
table served)."""
WHOLE_WAVE_MAX_WAVES = 2
"""The whole-wave rule considers at most this many resident waves of whole requests: more waves of near-even
batches lost 1-5 % to the even partition on the training batches (docs/perf.md, round 7)."""


def fit_heads_per_tile(params: Mapping[str, Any], num_qo_heads: int, num_kv_heads: int) -> Mapping[str, Any]:
    """``params`` with ``heads_per_tile`` lowered to the largest of the kernel's choices (1, 2, 4, 8) that divides
    H_kv and whose GQA groups fit one work tile's query rows (``h * H_q / H_kv <= TILE_QUERY_ROWS``), and
    ``whole_wave_heads`` to at most ``TILE_QUERY_ROWS / G``; ``params`` itself when both fit.

    A policy table keys its buckets by H_kv, not H_q (DESIGN.md §8), so a policy tuned at one GQA group
    (Qwen3-30B-A3B's 32/4, G = 8: two KV heads per tile) also serves models of a larger group (Qwen3-235B-A22B's
    64/4, G = 16), where the launch would refuse it (:func:`kvsplit.kernels.decode.check_heads_per_tile`):
    :class:`kvsplit.kernels.policy_table.PolicyTable` plans its policies through this. An explicit
    ``heads_per_tile`` given to :func:`make_plan` is not refitted (the launch names it instead).

    Parameters
    ----------
    params : Mapping
        A policy's parameters (validated by the planner afterwards; a non-integer ``heads_per_tile`` is
        returned unchanged for it to name).
    num_qo_heads, num_kv_heads : int
        H_q and H_kv (H_q a multiple of H_kv).
    """
    G = max(1, num_qo_heads // max(1, num_kv_heads))
    out = params
    for name in ("heads_per_tile", "whole_wave_heads"):
        h = params.get(name, 1)
        if isinstance(h, bool) or not isinstance(h, (int, np.integer)) or h <= 1:
            continue
        if name == "heads_per_tile":  # one of the kernel's choices that divides H_kv
            fit = max(c for c in HEADS_PER_TILE_CHOICES
                      if c == 1 or (c <= h and num_kv_heads % c == 0 and c * G <= TILE_QUERY_ROWS))
        else:  # a bound: whole_wave_config skips the tiles whose heads do not divide H_kv itself
            fit = max(1, min(int(h), TILE_QUERY_ROWS // G))
        if fit != h:
            out = {**out, name: fit}
    return out


def whole_wave_tiles(ctx: PlanContext, heads: int = 1,
                     tiles: tuple[tuple[int, int, int], ...] = WHOLE_WAVE_TILES) -> list[KernelConfig]:
    """The tiles :func:`whole_wave_config` considers, in its order: ``(block_n, num_warps, num_stages)`` of
    ``tiles``, then the :data:`WHOLE_WAVE_HEADS_TILES` configs of at most ``heads`` KV heads that divide H_kv;
    those the kernel refuses for ``ctx``'s head_dim and dtype left out. The compiled planner
    (kernels/fastplan.py) takes the same list."""
    cands = [KernelConfig(bn, nw, ns) for bn, nw, ns in tiles]
    cands += [c for c in WHOLE_WAVE_HEADS_TILES
              if c.heads_per_tile <= heads and ctx.num_kv_heads % c.heads_per_tile == 0]
    out = []
    for cfg in cands:
        try:
            _check_config(cfg, ctx.head_dim, ctx.dtype)
        except ValueError:
            continue
        out.append(cfg)
    return out


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
    total = int(L.sum())
    if eps <= 0 or total <= 0:
        return None
    lmax = int(L.max())
    best, best_cfg = None, None
    for cfg in whole_wave_tiles(ctx, heads, tiles):
        slots = resident_slots(ctx, cfg)
        ht = tile_heads(ctx, cfg)
        k = -(-(ht * int(L.shape[0])) // slots)
        if k > WHOLE_WAVE_MAX_WAVES:
            continue
        # the same float64 operations as the compiled core (kernels/fastplan.py), so both pick alike
        excess = float(k * lmax * slots) / float(ht * total)
        if excess <= 1.0 + eps and (best is None or excess < best):
            best, best_cfg = excess, cfg
    return best_cfg


def _whole_wave(L: np.ndarray, ctx: PlanContext, params: Mapping[str, Any]) -> KernelConfig | None:
    """``params.whole_wave`` checked (a number in [0, 1], default 0: off), ``params.whole_wave_heads`` (an
    integer in [1, 16], default 1) and :func:`whole_wave_config`."""
    heads = whole_wave_heads(params)
    if "whole_wave" not in params:
        return None
    return whole_wave_config(L, ctx, _num("whole_wave", params["whole_wave"], 0.0, 1.0), heads=heads)


def whole_wave_heads(params: Mapping[str, Any]) -> int:
    """``params.whole_wave_heads`` (default 1), checked: an integer in [1, 16]; raises ValueError naming it."""
    h = params.get("whole_wave_heads", 1)
    if isinstance(h, (bool, np.bool_)) or not isinstance(h, (int, np.integer)) or not 1 <= h <= TILE_QUERY_ROWS:
        raise ValueError(f"params.whole_wave_heads: expected an integer in [1, {TILE_QUERY_ROWS}], got {h!r}")
    return int(h)


@_register("balanced", ("ctas_per_sm", "whole_wave", "whole_wave_heads"))
def _policy_balanced(L: np.ndarray, ctx: PlanContext, params: Mapping[str, Any]):
    """Even chunks aimed at ``ctas_per_sm`` work tiles per SM (default 4), wave-aware.

    ``target = wave_target(ctas_per_sm)`` (``floor(ctas_per_sm * num_SMs)``, cut to a
    whole number of resident waves), ``chunk = wave_aware_chunk(kv_lens, H_kv,
    block_n, target)`` (H_kv / heads_per_tile tiles per item: :func:`tile_heads`),
    ``num_splits[b] = max(1, ceil(kv_len[b] / chunk))``.
    Aiming at 4 CTAs per SM was the best untuned rule on a Triton decode kernel
    (docs/data/anchors/policy_on_triton_kernel.md; DESIGN.md §7); counting the
    rounded tiles against the target removes the partial second wave that
    per-request rounding made (DESIGN.md §8: 1.34-1.49x the floor at T = 1M,
    B = 4-32 before; docs/results.md after). ``whole_wave`` (default off):
    :func:`whole_wave_config`'s one tile per request where it applies.
    """
    target = _ctas_per_sm(params, 4.0)
    cfg, order, pack = _knobs(params, ctx, "natural")
    ww = _whole_wave(L, ctx, params)
    if ww is not None:
        return np.ones_like(L, dtype=np.int64), ww, "natural", 0
    tt = wave_target(ctx, cfg, target)
    chunk = wave_aware_chunk(L, tile_heads(ctx, cfg), cfg.block_n, tt, tile_cost=wave_tile_cost(ctx, cfg, tt))
    return np.maximum(-(-L // chunk), 1), cfg, order, pack


STREAM_K_DEFAULTS = {"ctas_per_sm": 2.0, "item_cost_blocks": 1, "min_piece_blocks": 1}
"""Defaults of ``stream_k``'s rule parameters."""


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


def stream_k_work(L: np.ndarray, num_kv_heads: int, num_sms: int, block_n: int, ctas_per_sm: float,
                  item_cost_blocks: int, min_piece_blocks: int, perm: np.ndarray | None = None) -> WorkList:
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
    C = max(1, int(math.floor(ctas_per_sm * num_sms)) // num_kv_heads)
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


def _stream_k_params(params: Mapping[str, Any], space: Mapping[str, Any] | None = None) -> tuple[float, int, int]:
    """``(ctas_per_sm, item_cost_blocks, min_piece_blocks)`` checked against the ``stream_k`` policy's ranges,
    or against ``space`` (:data:`TUNED_PARAM_SPACE`, whose documented ranges ``tuned`` enforces)."""
    o_lo, o_hi = (space["item_cost_blocks"]["low"], space["item_cost_blocks"]["high"]) if space else (0, 1024)
    m_lo, m_hi = (space["min_piece_blocks"]["low"], space["min_piece_blocks"]["high"]) if space else (1, 1 << 20)
    target = _ctas_per_sm(params, STREAM_K_DEFAULTS["ctas_per_sm"])
    o = _pos_int("params.item_cost_blocks", params.get("item_cost_blocks", STREAM_K_DEFAULTS["item_cost_blocks"]),
                 o_lo, o_hi)
    mp = _pos_int("params.min_piece_blocks", params.get("min_piece_blocks", STREAM_K_DEFAULTS["min_piece_blocks"]),
                  m_lo, m_hi)
    return target, o, mp


@_register("stream_k", ("ctas_per_sm", "item_cost_blocks", "min_piece_blocks", "whole_wave", "whole_wave_heads"))
def _policy_stream_k(L: np.ndarray, ctx: PlanContext, params: Mapping[str, Any]):
    """Even partition of the concatenated KV stream (:func:`stream_k_work`).

    ``ctas_per_sm`` (default 2) sets the CTAs: ``floor(ctas_per_sm * num_SMs) //
    (H_kv / heads_per_tile)`` (:func:`tile_heads`) for each group of ``heads_per_tile``
    KV heads, so the work tiles never exceed that many per SM and need one
    resident wave when the config fits ``ctas_per_sm`` CTAs per SM.
    ``item_cost_blocks`` (default 1) is the fixed cost of a request's piece in
    ``block_n`` blocks; ``min_piece_blocks`` (default 1) keeps short requests
    whole. ``pack_tokens`` does not apply (the partition packs by itself).
    ``whole_wave`` (default off): :func:`whole_wave_config`'s one tile per
    request where it applies.
    """
    if params.get("pack_tokens", 0):
        raise ValueError("params.pack_tokens: not used by policy 'stream_k' (its CTAs already walk runs of items)")
    target, o, mp = _stream_k_params(params)
    cfg, order, _ = _knobs(params, ctx, "natural")
    ww = _whole_wave(L, ctx, params)
    if ww is not None:
        return np.ones_like(L, dtype=np.int64), ww, "natural", 0
    perm = np.argsort(-L, kind="stable") if order == "heavy_first" else None
    return stream_k_work(L, tile_heads(ctx, cfg), ctx.device.num_sms, cfg.block_n, target, o, mp, perm), cfg


# ---------------------------------------------------------------------------
# The tuned family (DESIGN.md §4)
# ---------------------------------------------------------------------------

TUNED_PARAM_SPACE: dict[str, dict[str, Any]] = {
    "ctas_per_sm": {
        "kind": "float", "low": 0.25, "high": 64.0, "log": True, "default": 4.0, "search": True,
        "doc": "target work tiles per SM: chunk = ceil(H_kv * sum(kv_len) / (ctas_per_sm * num_SMs))",
    },
    "partition": {
        "kind": "categorical", "choices": ["even_chunks", "stream_k"], "default": "even_chunks", "search": True,
        "doc": "even_chunks: per-request splits of one chunk size (min_chunk_tokens, max_splits apply); "
               "stream_k: even partition of the concatenated KV stream (stream_k_work; item_cost_blocks, "
               "min_piece_blocks apply)",
    },
    "min_chunk_tokens": {
        "kind": "int", "low": 16, "high": 65536, "log": True, "default": 16, "search": True,
        "condition": {"partition": "even_chunks"},
        "doc": "smallest chunk in tokens (before rounding up to block_n)",
    },
    "max_splits": {
        "kind": "int", "low": 1, "high": 1024, "log": True, "default": 1024, "search": True,
        "condition": {"partition": "even_chunks"},
        "doc": "cap on splits per request",
    },
    "block_n": {
        "kind": "categorical", "choices": list(BLOCK_N_CHOICES), "default": None, "search": True,
        "doc": "KV tokens per inner tile; None -> default_config(head_dim, dtype); some (block_n, "
               "num_warps, num_stages) combinations are rejected for large head_dim (ValueError)",
    },
    "num_warps": {
        "kind": "categorical", "choices": list(NUM_WARPS_CHOICES), "default": None, "search": True,
        "doc": "warps per CTA; None -> default_config",
    },
    "num_stages": {
        "kind": "int", "low": min(NUM_STAGES_CHOICES), "high": max(NUM_STAGES_CHOICES), "log": False,
        "default": None, "search": True, "doc": "pipeline stages; None -> default_config",
    },
    "prefetch": {
        "kind": "categorical", "choices": [False, True], "default": False, "search": True,
        "condition": {"num_stages": [n for n in NUM_STAGES_CHOICES if n >= 3]},
        "doc": "load the next tile's page ids one iteration ahead so the pipeliner keeps num_stages - 1 K/V tiles in "
               "flight (KernelConfig.prefetch; needs num_stages >= 3)",
    },
    "next_item": {
        "kind": "categorical", "choices": [False, True], "default": False, "search": True,
        "condition": {"prefetch": True},
        "doc": "look-ahead over a CTA's work items: the next items' entries, q and first page ids loaded while the "
               "current one streams (KernelConfig.next_item; needs prefetch)",
    },
    "heads_per_tile": {
        "kind": "categorical", "choices": list(HEADS_PER_TILE_CHOICES), "default": 1, "search": True,
        "doc": "KV heads per work tile (KernelConfig.heads_per_tile), at most: the tuner plans a choice through "
               "fit_heads_per_tile for its task's H_q / H_kv (the largest choice that divides H_kv and whose GQA "
               "groups fit the 16 query rows), as the policy table does at serving",
    },
    "order": {
        "kind": "categorical", "choices": list(ORDERS), "default": "natural", "search": True,
        "doc": "launch order of requests: batch order or kv_len descending",
    },
    "schedule": {
        "kind": "categorical", "choices": list(SCHEDULES), "default": "grid", "search": True,
        "doc": "grid launch or persistent programs pulling tiles from a counter",
    },
    "programs_per_sm": {
        "kind": "int", "low": 1, "high": 32, "log": True, "default": 4, "search": True,
        "condition": {"schedule": "persistent"},
        "doc": "persistent programs per SM (num_programs = programs_per_sm * num_SMs unless num_programs is given)",
    },
    "num_programs": {
        "kind": "int", "low": 1, "high": MAX_NUM_PROGRAMS, "log": True, "default": None, "search": False,
        "condition": {"schedule": "persistent"},
        "doc": "absolute number of persistent programs (overrides programs_per_sm); not searched",
    },
    "pack_tokens": {
        "kind": "categorical", "choices": [0, 128, 256, 512, 1024, 2048, 4096, 8192], "default": 0, "search": True,
        "condition": {"partition": "even_chunks"},
        "doc": "group consecutive items shorter than this into one CTA (cta_indptr); 0 = one item per CTA. "
               "Any integer in [0, 2^20] is accepted; the choices are the search grid",
    },
    "wave_aware": {
        "kind": "categorical", "choices": [True, False], "default": True, "search": False,
        "doc": "even_chunks: grow the chunk until the rounded tiles fit wave_target(ctas_per_sm) "
               "(wave_aware_chunk); False is the rule of the first campaign",
    },
    "whole_wave": {
        "kind": "float", "low": 0.0, "high": 1.0, "log": False, "default": 0.0, "search": False,
        "doc": "one work tile per request on a WHOLE_WAVE_TILES tile when that fills whole resident waves "
               "within this excess (whole_wave_config); 0 = off. Set per bucket from GPU timings "
               "(scripts/enable_whole_wave.py), not searched",
    },
    "whole_wave_heads": {
        "kind": "int", "low": 1, "high": 16, "log": False, "default": 1, "search": False,
        "doc": "the most KV heads per work tile the whole-wave rule may run (WHOLE_WAVE_HEADS_TILES); 1 = the "
               "one-head tiles only. Set with whole_wave (scripts/enable_whole_wave.py), refitted to the GQA group "
               "by the policy table (fit_heads_per_tile), not searched",
    },
    "item_cost_blocks": {
        "kind": "int", "low": 0, "high": 64, "log": False, "default": 1, "search": True,
        "condition": {"partition": "stream_k"},
        "doc": "stream_k: fixed cost of a request's piece, in block_n blocks",
    },
    "min_piece_blocks": {
        "kind": "int", "low": 1, "high": 4096, "log": True, "default": 1, "search": True,
        "condition": {"partition": "stream_k"},
        "doc": "stream_k: no cut closer than this many blocks to either end of its request (keeps "
               "requests of < 2 * min_piece_blocks blocks whole; interior pieces are whole shares)",
    },
}
"""Parameters of the ``tuned`` policy with their ranges, as data.

Each entry: ``kind`` (``"float"``, ``"int"`` or ``"categorical"``), ``low``/``high``/``log``
or ``choices``, ``default`` (``None``: from :func:`default_config`), ``search`` (whether
a tuner should search it), optional ``condition`` (only meaningful when the named
parameters have these values; a list names the values allowed: :func:`condition_holds`) and
``doc``. :func:`make_plan` accepts every value in these ranges (and raises ``ValueError`` naming the parameter outside them); with all
defaults ``tuned`` gives the same plan as ``balanced``.
"""

def condition_holds(condition: Mapping[str, Any] | None, params: Mapping[str, Any]) -> bool:
    """Whether ``params`` meet a :data:`TUNED_PARAM_SPACE` entry's ``condition``: every named parameter has the
    value given, or one of the values of a list (``{"num_stages": [3, 4]}``)."""
    for k, want in (condition or {}).items():
        got = params.get(k)
        if isinstance(want, (list, tuple)):
            if got not in want:
                return False
        elif got != want:
            return False
    return True


_TUNED_RULE_PARAMS = ("ctas_per_sm", "min_chunk_tokens", "max_splits", "programs_per_sm", "partition", "wave_aware",
                      "item_cost_blocks", "min_piece_blocks", "whole_wave", "whole_wave_heads")



@_register("tuned", _TUNED_RULE_PARAMS)
def _policy_tuned(L: np.ndarray, ctx: PlanContext, params: Mapping[str, Any]):
    """The parametric family of DESIGN.md §4, whose parameters are tuned per bucket.

    ``chunk = roundup(max(min_chunk_tokens, ceil(H_kv * sum(kv_len) / (ctas_per_sm
    * num_SMs))), block_n)``; ``num_splits[b] = clamp(cdiv(kv_len[b], chunk), 1,
    max_splits)``; plus the knobs ``block_n``, ``num_warps``, ``num_stages``,
    ``order``, ``schedule``, ``programs_per_sm`` / ``num_programs`` and
    ``pack_tokens`` (DESIGN.md §7). With ``wave_aware`` (default) the chunk is
    :func:`wave_aware_chunk`'s for ``wave_target(ctas_per_sm)`` tiles (as ``balanced``:
    ``floor(ctas_per_sm * num_SMs)`` cut to whole resident waves) and at least
    ``min_chunk_tokens``. ``partition="stream_k"`` uses
    :func:`stream_k_work` instead (``ctas_per_sm``, ``item_cost_blocks``,
    ``min_piece_blocks``, ``order``). ``whole_wave`` (default off): :func:`whole_wave_config`'s
    one tile per request where it applies. Ranges and defaults: :data:`TUNED_PARAM_SPACE`.
    """
    sp = TUNED_PARAM_SPACE
    target = _num("ctas_per_sm", params.get("ctas_per_sm", sp["ctas_per_sm"]["default"]),
                  sp["ctas_per_sm"]["low"], sp["ctas_per_sm"]["high"])
    min_chunk = _pos_int("params.min_chunk_tokens", params.get("min_chunk_tokens", sp["min_chunk_tokens"]["default"]),
                         sp["min_chunk_tokens"]["low"], sp["min_chunk_tokens"]["high"])
    max_splits = _pos_int("params.max_splits", params.get("max_splits", sp["max_splits"]["default"]),
                          sp["max_splits"]["low"], sp["max_splits"]["high"])
    pps = _pos_int("params.programs_per_sm", params.get("programs_per_sm", sp["programs_per_sm"]["default"]),
                   sp["programs_per_sm"]["low"], sp["programs_per_sm"]["high"])
    if "programs_per_sm" in params and params.get("schedule", "grid") != "persistent":
        raise ValueError("params.programs_per_sm: only meaningful with schedule='persistent'")
    partition = params.get("partition", sp["partition"]["default"])
    if partition not in sp["partition"]["choices"]:
        raise ValueError(f"params.partition: expected one of {sp['partition']['choices']}, got {partition!r}")
    wave_aware = params.get("wave_aware", sp["wave_aware"]["default"])
    if not isinstance(wave_aware, (bool, np.bool_)):
        raise ValueError(f"params.wave_aware: expected a boolean, got {wave_aware!r}")
    S = ctx.device.num_sms
    cfg, order, pack = _knobs(params, ctx, sp["order"]["default"], default_programs=pps * S)
    if partition == "stream_k":
        for name in ("min_chunk_tokens", "max_splits", "pack_tokens"):
            if params.get(name):
                raise ValueError(f"params.{name}: not used with partition='stream_k'")
        _, o, mp = _stream_k_params(params, TUNED_PARAM_SPACE)
    else:
        for name in ("item_cost_blocks", "min_piece_blocks"):
            if name in params:
                raise ValueError(f"params.{name}: only used with partition='stream_k'")
    ww = _whole_wave(L, ctx, params)  # after every check: a batch the rule takes validates the same
    if ww is not None:
        return np.ones_like(L, dtype=np.int64), ww, "natural", 0
    if partition == "stream_k":
        perm = np.argsort(-L, kind="stable") if order == "heavy_first" else None
        return stream_k_work(L, tile_heads(ctx, cfg), S, cfg.block_n, target, o, mp, perm), cfg
    if wave_aware:
        tt = wave_target(ctx, cfg, target)
        chunk = wave_aware_chunk(L, tile_heads(ctx, cfg), cfg.block_n, tt, min_chunk, wave_tile_cost(ctx, cfg, tt))
    else:
        total = int(L.sum()) * tile_heads(ctx, cfg)
        fair = cdiv(total, max(1, int(math.ceil(target * S))))
        chunk = cdiv(max(fair, min_chunk, 1), cfg.block_n) * cfg.block_n
    return np.clip(-(-L // chunk), 1, max_splits), cfg, order, pack



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
    if _fastplan.ENABLED:  # the compiled core (kernels/fastplan.py); None where it does not apply
        fast = _fastplan.make_plan(kv_lens, num_kv_heads=num_kv_heads, device=device, policy=policy, params=params,
                                   head_dim=head_dim, page_size=page_size, dtype=dtype)
        if fast is not None:
            return fast
    return make_plan_reference(kv_lens, num_kv_heads=num_kv_heads, device=device, policy=policy, params=params,
                               head_dim=head_dim, page_size=page_size, dtype=dtype)


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
    """:func:`make_plan` for already-validated data: ``L`` int64 ``[B]`` from
    :func:`~kvsplit.kernels.limits.check_batch_shape`, ``ctx`` a validated shape
    (:meth:`kvsplit.kernels.shape.Shape.plan_context`). Policy and params are checked here."""
    if not isinstance(policy, str) or policy not in POLICIES:
        raise ValueError(f"policy: unknown policy {policy!r}; known: {sorted(POLICIES)}")
    params = dict(params or {})
    allowed = _POLICY_PARAMS[policy]
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise ValueError(f"params: unknown parameters {unknown} for policy {policy!r}; allowed: {list(allowed)}")
    out = POLICIES[policy](L, ctx, params)
    if isinstance(out[0], WorkList):
        (n, req, start, end, cta_indptr), cfg = out
    else:
        num_splits, cfg, order, pack = out
        W = int(np.minimum(np.maximum(num_splits, 1), np.maximum(L, 1)).sum())
        if W > MAX_WORK_ITEMS:
            raise ValueError(f"params: the plan would have {W} work items, above the limit of {MAX_WORK_ITEMS} "
                             f"(fewer splits per request)")
        if isinstance(order, np.ndarray):
            n, req, start, end = build_work_list(L, num_splits, cfg.block_n, "natural", perm=order)
        else:
            n, req, start, end = build_work_list(L, num_splits, cfg.block_n, order)
        cta_indptr = pack_ctas(start, end, pack)
    # The arrays come from build_work_list/pack_ctas, which satisfy the
    # invariants by construction (tests/kernels/test_plan_policies.py checks them for
    # every policy); skipping the O(W) re-check keeps planning in tens of µs.
    return Plan._trusted(
        kv_lens=L,
        num_splits=n,
        work_request=req,
        work_kv_start=start,
        work_kv_end=end,
        cta_indptr=cta_indptr,
        config=cfg,
        policy=policy,
        params=_jsonable(params),
        num_kv_heads=ctx.num_kv_heads,
        head_dim=ctx.head_dim,
        page_size=ctx.page_size,
        dtype=ctx.dtype,
        gpu=ctx.device.name,
    )


