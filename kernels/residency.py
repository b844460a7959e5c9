"""Resident CTAs per SM of kvsplit's stage-1 decode kernel, per kernel config.

A plan counts its work tiles against *resident slots* (``resident_ctas_per_sm
* num_SMs``): tiles beyond a whole number of resident waves form a partial last
wave that costs as much as a full one (docs/concepts/design.md §8). Residency depends on the
config (registers per thread and shared memory of the compiled kernel), which a
NumPy planner cannot query, so it is data:

- :data:`MEASURED` holds occupancy figures read off the compiled Triton kernel
  on a GPU (``n_regs`` and ``metadata.shared`` of the CompiledKernel, then the
  CUDA occupancy limits below), recorded in
  docs/decisions/register-cap-residency.md.
- :data:`MEASURED_PREFETCH` and :data:`COMPILED` hold the same figures from
  the sm_90 compile on a CPU (Triton's ptxas; it reproduces MEASURED exactly)
  for the prefetching loop and for plain-loop configs MEASURED lacks.
- :func:`estimate` applies the same limits to a register/shared-memory guess
  when a config was not measured.

Occupancy limits (CUDA C Programming Guide, "Compute Capabilities", and the
occupancy calculator's allocation granularities): registers are allocated per
warp in units of 256 (``ceil(regs * 32 / 256) * 256`` per warp); shared memory
per CTA in units of 128 bytes plus 1 KB reserved by the system per CTA; at most
``max_threads_per_sm`` threads and 32 CTAs per SM.
"""

from __future__ import annotations

import math

from .device import DeviceSpec
from .limits import tile_rows

__all__ = [
    "MEASURED",
    "MEASURED_PREFETCH",
    "COMPILED",
    "COMPILED_HEADS",
    "COMPILED_NEXT",
    "NEXT_ITEM_EXTRA_REGS",
    "MEASURED_GROUP",
    "REGISTER_CAPS",
    "register_cap",
    "occupancy",
    "estimate",
    "resident_ctas_per_sm",
    "tile_resources",
    "extra_row_regs",
    "kv_buffer_bytes",
    "COMPILED_QLEN",
    "arch",
    "COMPILED_FP8",
    "padded_rows",
]

MEASURED_GROUP = 8
"""The GQA group G = H_q / H_kv the tables below were read at (Qwen3-30B-A3B's 32/4)."""

# (gpu, head_dim, dtype, block_n, num_warps, num_stages) -> (n_regs, shared bytes), read off the compiled
# stage-1 kernel (G = 8, page_size 16, grid schedule; Triton 3.6, CUDA 13) on the H200
# (docs/decisions/register-cap-residency.md). fp16 is assumed to compile to the same use (not measured).
MEASURED: dict[tuple[str, int, str, int, int, int], tuple[int, int]] = {
    ("NVIDIA H200", 128, "bfloat16", 64, 4, 2): (118, 38912),  # 4 CTAs/SM, 0 spills
    ("NVIDIA H200", 128, "bfloat16", 64, 4, 3): (156, 39168),  # 3 CTAs/SM, 0 spills
    ("NVIDIA H200", 128, "bfloat16", 64, 8, 2): (98, 38912),  # 2 CTAs/SM, 0 spills
    ("NVIDIA H200", 128, "bfloat16", 64, 8, 3): (114, 39168),  # 2 CTAs/SM, 0 spills
    ("NVIDIA H200", 128, "bfloat16", 128, 4, 2): (168, 73728),  # 3 CTAs/SM, 0 spills
    ("NVIDIA H200", 128, "bfloat16", 128, 4, 3): (238, 74240),  # 2 CTAs/SM, 0 spills
    ("NVIDIA H200", 128, "bfloat16", 128, 8, 2): (128, 73728),  # 2 CTAs/SM, 2 spills
    ("NVIDIA H200", 128, "bfloat16", 128, 8, 3): (156, 74240),  # 1 CTAs/SM, 0 spills
    ("NVIDIA H200", 128, "bfloat16", 256, 4, 2): (255, 143360),  # 1 CTAs/SM, 80 spills
    ("NVIDIA H200", 128, "bfloat16", 256, 8, 2): (175, 143360),  # 1 CTAs/SM, 0 spills
}
for (_gpu, _d, _dt, _bn, _w, _s), _v in list(MEASURED.items()):
    MEASURED[(_gpu, _d, "float16", _bn, _w, _s)] = _v

# The same for the prefetching loop (KernelConfig.prefetch): registers and shared memory of the stage-1 kernel
# compiled for sm_90 by Triton 3.6's ptxas on the CPU (triton.compile with the launch's specialization; the same
# procedure gives the device-read MEASURED figures above exactly). K/V get num_stages - 1 buffers.
MEASURED_PREFETCH: dict[tuple[str, int, str, int, int, int], tuple[int, int]] = {
    ("NVIDIA H200", 128, "bfloat16", 32, 4, 3): (110, 37888),  # 4 CTAs/SM
    ("NVIDIA H200", 128, "bfloat16", 32, 4, 4): (110, 54272),  # 4
    ("NVIDIA H200", 128, "bfloat16", 64, 4, 3): (164, 71680),  # 3
    ("NVIDIA H200", 128, "bfloat16", 64, 4, 4): (164, 104448),  # 2
    ("NVIDIA H200", 128, "bfloat16", 64, 8, 3): (112, 71680),  # 2
    ("NVIDIA H200", 128, "bfloat16", 128, 4, 3): (168, 139264),  # 1
    ("NVIDIA H200", 128, "bfloat16", 128, 8, 3): (167, 139264),  # 1
    ("NVIDIA H200", 128, "bfloat16", 128, 8, 4): (167, 204800),  # 1
}
for (_gpu, _d, _dt, _bn, _w, _s), _v in list(MEASURED_PREFETCH.items()):
    MEASURED_PREFETCH[(_gpu, _d, "float16", _bn, _w, _s)] = _v

# The plain loop's configs that MEASURED lacks, compiled for sm_90 the same way (Triton 3.6,
# docs/decisions/register-cap-residency.md).
# Before them the estimate below counted (64, 2, 3) at 3 CTAs per SM (compiled: 4) and (64, 4, 4) at 2 (3): the first
# served plans use those tiles, and the simulator's worst held-out errors were on them.
COMPILED: dict[tuple[str, int, str, int, int, int], tuple[int, int]] = {
    ("NVIDIA H200", 128, "bfloat16", 32, 2, 2): (168, 21504),  # 6 CTAs/SM (8 bytes of spill stores)
    ("NVIDIA H200", 128, "bfloat16", 32, 2, 3): (192, 21632),  # 5
    ("NVIDIA H200", 128, "bfloat16", 32, 4, 2): (80, 21504),  # 6
    ("NVIDIA H200", 128, "bfloat16", 32, 4, 3): (112, 21632),  # 4
    ("NVIDIA H200", 128, "bfloat16", 32, 4, 4): (112, 21632),  # 4
    ("NVIDIA H200", 128, "bfloat16", 32, 8, 2): (80, 21504),  # 3
    ("NVIDIA H200", 128, "bfloat16", 32, 8, 3): (80, 21632),  # 3
    ("NVIDIA H200", 128, "bfloat16", 64, 2, 2): (244, 38912),  # 4
    ("NVIDIA H200", 128, "bfloat16", 64, 2, 3): (246, 39168),  # 4
    ("NVIDIA H200", 128, "bfloat16", 64, 2, 4): (246, 39168),  # 4
    ("NVIDIA H200", 128, "bfloat16", 64, 4, 4): (156, 39168),  # 3
    ("NVIDIA H200", 128, "bfloat16", 64, 8, 4): (114, 39168),  # 2
    ("NVIDIA H200", 128, "bfloat16", 128, 2, 2): (255, 73728),  # 3 (364 bytes of spill stores)
    ("NVIDIA H200", 128, "bfloat16", 128, 2, 3): (255, 74240),  # 3 (344 bytes of spill stores)
    ("NVIDIA H200", 128, "bfloat16", 128, 4, 4): (238, 74240),  # 2
    ("NVIDIA H200", 128, "bfloat16", 128, 8, 4): (156, 74240),  # 1
}
for (_gpu, _d, _dt, _bn, _w, _s), _v in list(COMPILED.items()):
    COMPILED[(_gpu, _d, "float16", _bn, _w, _s)] = _v


# Work tiles of several KV heads (KernelConfig.heads_per_tile), compiled for sm_90 the same way
# (docs/decisions/two-heads-per-tile.md): heads_per_tile 2 at G = 8
# (H_q 32, H_kv 4: 16 query rows), 4 at G = 4 (H_q 16, H_kv 4: 16 rows). Shared memory grows with the heads' K/V
# buffers, registers with the per-head loads. Key: (gpu, head_dim, dtype, block_n, num_warps, num_stages, prefetch,
# heads_per_tile).
COMPILED_HEADS: dict[tuple[str, int, str, int, int, int, bool, int], tuple[int, int]] = {
    ("NVIDIA H200", 128, "bfloat16", 16, 2, 2, False, 2): (150, 20992),  # 6
    ("NVIDIA H200", 128, "bfloat16", 16, 2, 3, False, 2): (152, 21056),  # 6
    ("NVIDIA H200", 128, "bfloat16", 16, 2, 4, False, 2): (152, 21056),  # 6
    ("NVIDIA H200", 128, "bfloat16", 16, 4, 2, False, 2): (96, 20992),  # 5
    ("NVIDIA H200", 128, "bfloat16", 16, 4, 3, False, 2): (109, 21056),  # 4
    ("NVIDIA H200", 128, "bfloat16", 16, 4, 4, False, 2): (109, 21056),  # 4
    ("NVIDIA H200", 128, "bfloat16", 16, 8, 2, False, 2): (80, 20992),  # 3
    ("NVIDIA H200", 128, "bfloat16", 16, 8, 3, False, 2): (80, 21056),  # 3
    ("NVIDIA H200", 128, "bfloat16", 16, 8, 4, False, 2): (80, 21056),  # 3
    ("NVIDIA H200", 128, "bfloat16", 32, 2, 2, False, 2): (221, 37888),  # 4
    ("NVIDIA H200", 128, "bfloat16", 32, 2, 3, False, 2): (213, 38016),  # 4
    ("NVIDIA H200", 128, "bfloat16", 32, 2, 4, False, 2): (213, 38016),  # 4
    ("NVIDIA H200", 128, "bfloat16", 32, 4, 2, False, 2): (114, 37888),  # 4
    ("NVIDIA H200", 128, "bfloat16", 32, 4, 3, False, 2): (118, 38016),  # 4
    ("NVIDIA H200", 128, "bfloat16", 32, 4, 4, False, 2): (118, 38016),  # 4
    ("NVIDIA H200", 128, "bfloat16", 32, 8, 2, False, 2): (80, 37888),  # 3
    ("NVIDIA H200", 128, "bfloat16", 32, 8, 3, False, 2): (92, 38016),  # 2
    ("NVIDIA H200", 128, "bfloat16", 32, 8, 4, False, 2): (92, 38016),  # 2
    ("NVIDIA H200", 128, "bfloat16", 64, 2, 2, False, 2): (255, 71680),  # 3 (292 bytes of spill stores)
    ("NVIDIA H200", 128, "bfloat16", 64, 2, 3, False, 2): (255, 71936),  # 3 (224 bytes of spill stores)
    ("NVIDIA H200", 128, "bfloat16", 64, 2, 4, False, 2): (255, 71936),  # 3 (224 bytes of spill stores)
    ("NVIDIA H200", 128, "bfloat16", 64, 4, 2, False, 2): (168, 71680),  # 3
    ("NVIDIA H200", 128, "bfloat16", 64, 4, 3, False, 2): (207, 71936),  # 2
    ("NVIDIA H200", 128, "bfloat16", 64, 4, 4, False, 2): (207, 71936),  # 2
    ("NVIDIA H200", 128, "bfloat16", 64, 8, 2, False, 2): (116, 71680),  # 2
    ("NVIDIA H200", 128, "bfloat16", 64, 8, 3, False, 2): (118, 71936),  # 2
    ("NVIDIA H200", 128, "bfloat16", 64, 8, 4, False, 2): (118, 71936),  # 2
    ("NVIDIA H200", 128, "bfloat16", 16, 2, 3, True, 2): (156, 37376),  # 6
    ("NVIDIA H200", 128, "bfloat16", 16, 2, 4, True, 2): (156, 53760),  # 4
    ("NVIDIA H200", 128, "bfloat16", 16, 4, 3, True, 2): (96, 37376),  # 5
    ("NVIDIA H200", 128, "bfloat16", 16, 4, 4, True, 2): (96, 53760),  # 4
    ("NVIDIA H200", 128, "bfloat16", 16, 8, 3, True, 2): (76, 37376),  # 3
    ("NVIDIA H200", 128, "bfloat16", 16, 8, 4, True, 2): (76, 53760),  # 3
    ("NVIDIA H200", 128, "bfloat16", 32, 2, 3, True, 2): (255, 70656),  # 3
    ("NVIDIA H200", 128, "bfloat16", 32, 2, 4, True, 2): (255, 103424),  # 2
    ("NVIDIA H200", 128, "bfloat16", 32, 4, 3, True, 2): (120, 70656),  # 3
    ("NVIDIA H200", 128, "bfloat16", 32, 4, 4, True, 2): (120, 103424),  # 2
    ("NVIDIA H200", 128, "bfloat16", 32, 8, 3, True, 2): (80, 70656),  # 3 (8 bytes of spill stores)
    ("NVIDIA H200", 128, "bfloat16", 32, 8, 4, True, 2): (80, 103424),  # 2 (8 bytes of spill stores)
    ("NVIDIA H200", 128, "bfloat16", 64, 2, 3, True, 2): (255, 137216),  # 1 (280 bytes of spill stores)
    ("NVIDIA H200", 128, "bfloat16", 64, 2, 4, True, 2): (255, 202752),  # 1 (236 bytes of spill stores)
    ("NVIDIA H200", 128, "bfloat16", 64, 4, 3, True, 2): (218, 137216),  # 1
    ("NVIDIA H200", 128, "bfloat16", 64, 4, 4, True, 2): (218, 202752),  # 1
    ("NVIDIA H200", 128, "bfloat16", 64, 8, 3, True, 2): (117, 137216),  # 1
    ("NVIDIA H200", 128, "bfloat16", 64, 8, 4, True, 2): (117, 202752),  # 1
    ("NVIDIA H200", 128, "bfloat16", 16, 2, 2, False, 4): (192, 37376),  # 5
    ("NVIDIA H200", 128, "bfloat16", 16, 2, 3, False, 4): (194, 37440),  # 5
    ("NVIDIA H200", 128, "bfloat16", 16, 2, 4, False, 4): (194, 37440),  # 5
    ("NVIDIA H200", 128, "bfloat16", 16, 4, 2, False, 4): (140, 37376),  # 3
    ("NVIDIA H200", 128, "bfloat16", 16, 4, 3, False, 4): (139, 37440),  # 3
    ("NVIDIA H200", 128, "bfloat16", 16, 4, 4, False, 4): (139, 37440),  # 3
    ("NVIDIA H200", 128, "bfloat16", 16, 8, 2, False, 4): (118, 37376),  # 2
    ("NVIDIA H200", 128, "bfloat16", 16, 8, 3, False, 4): (120, 37440),  # 2
    ("NVIDIA H200", 128, "bfloat16", 16, 8, 4, False, 4): (120, 37440),  # 2
    ("NVIDIA H200", 128, "bfloat16", 32, 2, 2, False, 4): (232, 70656),  # 3
    ("NVIDIA H200", 128, "bfloat16", 32, 2, 3, False, 4): (215, 70784),  # 3
    ("NVIDIA H200", 128, "bfloat16", 32, 2, 4, False, 4): (215, 70784),  # 3
    ("NVIDIA H200", 128, "bfloat16", 32, 4, 2, False, 4): (154, 70656),  # 3
    ("NVIDIA H200", 128, "bfloat16", 32, 4, 3, False, 4): (156, 70784),  # 3
    ("NVIDIA H200", 128, "bfloat16", 32, 4, 4, False, 4): (156, 70784),  # 3
    ("NVIDIA H200", 128, "bfloat16", 32, 8, 2, False, 4): (128, 70656),  # 2 (4 bytes of spill stores)
    ("NVIDIA H200", 128, "bfloat16", 32, 8, 3, False, 4): (128, 70784),  # 2 (12 bytes of spill stores)
    ("NVIDIA H200", 128, "bfloat16", 32, 8, 4, False, 4): (128, 70784),  # 2 (12 bytes of spill stores)
    ("NVIDIA H200", 128, "bfloat16", 64, 2, 2, False, 4): (255, 137216),  # 1 (332 bytes of spill stores)
    ("NVIDIA H200", 128, "bfloat16", 64, 4, 2, False, 4): (230, 137216),  # 1
    ("NVIDIA H200", 128, "bfloat16", 64, 8, 2, False, 4): (154, 137216),  # 1
    ("NVIDIA H200", 128, "bfloat16", 16, 2, 3, True, 4): (203, 70144),  # 3
    ("NVIDIA H200", 128, "bfloat16", 16, 2, 4, True, 4): (202, 102912),  # 2
    ("NVIDIA H200", 128, "bfloat16", 16, 4, 3, True, 4): (140, 70144),  # 3
    ("NVIDIA H200", 128, "bfloat16", 16, 4, 4, True, 4): (140, 102912),  # 2
    ("NVIDIA H200", 128, "bfloat16", 16, 8, 3, True, 4): (124, 70144),  # 2
    ("NVIDIA H200", 128, "bfloat16", 16, 8, 4, True, 4): (124, 102912),  # 2
    ("NVIDIA H200", 128, "bfloat16", 32, 2, 3, True, 4): (232, 136192),  # 1
    ("NVIDIA H200", 128, "bfloat16", 32, 2, 4, True, 4): (232, 201728),  # 1
    ("NVIDIA H200", 128, "bfloat16", 32, 4, 3, True, 4): (158, 136192),  # 1
    ("NVIDIA H200", 128, "bfloat16", 32, 4, 4, True, 4): (162, 201728),  # 1
    ("NVIDIA H200", 128, "bfloat16", 32, 8, 3, True, 4): (128, 136192),  # 1 (24 bytes of spill stores)
    ("NVIDIA H200", 128, "bfloat16", 32, 8, 4, True, 4): (146, 201728),  # 1
}
for (_gpu, _d, _dt, _bn, _w, _s, _pf, _h), _v in list(COMPILED_HEADS.items()):
    COMPILED_HEADS[(_gpu, _d, "float16", _bn, _w, _s, _pf, _h)] = _v

