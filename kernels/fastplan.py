"""The host planner: every split rule written once, as plain loops, compiled by numba when it is present and
run as plain Python otherwise (docs/decisions/compiled-planner.md).

The rules: the work list of per-request split counts (:func:`_lay_out`), the wave-aware chunk
(:func:`_wave_aware_chunk`), CTA packing (:func:`_pack`), the stream-K partition (:func:`_stream_k`), the
whole-wave pick (:func:`_whole_wave_pick`), FlashInfer's and FA3's split counts (:func:`_flashinfer_splits`,
:func:`_fa3_splits`), the bucket key's histogram and round(log2) classes (:func:`_hist_units`,
:func:`log2_class`) and the bucket distance scan (:func:`_nearest_within`). They take the arguments of a
:class:`~kvsplit.kernels.rulespec.RuleSpec` (policy parameters are parsed once, by
:func:`~kvsplit.kernels.rulespec.resolve`); nothing about a batch, its plan or its bucket is cached.
tests/kernels/oracle.py restates each rule with NumPy whole-array operations, and
tests/kernels/test_planner_contract.py holds this planner (compiled and plain Python) and the device planner
to it.

- The batch is converted once (:func:`as_kv_lens`: a list becomes an int64 array in one ``np.array`` call, whose
  inferred dtype is the type check; only elements equal to 0 or 1 are looked at again, for bools; an int32 or
  int64 array is used as is) and its range check is fused into the pass that reads it (``kv_lens[i]`` out of
  range raises ``ValueError`` naming it).
- :meth:`kvsplit.kernels.policy_table.PolicyTable.plan` takes one call (:func:`key_plan`) for the bucket key,
  the nearest published bucket (over the table's cumulative histograms, one contiguous array per shape family)
  and the plan with that bucket's spec (an int64 row per candidate, :func:`spec_vector`; the plan pass skips the
  range check the key pass made).
- The loops divide by per-call constants with a multiply and an exact correction (:func:`div`) or a shift
  (``block_n`` is a power of two), not a 64-bit integer division per element.

numba is a dependency, but the planner needs only NumPy: without numba, or with ``KVSPLIT_NUMBA=0`` in the
environment, :data:`ENABLED` is false and the same functions run as Python. :func:`python` switches to the
plain-Python form inside a ``with`` block (tests). Compiled machine code is cached on disk next to this file,
or under ``NUMBA_CACHE_DIR``.
"""

from __future__ import annotations

import contextlib
import math
import os
import types
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from .limits import HIST_UNITS, MAX_BATCH, MAX_KV_LEN, MAX_WORK_ITEMS, NUM_BINS, check_covers_q_len, check_kv_lens
from .peer_policies import FA3_BLOCK_N, FA3_MAX_SPLITS, FA3_PREPARE_CTA_REQUESTS
from .rulespec import (
    RULE_CONST,
    RULE_FAIR,
    RULE_WAVE,
    RULE_WAVE1,
    RULE_WAVE2,
    WHOLE_WAVE_MAX_WAVES,
    RuleSpec,
    resolve,
)
from .workplan import Plan

try:  # pragma: no branch
    if os.environ.get("KVSPLIT_NUMBA", "1") == "0":
        raise ImportError("disabled by KVSPLIT_NUMBA=0")
    import numba
    from numba.cpython.unsafe.numbers import leading_zeros

    def _jit(fn):
        return numba.njit(cache=True, nogil=True)(fn)

    def _jit_inline(fn):
        return numba.njit(cache=True, nogil=True, inline="always")(fn)

    HAVE_NUMBA = True
except ImportError:  # pragma: no cover - exercised where numba is missing
    numba = None
    HAVE_NUMBA = False

    def _jit(fn):
        return fn

    def leading_zeros(x):  # the compiled functions' plain-Python form (unused while ENABLED is false)
        return 64 - int(x).bit_length()

    _jit_inline = _jit

ENABLED = HAVE_NUMBA
"""Whether the rules run compiled (numba present and not disabled by ``KVSPLIT_NUMBA=0``)."""


__all__ = ["ENABLED", "HAVE_NUMBA", "python", "as_kv_lens", "plan_with_spec", "hist_units", "key_plan", "warmup"]


# ----------------------------------------------------------------------------
# Compiled core (plain loops; each function is the loop form of the NumPy
# function it names, with the same integer and float operations)
# ----------------------------------------------------------------------------

_MAXLEN = np.int64(MAX_KV_LEN)
_MAX_ITEMS = np.int64(MAX_WORK_ITEMS)
_UNITS = HIST_UNITS
_NBINS = NUM_BINS

# rule codes of _even_chunks (RuleSpec.chunk_rule)
_CONST, _WAVE, _FAIR, _WAVE1, _WAVE2 = RULE_CONST, RULE_WAVE, RULE_FAIR, RULE_WAVE1, RULE_WAVE2


@_jit
def _check_lens(L, check):
    """int64 copy of ``L``, first out-of-range index (-1 if none, or not ``check``), sum, max."""
    B = L.shape[0]
    out = np.empty(B, np.int64)
    bad = -1
    total = 0
    lmax = 0
    for i in range(B):
        v = np.int64(L[i])
        if check and (v < 0 or v > _MAXLEN) and bad < 0:
            bad = i
        out[i] = v
        total += v
        if v > lmax:
            lmax = v
    return out, bad, total, lmax


@_jit
def _min_value(L):
    m = np.int64(L[0])
    for i in range(1, L.shape[0]):
        if L[i] < m:
            m = np.int64(L[i])
    return m


@_jit_inline
def div(a, d, inv):
    """``a // d`` for ``0 <= a < 2^51``, ``d >= 1``, ``inv = 1.0 / d``: a multiply
    and an exact correction instead of a 64-bit integer division (the planner's
    loops divide by a per-call constant; the division dominated their time)."""
    q = np.int64(a * inv)  # within 1 of a / d for a < 2^51: one correction each way
    if q * d > a:
        q -= 1
    elif (q + 1) * d <= a:
        q += 1
    return q


@_jit_inline
def _item_count(s, kv_len):
    """The work list's clamp of a request's split count ``s``: ``1 <= n <= max(kv_len, 1)``, so no item is
    empty."""
    cap = kv_len if kv_len > 1 else 1
    if s > cap:
        s = cap
    if s < 1:
        s = 1
    return s


