"""Restated split rules of peer libraries (FlashInfer, FlashAttention-3) as
kvsplit policies, so they run on kvsplit's kernel as baselines. Each rule cites
the source file it restates (docs/concepts/prior-art.md)."""

from __future__ import annotations

from .device import DeviceSpec
from .limits import DTYPES

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
(FlashInfer's CUDA-core decode timed on the H200) puts it.
"""


def flashinfer_decode_occupancy(
    head_dim: int, dtype: str, group_size: int, device: DeviceSpec, *, regs_per_thread: int = FLASHINFER_REGS_PER_THREAD
) -> int:
    """Resident CTAs per SM of FlashInfer's CUDA-core batch-decode kernel.

    Restates the kernel configuration of
    ``include/flashinfer/attention/scheduler.cuh::BatchDecodeWithPagedKVCacheWorkEstimationDispatched``
    (docs/concepts/prior-art.md §1a): ``vec = max(16 / elt, D / 32)``,
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