# The look-ahead over a CTA's work items (KernelConfig.next_item; always with the prefetch), compiled for
# sm_90 the same way (docs/decisions/look-ahead.md; with four heads per tile at G = 4 the pipeliner keeps one
# K/V buffer, so the planner refuses next_item there). Key: (gpu, head_dim, dtype, block_n, num_warps, num_stages,
# heads_per_tile).
COMPILED_NEXT: dict[tuple[str, int, str, int, int, int, int], tuple[int, int]] = {
    ("NVIDIA H200", 128, "bfloat16", 16, 2, 3, 1): (186, 20992),  # 5
    ("NVIDIA H200", 128, "bfloat16", 16, 2, 3, 2): (250, 37376),  # 4
    ("NVIDIA H200", 128, "bfloat16", 16, 2, 4, 1): (186, 29184),  # 5
    ("NVIDIA H200", 128, "bfloat16", 16, 2, 4, 2): (250, 53760),  # 4
    ("NVIDIA H200", 128, "bfloat16", 16, 4, 3, 1): (96, 20992),  # 5 (4 bytes of spill stores)
    ("NVIDIA H200", 128, "bfloat16", 16, 4, 3, 2): (128, 37376),  # 4
    ("NVIDIA H200", 128, "bfloat16", 16, 4, 4, 1): (96, 29184),  # 5 (4 bytes of spill stores)
    ("NVIDIA H200", 128, "bfloat16", 16, 4, 4, 2): (128, 53760),  # 4
    ("NVIDIA H200", 128, "bfloat16", 16, 8, 3, 1): (102, 20992),  # 2
    ("NVIDIA H200", 128, "bfloat16", 16, 8, 3, 2): (98, 37376),  # 2
    ("NVIDIA H200", 128, "bfloat16", 16, 8, 4, 1): (102, 29184),  # 2
    ("NVIDIA H200", 128, "bfloat16", 16, 8, 4, 2): (98, 53760),  # 2
    ("NVIDIA H200", 128, "bfloat16", 32, 2, 3, 1): (236, 37888),  # 4
    ("NVIDIA H200", 128, "bfloat16", 32, 2, 3, 2): (255, 70656),  # 3 (72 bytes of spill stores)
    ("NVIDIA H200", 128, "bfloat16", 32, 2, 4, 1): (255, 54272),  # 4
    ("NVIDIA H200", 128, "bfloat16", 32, 2, 4, 2): (255, 103424),  # 2 (72 bytes of spill stores)
    ("NVIDIA H200", 128, "bfloat16", 32, 4, 3, 1): (144, 37888),  # 3
    ("NVIDIA H200", 128, "bfloat16", 32, 4, 3, 2): (191, 70656),  # 2
    ("NVIDIA H200", 128, "bfloat16", 32, 4, 4, 1): (144, 54272),  # 3
    ("NVIDIA H200", 128, "bfloat16", 32, 4, 4, 2): (191, 103424),  # 2
    ("NVIDIA H200", 128, "bfloat16", 32, 8, 3, 1): (121, 37888),  # 2
    ("NVIDIA H200", 128, "bfloat16", 32, 8, 3, 2): (128, 70656),  # 2
    ("NVIDIA H200", 128, "bfloat16", 32, 8, 4, 1): (121, 54272),  # 2
    ("NVIDIA H200", 128, "bfloat16", 32, 8, 4, 2): (128, 103424),  # 2
    ("NVIDIA H200", 128, "bfloat16", 64, 2, 3, 1): (255, 71680),  # 3 (72 bytes of spill stores)
    ("NVIDIA H200", 128, "bfloat16", 64, 2, 3, 2): (255, 137216),  # 1 (284 bytes of spill stores)
    ("NVIDIA H200", 128, "bfloat16", 64, 2, 4, 1): (255, 104448),  # 2 (72 bytes of spill stores)
    ("NVIDIA H200", 128, "bfloat16", 64, 2, 4, 2): (255, 202752),  # 1 (284 bytes of spill stores)
    ("NVIDIA H200", 128, "bfloat16", 64, 4, 3, 1): (202, 71680),  # 2
    ("NVIDIA H200", 128, "bfloat16", 64, 4, 3, 2): (225, 137216),  # 1
    ("NVIDIA H200", 128, "bfloat16", 64, 4, 4, 1): (202, 104448),  # 2
    ("NVIDIA H200", 128, "bfloat16", 64, 4, 4, 2): (225, 202752),  # 1
    ("NVIDIA H200", 128, "bfloat16", 64, 8, 3, 1): (146, 71680),  # 1
    ("NVIDIA H200", 128, "bfloat16", 64, 8, 3, 2): (193, 137216),  # 1
    ("NVIDIA H200", 128, "bfloat16", 64, 8, 4, 1): (146, 104448),  # 1
    ("NVIDIA H200", 128, "bfloat16", 64, 8, 4, 2): (193, 202752),  # 1
    ("NVIDIA H200", 128, "bfloat16", 128, 4, 3, 1): (214, 139264),  # 1
    ("NVIDIA H200", 128, "bfloat16", 128, 8, 3, 1): (204, 139264),  # 1
    ("NVIDIA H200", 128, "bfloat16", 128, 8, 4, 1): (204, 204800),  # 1
}
for (_gpu, _d, _dt, _bn, _w, _s, _h), _v in list(COMPILED_NEXT.items()):
    COMPILED_NEXT[(_gpu, _d, "float16", _bn, _w, _s, _h)] = _v