@_jit
def log2_exact(d):
    """``k`` with ``2^k == d``, or -1 when ``d`` is not a power of two."""
    k = 0
    while (np.int64(1) << k) < d and k < 62:
        k += 1
    return k if (np.int64(1) << k) == d else -1


@_jit_inline
def blocks(x, block_n, sh, inv):
    """``ceil(x / block_n)``: a shift when block_n is ``2^sh`` (every BLOCK_N_CHOICES), else :func:`div`."""
    if sh >= 0:
        return (x + block_n - 1) >> sh
    return div(x + block_n - 1, block_n, inv)


@_jit
def _tiles(L, chunk):
    s = 0
    inv = 1.0 / chunk
    for i in range(L.shape[0]):
        t = div(L[i] + chunk - 1, chunk, inv)
        s += t if t > 1 else 1
    return s


@_jit
def _wave_aware_chunk(L, total, lmax, H, block_n, target, min_chunk, tile_cost):
    """The chunk (tokens, a multiple of ``block_n``) of an even-chunk split for ``target`` work tiles
    (``total``, ``lmax``: the batch's sum and maximum; ``H``: work tiles per work item).

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
    (:func:`kvsplit.kernels.rulespec.wave_tile_cost`: one ``block_n`` block, its q load and output or
    partial write, as ``stream_k``'s ``item_cost_blocks`` default, when the target
    is one resident wave), so a tie goes to fewer tiles: one tile per request of
    a near-even batch, not two waves of halves and a merge (measured on the
    H200, B = 128 of ~2,572 tokens, H_kv 4, BLOCK_N 64: 1.248x the floor split in
    two; docs/decisions/flat-work-list.md).
    (Growing the chunk is wrong when few tiles are left for the long requests,
    e.g. B = 128 at H_kv = 4 leaves 16 of 528 tiles: measured 6-11x the floor.)
    """
    tot = total * H
    c = (tot + target - 1) // target
    c = max(c, block_n, min_chunk)
    chunk0 = (c + block_n - 1) // block_n * block_n
    B = L.shape[0]
    tiles0 = H * _tiles(L, chunk0)
    if H * B > target or tiles0 <= target:
        return chunk0
    lo = chunk0 // block_n
    hi = max((lmax + block_n - 1) // block_n, lo)
    limit = target // H
    while lo < hi:
        mid = (lo + hi) // 2
        if _tiles(L, mid * block_n) > limit:
            lo = mid + 1
        else:
            hi = mid
    chunk_fit = lo * block_n
    if tiles0 > 2 * target:
        return chunk0
    sizes = np.empty(tiles0, np.float64)
    k = 0
    for i in range(B):
        n = (L[i] + chunk0 - 1) // chunk0
        if n < 1:
            n = 1
        s = L[i] / n + tile_cost
        for _ in range(n * H):
            sizes[k] = s
            k += 1
    first = np.sort(sizes[:target])
    est0 = first[-1]
    for j in range(tiles0 - target):
        v = first[j] + sizes[target + j]
        if v > est0:
            est0 = v
    if tile_cost == 0:
        return chunk_fit if chunk_fit <= est0 else chunk0
    est_fit = 0.0
    for i in range(B):
        n = (L[i] + chunk_fit - 1) // chunk_fit
        if n < 1:
            n = 1
        v = L[i] / n
        if v > est_fit:
            est_fit = v
    return chunk_fit if est_fit + tile_cost <= est0 else chunk0


@_jit
def _heavy_first(L):
    return np.argsort(-L, kind="mergesort")


@_jit
def _pack(start, end, pack, out):
    """``cta_indptr`` of the work list ``[start, end)`` into ``out`` (>= W + 1 entries); returns the entries
    written.

    An item of fewer than ``pack_tokens`` tokens shares its CTA with its short
    neighbours in launch order until their running token count crosses a
    multiple of ``pack_tokens``; longer items get a CTA each. ``pack_tokens=0``
    gives one item per CTA. (The lever of docs/concepts/design.md §7: thousands of tiny tiles
    each pay a fixed per-CTA cost.)
    """
    W = start.shape[0]
    if pack <= 0 or W <= 1:
        for i in range(W + 1):
            out[i] = i
        return W + 1
    c = 0
    cum = 0
    prev_short = False
    prev_bucket = -1
    inv = 1.0 / pack
    for i in range(W):
        length = end[i] - start[i]
        short = length < pack
        bucket = div(cum, pack, inv)
        if i == 0 or not short or not prev_short or bucket != prev_bucket:
            out[c] = i
            c += 1
        if short:
            cum += length
        prev_short = short
        prev_bucket = bucket
    out[c] = W
    return c + 1


@_jit
def _even_chunks(L_in, H, block_n, rule, arg, min_chunk, max_splits, heavy_first, pack, max_items, check):
    """Validate (``check``), split (rule), lay out the work list (:func:`_lay_out`) and pack CTAs.

    rule _CONST: num_splits = arg; _WAVE / _WAVE1 / _WAVE2: chunk = wave_aware_chunk(target=arg,
    min_chunk, tile_cost 0 / block_n / 2 * block_n); _FAIR: chunk = roundup(max(cdiv(H*sum, arg), min_chunk, 1), block_n).
    Returns (status, info, W, NC, b64, b32): b64 = [kv_lens (B) | start (W) | end (W)],
    b32 = [num_splits (B) | work_request (W) | cta_indptr (NC) | spare] (two
    buffers: boxing each returned array costs about a microsecond); status 1:
    kv_lens[info] out of range, 2: info work items above max_items.
    """
    L, bad, total, lmax = _check_lens(L_in, check)
    B = L.shape[0]
    if bad >= 0:
        return 1, bad, 0, 0, L, np.empty(0, np.int32)
    if rule == _WAVE or rule == _WAVE1 or rule == _WAVE2:
        tile_cost = block_n if rule == _WAVE1 else (2 * block_n if rule == _WAVE2 else 0)
        chunk = _wave_aware_chunk(L, total, lmax, H, block_n, arg, min_chunk, tile_cost)
    elif rule == _FAIR:
        fair = (total * H + arg - 1) // arg
        chunk = (max(fair, min_chunk, 1) + block_n - 1) // block_n * block_n
    else:
        chunk = 0
    n = np.empty(B, np.int64)
    W = 0
    inv = 1.0 / chunk if chunk > 0 else 0.0
    for i in range(B):
        if rule == _CONST:
            s = arg
        else:
            s = div(L[i] + chunk - 1, chunk, inv)
            if s < 1:
                s = 1
            if s > max_splits:
                s = max_splits
        s = _item_count(s, L[i])
        n[i] = s
        W += s
    if W > max_items:
        return 2, W, 0, 0, L, np.empty(0, np.int32)
    perm = _heavy_first(L) if heavy_first else np.arange(B)
    nc, b64, b32 = _lay_out(L, n, W, perm, block_n, pack)
    return 0, 0, W, nc, b64, b32


@_jit
def _lay_out(L, n, W, perm, block_n, pack):
    """The work list of per-request split counts ``n`` (clamped, summing to ``W``) in the order ``perm``:
    each request's items spread evenly, on ``block_n`` boundaries where it has at least as many blocks as
    splits (``start_j = block_n * floor(j * blocks / n)``, as FlashAttention-3's ``get_n_block_min_max``
    spreads blocks), else on token boundaries ``floor(j * kv_len / n)``; then the CTA packing.
    Returns (NC, b64, b32) as :func:`_even_chunks`."""
    B = L.shape[0]
    b64 = np.empty(B + 2 * W, np.int64)
    b32 = np.empty(B + 2 * W + 1, np.int32)
    b64[:B] = L
    start = b64[B : B + W]
    end = b64[B + W :]
    req = b32[B : B + W]
    k = 0
    inv_bn = 1.0 / block_n
    sh = log2_exact(block_n)
    for ii in range(B):
        b = perm[ii]
        Lb = L[b]
        nb = n[b]
        tiles = blocks(Lb, block_n, sh, inv_bn)
        aligned = tiles >= nb
        # item j covers [floor(j * x / nb), floor((j + 1) * x / nb)) of x = tiles
        # (times block_n, clipped to Lb) or x = Lb: the floors are walked with
        # x = q * nb + r (one division per request, none per item)
        x = tiles if aligned else Lb
        q = x // nb
        r = x - q * nb
        f = 0  # floor(j * x / nb)
        acc = 0  # (j * r) % nb
        for _j in range(nb):
            f1 = f + q
            acc += r
            if acc >= nb:
                acc -= nb
                f1 += 1
            req[k] = b
            if aligned:
                start[k] = block_n * f
                e = block_n * f1
                end[k] = e if e < Lb else Lb
            else:
                start[k] = f
                end[k] = f1
            f = f1
            k += 1
    for i in range(B):
        b32[i] = n[i]
    nc = _pack(start, end, pack, b32[B + W :])
    return nc, b64, b32


@_jit
def _chunk_count(pages, c):
    """``sum_b cdiv(max(pages_b, 1), c)``."""
    s = 0
    for i in range(pages.shape[0]):
        p = pages[i] if pages[i] > 1 else 1
        s += (p + c - 1) // c
    return s


@_jit
def _smallest_chunk(pages, total, lo, hi, limit):
    """Smallest ``c`` in ``[lo, hi]`` with ``sum_b cdiv(max(pages_b, 1), c) <= limit`` (``total`` the sum of
    ``max(pages_b, 1)``): FlashInfer's binary search (``PartitionPagedKVCacheBinarySearchMinNumPagePerBatch``,
    ``PrefillBinarySearchKVChunkSize``), ``hi`` when no chunk fits, ``lo`` when ``lo >= hi``. The bracket is
    first narrowed with exact bounds on the count (``total / c <= count(c) <= total / c + B``), which does not
    change the result."""
    low = lo
    high = hi
    if low >= high:
        return low
    if limit < 1:
        return hi
    B = pages.shape[0]
    c0 = (total + limit - 1) // limit  # any c below total / limit has more chunks than limit
    low = max(low, min(high, c0))
    if limit > B:
        high = min(high, max(low, (total + limit - B - 1) // (limit - B)))
    while low < high:
        mid = (low + high) // 2
        if _chunk_count(pages, mid) > limit:
            low = mid + 1
        else:
            high = mid
    return low


@_jit
def _flashinfer_splits(L, page_size, H, tensor_cores, max_grid):
    """FlashInfer's split counts (:func:`kvsplit.kernels.peer_policies.flashinfer_decode_occupancy` gives the
    CUDA-core path's grid bound): the chunk ``c`` in pages is the smallest in ``[max(128 / page_size, 1),
    max_pages]`` with ``sum_b cdiv(max(pages_b, 1), c) <= max_grid / H_kv``; split-KV is on iff ``c <
    max_pages`` (tensor cores) or iff that makes more chunks than requests (CUDA cores, and only when ``B * H_kv
    < max_grid``). With split-KV on ``num_splits[b] = cdiv(max(pages_b, 1), c)``, else 1. Restates
    ``scheduler.cuh::PrefillPlanImpl`` and ``BatchDecodeWithPagedKVCacheWorkEstimationDispatched`` (docs/concepts/prior-art.md
    §1a/§1b)."""
    B = L.shape[0]
    pages = np.empty(B, np.int64)
    max_pages = 0
    total = 0
    for i in range(B):
        p = (L[i] + page_size - 1) // page_size
        pages[i] = p
        if p > max_pages:
            max_pages = p
        total += p if p > 1 else 1
    lo = max(128 // page_size, 1)
    n = np.ones(B, np.int64)
    if tensor_cores:
        c = _smallest_chunk(pages, total, lo, max_pages, max_grid // H)
        split = c < max_pages
    elif B * H >= max_grid:
        return n
    else:
        c = _smallest_chunk(pages, total, lo, max_pages, max_grid // H)
        split = _chunk_count(pages, c) != B
    if split:
        for i in range(B):
            p = pages[i] if pages[i] > 1 else 1
            n[i] = (p + c - 1) // c
    return n


@_jit
def _fa3_static(H, num_n_blocks, S):
    """FA3's static split cap (:func:`kvsplit.kernels.peer_policies.fa3_static_num_splits`'s rule): 1 when
    ``H_kv >= 0.8 * S`` or ``num_n_blocks <= 4``; else the smallest ``s <= min(128, S, num_n_blocks)`` whose
    wave efficiency ``w / ceil(w)`` (``w = H_kv * s / S``) is at least 0.85 times the best."""
    if H >= 0.8 * S or num_n_blocks <= 4:
        return 1
    max_s = min(FA3_MAX_SPLITS, S, num_n_blocks)
    best = 0.0
    for s in range(1, max_s + 1):
        w = H * float(s) / S
        e = w / math.ceil(w)
        if e > best:
            best = e
    for s in range(1, max_s + 1):
        w = H * float(s) / S
        if w / math.ceil(w) >= 0.85 * best:
            return s
    return max_s


@_jit
def _fa3_splits(L, H, S, static_splits, heavy_first):
    """FA3's varlen split counts and launch order (``prepare_varlen_num_blocks_kernel``, docs/concepts/prior-art.md §2b):
    ``n_b = cdiv(kv_len, 128)``, ``blocks_per_sm = cdiv(11 * H_kv * sum(n_b), 10 * S)``, ``num_splits =
    clamp(cdiv(n_b, blocks_per_sm), 1, static)`` (1 above 992 requests or with a static cap of 1); heaviest
    ``cdiv(n_b, num_splits)`` first, stably, within each group of 992 requests."""
    B = L.shape[0]
    nb = np.empty(B, np.int64)
    total = 0
    nmax = 0
    for i in range(B):
        x = (L[i] + FA3_BLOCK_N - 1) // FA3_BLOCK_N
        nb[i] = x
        total += x
        if x > nmax:
            nmax = x
    static = static_splits if static_splits > 0 else _fa3_static(H, nmax, S)
    n = np.ones(B, np.int64)
    if B <= FA3_PREPARE_CTA_REQUESTS and static != 1:
        bps = max(1, (total * 11 * H + 10 * S - 1) // (10 * S))
        for i in range(B):
            s = (nb[i] + bps - 1) // bps
            n[i] = min(max(s, 1), static)
    if not heavy_first:
        return n, np.arange(B)
    key = np.empty(B, np.int64)
    for i in range(B):
        key[i] = -((nb[i] + n[i] - 1) // n[i])
    perm = np.empty(B, np.int64)
    for c0 in range(0, B, FA3_PREPARE_CTA_REQUESTS):
        c1 = min(B, c0 + FA3_PREPARE_CTA_REQUESTS)
        part = np.argsort(key[c0:c1], kind="mergesort")
        for i in range(c1 - c0):
            perm[c0 + i] = c0 + part[i]
    return n, perm


@_jit
def _peer_chunks(
    L_in, H, block_n, kind, page_size, tensor_cores, max_grid, S, static_splits, heavy_first, pack, max_items, check
):
    """Validate (``check``), the peers' split counts (kind 0: FlashInfer, 1: FA3), the work list and the CTA
    packing (same return as :func:`_even_chunks`)."""
    L, bad, total, lmax = _check_lens(L_in, check)
    B = L.shape[0]
    if bad >= 0:
        return 1, bad, 0, 0, L, np.empty(0, np.int32)
    if kind == 0:
        n = _flashinfer_splits(L, page_size, H, tensor_cores, max_grid)
        perm = _heavy_first(L) if heavy_first else np.arange(B)
    else:
        n, perm = _fa3_splits(L, H, S, static_splits, heavy_first)
    W = 0
    for i in range(B):
        s = _item_count(n[i], L[i])
        n[i] = s
        W += s
    if W > max_items:
        return 2, W, 0, 0, L, np.empty(0, np.int32)
    nc, b64, b32 = _lay_out(L, n, W, perm, block_n, pack)
    return 0, 0, W, nc, b64, b32


@_jit
def _stream_k(L_in, H, C, block_n, o, mp, heavy_first, check):
    """Validate (``check``), then the stream-K partition over ``C`` CTAs per group of KV heads (same return as
    :func:`_even_chunks`).

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

    A request's kept cuts are the multiples of ``share`` in ``[lo + m0, hi - m0]``
    (``m0 = max(min_piece_blocks, 1)``), so they are listed with a few :func:`div`
    per request, no search. One pass: the buffers are sized for the most items
    there can be (every cut is a multiple of share below the total cost, so at
    most C - 1 of them, and at most one per block) and compacted at the end.
    """
    L, bad, total, lmax = _check_lens(L_in, check)
    B = L.shape[0]
    if bad >= 0:
        return 1, bad, 0, 0, L, np.empty(0, np.int32)
    order = _heavy_first(L) if heavy_first else np.arange(B)
    inv_bn = 1.0 / block_n
    sh = log2_exact(block_n)
    sum_nb = 0
    for i in range(B):
        sum_nb += blocks(L[i], block_n, sh, inv_bn)
    total_cost = sum_nb + o * B
    share = (total_cost + C - 1) // C
    if share < 1:
        share = 1
    inv = 1.0 / share
    m0 = mp if mp > 1 else 1
    WM = B + min(C - 1, sum_nb)  # at least W
    b64 = np.empty(B + 2 * WM, np.int64)
    b32 = np.empty(B + 2 * WM + 1, np.int32)
    b64[:B] = L
    start = b64[B : B + WM]
    end = b64[B + WM :]
    num_splits = b32[:B]
    req = b32[B : B + WM]
    cta_start = b32[B + WM :]
    nc = 0
    prev_cta = -1
    w = 0
    P = 0
    for i in range(B):
        b = order[i]
        Lb = L[b]
        nb = blocks(Lb, block_n, sh, inv_bn)
        lo = P + o
        hi = lo + nb
        # the first kept cut (a multiple of share at or after lo + m0) and the last allowed position
        m = (div(lo + m0 - 1, share, inv) + 1) * share
        m_end = hi - m0
        prev = 0
        j = 0
        while True:
            if m <= m_end:
                eb = m - lo
                m += share
            else:
                eb = nb
            req[w] = b
            s = prev * block_n
            e = eb * block_n
            start[w] = s if s < Lb else Lb
            end[w] = e if e < Lb else Lb
            pos = lo + prev
            if j == 0:  # push = min(mp - 1, max(nb - 1, 0))
                push = nb - 1 if nb > 1 else 0
                if mp - 1 < push:
                    push = mp - 1
                pos += push
            c = div(pos, share, inv)
            if c > C - 1:
                c = C - 1
            # a new CTA starts here when c changes: the slot is written either way
            # and kept only then (a select, not a mispredicted branch)
            cta_start[nc] = w
            nc += 1 if c != prev_cta else 0
            prev_cta = c
            w += 1
            j += 1
            if eb == nb:
                break
            prev = eb
        num_splits[b] = j
        P = hi
    W = w
    cta_start[nc] = W
    if W < WM:  # compact to [kv_lens | start | end] and [num_splits | work_request | cta_indptr]
        b64[B + W : B + 2 * W] = end[:W]
        b32[B + W : B + W + nc + 1] = cta_start[: nc + 1]
        b64 = b64[: B + 2 * W]
    return 0, 0, W, nc + 1, b64, b32


@_jit
def _hist_units(L_in):
    """Validate, then buckets.bucket_key's quantized token-weighted histogram.

    Returns (bad, B, total, q int64 [NUM_BINS]) (q all zero when total == 0).
    ``floor(log2 v)`` is the bit length of ``v`` less one (exact; the reference's
    ``frexp`` is exact below 2^53), and the units left after flooring go to the
    largest remainders, lower bin first on ties: the reference's stable sort of
    the negated remainders, done as a selection (at most HIST_UNITS picks).
    """
    B = L_in.shape[0]
    w = np.zeros(_NBINS, np.int64)
    total = 0
    bad = -1
    for i in range(B):
        v = np.int64(L_in[i])
        if v < 0 or v > _MAXLEN:
            if bad < 0:
                bad = i
            continue
        if v > 0:
            k = 63 - np.int64(leading_zeros(np.uint64(v)))  # floor(log2 v)
            half = 1 if v * v >= (np.int64(1) << (2 * k + 1)) else 0
            w[2 * k + half] += v
            total += v
    q = np.zeros(_NBINS, np.int64)
    if bad >= 0 or total == 0:
        return bad, B, total, q
    scale = _UNITS / float(total)
    rem = np.empty(_NBINS, np.float64)
    got = 0
    for i in range(_NBINS):
        exact = float(w[i]) * scale
        q[i] = np.int64(math.floor(exact))
        got += q[i]
        rem[i] = -(exact - q[i])
    for _ in range(_UNITS - got):  # the smallest -remainder not yet taken, the lowest index on ties
        best = 0
        for i in range(1, _NBINS):
            if rem[i] < rem[best]:
                best = i
        q[best] += 1
        rem[best] = np.inf
    return bad, B, total, q


# smallest x with x * x >= 2^(2k + 1), k = 0..62: round(log2 x) without squaring x
HALF_UP = np.array([math.isqrt((1 << (2 * k + 1)) - 1) + 1 for k in range(63)], dtype=np.int64)


@_jit
def log2_class(x):
    """buckets.log2_class, ``round(log2 x)`` (halves up) for ``1 <= x < 2^53``."""
    k = math.frexp(float(x))[1] - 1  # floor(log2 x), exact below 2^53
    return k + (1 if x >= HALF_UP[k] else 0)


@_jit
def _nearest_within(cum, cls, empty, lo, hi, key_cum, key_b, key_t, key_empty, class_units, lim):
    """First minimum of the scaled distance over rows ``lo:hi`` among those within
    ``lim`` (scaled); (-1, 0) if none. Rows whose class steps alone exceed the
    limit or reach the best so far are skipped without their histogram."""
    best = -1
    best_d = 0
    nb = cum.shape[1]
    for i in range(lo, hi):
        if empty[i] != key_empty:
            continue
        d = class_units * (abs(cls[i, 0] - key_b) + abs(cls[i, 1] - key_t))
        if d > lim or (best >= 0 and d >= best_d):
            continue
        if not key_empty:
            for j in range(nb):
                d += abs(cum[i, j] - key_cum[j])
        if d <= lim and (best < 0 or d < best_d):
            best = i
            best_d = d
    return best, best_d


@_jit
def _put_int(out, n, v):
    """Decimal digits of ``0 <= v < 1000`` into ``out[n:]``; returns the new end."""
    if v >= 100:
        out[n] = 48 + v // 100
        n += 1
    if v >= 10:
        out[n] = 48 + (v // 10) % 10
        n += 1
    out[n] = 48 + v % 10
    return n + 1


@_jit
def _key_nearest(L_in, cum, cls, empty, n_first, class_units, lim):
    """PolicyTable.plan's compiled step: validate the lengths, the bucket key's
    classes and histogram (as ``bucket_key``), and the nearest candidate.

    Candidates are rows of ``cum`` (int64 [n, NUM_BINS], cumulative histograms),
    ``cls`` (int64 [n, 2], batch and tokens class) and ``empty`` (bool [n]);
    rows ``:n_first`` are searched first, rows ``n_first:`` only when none of
    those is within ``lim`` (the scaled distance limit, float). Returns (bad,
    batch_class, tokens_class, w, row, scaled distance): ``bad`` the first
    out-of-range index or -1; ``w`` the ASCII text of the key's ``w`` field
    (uint8); ``row`` -1 when no candidate is within the limit.
    """
    bad, B, total, q = _hist_units(L_in)
    w = np.empty(6 * _UNITS, np.uint8)
    if bad >= 0:
        return bad, 0, 0, w[:0], -1, 0
    bc = log2_class(B)
    key_empty = total == 0
    tc = -1 if key_empty else log2_class(total)
    key_cum = np.empty(_NBINS, np.int64)
    acc = 0
    n = 0
    for j in range(_NBINS):
        u = q[j]
        acc += u
        key_cum[j] = acc
        if u:
            if n:
                w[n] = 45  # "-"
                n += 1
            n = _put_int(w, n, j)
            w[n] = 120  # "x"
            n = _put_int(w, n + 1, u)
    row, d = _nearest_within(cum, cls, empty, 0, n_first, key_cum, bc, tc, key_empty, class_units, lim)
    if row < 0:
        row, d = _nearest_within(cum, cls, empty, n_first, cum.shape[0], key_cum, bc, tc, key_empty, class_units, lim)
    return -1, bc, tc, w[:n], row, d


# a parsed spec as one int64 row for key_plan: state (0 not parsed yet, 1 compiled, 2 a policy the
# compiled core does not plan), kind (0 _even_chunks, 1 _stream_k), then the rule's arguments
(
    SV_STATE,
    SV_KIND,
    SV_H,
    SV_BLOCK_N,
    SV_RULE,
    SV_ARG,
    SV_MIN_CHUNK,
    SV_MAX_SPLITS,
    SV_HEAVY,
    SV_PACK,
    SV_C,
    SV_O,
    SV_MP,
    SV_PEER,
    SV_PAGE,
    SV_TC,
    SV_GRID,
    SV_S,
    SV_STATIC,
) = range(19)
SV_LEN = 19


@_jit
def _key_text(prefix, bc, tc, w):
    """The bucket key's string form as ASCII: ``{prefix}.b{bc}.t{tc}.w{w}`` (``0 <= bc < 1000``,
    ``-1000 < tc < 1000``)."""
    out = np.empty(prefix.shape[0] + w.shape[0] + 14, np.uint8)
    n = prefix.shape[0]
    out[:n] = prefix
    out[n] = 46  # ".b"
    out[n + 1] = 98
    n = _put_int(out, n + 2, bc)
    out[n] = 46  # ".t"
    out[n + 1] = 116
    n += 2
    if tc < 0:
        out[n] = 45  # "-"
        n += 1
    n = _put_int(out, n, abs(tc))
    out[n] = 46  # ".w"
    out[n + 1] = 119
    n += 2
    out[n : n + w.shape[0]] = w
    return out[: n + w.shape[0]]


@_jit
def _key_plan(L_in, cum, cls, empty, n_first, class_units, lim, specs, prefix):
    """:func:`_key_nearest` then the plan with the matched row's spec (``specs[row]``, the last row
    for the fallback), one compiled call (PolicyTable.plan's core).

    Returns (status, info, key, row, scaled, W, nc, b64, b32): status 0 and the plan's buffers
    (:func:`run_spec`); 1: kv_lens[info] out of range; 2: info work items above MAX_WORK_ITEMS;
    3: the row's spec is not parsed yet or not compiled (no plan made). ``key`` is the bucket key's
    text (:func:`_key_text` with the family's ``prefix``, ASCII) unless status is 1.
    """
    bad, bc, tc, w, row, d = _key_nearest(L_in, cum, cls, empty, n_first, class_units, lim)
    if bad >= 0:
        return 1, bad, w, row, d, 0, 0, np.empty(0, np.int64), np.empty(0, np.int32)
    key = _key_text(prefix, bc, tc, w)
    r = row if row >= 0 else specs.shape[0] - 1
    sv = specs[r]
    if sv[SV_STATE] != 1:
        return 3, 0, key, row, d, 0, 0, np.empty(0, np.int64), np.empty(0, np.int32)
    if sv[SV_KIND] == 1:
        status, info, W, nc, b64, b32 = _stream_k(
            L_in, sv[SV_H], sv[SV_C], sv[SV_BLOCK_N], sv[SV_O], sv[SV_MP], sv[SV_HEAVY] != 0, False
        )
    elif sv[SV_KIND] == 2:
        status, info, W, nc, b64, b32 = _peer_chunks(
            L_in,
            sv[SV_H],
            sv[SV_BLOCK_N],
            sv[SV_PEER],
            sv[SV_PAGE],
            sv[SV_TC] != 0,
            sv[SV_GRID],
            sv[SV_S],
            sv[SV_STATIC],
            sv[SV_HEAVY] != 0,
            sv[SV_PACK],
            _MAX_ITEMS,
            False,
        )
    else:
        status, info, W, nc, b64, b32 = _even_chunks(
            L_in,
            sv[SV_H],
            sv[SV_BLOCK_N],
            sv[SV_RULE],
            sv[SV_ARG],
            sv[SV_MIN_CHUNK],
            sv[SV_MAX_SPLITS],
            sv[SV_HEAVY] != 0,
            sv[SV_PACK],
            _MAX_ITEMS,
            False,
        )
    return status, info, key, row, d, W, nc, b64, b32


# ----------------------------------------------------------------------------
# Input conversion (once per call)
# ----------------------------------------------------------------------------


def as_kv_lens(kv_lens: Any) -> np.ndarray:
    """``kv_lens`` as a 1-D int32 or int64 NumPy array, converted once.

    A list or tuple of Python ints becomes int64 in one ``np.array`` call (elements
    that are not integers, bools and NumPy bools included, raise the reference's
    ``ValueError`` naming the index); an
    int32/int64 array is returned as is; anything else goes through the reference
    conversion. The value range (0 <= kv_len <= 2^31-1) is checked by the
    compiled pass that reads the array, not here.
    """
    t = type(kv_lens)
    if t is np.ndarray:
        arr = kv_lens
        if arr.dtype.kind != "i" or arr.dtype.itemsize not in (4, 8):
            return check_kv_lens(arr)
    elif t is list or t is tuple:
        try:
            arr = np.array(kv_lens)
        except (OverflowError, ValueError, TypeError):
            return check_kv_lens(kv_lens)
        # int64 exactly when every element is an int, NumPy integer or bool (the
        # dtype singleton; anything else goes to the reference, which names the element)
        if arr.dtype is not _I64 or arr.ndim != 1 or not 0 < arr.shape[0] <= MAX_BATCH:
            return check_kv_lens(kv_lens)
        # a bool (Python's or NumPy's) among ints converts to 0/1: only then look
        # at the types of the elements that are 0 or 1
        if _min_value(arr) <= 1:
            for i in np.flatnonzero(arr <= 1).tolist():
                v = kv_lens[i]
                if type(v) is not int and (isinstance(v, bool) or not isinstance(v, (int, np.integer))):
                    return check_kv_lens(kv_lens)
        return arr  # a new 1-D C-contiguous array
    else:
        return check_kv_lens(kv_lens)
    if arr.ndim != 1:
        raise ValueError(f"kv_lens: expected a 1-D array, got shape {arr.shape}")
    B = arr.shape[0]
    if B < 1:
        raise ValueError("kv_lens: expected at least one request, got an empty batch")
    if B > MAX_BATCH:
        raise ValueError(f"kv_lens: expected at most {MAX_BATCH} requests, got {B}")
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    return arr


_I64 = np.dtype(np.int64)


def range_error(arr: np.ndarray, i: int) -> ValueError:
    """The ``ValueError`` for ``kv_lens[i]`` outside ``[0, MAX_KV_LEN]`` (the compiled checks return the index)."""
    return ValueError(f"kv_lens[{i}]: expected 0 <= kv_len <= {MAX_KV_LEN}, got {int(arr[i])}")


@_jit
def _whole_wave_pick(L, Ht, eps, slots, max_waves):
    """The whole-wave rule (docs/decisions/whole-wave-rule.md) on the tiles' resident slots ``slots`` and work tiles
    per request ``Ht`` (H_kv / heads_per_tile; int64, in the tiles' order): the index of the chosen tile, or -1
    (the same float64 operations and tie rule)."""
    total = 0
    lmax = 0
    for i in range(L.shape[0]):
        x = np.int64(L[i])
        total += x
        if x > lmax:
            lmax = x
    if eps <= 0.0 or total <= 0:
        return -1
    best = -1
    best_e = 0.0
    for j in range(slots.shape[0]):
        sl = slots[j]
        n = Ht[j] * L.shape[0]
        k = (n + sl - 1) // sl
        if k > max_waves:
            continue
        e = float(k * lmax * sl) / float(Ht[j] * total)
        if e <= 1.0 + eps and (best < 0 or e < best_e):
            best = j
            best_e = e
    return best


# ----------------------------------------------------------------------------
# The core in use: compiled (numba present and KVSPLIT_NUMBA not 0) or the same loops as plain Python
# ----------------------------------------------------------------------------

_ENTRY = {
    "even_chunks": "_even_chunks",
    "stream_k": "_stream_k",
    "peer_chunks": "_peer_chunks",
    "whole_wave_pick": "_whole_wave_pick",
    "hist_units": "_hist_units",
    "key_plan": "_key_plan",
    "nearest_within": "_nearest_within",
    "fa3_static": "_fa3_static",
}


def _entries(ns: Mapping[str, Any]) -> types.SimpleNamespace:
    return types.SimpleNamespace(**{k: ns[v] for k, v in _ENTRY.items()})


def _plain_namespace() -> dict[str, Any]:
    """This module's globals with every compiled function replaced by its plain-Python body, the bodies
    calling one another in the new namespace (numba's ``py_func``; the module's own functions without numba)."""
    ns = dict(globals())
    for name, v in list(ns.items()):
        fn = getattr(v, "py_func", None)
        if fn is not None:
            ns[name] = types.FunctionType(fn.__code__, ns, name, fn.__defaults__, fn.__closure__)
    ns["leading_zeros"] = _py_leading_zeros
    return ns


def _py_leading_zeros(x: Any) -> int:
    return 64 - int(x).bit_length()


_COMPILED_CORE = _entries(globals())
_PLAIN_CORE = _entries(_plain_namespace()) if HAVE_NUMBA else _COMPILED_CORE
_CORE = _COMPILED_CORE if ENABLED else _PLAIN_CORE


@contextlib.contextmanager
def python() -> Iterator[None]:
    """Run the loop-form rules as plain Python inside the ``with`` block (the same code numba compiles)."""
    global _CORE
    old = _CORE
    _CORE = _PLAIN_CORE
    try:
        yield
    finally:
        _CORE = old


def fa3_static_num_splits(num_kv_heads: int, num_n_blocks: int, num_sms: int) -> int:
    """FA3's static split heuristic for a varlen / paged decode batch.

    Restates ``hopper/heuristics.h::num_splits_heuristic`` as called by
    ``hopper/flash_api.cpp::get_num_splits`` (docs/concepts/prior-art.md §2a), with the batch
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
    return int(_CORE.fa3_static(int(num_kv_heads), int(num_n_blocks), int(num_sms)))


def key_plan(
    L_in: np.ndarray,
    cum: np.ndarray,
    cls: np.ndarray,
    empty: np.ndarray,
    n_first: int,
    class_units: int,
    lim: float,
    specs: np.ndarray,
    prefix: np.ndarray,
) -> tuple:
    """:meth:`PolicyTable.plan`'s core in one call: the bucket key, the nearest candidate and the plan with the
    matched row's spec (:func:`_key_plan`)."""
    return _CORE.key_plan(L_in, cum, cls, empty, n_first, class_units, lim, specs, prefix)


# ----------------------------------------------------------------------------
# Parsed policy parameters (memoized per policy, params, shape and device)
# ----------------------------------------------------------------------------


_SHAPES: dict[tuple, tuple] = {}
_MEMO_MAX = 512


def _device_key(device: Any) -> Any:
    return device if type(device) is str else id(device)


def whole_wave_spec(arr: np.ndarray, sp: RuleSpec) -> RuleSpec:
    """The spec that plans ``arr`` under ``sp``: ``sp`` itself, or the whole-request spec of the tile the
    whole-wave rule picks."""
    if not sp.whole_wave_specs:
        return sp
    j = _CORE.whole_wave_pick(arr, sp.whole_wave_tile_heads, sp.whole_wave, sp.whole_wave_slots, WHOLE_WAVE_MAX_WAVES)
    return sp if j < 0 else sp.whole_wave_specs[j]


# ----------------------------------------------------------------------------
# Entry points
# ----------------------------------------------------------------------------

_new = object.__new__


def spec_vector(sp: RuleSpec, out: np.ndarray) -> None:
    """Write a parsed spec into its :func:`key_plan` row ``out`` (int64 [SV_LEN]); None: a policy the
    compiled core does not plan."""
    out[:] = 0
    out[SV_H], out[SV_BLOCK_N], out[SV_HEAVY] = sp.tile_heads, sp.config.block_n, int(sp.heavy_first)
    if sp.partition == "stream_k":
        out[SV_KIND], out[SV_C], out[SV_O], out[SV_MP] = 1, sp.ctas, sp.item_cost_blocks, sp.min_piece_blocks
    elif sp.partition != "even_chunks":
        out[SV_KIND], out[SV_H], out[SV_PACK] = 2, sp.num_kv_heads, sp.pack_tokens
        out[SV_PEER], out[SV_PAGE], out[SV_TC], out[SV_GRID], out[SV_S], out[SV_STATIC] = (
            0 if sp.partition == "flashinfer" else 1,
            sp.page_size,
            int(sp.tensor_cores),
            sp.max_grid,
            sp.device.num_sms,
            sp.static_splits,
        )
    else:
        out[SV_RULE], out[SV_ARG], out[SV_MIN_CHUNK], out[SV_MAX_SPLITS], out[SV_PACK] = (
            sp.chunk_rule,
            sp.chunk_arg,
            sp.min_chunk,
            sp.max_splits,
            sp.pack_tokens,
        )
    out[SV_STATE] = 1  # last: a row is used only once complete


def too_many_items(n: int) -> ValueError:
    """The ``ValueError`` for a plan of ``n`` work items, above ``MAX_WORK_ITEMS`` (names ``params``)."""
    return ValueError(
        f"params: the plan would have {n} work items, above the limit of {MAX_WORK_ITEMS} (fewer splits per request)"
    )


def run_spec(arr: np.ndarray, sp: RuleSpec, check: bool) -> tuple[int, int, np.ndarray, np.ndarray]:
    """The compiled plan of ``arr`` (from :func:`as_kv_lens`) with a parsed spec (:func:`spec`) as
    ``(W, nc, b64, b32)``: ``b64 = [kv_lens (B) | work_kv_start (W) | work_kv_end (W)]`` (int64),
    ``b32 = [num_splits (B) | work_request (W) | cta_indptr (nc) | ...]`` (int32), the arrays of
    :func:`plan_with_spec`'s Plan. ``check=False`` skips the range check of lengths an earlier compiled
    pass checked. Raises the reference's ValueError (a length out of range, too many work items)."""
    part = sp.partition
    if part == "stream_k":
        status, info, W, nc, b64, b32 = _CORE.stream_k(
            arr,
            sp.tile_heads,
            sp.ctas,
            sp.config.block_n,
            sp.item_cost_blocks,
            sp.min_piece_blocks,
            sp.heavy_first,
            check,
        )
    elif part != "even_chunks":
        status, info, W, nc, b64, b32 = _CORE.peer_chunks(
            arr,
            sp.num_kv_heads,
            sp.config.block_n,
            0 if part == "flashinfer" else 1,
            sp.page_size,
            sp.tensor_cores,
            sp.max_grid,
            sp.device.num_sms,
            sp.static_splits,
            sp.heavy_first,
            sp.pack_tokens,
            _MAX_ITEMS,
            check,
        )
    else:
        status, info, W, nc, b64, b32 = _CORE.even_chunks(
            arr,
            sp.tile_heads,
            sp.config.block_n,
            sp.chunk_rule,
            sp.chunk_arg,
            sp.min_chunk,
            sp.max_splits,
            sp.heavy_first,
            sp.pack_tokens,
            _MAX_ITEMS,
            check,
        )
    if status:
        if status == 1:
            raise range_error(arr, info)
        raise too_many_items(info)
    return W, nc, b64, b32


def plan_with_spec(arr: np.ndarray, sp: RuleSpec, check: bool) -> Plan:
    """The plan of ``arr`` (from :func:`as_kv_lens`) with a parsed spec (:func:`spec`);
    ``check=False`` skips the range check of lengths an earlier compiled pass checked (and, at q_len > 1,
    :func:`~kvsplit.kernels.limits.check_covers_q_len`)."""
    sp = whole_wave_spec(arr, sp)
    W, nc, b64, b32 = run_spec(arr, sp, check)
    if check and sp.q_len > 1:  # (after the range check of run_spec)
        check_covers_q_len(arr, sp.q_len)
    return plan_of_buffers(arr.shape[0], W, nc, b64, b32, sp)


def plan_of_buffers(B: int, W: int, nc: int, b64: np.ndarray, b32: np.ndarray, sp: RuleSpec) -> Plan:
    """The Plan of the compiled planner's buffers (:func:`run_spec`) for the spec ``sp`` (read-only views)."""
    b64.setflags(write=False)  # (cheaper than .flags.writeable = False)
    b32.setflags(write=False)
    L, start, end = b64[:B], b64[B : B + W], b64[B + W :]
    n, req, cta = b32[:B], b32[B : B + W], b32[B + W : B + W + nc]
    plan = _new(Plan)
    d = plan.__dict__
    d.update(sp.fields)
    d.update(
        kv_lens=L,
        num_splits=n,
        work_request=req,
        work_kv_start=start,
        work_kv_end=end,
        cta_indptr=cta,
        params=dict(sp.params),
        _cache={},
    )
    return plan


def hist_units(arr: np.ndarray) -> tuple:
    """The bucket key's histogram of ``arr`` (from :func:`as_kv_lens`): ``(bad, B, total, q)``, ``bad`` the
    first out-of-range index or -1, ``q`` int64 ``[NUM_BINS]`` (:func:`_hist_units`)."""
    return _CORE.hist_units(arr)


def nearest_scaled(
    cum: np.ndarray,
    cls: np.ndarray,
    empty: np.ndarray,
    key_cum: np.ndarray,
    key_b: int,
    key_t: int,
    key_empty: bool,
    class_units: int,
) -> tuple[int, int]:
    """Index of the first candidate row at the smallest scaled distance from the key and that distance
    (``distance * HIST_UNITS * BINS_PER_OCTAVE``, an integer; :func:`kvsplit.kernels.buckets.distance`), or
    ``(-1, 0)`` when every candidate is infinitely far (exactly one of the two histograms empty)."""
    return _CORE.nearest_within(cum, cls, empty, 0, cum.shape[0], key_cum, key_b, key_t, key_empty, class_units, np.inf)


def warmup() -> None:
    """Compile (or load from the on-disk cache) every compiled function once."""
    if not HAVE_NUMBA:
        return
    dev = "NVIDIA H200"
    for dt in (np.int32, np.int64):
        L = np.array([5, 0, 4096, 17], dtype=dt)
        for pol, params in (
            ("balanced", {}),
            ("stream_k", {}),
            ("tuned", {"order": "heavy_first", "pack_tokens": 256}),
            ("flashinfer", {}),
            ("fa3", {}),
        ):
            plan_with_spec(L, resolve(pol, params, num_kv_heads=4, device=dev), True)
        hist_units(L)
    as_kv_lens([3, 1, 2])
    for dt in (np.int32, np.int64):
        _whole_wave_pick(
            np.array([2048, 2048], dtype=dt), np.array([4, 4], np.int64), 0.05, np.array([528, 396], np.int64), 2
        )
    z = np.zeros((1, NUM_BINS), np.int64)
    nearest_scaled(z, np.zeros((1, 2), np.int64), np.zeros(1, np.bool_), z[0], 0, 0, False, 16)
    sv = np.zeros((2, SV_LEN), np.int64)
    for dt in (np.int32, np.int64):
        _key_nearest(
            np.array([5, 0, 4096], dtype=dt), z, np.zeros((1, 2), np.int64), np.zeros(1, np.bool_), 1, 16, 80.0
        )
        _key_plan(
            np.array([5, 0, 4096], dtype=dt),
            z,
            np.zeros((1, 2), np.int64),
            np.zeros(1, np.bool_),
            1,
            16,
            80.0,
            sv,
            np.frombuffer(b"gpu.kv1", np.uint8).copy(),
        )
