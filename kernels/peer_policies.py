"""Restated split rules of peer libraries (FlashInfer, FlashAttention-3) as
kvsplit policies, so they run on kvsplit's kernel as baselines. Each rule cites
the source file it restates (docs/policies.md)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .device import DeviceSpec
from .limits import DTYPES, check_int, cdiv

# ---------------------------------------------------------------------------
# FlashInfer
# ---------------------------------------------------------------------------

FLASHINFER_REGS_PER_THREAD = 64
"""Registers per thread assumed for FlashInfer's CUDA-core decode kernel.

``cudaOccupancyMaxActiveBlocksPerMultiprocessor`` needs the compiled kernel's
register count, which a NumPy planner cannot know. 64 registers per thread
gives 8 resident CTAs per SM for the reference shape (G = 8, D = 128, bf16),
i.e. a capacity of 1,056 CTAs on an H200; that places the CUDA-core path's
threshold between B = 256 and B = 512 at H_kv = 4, where the H200 measurement
(docs/data/anchors/h200_peers.csv, ``flashinfer_decode_notc``) puts it.
"""


def flashinfer_decode_occupancy(
    head_dim: int, dtype: str, group_size: int, device: DeviceSpec, *, regs_per_thread: int = FLASHINFER_REGS_PER_THREAD
) -> int:
    """Resident CTAs per SM of FlashInfer's CUDA-core batch-decode kernel.

    Restates the kernel configuration of
    ``include/flashinfer/attention/scheduler.cuh::BatchDecodeWithPagedKVCacheWorkEstimationDispatched``
    (docs/policies.md §1a): ``vec = max(16 / elt, D / 32)``,
    ``bdx = D / vec``, ``bdy = G``, ``threads = max(128, bdx * bdy)``,
    ``bdz = threads / (bdx * bdy)``, ``tile_per_bdx = 4 if G == 1 else 1``,
    ``stages = 2`` on sm80+ (else 1) and
    ``smem = 2 * stages * tile_per_bdx * bdy * bdz * D * elt
    + max(tile_per_bdx * threads * 8, 2 * bdy * bdz * 4)`` bytes. The occupancy
    query is replaced by the usual limits: threads per SM, shared memory per SM
    (1 KB reserved per CTA), registers (``regs_per_thread``, see
    :data:`FLASHINFER_REGS_PER_THREAD`) and 32 CTAs per SM.

    Parameters
    ----------
    head_dim : int
        D.
    dtype : str
        KV dtype name (``elt`` = its size in bytes).
    group_size : int
        G = H_q / H_kv, >= 1, with ``bdx * G <= 1024`` (one CTA's threads).
    device : DeviceSpec
    regs_per_thread : int

    Returns
    -------
    int
        CTAs per SM, >= 1.

    Raises
    ------
    ValueError
        If ``group_size`` makes one CTA larger than 1,024 threads.
    """
    elt = DTYPES[dtype]
    vec = max(16 // elt, head_dim // 32)
    bdx = max(head_dim // vec, 1)
    bdy = int(group_size)
    if bdx * bdy > 1024:
        raise ValueError(
            f"params.group_size: FlashInfer's decode CTA would need {bdx * bdy} threads (> 1024) "
            f"for group_size={group_size}, head_dim={head_dim}"
        )
    threads = max(128, bdx * bdy)
    bdz = threads // (bdx * bdy)
    tile_per_bdx = 4 if bdy == 1 else 1
    stages = 2 if device.compute_capability >= (8, 0) else 1
    smem = 2 * stages * tile_per_bdx * bdy * bdz * head_dim * elt + max(tile_per_bdx * threads * 8, 2 * bdy * bdz * 4)
    by_threads = device.max_threads_per_sm // threads
    by_smem = device.smem_per_sm_bytes // (smem + 1024)
    by_regs = device.regs_per_sm // (threads * regs_per_thread)
    return max(1, min(by_threads, by_smem, by_regs, 32))


def _smallest_chunk(pages: np.ndarray, lo: int, hi: int, limit: int) -> int:
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


def flashinfer_num_splits(L: np.ndarray, page_size: int, num_kv_heads: int, tensor_cores: bool,
                          max_grid: int) -> np.ndarray:
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
        c = _smallest_chunk(pages, lo, max_pages, max_grid // H)
        split = c < max_pages
    elif L.shape[0] * H >= max_grid:
        split = False
        c = max_pages
    else:
        c = _smallest_chunk(pages, lo, max_pages, max_grid // H)
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


def fa3_num_splits(L: np.ndarray, num_kv_heads: int, num_sms: int, static_splits: int,
                   heavy_first: bool) -> tuple[np.ndarray, np.ndarray | None]:
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