# Verify-step kernels (q_len > 1: the causal mask over each request's q_len new tokens, G * q_len query rows per KV
# head), compiled for sm_90 the same way: bench/compile_sm90.py --configs 128,4,2 128,4,3 64,4,2 64,4,3 32,4,2
# 32,4,3 32,4,4 64,8,2 64,8,3 --variants plain,prefetch,next_item --heads 1,2 --maxnreg auto --q-len N for N = 2, 4
# and 8 and --configs 128,8,2 --variants plain, each over a 16-bit cache and, with --kv-dtype fp8 --scales tensor, an
# FP8 one (the kernel that widens e4m3 to float16 in registers, V before its shared-memory copy; recompiled
# 2026-12-06); and over a 16-bit cache at q_len 2, 4 and 8 every
# (block_n, num_warps, num_stages) the tuner's space takes for head_dim 128 (64) x plain / prefetch / next_item x the
# heads per tile whose rows fit (1-2; 1 at q_len 8). G = 8; Triton 3.6, 2026-12-05. The q_len > 1 kernel takes more registers than the q_len-1 kernel even where
# its padded rows are the same: at q_len 2 (16 rows, as at q_len 1) (128, 4, 2) takes 238 where the q_len-1 kernel
# takes 168 (2 CTAs per SM, not 3) and (64, 4, 2) 150 where it takes 118 (3, not 4). The q_len-1 kernel compiled at
# G = 32 and 64 (the rows q_len 4 and 8 give at G = 8) under-counts them too: (64, 4, 2) at 32 rows takes 168, not
# 128; an FP8 cache's K buffers halve (V's hold float16) and its widening costs registers, which halving the
# 16-bit figures' buffers misses for 17 of the 94 FP8 compiles. Key: (arch, head_dim, dtype, bytes per K/V element, block_n, num_warps,
# num_stages, prefetch, next_item, heads_per_tile, rows), rows
# the tile's padded query rows (:func:`padded_rows` of ``heads_per_tile * G * q_len``); the comment gives the
# resident CTAs per SM on an sm_90 SM. The compiled kernel is a property of the target (sm_90), not of the board, so
# every sm_90 GPU (:func:`arch`) reads this table.
COMPILED_QLEN: dict[tuple[str, int, str, int, int, int, int, bool, bool, int, int], tuple[int, int]] = {
    ("sm_90", 128, "bfloat16", 2, 16, 1, 1, False, False, 1, 16): (223, 8192),  # 9
    ("sm_90", 128, "bfloat16", 2, 16, 1, 1, False, False, 1, 32): (255, 12288),  # 8, 8 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 16, 1, 1, False, False, 1, 64): (255, 20480),  # 8, 2168 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 16, 1, 1, False, False, 2, 32): (255, 12288),  # 8, 264 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 16, 1, 1, False, False, 2, 64): (255, 20480),  # 8, 3472 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 16, 1, 2, False, False, 1, 16): (255, 12288),  # 8, 36 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 16, 1, 2, False, False, 1, 32): (255, 16384),  # 8, 12 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 16, 1, 2, False, False, 1, 64): (255, 24576),  # 8, 1932 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 16, 1, 2, False, False, 2, 32): (255, 24576),  # 8, 36 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 16, 1, 2, False, False, 2, 64): (255, 32768),  # 6, 2396 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 16, 1, 3, False, False, 1, 16): (200, 12352),  # 10
    ("sm_90", 128, "bfloat16", 2, 16, 1, 3, False, False, 1, 32): (255, 16448),  # 8, 148 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 16, 1, 3, False, False, 1, 64): (255, 24640),  # 8, 2116 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 16, 1, 3, False, False, 2, 32): (255, 24640),  # 8, 240 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 16, 1, 3, False, False, 2, 64): (255, 32832),  # 6, 2464 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 16, 1, 3, True, False, 1, 16): (255, 20480),  # 8, 44 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 16, 1, 3, True, False, 1, 32): (255, 24576),  # 8, 52 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 16, 1, 3, True, False, 1, 64): (255, 32768),  # 6, 2088 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 16, 1, 3, True, False, 2, 32): (255, 40960),  # 5, 152 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 16, 1, 3, True, False, 2, 64): (255, 49152),  # 4, 2940 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 16, 1, 3, True, True, 1, 16): (255, 20480),  # 8, 96 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 16, 1, 3, True, True, 1, 32): (255, 24576),  # 8, 480 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 16, 1, 3, True, True, 1, 64): (255, 32768),  # 6, 3244 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 16, 1, 3, True, True, 2, 32): (255, 40960),  # 5, 624 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 16, 1, 3, True, True, 2, 64): (255, 49152),  # 4, 3852 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 16, 1, 4, False, False, 1, 16): (200, 12352),  # 10
    ("sm_90", 128, "bfloat16", 2, 16, 1, 4, False, False, 1, 32): (255, 16448),  # 8, 148 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 16, 1, 4, False, False, 1, 64): (255, 24640),  # 8, 2116 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 16, 1, 4, False, False, 2, 32): (255, 24640),  # 8, 240 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 16, 1, 4, False, False, 2, 64): (255, 32832),  # 6, 2464 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 16, 1, 4, True, False, 1, 16): (255, 28672),  # 7, 44 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 16, 1, 4, True, False, 1, 32): (255, 32768),  # 6, 52 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 16, 1, 4, True, False, 1, 64): (255, 40960),  # 5, 2032 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 16, 1, 4, True, False, 2, 32): (255, 57344),  # 4, 152 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 16, 1, 4, True, False, 2, 64): (255, 65536),  # 3, 2880 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 16, 1, 4, True, True, 1, 16): (255, 28672),  # 7, 100 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 16, 1, 4, True, True, 1, 32): (255, 32768),  # 6, 476 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 16, 1, 4, True, True, 1, 64): (255, 40960),  # 5, 3268 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 16, 1, 4, True, True, 2, 32): (255, 57344),  # 4, 640 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 16, 1, 4, True, True, 2, 64): (255, 65536),  # 3, 3852 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 16, 2, 1, False, False, 1, 16): (128, 8704),  # 8
    ("sm_90", 128, "bfloat16", 2, 16, 2, 1, False, False, 1, 32): (199, 13312),  # 5
    ("sm_90", 128, "bfloat16", 2, 16, 2, 1, False, False, 1, 64): (255, 22528),  # 4, 8 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 16, 2, 1, False, False, 2, 32): (243, 13312),  # 4
    ("sm_90", 128, "bfloat16", 2, 16, 2, 1, False, False, 2, 64): (255, 22528),  # 4, 220 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 16, 2, 2, False, False, 1, 16): (140, 12800),  # 7
    ("sm_90", 128, "bfloat16", 2, 16, 2, 2, False, False, 1, 32): (168, 17408),  # 6
    ("sm_90", 128, "bfloat16", 2, 16, 2, 2, False, False, 1, 64): (255, 26624),  # 4, 8 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 16, 2, 2, False, False, 2, 32): (174, 25600),  # 5
    ("sm_90", 128, "bfloat16", 2, 16, 2, 2, False, False, 2, 64): (255, 34816),  # 4, 12 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 16, 2, 3, False, False, 1, 16): (136, 12864),  # 7
    ("sm_90", 128, "bfloat16", 2, 16, 2, 3, False, False, 1, 32): (182, 17472),  # 5
    ("sm_90", 128, "bfloat16", 2, 16, 2, 3, False, False, 1, 64): (255, 26688),  # 4, 140 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 16, 2, 3, False, False, 2, 32): (186, 25664),  # 5
    ("sm_90", 128, "bfloat16", 2, 16, 2, 3, False, False, 2, 64): (255, 34880),  # 4, 76 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 16, 2, 3, True, False, 1, 16): (144, 20992),  # 7
    ("sm_90", 128, "bfloat16", 2, 16, 2, 3, True, False, 1, 32): (211, 25600),  # 4
    ("sm_90", 128, "bfloat16", 2, 16, 2, 3, True, False, 1, 64): (255, 34816),  # 4, 20 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 16, 2, 3, True, False, 2, 32): (168, 41984),  # 5
    ("sm_90", 128, "bfloat16", 2, 16, 2, 3, True, False, 2, 64): (255, 51200),  # 4, 12 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 16, 2, 3, True, True, 1, 16): (206, 20992),  # 4
    ("sm_90", 128, "bfloat16", 2, 16, 2, 3, True, True, 1, 32): (236, 25600),  # 4
    ("sm_90", 128, "bfloat16", 2, 16, 2, 3, True, True, 1, 64): (255, 34816),  # 4, 332 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 16, 2, 3, True, True, 2, 32): (253, 41984),  # 4
    ("sm_90", 128, "bfloat16", 2, 16, 2, 3, True, True, 2, 64): (255, 51200),  # 4, 388 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 16, 2, 4, False, False, 1, 16): (136, 12864),  # 7
    ("sm_90", 128, "bfloat16", 2, 16, 2, 4, False, False, 1, 32): (182, 17472),  # 5
    ("sm_90", 128, "bfloat16", 2, 16, 2, 4, False, False, 1, 64): (255, 26688),  # 4, 140 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 16, 2, 4, False, False, 2, 32): (186, 25664),  # 5
    ("sm_90", 128, "bfloat16", 2, 16, 2, 4, False, False, 2, 64): (255, 34880),  # 4, 76 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 16, 2, 4, True, False, 1, 16): (144, 29184),  # 7
    ("sm_90", 128, "bfloat16", 2, 16, 2, 4, True, False, 1, 32): (211, 33792),  # 4
    ("sm_90", 128, "bfloat16", 2, 16, 2, 4, True, False, 1, 64): (255, 43008),  # 4, 40 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 16, 2, 4, True, False, 2, 32): (168, 58368),  # 3
    ("sm_90", 128, "bfloat16", 2, 16, 2, 4, True, False, 2, 64): (255, 67584),  # 3, 16 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 16, 2, 4, True, True, 1, 16): (206, 29184),  # 4
    ("sm_90", 128, "bfloat16", 2, 16, 2, 4, True, True, 1, 32): (236, 33792),  # 4
    ("sm_90", 128, "bfloat16", 2, 16, 2, 4, True, True, 1, 64): (255, 43008),  # 4, 340 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 16, 2, 4, True, True, 2, 32): (253, 58368),  # 3
    ("sm_90", 128, "bfloat16", 2, 16, 2, 4, True, True, 2, 64): (255, 67584),  # 3, 392 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 16, 4, 1, False, False, 1, 16): (95, 8704),  # 5
    ("sm_90", 128, "bfloat16", 2, 16, 4, 1, False, False, 1, 32): (156, 13312),  # 3
    ("sm_90", 128, "bfloat16", 2, 16, 4, 1, False, False, 1, 64): (152, 32768),  # 3
    ("sm_90", 128, "bfloat16", 2, 16, 4, 1, False, False, 2, 32): (166, 13312),  # 3
    ("sm_90", 128, "bfloat16", 2, 16, 4, 1, False, False, 2, 64): (166, 32768),  # 3
    ("sm_90", 128, "bfloat16", 2, 16, 4, 2, False, False, 1, 16): (80, 12800),  # 6
    ("sm_90", 128, "bfloat16", 2, 16, 4, 2, False, False, 1, 32): (155, 17408),  # 3
    ("sm_90", 128, "bfloat16", 2, 16, 4, 2, False, False, 1, 64): (176, 32768),  # 2
    ("sm_90", 128, "bfloat16", 2, 16, 4, 2, False, False, 2, 32): (164, 25600),  # 3
    ("sm_90", 128, "bfloat16", 2, 16, 4, 2, False, False, 2, 64): (182, 49152),  # 2
    ("sm_90", 128, "bfloat16", 2, 16, 4, 3, False, False, 1, 16): (92, 12864),  # 5
    ("sm_90", 128, "bfloat16", 2, 16, 4, 3, False, False, 1, 32): (161, 17472),  # 3
    ("sm_90", 128, "bfloat16", 2, 16, 4, 3, False, False, 1, 64): (176, 32832),  # 2
    ("sm_90", 128, "bfloat16", 2, 16, 4, 3, False, False, 2, 32): (160, 25664),  # 3
    ("sm_90", 128, "bfloat16", 2, 16, 4, 3, False, False, 2, 64): (186, 49216),  # 2
    ("sm_90", 128, "bfloat16", 2, 16, 4, 3, True, False, 1, 16): (93, 20992),  # 5
    ("sm_90", 128, "bfloat16", 2, 16, 4, 3, True, False, 1, 32): (165, 25600),  # 3
    ("sm_90", 128, "bfloat16", 2, 16, 4, 3, True, False, 1, 64): (176, 40960),  # 2
    ("sm_90", 128, "bfloat16", 2, 16, 4, 3, True, False, 2, 32): (167, 41984),  # 3
    ("sm_90", 128, "bfloat16", 2, 16, 4, 3, True, False, 2, 64): (186, 65536),  # 2
    ("sm_90", 128, "bfloat16", 2, 16, 4, 3, True, True, 1, 16): (128, 20992),  # 4
    ("sm_90", 128, "bfloat16", 2, 16, 4, 3, True, True, 1, 32): (166, 25600),  # 3
    ("sm_90", 128, "bfloat16", 2, 16, 4, 3, True, True, 1, 64): (240, 40960),  # 2
    ("sm_90", 128, "bfloat16", 2, 16, 4, 3, True, True, 2, 32): (168, 41984),  # 3
    ("sm_90", 128, "bfloat16", 2, 16, 4, 3, True, True, 2, 64): (242, 65536),  # 2
    ("sm_90", 128, "bfloat16", 2, 16, 4, 4, False, False, 1, 16): (92, 12864),  # 5
    ("sm_90", 128, "bfloat16", 2, 16, 4, 4, False, False, 1, 32): (161, 17472),  # 3
    ("sm_90", 128, "bfloat16", 2, 16, 4, 4, False, False, 1, 64): (176, 32832),  # 2
    ("sm_90", 128, "bfloat16", 2, 16, 4, 4, False, False, 2, 32): (160, 25664),  # 3
    ("sm_90", 128, "bfloat16", 2, 16, 4, 4, False, False, 2, 64): (186, 49216),  # 2
    ("sm_90", 128, "bfloat16", 2, 16, 4, 4, True, False, 1, 16): (93, 29184),  # 5
    ("sm_90", 128, "bfloat16", 2, 16, 4, 4, True, False, 1, 32): (165, 33792),  # 3
    ("sm_90", 128, "bfloat16", 2, 16, 4, 4, True, False, 1, 64): (176, 49152),  # 2
    ("sm_90", 128, "bfloat16", 2, 16, 4, 4, True, False, 2, 32): (165, 58368),  # 3
    ("sm_90", 128, "bfloat16", 2, 16, 4, 4, True, False, 2, 64): (186, 81920),  # 2
    ("sm_90", 128, "bfloat16", 2, 16, 4, 4, True, True, 1, 16): (128, 29184),  # 4
    ("sm_90", 128, "bfloat16", 2, 16, 4, 4, True, True, 1, 32): (164, 33792),  # 3
    ("sm_90", 128, "bfloat16", 2, 16, 4, 4, True, True, 1, 64): (240, 49152),  # 2
    ("sm_90", 128, "bfloat16", 2, 16, 4, 4, True, True, 2, 32): (168, 58368),  # 3
    ("sm_90", 128, "bfloat16", 2, 16, 4, 4, True, True, 2, 64): (242, 81920),  # 2
    ("sm_90", 128, "bfloat16", 2, 16, 8, 1, False, False, 1, 16): (100, 8704),  # 2
    ("sm_90", 128, "bfloat16", 2, 16, 8, 1, False, False, 1, 32): (125, 13312),  # 2
    ("sm_90", 128, "bfloat16", 2, 16, 8, 1, False, False, 1, 64): (126, 32768),  # 2
    ("sm_90", 128, "bfloat16", 2, 16, 8, 1, False, False, 2, 32): (169, 13312),  # 1
    ("sm_90", 128, "bfloat16", 2, 16, 8, 1, False, False, 2, 64): (214, 32768),  # 1
    ("sm_90", 128, "bfloat16", 2, 16, 8, 2, False, False, 1, 16): (80, 12800),  # 3
    ("sm_90", 128, "bfloat16", 2, 16, 8, 2, False, False, 1, 32): (121, 17408),  # 2
    ("sm_90", 128, "bfloat16", 2, 16, 8, 2, False, False, 1, 64): (114, 32768),  # 2
    ("sm_90", 128, "bfloat16", 2, 16, 8, 2, False, False, 2, 32): (128, 25600),  # 2
    ("sm_90", 128, "bfloat16", 2, 16, 8, 2, False, False, 2, 64): (192, 53248),  # 1
    ("sm_90", 128, "bfloat16", 2, 16, 8, 3, False, False, 1, 16): (78, 12864),  # 3
    ("sm_90", 128, "bfloat16", 2, 16, 8, 3, False, False, 1, 32): (125, 17472),  # 2
    ("sm_90", 128, "bfloat16", 2, 16, 8, 3, False, False, 1, 64): (128, 32832),  # 2
    ("sm_90", 128, "bfloat16", 2, 16, 8, 3, False, False, 2, 32): (127, 25664),  # 2
    ("sm_90", 128, "bfloat16", 2, 16, 8, 3, False, False, 2, 64): (196, 53312),  # 1
    ("sm_90", 128, "bfloat16", 2, 16, 8, 3, True, False, 1, 16): (77, 20992),  # 3
    ("sm_90", 128, "bfloat16", 2, 16, 8, 3, True, False, 1, 32): (126, 25600),  # 2
    ("sm_90", 128, "bfloat16", 2, 16, 8, 3, True, False, 1, 64): (115, 40960),  # 2
    ("sm_90", 128, "bfloat16", 2, 16, 8, 3, True, False, 2, 32): (128, 41984),  # 2
    ("sm_90", 128, "bfloat16", 2, 16, 8, 3, True, False, 2, 64): (191, 69632),  # 1
    ("sm_90", 128, "bfloat16", 2, 16, 8, 3, True, True, 1, 16): (97, 20992),  # 2
    ("sm_90", 128, "bfloat16", 2, 16, 8, 3, True, True, 1, 32): (157, 25600),  # 1
    ("sm_90", 128, "bfloat16", 2, 16, 8, 3, True, True, 1, 64): (181, 40960),  # 1
    ("sm_90", 128, "bfloat16", 2, 16, 8, 3, True, True, 2, 32): (168, 41984),  # 1
    ("sm_90", 128, "bfloat16", 2, 16, 8, 3, True, True, 2, 64): (238, 69632),  # 1
    ("sm_90", 128, "bfloat16", 2, 16, 8, 4, False, False, 1, 16): (78, 12864),  # 3
    ("sm_90", 128, "bfloat16", 2, 16, 8, 4, False, False, 1, 32): (125, 17472),  # 2
    ("sm_90", 128, "bfloat16", 2, 16, 8, 4, False, False, 1, 64): (128, 32832),  # 2
    ("sm_90", 128, "bfloat16", 2, 16, 8, 4, False, False, 2, 32): (127, 25664),  # 2
    ("sm_90", 128, "bfloat16", 2, 16, 8, 4, False, False, 2, 64): (196, 53312),  # 1
    ("sm_90", 128, "bfloat16", 2, 16, 8, 4, True, False, 1, 16): (77, 29184),  # 3
    ("sm_90", 128, "bfloat16", 2, 16, 8, 4, True, False, 1, 32): (126, 33792),  # 2
    ("sm_90", 128, "bfloat16", 2, 16, 8, 4, True, False, 1, 64): (115, 49152),  # 2
    ("sm_90", 128, "bfloat16", 2, 16, 8, 4, True, False, 2, 32): (128, 58368),  # 2
    ("sm_90", 128, "bfloat16", 2, 16, 8, 4, True, False, 2, 64): (191, 86016),  # 1
    ("sm_90", 128, "bfloat16", 2, 16, 8, 4, True, True, 1, 16): (97, 29184),  # 2
    ("sm_90", 128, "bfloat16", 2, 16, 8, 4, True, True, 1, 32): (156, 33792),  # 1
    ("sm_90", 128, "bfloat16", 2, 16, 8, 4, True, True, 1, 64): (181, 49152),  # 1
    ("sm_90", 128, "bfloat16", 2, 16, 8, 4, True, True, 2, 32): (168, 58368),  # 1
    ("sm_90", 128, "bfloat16", 2, 16, 8, 4, True, True, 2, 64): (238, 86016),  # 1
    ("sm_90", 128, "bfloat16", 2, 32, 1, 1, False, False, 1, 16): (254, 12288),  # 8
    ("sm_90", 128, "bfloat16", 2, 32, 1, 1, False, False, 1, 32): (255, 16384),  # 8, 320 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 1, 1, False, False, 1, 64): (255, 24576),  # 8, 3440 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 1, 1, False, False, 2, 32): (255, 16384),  # 8, 1556 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 1, 1, False, False, 2, 64): (64, 24576),  # 9, 17044 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 1, 2, False, False, 1, 16): (255, 20608),  # 8, 164 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 1, 2, False, False, 1, 32): (255, 24704),  # 8, 484 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 1, 2, False, False, 1, 64): (168, 32896),  # 6, 6936 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 1, 2, False, False, 2, 32): (255, 41216),  # 5, 632 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 1, 2, False, False, 2, 64): (255, 49408),  # 4, 5328 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 1, 3, False, False, 1, 16): (255, 20608),  # 8, 176 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 1, 3, False, False, 1, 32): (255, 24704),  # 8, 492 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 1, 3, False, False, 1, 64): (255, 32896),  # 6, 4000 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 1, 3, False, False, 2, 32): (255, 41088),  # 5, 676 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 1, 3, False, False, 2, 64): (64, 49280),  # 4, 17184 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 1, 3, True, False, 1, 16): (255, 36992),  # 6, 164 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 1, 3, True, False, 1, 32): (255, 41088),  # 5, 492 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 1, 3, True, False, 1, 64): (168, 49280),  # 4, 7000 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 1, 3, True, False, 2, 32): (255, 73984),  # 3, 612 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 1, 3, True, False, 2, 64): (255, 82176),  # 2, 5392 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 1, 3, True, True, 1, 16): (255, 36992),  # 6, 188 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 1, 3, True, True, 1, 32): (255, 41088),  # 5, 836 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 1, 3, True, True, 1, 64): (255, 49280),  # 4, 4760 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 1, 3, True, True, 2, 32): (255, 73984),  # 3, 932 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 1, 3, True, True, 2, 64): (255, 82176),  # 2, 6128 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 1, 4, False, False, 1, 16): (255, 20608),  # 8, 176 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 1, 4, False, False, 1, 32): (255, 24704),  # 8, 492 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 1, 4, False, False, 1, 64): (255, 32896),  # 6, 4000 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 1, 4, False, False, 2, 32): (255, 41088),  # 5, 676 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 1, 4, False, False, 2, 64): (64, 49280),  # 4, 17184 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 1, 4, True, False, 1, 16): (255, 53376),  # 4, 156 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 1, 4, True, False, 1, 32): (255, 57472),  # 3, 284 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 1, 4, True, False, 1, 64): (168, 65664),  # 3, 6972 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 1, 4, True, False, 2, 32): (255, 106752),  # 2, 628 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 1, 4, True, False, 2, 64): (255, 114944),  # 2, 5424 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 1, 4, True, True, 1, 16): (255, 53376),  # 4, 196 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 1, 4, True, True, 1, 32): (255, 57472),  # 3, 836 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 1, 4, True, True, 1, 64): (255, 65664),  # 3, 4760 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 1, 4, True, True, 2, 32): (255, 106752),  # 2, 940 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 1, 4, True, True, 2, 64): (255, 114944),  # 2, 6072 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 2, 1, False, False, 1, 16): (168, 13312),  # 6, 8 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 2, 1, False, False, 1, 32): (213, 18432),  # 4
    ("sm_90", 128, "bfloat16", 2, 32, 2, 1, False, False, 1, 64): (255, 28672),  # 4, 52 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 2, 1, False, False, 2, 32): (255, 18432),  # 4, 8 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 2, 1, False, False, 2, 64): (255, 28672),  # 4, 632 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 2, 2, False, False, 1, 16): (190, 21504),  # 5
    ("sm_90", 128, "bfloat16", 2, 32, 2, 2, False, False, 1, 32): (181, 26624),  # 5
    ("sm_90", 128, "bfloat16", 2, 32, 2, 2, False, False, 1, 64): (255, 36864),  # 4, 72 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 2, 2, False, False, 2, 32): (255, 43008),  # 4, 72 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 2, 2, False, False, 2, 64): (255, 53248),  # 4, 128 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 2, 3, False, False, 1, 16): (196, 21632),  # 5
    ("sm_90", 128, "bfloat16", 2, 32, 2, 3, False, False, 1, 32): (200, 26752),  # 5
    ("sm_90", 128, "bfloat16", 2, 32, 2, 3, False, False, 1, 64): (255, 36992),  # 4, 108 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 2, 3, False, False, 2, 32): (255, 43136),  # 4, 44 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 2, 3, False, False, 2, 64): (255, 53376),  # 4, 160 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 2, 3, True, False, 1, 16): (222, 37888),  # 4
    ("sm_90", 128, "bfloat16", 2, 32, 2, 3, True, False, 1, 32): (196, 43008),  # 5
    ("sm_90", 128, "bfloat16", 2, 32, 2, 3, True, False, 1, 64): (255, 53248),  # 4, 116 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 2, 3, True, False, 2, 32): (255, 75776),  # 3, 88 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 2, 3, True, False, 2, 64): (255, 86016),  # 2, 292 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 2, 3, True, True, 1, 16): (224, 37888),  # 4
    ("sm_90", 128, "bfloat16", 2, 32, 2, 3, True, True, 1, 32): (255, 43008),  # 4, 104 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 2, 3, True, True, 1, 64): (255, 53248),  # 4, 520 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 2, 3, True, True, 2, 32): (255, 75776),  # 3, 136 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 2, 3, True, True, 2, 64): (255, 86016),  # 2, 724 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 2, 4, False, False, 1, 16): (196, 21632),  # 5
    ("sm_90", 128, "bfloat16", 2, 32, 2, 4, False, False, 1, 32): (200, 26752),  # 5
    ("sm_90", 128, "bfloat16", 2, 32, 2, 4, False, False, 1, 64): (255, 36992),  # 4, 108 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 2, 4, False, False, 2, 32): (255, 43136),  # 4, 44 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 2, 4, False, False, 2, 64): (255, 53376),  # 4, 160 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 2, 4, True, False, 1, 16): (222, 54272),  # 4
    ("sm_90", 128, "bfloat16", 2, 32, 2, 4, True, False, 1, 32): (196, 59392),  # 3
    ("sm_90", 128, "bfloat16", 2, 32, 2, 4, True, False, 1, 64): (255, 69632),  # 3, 128 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 2, 4, True, False, 2, 32): (255, 108544),  # 2, 88 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 2, 4, True, False, 2, 64): (255, 118784),  # 1, 256 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 2, 4, True, True, 1, 16): (243, 54272),  # 4
    ("sm_90", 128, "bfloat16", 2, 32, 2, 4, True, True, 1, 32): (255, 59392),  # 3, 104 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 2, 4, True, True, 1, 64): (255, 69632),  # 3, 520 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 2, 4, True, True, 2, 32): (255, 108544),  # 2, 136 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 2, 4, True, True, 2, 64): (255, 118784),  # 1, 724 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 4, 1, False, False, 1, 16): (111, 13312),  # 4
    ("sm_90", 128, "bfloat16", 2, 32, 4, 1, False, False, 1, 32): (128, 18432),  # 4, 32 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 4, 1, False, False, 1, 64): (189, 32768),  # 2
    ("sm_90", 128, "bfloat16", 2, 32, 4, 1, False, False, 2, 32): (230, 18432),  # 2
    ("sm_90", 128, "bfloat16", 2, 32, 4, 1, False, False, 2, 64): (221, 32768),  # 2
    ("sm_90", 128, "bfloat16", 2, 32, 4, 2, False, False, 1, 16): (96, 21504),  # 5
    ("sm_90", 128, "bfloat16", 2, 32, 4, 2, False, False, 1, 32): (162, 26624),  # 3
    ("sm_90", 128, "bfloat16", 2, 32, 4, 2, False, False, 1, 64): (199, 49152),  # 2
    ("sm_90", 128, "bfloat16", 2, 32, 4, 2, False, False, 2, 32): (168, 43008),  # 3
    ("sm_90", 128, "bfloat16", 2, 32, 4, 2, False, False, 2, 64): (220, 81920),  # 2
    ("sm_90", 128, "bfloat16", 2, 32, 4, 3, False, False, 1, 16): (112, 21632),  # 4
    ("sm_90", 128, "bfloat16", 2, 32, 4, 3, False, False, 1, 32): (166, 26752),  # 3
    ("sm_90", 128, "bfloat16", 2, 32, 4, 3, False, False, 1, 64): (216, 49280),  # 2
    ("sm_90", 128, "bfloat16", 2, 32, 4, 3, False, False, 2, 32): (168, 43136),  # 3
    ("sm_90", 128, "bfloat16", 2, 32, 4, 3, False, False, 2, 64): (224, 82048),  # 2
    ("sm_90", 128, "bfloat16", 2, 32, 4, 3, True, False, 1, 16): (110, 37888),  # 4
    ("sm_90", 128, "bfloat16", 2, 32, 4, 3, True, False, 1, 32): (166, 43008),  # 3
    ("sm_90", 128, "bfloat16", 2, 32, 4, 3, True, False, 1, 64): (224, 65536),  # 2
    ("sm_90", 128, "bfloat16", 2, 32, 4, 3, True, False, 2, 32): (168, 75776),  # 3
    ("sm_90", 128, "bfloat16", 2, 32, 4, 3, True, False, 2, 64): (245, 114688),  # 2
    ("sm_90", 128, "bfloat16", 2, 32, 4, 3, True, True, 1, 16): (144, 37888),  # 3
    ("sm_90", 128, "bfloat16", 2, 32, 4, 3, True, True, 1, 32): (168, 43008),  # 3
    ("sm_90", 128, "bfloat16", 2, 32, 4, 3, True, True, 1, 64): (254, 65536),  # 2
    ("sm_90", 128, "bfloat16", 2, 32, 4, 3, True, True, 2, 32): (176, 75776),  # 2
    ("sm_90", 128, "bfloat16", 2, 32, 4, 3, True, True, 2, 64): (255, 114688),  # 2, 24 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 4, 4, False, False, 1, 16): (112, 21632),  # 4
    ("sm_90", 128, "bfloat16", 2, 32, 4, 4, False, False, 1, 32): (166, 26752),  # 3
    ("sm_90", 128, "bfloat16", 2, 32, 4, 4, False, False, 1, 64): (216, 49280),  # 2
    ("sm_90", 128, "bfloat16", 2, 32, 4, 4, False, False, 2, 32): (168, 43136),  # 3
    ("sm_90", 128, "bfloat16", 2, 32, 4, 4, False, False, 2, 64): (224, 82048),  # 2
    ("sm_90", 128, "bfloat16", 2, 32, 4, 4, True, False, 1, 16): (110, 54272),  # 4
    ("sm_90", 128, "bfloat16", 2, 32, 4, 4, True, False, 1, 32): (166, 59392),  # 3
    ("sm_90", 128, "bfloat16", 2, 32, 4, 4, True, False, 1, 64): (224, 81920),  # 2
    ("sm_90", 128, "bfloat16", 2, 32, 4, 4, True, False, 2, 32): (168, 108544),  # 2
    ("sm_90", 128, "bfloat16", 2, 32, 4, 4, True, False, 2, 64): (245, 147456),  # 1
    ("sm_90", 128, "bfloat16", 2, 32, 4, 4, True, True, 1, 16): (144, 54272),  # 3
    ("sm_90", 128, "bfloat16", 2, 32, 4, 4, True, True, 1, 32): (168, 59392),  # 3
    ("sm_90", 128, "bfloat16", 2, 32, 4, 4, True, True, 1, 64): (252, 81920),  # 2
    ("sm_90", 128, "bfloat16", 2, 32, 4, 4, True, True, 2, 32): (176, 108544),  # 2
    ("sm_90", 128, "bfloat16", 2, 32, 4, 4, True, True, 2, 64): (255, 147456),  # 1, 24 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 32, 8, 1, False, False, 1, 16): (102, 13312),  # 2
    ("sm_90", 128, "bfloat16", 2, 32, 8, 1, False, False, 1, 32): (128, 18432),  # 2
    ("sm_90", 128, "bfloat16", 2, 32, 8, 1, False, False, 1, 64): (136, 32768),  # 1
    ("sm_90", 128, "bfloat16", 2, 32, 8, 1, False, False, 2, 32): (169, 18432),  # 1
    ("sm_90", 128, "bfloat16", 2, 32, 8, 1, False, False, 2, 64): (215, 32768),  # 1
    ("sm_90", 128, "bfloat16", 2, 32, 8, 2, False, False, 1, 16): (80, 21504),  # 3
    ("sm_90", 128, "bfloat16", 2, 32, 8, 2, False, False, 1, 32): (125, 26624),  # 2
    ("sm_90", 128, "bfloat16", 2, 32, 8, 2, False, False, 1, 64): (128, 49152),  # 2
    ("sm_90", 128, "bfloat16", 2, 32, 8, 2, False, False, 2, 32): (128, 43008),  # 2
    ("sm_90", 128, "bfloat16", 2, 32, 8, 2, False, False, 2, 64): (215, 86016),  # 1
    ("sm_90", 128, "bfloat16", 2, 32, 8, 3, False, False, 1, 16): (92, 21632),  # 2
    ("sm_90", 128, "bfloat16", 2, 32, 8, 3, False, False, 1, 32): (123, 26752),  # 2
    ("sm_90", 128, "bfloat16", 2, 32, 8, 3, False, False, 1, 64): (143, 49280),  # 1
    ("sm_90", 128, "bfloat16", 2, 32, 8, 3, False, False, 2, 32): (128, 43136),  # 2
    ("sm_90", 128, "bfloat16", 2, 32, 8, 3, False, False, 2, 64): (192, 86144),  # 1
    ("sm_90", 128, "bfloat16", 2, 32, 8, 3, True, False, 1, 16): (79, 37888),  # 3
    ("sm_90", 128, "bfloat16", 2, 32, 8, 3, True, False, 1, 32): (126, 43008),  # 2
    ("sm_90", 128, "bfloat16", 2, 32, 8, 3, True, False, 1, 64): (145, 65536),  # 1
    ("sm_90", 128, "bfloat16", 2, 32, 8, 3, True, False, 2, 32): (128, 75776),  # 2
    ("sm_90", 128, "bfloat16", 2, 32, 8, 3, True, False, 2, 64): (218, 118784),  # 1
    ("sm_90", 128, "bfloat16", 2, 32, 8, 3, True, True, 1, 16): (125, 37888),  # 2
    ("sm_90", 128, "bfloat16", 2, 32, 8, 3, True, True, 1, 32): (166, 43008),  # 1
    ("sm_90", 128, "bfloat16", 2, 32, 8, 3, True, True, 1, 64): (177, 65536),  # 1
    ("sm_90", 128, "bfloat16", 2, 32, 8, 3, True, True, 2, 32): (166, 75776),  # 1
    ("sm_90", 128, "bfloat16", 2, 32, 8, 3, True, True, 2, 64): (252, 118784),  # 1
    ("sm_90", 128, "bfloat16", 2, 32, 8, 4, False, False, 1, 16): (92, 21632),  # 2
    ("sm_90", 128, "bfloat16", 2, 32, 8, 4, False, False, 1, 32): (123, 26752),  # 2
    ("sm_90", 128, "bfloat16", 2, 32, 8, 4, False, False, 1, 64): (143, 49280),  # 1
    ("sm_90", 128, "bfloat16", 2, 32, 8, 4, False, False, 2, 32): (128, 43136),  # 2
    ("sm_90", 128, "bfloat16", 2, 32, 8, 4, False, False, 2, 64): (192, 86144),  # 1
    ("sm_90", 128, "bfloat16", 2, 32, 8, 4, True, False, 1, 16): (79, 54272),  # 3
    ("sm_90", 128, "bfloat16", 2, 32, 8, 4, True, False, 1, 32): (126, 59392),  # 2
    ("sm_90", 128, "bfloat16", 2, 32, 8, 4, True, False, 1, 64): (145, 81920),  # 1
    ("sm_90", 128, "bfloat16", 2, 32, 8, 4, True, False, 2, 32): (128, 108544),  # 2
    ("sm_90", 128, "bfloat16", 2, 32, 8, 4, True, False, 2, 64): (218, 151552),  # 1
    ("sm_90", 128, "bfloat16", 2, 32, 8, 4, True, True, 1, 16): (125, 54272),  # 2
    ("sm_90", 128, "bfloat16", 2, 32, 8, 4, True, True, 1, 32): (166, 59392),  # 1
    ("sm_90", 128, "bfloat16", 2, 32, 8, 4, True, True, 1, 64): (179, 81920),  # 1
    ("sm_90", 128, "bfloat16", 2, 32, 8, 4, True, True, 2, 32): (167, 108544),  # 1
    ("sm_90", 128, "bfloat16", 2, 32, 8, 4, True, True, 2, 64): (252, 151552),  # 1
    ("sm_90", 128, "bfloat16", 2, 64, 1, 1, False, False, 1, 16): (255, 20480),  # 8, 512 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 1, 1, False, False, 1, 32): (255, 24576),  # 8, 1984 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 1, 1, False, False, 1, 64): (255, 32768),  # 6, 5852 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 1, 1, False, False, 2, 32): (255, 24576),  # 8, 3616 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 1, 1, False, False, 2, 64): (64, 32768),  # 6, 27088 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 1, 2, False, False, 1, 16): (255, 37120),  # 6, 388 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 1, 2, False, False, 1, 32): (255, 41216),  # 5, 932 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 1, 2, False, False, 1, 64): (255, 49408),  # 4, 6648 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 1, 2, False, False, 2, 32): (255, 74240),  # 3, 1808 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 1, 2, False, False, 2, 64): (64, 82432),  # 2, 28684 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 1, 3, False, False, 1, 16): (255, 37120),  # 6, 400 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 1, 3, False, False, 1, 32): (255, 41216),  # 5, 948 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 1, 3, False, False, 1, 64): (255, 49408),  # 4, 6148 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 1, 3, False, False, 2, 32): (255, 73984),  # 3, 2504 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 1, 3, False, False, 2, 64): (64, 82176),  # 2, 29024 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 1, 3, True, False, 1, 16): (255, 69888),  # 3, 380 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 1, 3, True, False, 1, 32): (255, 73984),  # 3, 792 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 1, 3, True, False, 1, 64): (255, 82176),  # 2, 6744 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 1, 3, True, False, 2, 32): (255, 139776),  # 1, 1844 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 1, 3, True, False, 2, 64): (64, 147968),  # 1, 30164 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 1, 3, True, True, 1, 16): (255, 69888),  # 3, 600 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 1, 3, True, True, 1, 32): (255, 73984),  # 3, 1320 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 1, 3, True, True, 1, 64): (64, 82176),  # 2, 25800 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 1, 3, True, True, 2, 32): (255, 139776),  # 1, 2144 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 1, 3, True, True, 2, 64): (64, 147968),  # 1, 31272 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 1, 4, False, False, 1, 16): (255, 37120),  # 6, 400 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 1, 4, False, False, 1, 32): (255, 41216),  # 5, 948 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 1, 4, False, False, 1, 64): (255, 49408),  # 4, 6148 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 1, 4, False, False, 2, 32): (255, 73984),  # 3, 2504 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 1, 4, False, False, 2, 64): (64, 82176),  # 2, 29024 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 1, 4, True, False, 1, 16): (255, 102656),  # 2, 316 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 1, 4, True, False, 1, 32): (255, 106752),  # 2, 784 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 1, 4, True, False, 1, 64): (255, 114944),  # 2, 6744 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 1, 4, True, False, 2, 32): (255, 205312),  # 1, 1696 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 1, 4, True, False, 2, 64): (64, 213504),  # 1, 31220 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 1, 4, True, True, 1, 16): (255, 102656),  # 2, 568 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 1, 4, True, True, 1, 32): (255, 106752),  # 2, 1184 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 1, 4, True, True, 1, 64): (64, 114944),  # 2, 26708 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 1, 4, True, True, 2, 32): (255, 205312),  # 1, 2028 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 1, 4, True, True, 2, 64): (64, 213504),  # 1, 32140 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 2, 1, False, False, 1, 16): (224, 22528),  # 4
    ("sm_90", 128, "bfloat16", 2, 64, 2, 1, False, False, 1, 32): (255, 28672),  # 4, 8 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 2, 1, False, False, 1, 64): (255, 40960),  # 4, 532 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 2, 1, False, False, 2, 32): (255, 28672),  # 4, 432 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 2, 1, False, False, 2, 64): (255, 40960),  # 4, 2112 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 2, 2, False, False, 1, 16): (244, 38912),  # 4
    ("sm_90", 128, "bfloat16", 2, 64, 2, 2, False, False, 1, 32): (255, 45056),  # 4, 184 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 2, 2, False, False, 1, 64): (255, 57344),  # 4, 476 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 2, 2, False, False, 2, 32): (255, 77824),  # 2, 320 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 2, 2, False, False, 2, 64): (255, 90112),  # 2, 696 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 2, 3, False, False, 1, 16): (244, 39168),  # 4
    ("sm_90", 128, "bfloat16", 2, 64, 2, 3, False, False, 1, 32): (255, 45312),  # 4, 216 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 2, 3, False, False, 1, 64): (255, 57600),  # 3, 500 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 2, 3, False, False, 2, 32): (255, 78080),  # 2, 272 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 2, 3, False, False, 2, 64): (255, 90368),  # 2, 876 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 2, 3, True, False, 1, 16): (242, 71680),  # 3
    ("sm_90", 128, "bfloat16", 2, 64, 2, 3, True, False, 1, 32): (255, 77824),  # 2, 188 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 2, 3, True, False, 1, 64): (255, 90112),  # 2, 464 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 2, 3, True, False, 2, 32): (255, 143360),  # 1, 316 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 2, 3, True, False, 2, 64): (255, 155648),  # 1, 684 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 2, 3, True, True, 1, 16): (255, 71680),  # 3, 96 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 2, 3, True, True, 1, 32): (255, 77824),  # 2, 196 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 2, 3, True, True, 1, 64): (255, 90112),  # 2, 864 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 2, 3, True, True, 2, 32): (255, 143360),  # 1, 448 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 2, 3, True, True, 2, 64): (255, 155648),  # 1, 968 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 2, 4, False, False, 1, 16): (244, 39168),  # 4
    ("sm_90", 128, "bfloat16", 2, 64, 2, 4, False, False, 1, 32): (255, 45312),  # 4, 216 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 2, 4, False, False, 1, 64): (255, 57600),  # 3, 500 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 2, 4, False, False, 2, 32): (255, 78080),  # 2, 272 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 2, 4, False, False, 2, 64): (255, 90368),  # 2, 876 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 2, 4, True, False, 1, 16): (222, 104448),  # 2
    ("sm_90", 128, "bfloat16", 2, 64, 2, 4, True, False, 1, 32): (255, 110592),  # 2, 60 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 2, 4, True, False, 1, 64): (255, 122880),  # 1, 368 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 2, 4, True, False, 2, 32): (255, 208896),  # 1, 164 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 2, 4, True, False, 2, 64): (255, 221184),  # 1, 648 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 2, 4, True, True, 1, 16): (255, 104448),  # 2, 96 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 2, 4, True, True, 1, 32): (255, 110592),  # 2, 204 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 2, 4, True, True, 1, 64): (255, 122880),  # 1, 864 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 2, 4, True, True, 2, 32): (255, 208896),  # 1, 456 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 2, 4, True, True, 2, 64): (255, 221184),  # 1, 968 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 4, 1, False, False, 1, 16): (121, 22528),  # 4
    ("sm_90", 128, "bfloat16", 2, 64, 4, 1, False, False, 1, 32): (193, 28672),  # 2
    ("sm_90", 128, "bfloat16", 2, 64, 4, 1, False, False, 1, 64): (210, 49152),  # 2
    ("sm_90", 128, "bfloat16", 2, 64, 4, 1, False, False, 2, 32): (252, 28672),  # 2
    ("sm_90", 128, "bfloat16", 2, 64, 4, 1, False, False, 2, 64): (255, 32768),  # 2, 72 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 4, 2, False, False, 1, 16): (150, 38912),  # 3
    ("sm_90", 128, "bfloat16", 2, 64, 4, 2, False, False, 1, 32): (168, 45056),  # 3
    ("sm_90", 128, "bfloat16", 2, 64, 4, 2, False, False, 1, 64): (241, 81920),  # 2
    ("sm_90", 128, "bfloat16", 2, 64, 4, 2, False, False, 2, 32): (210, 77824),  # 2
    ("sm_90", 128, "bfloat16", 2, 64, 4, 2, False, False, 2, 64): (255, 147456),  # 1, 100 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 4, 3, False, False, 1, 16): (154, 39168),  # 3
    ("sm_90", 128, "bfloat16", 2, 64, 4, 3, False, False, 1, 32): (196, 45312),  # 2
    ("sm_90", 128, "bfloat16", 2, 64, 4, 3, False, False, 1, 64): (255, 82176),  # 2
    ("sm_90", 128, "bfloat16", 2, 64, 4, 3, False, False, 2, 32): (205, 78080),  # 2
    ("sm_90", 128, "bfloat16", 2, 64, 4, 3, False, False, 2, 64): (255, 147712),  # 1, 48 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 4, 3, True, False, 1, 16): (164, 71680),  # 3
    ("sm_90", 128, "bfloat16", 2, 64, 4, 3, True, False, 1, 32): (194, 77824),  # 2
    ("sm_90", 128, "bfloat16", 2, 64, 4, 3, True, False, 1, 64): (255, 114688),  # 2, 24 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 4, 3, True, False, 2, 32): (210, 143360),  # 1
    ("sm_90", 128, "bfloat16", 2, 64, 4, 3, True, False, 2, 64): (255, 212992),  # 1, 68 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 4, 3, True, True, 1, 16): (227, 71680),  # 2
    ("sm_90", 128, "bfloat16", 2, 64, 4, 3, True, True, 1, 32): (168, 77824),  # 2, 16 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 4, 3, True, True, 1, 64): (255, 114688),  # 2, 144 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 4, 3, True, True, 2, 32): (255, 143360),  # 1, 128 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 4, 3, True, True, 2, 64): (255, 212992),  # 1, 212 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 4, 4, False, False, 1, 16): (154, 39168),  # 3
    ("sm_90", 128, "bfloat16", 2, 64, 4, 4, False, False, 1, 32): (196, 45312),  # 2
    ("sm_90", 128, "bfloat16", 2, 64, 4, 4, False, False, 1, 64): (255, 82176),  # 2
    ("sm_90", 128, "bfloat16", 2, 64, 4, 4, False, False, 2, 32): (205, 78080),  # 2
    ("sm_90", 128, "bfloat16", 2, 64, 4, 4, False, False, 2, 64): (255, 147712),  # 1, 48 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 4, 4, True, False, 1, 16): (164, 104448),  # 2
    ("sm_90", 128, "bfloat16", 2, 64, 4, 4, True, False, 1, 32): (194, 110592),  # 2
    ("sm_90", 128, "bfloat16", 2, 64, 4, 4, True, False, 1, 64): (255, 147456),  # 1, 24 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 4, 4, True, False, 2, 32): (210, 208896),  # 1
    ("sm_90", 128, "bfloat16", 2, 64, 4, 4, True, False, 2, 64): (255, 278528),  # 1, 68 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 4, 4, True, True, 1, 16): (255, 104448),  # 2
    ("sm_90", 128, "bfloat16", 2, 64, 4, 4, True, True, 1, 32): (168, 110592),  # 2, 16 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 4, 4, True, True, 1, 64): (255, 147456),  # 1, 140 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 4, 4, True, True, 2, 32): (255, 208896),  # 1, 120 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 4, 4, True, True, 2, 64): (255, 278528),  # 1, 204 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 8, 1, False, False, 1, 16): (110, 22528),  # 2
    ("sm_90", 128, "bfloat16", 2, 64, 8, 1, False, False, 1, 32): (128, 28672),  # 2, 16 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 8, 1, False, False, 1, 64): (186, 49152),  # 1
    ("sm_90", 128, "bfloat16", 2, 64, 8, 1, False, False, 2, 32): (168, 28672),  # 1
    ("sm_90", 128, "bfloat16", 2, 64, 8, 1, False, False, 2, 64): (255, 36864),  # 1, 72 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 8, 2, False, False, 1, 16): (80, 38912),  # 3
    ("sm_90", 128, "bfloat16", 2, 64, 8, 2, False, False, 1, 32): (128, 45056),  # 2
    ("sm_90", 128, "bfloat16", 2, 64, 8, 2, False, False, 1, 64): (175, 81920),  # 1
    ("sm_90", 128, "bfloat16", 2, 64, 8, 2, False, False, 2, 32): (170, 77824),  # 1
    ("sm_90", 128, "bfloat16", 2, 64, 8, 2, False, False, 2, 64): (255, 151552),  # 1
    ("sm_90", 128, "bfloat16", 2, 64, 8, 3, False, False, 1, 16): (96, 39168),  # 2
    ("sm_90", 128, "bfloat16", 2, 64, 8, 3, False, False, 1, 32): (128, 45312),  # 2
    ("sm_90", 128, "bfloat16", 2, 64, 8, 3, False, False, 1, 64): (176, 82176),  # 1
    ("sm_90", 128, "bfloat16", 2, 64, 8, 3, False, False, 2, 32): (185, 78080),  # 1
    ("sm_90", 128, "bfloat16", 2, 64, 8, 3, False, False, 2, 64): (246, 151808),  # 1
    ("sm_90", 128, "bfloat16", 2, 64, 8, 3, True, False, 1, 16): (110, 71680),  # 2
    ("sm_90", 128, "bfloat16", 2, 64, 8, 3, True, False, 1, 32): (128, 77824),  # 2
    ("sm_90", 128, "bfloat16", 2, 64, 8, 3, True, False, 1, 64): (208, 114688),  # 1
    ("sm_90", 128, "bfloat16", 2, 64, 8, 3, True, False, 2, 32): (169, 143360),  # 1
    ("sm_90", 128, "bfloat16", 2, 64, 8, 3, True, False, 2, 64): (249, 217088),  # 1
    ("sm_90", 128, "bfloat16", 2, 64, 8, 3, True, True, 1, 16): (128, 71680),  # 2
    ("sm_90", 128, "bfloat16", 2, 64, 8, 3, True, True, 1, 32): (168, 77824),  # 1
    ("sm_90", 128, "bfloat16", 2, 64, 8, 3, True, True, 1, 64): (246, 114688),  # 1
    ("sm_90", 128, "bfloat16", 2, 64, 8, 3, True, True, 2, 32): (175, 143360),  # 1
    ("sm_90", 128, "bfloat16", 2, 64, 8, 3, True, True, 2, 64): (255, 217088),  # 1, 68 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 64, 8, 4, False, False, 1, 16): (96, 39168),  # 2
    ("sm_90", 128, "bfloat16", 2, 64, 8, 4, False, False, 1, 32): (128, 45312),  # 2
    ("sm_90", 128, "bfloat16", 2, 64, 8, 4, False, False, 1, 64): (176, 82176),  # 1
    ("sm_90", 128, "bfloat16", 2, 64, 8, 4, False, False, 2, 32): (185, 78080),  # 1
    ("sm_90", 128, "bfloat16", 2, 64, 8, 4, False, False, 2, 64): (246, 151808),  # 1
    ("sm_90", 128, "bfloat16", 2, 64, 8, 4, True, False, 1, 16): (110, 104448),  # 2
    ("sm_90", 128, "bfloat16", 2, 64, 8, 4, True, False, 1, 32): (128, 110592),  # 2
    ("sm_90", 128, "bfloat16", 2, 64, 8, 4, True, False, 1, 64): (208, 147456),  # 1
    ("sm_90", 128, "bfloat16", 2, 64, 8, 4, True, False, 2, 32): (169, 208896),  # 1
    ("sm_90", 128, "bfloat16", 2, 64, 8, 4, True, False, 2, 64): (249, 282624),  # 1
    ("sm_90", 128, "bfloat16", 2, 64, 8, 4, True, True, 1, 16): (128, 104448),  # 2
    ("sm_90", 128, "bfloat16", 2, 64, 8, 4, True, True, 1, 32): (168, 110592),  # 1
    ("sm_90", 128, "bfloat16", 2, 64, 8, 4, True, True, 1, 64): (246, 147456),  # 1
    ("sm_90", 128, "bfloat16", 2, 64, 8, 4, True, True, 2, 32): (175, 208896),  # 1
    ("sm_90", 128, "bfloat16", 2, 64, 8, 4, True, True, 2, 64): (255, 282624),  # 1, 68 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 128, 2, 1, False, False, 1, 16): (255, 40960),  # 4, 280 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 128, 2, 1, False, False, 1, 32): (255, 49152),  # 4, 988 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 128, 2, 1, False, False, 1, 64): (255, 65536),  # 3, 1968 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 128, 2, 1, False, False, 2, 32): (255, 49152),  # 4, 2136 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 128, 2, 1, False, False, 2, 64): (32, 65536),  # 3, 37464 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 128, 2, 2, False, False, 1, 16): (255, 73728),  # 3, 352 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 128, 2, 2, False, False, 1, 32): (255, 81920),  # 2, 440 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 128, 2, 2, False, False, 1, 64): (255, 98304),  # 2, 1676 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 128, 2, 2, False, False, 2, 32): (255, 147456),  # 1, 812 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 128, 2, 2, False, False, 2, 64): (255, 163840),  # 1, 2220 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 128, 2, 3, False, False, 1, 16): (255, 74240),  # 3, 308 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 128, 2, 3, False, False, 1, 32): (255, 82432),  # 2, 472 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 128, 2, 3, False, False, 1, 64): (255, 98816),  # 2, 1828 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 128, 2, 3, True, False, 1, 16): (255, 139264),  # 1, 172 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 128, 2, 3, True, False, 1, 32): (255, 147456),  # 1, 208 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 128, 2, 3, True, False, 1, 64): (255, 163840),  # 1, 1528 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 128, 2, 3, True, True, 1, 16): (255, 139264),  # 1, 348 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 128, 2, 3, True, True, 1, 32): (255, 147456),  # 1, 672 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 128, 2, 3, True, True, 1, 64): (255, 163840),  # 1, 2084 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 128, 2, 4, False, False, 1, 16): (255, 74240),  # 3, 308 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 128, 2, 4, False, False, 1, 32): (255, 82432),  # 2, 472 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 128, 2, 4, False, False, 1, 64): (255, 98816),  # 2, 1828 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 128, 2, 4, True, False, 1, 16): (255, 204800),  # 1, 144 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 128, 2, 4, True, False, 1, 32): (255, 212992),  # 1, 196 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 128, 2, 4, True, False, 1, 64): (255, 229376),  # 1, 1532 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 128, 2, 4, True, True, 1, 16): (255, 204800),  # 1, 196 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 128, 2, 4, True, True, 1, 32): (255, 212992),  # 1, 372 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 128, 2, 4, True, True, 1, 64): (255, 229376),  # 1, 1988 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 128, 4, 1, False, False, 1, 16): (196, 40960),  # 2
    ("sm_90", 128, "bfloat16", 2, 128, 4, 1, False, False, 1, 32): (224, 49152),  # 2
    ("sm_90", 128, "bfloat16", 2, 128, 4, 1, False, False, 1, 64): (255, 81920),  # 2, 172 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 128, 4, 1, False, False, 2, 32): (255, 49152),  # 2, 168 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 128, 4, 1, False, False, 2, 64): (255, 49152),  # 2, 626 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 128, 4, 2, False, False, 1, 16): (238, 73728),  # 2
    ("sm_90", 128, "bfloat16", 2, 128, 4, 2, False, False, 1, 32): (232, 81920),  # 2
    ("sm_90", 128, "bfloat16", 2, 128, 4, 2, False, False, 1, 64): (255, 147968),  # 1, 232 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 128, 4, 2, False, False, 2, 32): (255, 147456),  # 1, 312 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 128, 4, 2, False, False, 2, 64): (255, 279552),  # 1, 548 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 128, 4, 3, False, False, 1, 16): (238, 74240),  # 2
    ("sm_90", 128, "bfloat16", 2, 128, 4, 3, False, False, 1, 32): (232, 82432),  # 2
    ("sm_90", 128, "bfloat16", 2, 128, 4, 3, False, False, 1, 64): (255, 147968),  # 1, 236 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 128, 4, 3, True, False, 1, 16): (168, 139264),  # 1
    ("sm_90", 128, "bfloat16", 2, 128, 4, 3, True, False, 1, 32): (203, 147456),  # 1
    ("sm_90", 128, "bfloat16", 2, 128, 4, 3, True, False, 1, 64): (255, 213504),  # 1, 232 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 128, 4, 3, True, True, 1, 16): (210, 139264),  # 1
    ("sm_90", 128, "bfloat16", 2, 128, 4, 3, True, True, 1, 32): (255, 147456),  # 1, 172 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 128, 4, 3, True, True, 1, 64): (255, 213504),  # 1, 404 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 128, 4, 4, False, False, 1, 16): (238, 74240),  # 2
    ("sm_90", 128, "bfloat16", 2, 128, 4, 4, False, False, 1, 32): (232, 82432),  # 2
    ("sm_90", 128, "bfloat16", 2, 128, 4, 4, False, False, 1, 64): (255, 147968),  # 1, 236 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 128, 4, 4, True, False, 1, 16): (210, 204800),  # 1
    ("sm_90", 128, "bfloat16", 2, 128, 4, 4, True, False, 1, 32): (201, 212992),  # 1
    ("sm_90", 128, "bfloat16", 2, 128, 4, 4, True, False, 1, 64): (255, 279040),  # 1, 232 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 128, 4, 4, True, True, 1, 16): (207, 204800),  # 1
    ("sm_90", 128, "bfloat16", 2, 128, 4, 4, True, True, 1, 32): (255, 212992),  # 1, 172 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 128, 4, 4, True, True, 1, 64): (255, 279040),  # 1, 404 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 128, 8, 1, False, False, 1, 16): (128, 40960),  # 2
    ("sm_90", 128, "bfloat16", 2, 128, 8, 1, False, False, 1, 32): (169, 49152),  # 1
    ("sm_90", 128, "bfloat16", 2, 128, 8, 1, False, False, 1, 64): (231, 81920),  # 1
    ("sm_90", 128, "bfloat16", 2, 128, 8, 1, False, False, 2, 32): (248, 49152),  # 1
    ("sm_90", 128, "bfloat16", 2, 128, 8, 1, False, False, 2, 64): (255, 53248),  # 1, 334 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 128, 8, 2, False, False, 1, 16): (128, 73728),  # 2, 16 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 128, 8, 2, False, False, 1, 32): (128, 81920),  # 2
    ("sm_90", 128, "bfloat16", 2, 128, 8, 2, False, False, 1, 64): (255, 147456),  # 1, 52 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 128, 8, 2, False, False, 2, 32): (209, 147456),  # 1
    ("sm_90", 128, "bfloat16", 2, 128, 8, 2, False, False, 2, 64): (255, 282624),  # 1, 208 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 128, 8, 3, False, False, 1, 16): (154, 74240),  # 1
    ("sm_90", 128, "bfloat16", 2, 128, 8, 3, False, False, 1, 32): (196, 82432),  # 1
    ("sm_90", 128, "bfloat16", 2, 128, 8, 3, False, False, 1, 64): (255, 147968),  # 1, 76 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 128, 8, 3, True, False, 1, 16): (162, 139264),  # 1
    ("sm_90", 128, "bfloat16", 2, 128, 8, 3, True, False, 1, 32): (194, 147456),  # 1
    ("sm_90", 128, "bfloat16", 2, 128, 8, 3, True, False, 1, 64): (255, 212992),  # 1, 92 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 128, 8, 3, True, True, 1, 16): (198, 139264),  # 1
    ("sm_90", 128, "bfloat16", 2, 128, 8, 3, True, True, 1, 32): (196, 147456),  # 1
    ("sm_90", 128, "bfloat16", 2, 128, 8, 3, True, True, 1, 64): (255, 212992),  # 1, 176 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 128, 8, 4, False, False, 1, 16): (154, 74240),  # 1
    ("sm_90", 128, "bfloat16", 2, 128, 8, 4, False, False, 1, 32): (196, 82432),  # 1
    ("sm_90", 128, "bfloat16", 2, 128, 8, 4, False, False, 1, 64): (255, 147968),  # 1, 76 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 128, 8, 4, True, False, 1, 16): (162, 204800),  # 1
    ("sm_90", 128, "bfloat16", 2, 128, 8, 4, True, False, 1, 32): (194, 212992),  # 1
    ("sm_90", 128, "bfloat16", 2, 128, 8, 4, True, False, 1, 64): (255, 278528),  # 1, 92 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 128, 8, 4, True, True, 1, 16): (198, 204800),  # 1
    ("sm_90", 128, "bfloat16", 2, 128, 8, 4, True, True, 1, 32): (196, 212992),  # 1
    ("sm_90", 128, "bfloat16", 2, 128, 8, 4, True, True, 1, 64): (255, 278528),  # 1, 176 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 256, 4, 1, False, False, 1, 16): (255, 77824),  # 2, 196 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 256, 4, 1, False, False, 1, 32): (255, 90112),  # 2, 576 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 256, 4, 1, False, False, 1, 64): (255, 147456),  # 1, 1176 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 256, 4, 2, False, False, 1, 16): (255, 143360),  # 1, 328 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 256, 4, 2, False, False, 1, 32): (255, 155648),  # 1, 288 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 256, 4, 2, False, False, 1, 64): (255, 279552),  # 1, 668 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 256, 8, 1, False, False, 1, 16): (192, 77824),  # 1
    ("sm_90", 128, "bfloat16", 2, 256, 8, 1, False, False, 1, 32): (208, 90112),  # 1
    ("sm_90", 128, "bfloat16", 2, 256, 8, 1, False, False, 1, 64): (255, 147456),  # 1, 124 B of spill stores
    ("sm_90", 128, "bfloat16", 2, 256, 8, 2, False, False, 1, 16): (174, 143360),  # 1
    ("sm_90", 128, "bfloat16", 2, 256, 8, 2, False, False, 1, 32): (238, 155648),  # 1
    ("sm_90", 128, "bfloat16", 2, 256, 8, 2, False, False, 1, 64): (255, 279552),  # 1, 360 B of spill stores
    ("sm_90", 128, "bfloat16", 1, 32, 4, 2, False, False, 1, 16): (126, 21504),  # 4
    ("sm_90", 128, "bfloat16", 1, 32, 4, 2, False, False, 1, 32): (166, 26624),  # 3
    ("sm_90", 128, "bfloat16", 1, 32, 4, 2, False, False, 1, 64): (212, 40960),  # 2
    ("sm_90", 128, "bfloat16", 1, 32, 4, 2, False, False, 2, 32): (168, 34816),  # 3
    ("sm_90", 128, "bfloat16", 1, 32, 4, 2, False, False, 2, 64): (211, 40960),  # 2
    ("sm_90", 128, "bfloat16", 1, 32, 4, 3, False, False, 1, 16): (128, 21632),  # 4
    ("sm_90", 128, "bfloat16", 1, 32, 4, 3, False, False, 1, 32): (166, 26752),  # 3
    ("sm_90", 128, "bfloat16", 1, 32, 4, 3, False, False, 1, 64): (208, 41088),  # 2
    ("sm_90", 128, "bfloat16", 1, 32, 4, 3, False, False, 2, 32): (168, 34944),  # 3
    ("sm_90", 128, "bfloat16", 1, 32, 4, 3, False, False, 2, 64): (215, 41088),  # 2
    ("sm_90", 128, "bfloat16", 1, 32, 4, 3, True, False, 1, 16): (125, 29696),  # 4
    ("sm_90", 128, "bfloat16", 1, 32, 4, 3, True, False, 1, 32): (168, 34816),  # 3
    ("sm_90", 128, "bfloat16", 1, 32, 4, 3, True, False, 1, 64): (213, 49152),  # 2
    ("sm_90", 128, "bfloat16", 1, 32, 4, 3, True, False, 2, 32): (168, 51200),  # 3
    ("sm_90", 128, "bfloat16", 1, 32, 4, 3, True, False, 2, 64): (213, 57344),  # 2
    ("sm_90", 128, "bfloat16", 1, 32, 4, 3, True, True, 1, 16): (128, 29696),  # 4
    ("sm_90", 128, "bfloat16", 1, 32, 4, 3, True, True, 1, 32): (168, 34816),  # 3
    ("sm_90", 128, "bfloat16", 1, 32, 4, 3, True, True, 1, 64): (234, 49152),  # 2
    ("sm_90", 128, "bfloat16", 1, 32, 4, 3, True, True, 2, 32): (181, 51200),  # 2
    ("sm_90", 128, "bfloat16", 1, 32, 4, 3, True, True, 2, 64): (238, 57344),  # 2
    ("sm_90", 128, "bfloat16", 1, 32, 4, 4, False, False, 1, 16): (128, 21632),  # 4
    ("sm_90", 128, "bfloat16", 1, 32, 4, 4, False, False, 1, 32): (166, 26752),  # 3
    ("sm_90", 128, "bfloat16", 1, 32, 4, 4, False, False, 1, 64): (208, 41088),  # 2
    ("sm_90", 128, "bfloat16", 1, 32, 4, 4, False, False, 2, 32): (168, 34944),  # 3
    ("sm_90", 128, "bfloat16", 1, 32, 4, 4, False, False, 2, 64): (215, 41088),  # 2
    ("sm_90", 128, "bfloat16", 1, 32, 4, 4, True, False, 1, 16): (125, 37888),  # 4
    ("sm_90", 128, "bfloat16", 1, 32, 4, 4, True, False, 1, 32): (168, 43008),  # 3
    ("sm_90", 128, "bfloat16", 1, 32, 4, 4, True, False, 1, 64): (213, 57344),  # 2
    ("sm_90", 128, "bfloat16", 1, 32, 4, 4, True, False, 2, 32): (168, 67584),  # 3
    ("sm_90", 128, "bfloat16", 1, 32, 4, 4, True, False, 2, 64): (213, 73728),  # 2
    ("sm_90", 128, "bfloat16", 1, 32, 4, 4, True, True, 1, 16): (128, 37888),  # 4
    ("sm_90", 128, "bfloat16", 1, 32, 4, 4, True, True, 1, 32): (168, 43008),  # 3
    ("sm_90", 128, "bfloat16", 1, 32, 4, 4, True, True, 1, 64): (234, 57344),  # 2
    ("sm_90", 128, "bfloat16", 1, 32, 4, 4, True, True, 2, 32): (181, 67584),  # 2
    ("sm_90", 128, "bfloat16", 1, 32, 4, 4, True, True, 2, 64): (240, 73728),  # 2
    ("sm_90", 128, "bfloat16", 1, 64, 4, 2, False, False, 1, 16): (144, 38912),  # 3
    ("sm_90", 128, "bfloat16", 1, 64, 4, 2, False, False, 1, 32): (166, 45056),  # 3
    ("sm_90", 128, "bfloat16", 1, 64, 4, 2, False, False, 1, 64): (219, 65536),  # 2
    ("sm_90", 128, "bfloat16", 1, 64, 4, 2, False, False, 2, 32): (178, 61440),  # 2
    ("sm_90", 128, "bfloat16", 1, 64, 4, 2, False, False, 2, 64): (223, 65536),  # 2
    ("sm_90", 128, "bfloat16", 1, 64, 4, 3, False, False, 1, 16): (148, 39168),  # 3
    ("sm_90", 128, "bfloat16", 1, 64, 4, 3, False, False, 1, 32): (168, 45312),  # 3
    ("sm_90", 128, "bfloat16", 1, 64, 4, 3, False, False, 1, 64): (212, 65792),  # 2
    ("sm_90", 128, "bfloat16", 1, 64, 4, 3, False, False, 2, 32): (183, 61696),  # 2
    ("sm_90", 128, "bfloat16", 1, 64, 4, 3, False, False, 2, 64): (220, 65792),  # 2
    ("sm_90", 128, "bfloat16", 1, 64, 4, 3, True, False, 1, 16): (142, 55296),  # 3
    ("sm_90", 128, "bfloat16", 1, 64, 4, 3, True, False, 1, 32): (168, 61440),  # 3
    ("sm_90", 128, "bfloat16", 1, 64, 4, 3, True, False, 1, 64): (236, 81920),  # 2
    ("sm_90", 128, "bfloat16", 1, 64, 4, 3, True, False, 2, 32): (181, 94208),  # 2
    ("sm_90", 128, "bfloat16", 1, 64, 4, 3, True, False, 2, 64): (227, 98304),  # 2
    ("sm_90", 128, "bfloat16", 1, 64, 4, 3, True, True, 1, 16): (168, 55296),  # 3
    ("sm_90", 128, "bfloat16", 1, 64, 4, 3, True, True, 1, 32): (173, 61440),  # 2
    ("sm_90", 128, "bfloat16", 1, 64, 4, 3, True, True, 1, 64): (250, 81920),  # 2
    ("sm_90", 128, "bfloat16", 1, 64, 4, 3, True, True, 2, 32): (177, 94208),  # 2
    ("sm_90", 128, "bfloat16", 1, 64, 4, 3, True, True, 2, 64): (255, 98304),  # 2, 48 B of spill stores
    ("sm_90", 128, "bfloat16", 1, 64, 8, 2, False, False, 1, 16): (86, 38912),  # 2
    ("sm_90", 128, "bfloat16", 1, 64, 8, 2, False, False, 1, 32): (128, 45056),  # 2
    ("sm_90", 128, "bfloat16", 1, 64, 8, 2, False, False, 1, 64): (187, 65536),  # 1
    ("sm_90", 128, "bfloat16", 1, 64, 8, 2, False, False, 2, 32): (128, 61440),  # 2
    ("sm_90", 128, "bfloat16", 1, 64, 8, 2, False, False, 2, 64): (247, 69632),  # 1
    ("sm_90", 128, "bfloat16", 1, 64, 8, 3, False, False, 1, 16): (105, 39168),  # 2
    ("sm_90", 128, "bfloat16", 1, 64, 8, 3, False, False, 1, 32): (128, 45312),  # 2
    ("sm_90", 128, "bfloat16", 1, 64, 8, 3, False, False, 1, 64): (189, 65792),  # 1
    ("sm_90", 128, "bfloat16", 1, 64, 8, 3, False, False, 2, 32): (128, 61696),  # 2
    ("sm_90", 128, "bfloat16", 1, 64, 8, 3, False, False, 2, 64): (249, 69888),  # 1
    ("sm_90", 128, "bfloat16", 1, 64, 8, 3, True, False, 1, 16): (80, 55296),  # 3, 16 B of spill stores
    ("sm_90", 128, "bfloat16", 1, 64, 8, 3, True, False, 1, 32): (128, 61440),  # 2
    ("sm_90", 128, "bfloat16", 1, 64, 8, 3, True, False, 1, 64): (190, 81920),  # 1
    ("sm_90", 128, "bfloat16", 1, 64, 8, 3, True, False, 2, 32): (128, 94208),  # 2
    ("sm_90", 128, "bfloat16", 1, 64, 8, 3, True, False, 2, 64): (250, 102400),  # 1
    ("sm_90", 128, "bfloat16", 1, 64, 8, 3, True, True, 1, 16): (128, 55296),  # 2
    ("sm_90", 128, "bfloat16", 1, 64, 8, 3, True, True, 1, 32): (170, 61440),  # 1
    ("sm_90", 128, "bfloat16", 1, 64, 8, 3, True, True, 1, 64): (214, 81920),  # 1
    ("sm_90", 128, "bfloat16", 1, 64, 8, 3, True, True, 2, 32): (178, 94208),  # 1
    ("sm_90", 128, "bfloat16", 1, 64, 8, 3, True, True, 2, 64): (255, 102400),  # 1, 32 B of spill stores
    ("sm_90", 128, "bfloat16", 1, 128, 4, 2, False, False, 1, 16): (200, 73728),  # 2
    ("sm_90", 128, "bfloat16", 1, 128, 4, 2, False, False, 1, 32): (255, 81920),  # 2, 8 B of spill stores
    ("sm_90", 128, "bfloat16", 1, 128, 4, 2, False, False, 1, 64): (255, 114688),  # 2, 24 B of spill stores
    ("sm_90", 128, "bfloat16", 1, 128, 4, 2, False, False, 2, 32): (255, 114688),  # 2, 104 B of spill stores
    ("sm_90", 128, "bfloat16", 1, 128, 4, 2, False, False, 2, 64): (255, 114688),  # 2, 240 B of spill stores
    ("sm_90", 128, "bfloat16", 1, 128, 4, 3, False, False, 1, 16): (200, 74240),  # 2
    ("sm_90", 128, "bfloat16", 1, 128, 4, 3, False, False, 1, 32): (255, 82432),  # 2, 20 B of spill stores
    ("sm_90", 128, "bfloat16", 1, 128, 4, 3, False, False, 1, 64): (255, 115200),  # 2, 8 B of spill stores
    ("sm_90", 128, "bfloat16", 1, 128, 4, 3, True, False, 1, 16): (198, 106496),  # 2
    ("sm_90", 128, "bfloat16", 1, 128, 4, 3, True, False, 1, 32): (255, 114688),  # 2, 8 B of spill stores
    ("sm_90", 128, "bfloat16", 1, 128, 4, 3, True, False, 1, 64): (255, 147456),  # 1, 28 B of spill stores
    ("sm_90", 128, "bfloat16", 1, 128, 4, 3, True, True, 1, 16): (200, 106496),  # 2
    ("sm_90", 128, "bfloat16", 1, 128, 4, 3, True, True, 1, 32): (255, 114688),  # 2, 12 B of spill stores
    ("sm_90", 128, "bfloat16", 1, 128, 4, 3, True, True, 1, 64): (255, 147456),  # 1, 212 B of spill stores
    ("sm_90", 128, "bfloat16", 1, 128, 8, 2, False, False, 1, 16): (128, 73728),  # 2
    ("sm_90", 128, "bfloat16", 1, 128, 8, 2, False, False, 1, 32): (166, 81920),  # 1
    ("sm_90", 128, "bfloat16", 1, 128, 8, 2, False, False, 1, 64): (227, 114688),  # 1
    ("sm_90", 128, "bfloat16", 1, 128, 8, 2, False, False, 2, 32): (176, 114688),  # 1
    ("sm_90", 128, "bfloat16", 1, 128, 8, 2, False, False, 2, 64): (255, 118784),  # 1, 248 B of spill stores
}
for (_a, _d, _dt, _kb, _bn, _w, _s, _pf, _nx, _h, _r), _v in list(COMPILED_QLEN.items()):
    COMPILED_QLEN[(_a, _d, "float16", _kb, _bn, _w, _s, _pf, _nx, _h, _r)] = _v


def arch(device: DeviceSpec) -> str:
    """The compile target of ``device``, ``"sm_<major><minor>"`` of its compute capability (``"sm_90"`` for the H100
    and H200): the key of the tables of compiled kernels that depend on the target only (:data:`COMPILED_QLEN`)."""
    major, minor = device.compute_capability
    return f"sm_{major}{minor}"


# An FP8 (float8_e4m3fn) K/V cache read with a 16-bit q: the kernel that dots it in float16 and widens V in registers
# before its shared-memory copy (docs/decisions/fp8-dot-dtype.md), compiled for sm_90 the same way
# (bench/compile_sm90.py --kv-dtype fp8 --scales tensor --variants plain,prefetch,next_item --heads 1,2: G = 8, q_len
# 1, per-tensor scales; Triton 3.6, 2026-12-06). V's buffers hold float16, K's e4m3: (32, 4, 3) with the prefetch
# and two heads takes 128 registers and 46,080 B (4 CTAs per SM), (64, 4, 2) 140 registers where the 16-bit kernel
# takes 118 (3 CTAs per SM, not 4), (128, 4, 2) 204 where it takes 168 (2, not 3). Halving the 16-bit figures' K/V
# buffers (what resident_ctas_per_sm does for a config this table lacks) counts a wrong residency for 13 of these 34
# configs, more CTAs than run for 7 of them. Key: (arch, head_dim, dtype, block_n, num_warps, num_stages, prefetch,
# heads_per_tile, next_item), arch the compile target (:func:`arch`: every sm_90 GPU reads these figures); the
# comment gives the resident CTAs per SM.
COMPILED_FP8: dict[tuple[str, int, str, int, int, int, bool, int, bool], tuple[int, int]] = {
    ("sm_90", 128, "bfloat16", 32, 4, 2, False, 1, False): (104, 21504),  # 4
    ("sm_90", 128, "bfloat16", 32, 4, 2, False, 2, False): (128, 29696),  # 4
    ("sm_90", 128, "bfloat16", 32, 4, 3, False, 1, False): (106, 21632),  # 4
    ("sm_90", 128, "bfloat16", 32, 4, 3, False, 2, False): (142, 29824),  # 3
    ("sm_90", 128, "bfloat16", 32, 4, 3, True, 1, False): (102, 29696),  # 4
    ("sm_90", 128, "bfloat16", 32, 4, 3, True, 1, True): (128, 29696),  # 4
    ("sm_90", 128, "bfloat16", 32, 4, 3, True, 2, False): (128, 46080),  # 4
    ("sm_90", 128, "bfloat16", 32, 4, 3, True, 2, True): (168, 46080),  # 3
    ("sm_90", 128, "bfloat16", 32, 4, 4, False, 2, False): (142, 29824),  # 3
    ("sm_90", 128, "bfloat16", 32, 4, 4, True, 1, False): (102, 37888),  # 4
    ("sm_90", 128, "bfloat16", 32, 4, 4, True, 1, True): (128, 37888),  # 4
    ("sm_90", 128, "bfloat16", 32, 4, 4, True, 2, False): (128, 62464),  # 3
    ("sm_90", 128, "bfloat16", 64, 4, 2, False, 1, False): (140, 38912),  # 3
    ("sm_90", 128, "bfloat16", 64, 4, 2, False, 2, False): (150, 55296),  # 3
    ("sm_90", 128, "bfloat16", 64, 4, 3, False, 1, False): (150, 39168),  # 3
    ("sm_90", 128, "bfloat16", 64, 4, 3, True, 1, False): (150, 55296),  # 3
    ("sm_90", 128, "bfloat16", 64, 4, 3, True, 1, True): (186, 55296),  # 2
    ("sm_90", 128, "bfloat16", 64, 4, 3, True, 2, False): (150, 88064),  # 2
    ("sm_90", 128, "bfloat16", 64, 4, 3, True, 2, True): (255, 88064),  # 2
    ("sm_90", 128, "bfloat16", 64, 4, 4, True, 1, False): (150, 71680),  # 3
    ("sm_90", 128, "bfloat16", 64, 4, 4, True, 1, True): (186, 71680),  # 2
    ("sm_90", 128, "bfloat16", 64, 8, 2, False, 1, False): (80, 38912),  # 3, 20 B of spill stores
    ("sm_90", 128, "bfloat16", 64, 8, 2, False, 2, False): (124, 55296),  # 2
    ("sm_90", 128, "bfloat16", 64, 8, 3, False, 1, False): (105, 39168),  # 2
    ("sm_90", 128, "bfloat16", 64, 8, 3, True, 1, False): (108, 55296),  # 2
    ("sm_90", 128, "bfloat16", 64, 8, 3, True, 1, True): (128, 55296),  # 2
    ("sm_90", 128, "bfloat16", 64, 8, 3, True, 2, False): (128, 88064),  # 2
    ("sm_90", 128, "bfloat16", 64, 8, 3, True, 2, True): (172, 88064),  # 1
    ("sm_90", 128, "bfloat16", 128, 4, 2, False, 1, False): (204, 73728),  # 2
    ("sm_90", 128, "bfloat16", 128, 4, 3, False, 1, False): (202, 74240),  # 2
    ("sm_90", 128, "bfloat16", 128, 8, 2, False, 1, False): (128, 73728),  # 2, 4 B of spill stores
    ("sm_90", 128, "bfloat16", 128, 8, 3, False, 1, False): (128, 74240),  # 2, 8 B of spill stores
    ("sm_90", 128, "bfloat16", 256, 4, 2, False, 1, False): (255, 143360),  # 1, 168 B of spill stores
    ("sm_90", 128, "bfloat16", 256, 8, 2, False, 1, False): (200, 143360),  # 1
}
for (_gpu, _d, _dt, _bn, _w, _s, _pf, _h, _nx), _v in list(COMPILED_FP8.items()):
    COMPILED_FP8[(_gpu, _d, "float16", _bn, _w, _s, _pf, _h, _nx)] = _v

NEXT_ITEM_EXTRA_REGS = 80
"""Registers the look-ahead is assumed to add to a config :data:`COMPILED_NEXT` lacks (the compiles above add
up to 76)."""

# Registers of the stage-1 kernel depend on the GQA group for some tiles: compiled for sm_90 at G = 1..8 and 16
# (docs/decisions/register-cap-residency.md), every config of MEASURED keeps its residency for G <= 8 except
# (64, 4, 2), which takes 154-166 registers (3 CTAs per SM) at G != 8 against 118 (4) at G = 8. Its launch is
# capped at 128 registers (Triton's ``maxnreg``; 44 bytes of spill stores), which restores 4 CTAs per SM for every
# G: on the H200 the capped kernel ran G = 4 plans on that tile 1.31x (stream_k) and 1.24x (balanced) faster,
# geomean over 12 batches of 262,144 and 1,048,576 tokens, and G = 16 plans 1.32x / 1.25x; at G = 8 the cap cost
# 0.5-0.7 % (geomean) and is not applied (docs/decisions/register-cap-residency.md). A cap at 168 for (128, 4, 2) (3 CTAs per SM at
# G = 16) made it 1.05x slower at G = 16 and 1.28-1.35x at G = 4 and 8 (180 bytes of spills): not applied, so
# G = 16 runs that tile at 2 CTAs per SM where the tables say 3.
# (head_dim, block_n, num_warps, num_stages, prefetch) -> maxnreg for G != MEASURED_GROUP, G <= 16 (the 16-row
# query tile every measured group compiles to), 16-bit K/V
REGISTER_CAPS: dict[tuple[int, int, int, int, bool], int] = {
    (128, 64, 4, 2, False): 128,
}


def register_cap(
    head_dim: int,
    group: int,
    block_n: int,
    num_warps: int,
    num_stages: int,
    prefetch: bool = False,
    dtype_bytes: int = 2,
) -> int | None:
    """Register cap (``maxnreg``) of the stage-1 launch that keeps a config's measured residency at GQA
    group ``group`` (:data:`REGISTER_CAPS`), or None when the uncapped kernel keeps it or the case was not
    measured (G > 16: a 32- or 64-row query tile; fp32)."""
    if group == MEASURED_GROUP or group > 16 or dtype_bytes != 2:
        return None
    return REGISTER_CAPS.get((head_dim, block_n, num_warps, num_stages, bool(prefetch)))


def occupancy(device: DeviceSpec, num_warps: int, n_regs: int, shared_bytes: int) -> int:
    """CTAs of one kernel resident on one SM (>= 1).

    Parameters
    ----------
    device : DeviceSpec
    num_warps : int
        Warps per CTA.
    n_regs : int
        Registers per thread of the compiled kernel.
    shared_bytes : int
        Shared memory per CTA, bytes.
    """
    threads = 32 * num_warps
    regs_per_warp = math.ceil(max(n_regs, 1) * 32 / 256) * 256
    by_regs = device.regs_per_sm // (regs_per_warp * num_warps)
    smem = math.ceil(max(shared_bytes, 0) / 128) * 128 + 1024
    by_smem = device.smem_per_sm_bytes // smem
    by_threads = device.max_threads_per_sm // threads
    return max(1, min(by_regs, by_smem, by_threads, 32))


def estimate(
    device: DeviceSpec,
    head_dim: int,
    dtype_bytes: int,
    block_n: int,
    num_warps: int,
    num_stages: int,
    heads_per_tile: int = 1,
) -> int:
    """Residency of an unmeasured config: shared memory of ``max(num_stages - 1, 1)``
    K+V tile buffers (Triton's software pipeline) per KV head of the tile and 128 registers per thread
    (the register budget Triton's 4-warp decode tiles reach; a guess, see MEASURED)."""
    return occupancy(device, num_warps, 128, _estimate_smem(head_dim, dtype_bytes, block_n, num_stages, heads_per_tile))


def _estimate_smem(head_dim: int, dtype_bytes: int, block_n: int, num_stages: int, heads_per_tile: int) -> int:
    return kv_buffer_bytes(head_dim, dtype_bytes, block_n, num_stages, heads_per_tile)


def tile_resources(
    device: DeviceSpec,
    head_dim: int,
    dtype: str,
    dtype_bytes: int,
    block_n: int,
    num_warps: int,
    num_stages: int,
    *,
    prefetch: bool = False,
    heads_per_tile: int = 1,
    next_item: bool = False,
    kv_bytes: int | None = None,
    extra_rows: int = 0,
    rows: int = 0,
) -> tuple[int, int]:
    """``(registers per thread, shared memory per CTA in bytes)`` of a config's compiled kernel on ``device``, as
    :func:`resident_ctas_per_sm` counts them: measured figures if known (:data:`MEASURED`, then the sm_90 compiles of
    :data:`COMPILED`), else :func:`estimate`'s (128 registers, :func:`kv_buffer_bytes`: ``num_stages - 1`` K/V
    buffers, as the prefetching loop has). ``prefetch``: the config with ``KernelConfig.prefetch``
    (:data:`MEASURED_PREFETCH`); ``heads_per_tile`` > 1: :data:`COMPILED_HEADS`; ``next_item`` (with the prefetch):
    :data:`COMPILED_NEXT`, else the config without it at :data:`NEXT_ITEM_EXTRA_REGS` more registers (at most 255).

    ``kv_bytes`` (bytes per K/V element, default ``dtype_bytes``), ``rows`` (a q_len > 1 tile's padded query rows,
    :func:`q_len_rows`; 0 at q_len 1) and ``extra_rows`` (what those rows add over the q_len-1 tile's) adjust the
    tables' figures: the K/V buffers at ``kv_bytes`` (:func:`kv_buffer_bytes`), and at q_len > 1 the registers and
    shared memory of the compiled verify-step kernel (:data:`COMPILED_QLEN`, by the device's :func:`arch`) where it
    has the config, else :func:`extra_row_regs` more registers than the q_len-1 figures (at most 255; a spilling
    tile keeps the register file's residency). With neither, the tables' figures as they are."""
    kvb = dtype_bytes if kv_bytes is None else kv_bytes
    if kvb == 1 and rows <= 0 and extra_rows <= 0:  # the q_len-1 FP8 kernel
        fp8 = COMPILED_FP8.get(
            (
                arch(device),
                head_dim,
                dtype,
                block_n,
                num_warps,
                num_stages,
                bool(prefetch or next_item),
                heads_per_tile,
                bool(next_item),
            )
        )
        if fp8 is not None:
            return fp8
    regs, smem = _regs_smem(
        device, head_dim, dtype, dtype_bytes, block_n, num_warps, num_stages, prefetch, heads_per_tile, next_item
    )
    if kvb == dtype_bytes and extra_rows <= 0 and rows <= 0:
        return regs, smem
    compiled = None
    if rows > 0:
        key = (arch(device), head_dim, dtype)
        rest = (block_n, num_warps, num_stages, bool(prefetch or next_item), bool(next_item), heads_per_tile, int(rows))
        compiled = COMPILED_QLEN.get((*key, kvb, *rest))
        if compiled is not None:  # the kernel of this cache's element size: its buffers as compiled
            return compiled
        compiled = COMPILED_QLEN.get((*key, dtype_bytes, *rest))  # the 16-bit kernel, its K/V buffers at kv_bytes
    if compiled is not None:
        regs, smem = compiled
        extra_rows = 0
    # K/V buffers at the cache's element size (FP8: half the 16-bit bytes; the other shared memory is unchanged).
    # The plain loop keeps one K/V buffer whatever num_stages, the prefetching loop num_stages - 1 (KernelConfig).
    copies = max(num_stages - 1, 1) if prefetch or next_item else 1
    kv16 = min(smem, kv_buffer_bytes(head_dim, dtype_bytes, block_n, copies + 1, heads_per_tile))
    smem = smem - kv16 + kv16 * kvb // dtype_bytes
    regs = min(regs + extra_row_regs(head_dim, block_n, num_warps, extra_rows), 255)
    return regs, smem


def resident_ctas_per_sm(
    device: DeviceSpec,
    head_dim: int,
    dtype: str,
    dtype_bytes: int,
    block_n: int,
    num_warps: int,
    num_stages: int,
    *,
    prefetch: bool = False,
    heads_per_tile: int = 1,
    next_item: bool = False,
    kv_bytes: int | None = None,
    extra_rows: int = 0,
    rows: int = 0,
) -> int:
    """CTAs of the config resident on one SM of ``device``: :func:`occupancy` of its :func:`tile_resources` (the same
    arguments)."""
    return occupancy(
        device,
        num_warps,
        *tile_resources(
            device,
            head_dim,
            dtype,
            dtype_bytes,
            block_n,
            num_warps,
            num_stages,
            prefetch=prefetch,
            heads_per_tile=heads_per_tile,
            next_item=next_item,
            kv_bytes=kv_bytes,
            extra_rows=extra_rows,
            rows=rows,
        ),
    )


def kv_buffer_bytes(head_dim: int, kv_bytes: int, block_n: int, num_stages: int, heads_per_tile: int) -> int:
    """Shared memory of a work tile's K and V buffers, bytes: ``max(num_stages - 1, 1) * 2 * block_n * head_dim *
    kv_bytes * heads_per_tile`` (Triton's software pipeline keeps up to ``num_stages - 1`` copies; 1 byte per
    element for an FP8 cache, which the kernel dequantizes in registers)."""
    return max(num_stages - 1, 1) * 2 * block_n * head_dim * kv_bytes * heads_per_tile


ROW_REG_FACTOR = 1.5
"""Registers per thread per extra query row, in units of ``(head_dim + block_n) / threads``, for configs
:data:`COMPILED_QLEN` lacks: an fp32 row of the output accumulator (``head_dim``) and of the scores (``block_n``),
plus 16-bit rows of q and of the probabilities (half as many registers each). A count of the tile's live values:
against the verify-step compiles it is close for (128, 4, 2) at 32 rows (216 counted, 232 compiled, both 2 CTAs per
SM) and (64, 4, 2) at 32 (154 / 168, both 3), and it counts nothing for a q_len-2 tile of G = 8 (no rows beyond the
q_len-1 tile's 16), which compiles to more registers (:data:`COMPILED_QLEN`)."""


def extra_row_regs(head_dim: int, block_n: int, num_warps: int, extra_rows: int) -> int:
    """Registers per thread that ``extra_rows`` more query rows of a work tile add (:data:`ROW_REG_FACTOR`):
    ``ceil(extra_rows * ROW_REG_FACTOR * (head_dim + block_n) / (32 * num_warps))``, 0 for ``extra_rows <= 0``."""
    if extra_rows <= 0:
        return 0
    return math.ceil(extra_rows * ROW_REG_FACTOR * (head_dim + block_n) / (32 * num_warps))


def padded_rows(rows: int) -> int:
    """Query rows of the ``tl.dot`` a work tile of ``rows`` rows compiles to: the next power of two, at least 16."""
    return max(16, 1 << max(0, int(rows) - 1).bit_length())


def q_len_rows(heads_per_tile: int, group_size: int | None, q_len: int) -> tuple[int, int]:
    """``(rows, extra_rows)`` the residency counts for a work tile at ``q_len`` tokens: the padded rows of its
    :func:`~kvsplit.kernels.limits.tile_rows` (``heads_per_tile * G * q_len``) and what they add over the same tile
    at q_len 1 (both :func:`padded_rows`); ``(0, 0)`` at q_len 1, so q_len-1 tiles count the tables' residency as
    they are. G is :data:`MEASURED_GROUP` when not given."""
    if q_len <= 1:
        return 0, 0
    G = group_size or MEASURED_GROUP
    rows = padded_rows(tile_rows(heads_per_tile, G, q_len))
    return rows, rows - padded_rows(tile_rows(heads_per_tile, G))


def _regs_smem(
    device: DeviceSpec,
    head_dim: int,
    dtype: str,
    dtype_bytes: int,
    block_n: int,
    num_warps: int,
    num_stages: int,
    prefetch: bool,
    heads_per_tile: int,
    next_item: bool,
) -> tuple[int, int]:
    """(registers, shared bytes) of a config's 16-bit q_len-1 kernel: the tables' figures, else the estimate's
    (128 registers, :func:`kv_buffer_bytes`)."""
    if next_item:
        m = COMPILED_NEXT.get((device.name, head_dim, dtype, block_n, num_warps, num_stages, heads_per_tile))
        if m is not None:
            return m
        base = _table(device, head_dim, dtype, block_n, num_warps, num_stages, True, heads_per_tile)
        regs, smem = (
            base
            if base is not None
            else (128, _estimate_smem(head_dim, dtype_bytes, block_n, num_stages, heads_per_tile))
        )
        return min(regs + NEXT_ITEM_EXTRA_REGS, 255), smem
    m = _table(device, head_dim, dtype, block_n, num_warps, num_stages, prefetch, heads_per_tile)
    if m is None:
        return 128, _estimate_smem(head_dim, dtype_bytes, block_n, num_stages, heads_per_tile)
    return m


def _table(
    device: DeviceSpec,
    head_dim: int,
    dtype: str,
    block_n: int,
    num_warps: int,
    num_stages: int,
    prefetch: bool,
    heads_per_tile: int,
) -> tuple[int, int] | None:
    """(registers, shared bytes) of a config in the tables above, or None."""
    if heads_per_tile != 1:
        m = COMPILED_HEADS.get(
            (device.name, head_dim, dtype, block_n, num_warps, num_stages, bool(prefetch), heads_per_tile)
        )
    else:
        key = (device.name, head_dim, dtype, block_n, num_warps, num_stages)
        m = MEASURED_PREFETCH.get(key) if prefetch else (MEASURED.get(key) or COMPILED.get(key))
    return m
