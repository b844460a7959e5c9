"""Limits of the planner, the kernel's knobs (:class:`KernelConfig`) and the
argument checks every entry point shares (validated once, errors name the argument).

No torch import: servers plan in-process.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from .device import DeviceSpec, resolve_device

MAX_BATCH = 65536
"""Most requests one plan may hold."""
MAX_KV_LEN = 2**31 - 1
"""Largest kv_len the planner accepts (int32 token offsets)."""
MAX_PAGE_SIZE = 256
MAX_WORK_ITEMS = 1 << 24
"""Most work items a plan may hold (int32 indices with room; far above any useful split)."""
BLOCK_N_CHOICES = (16, 32, 64, 128, 256)
NUM_WARPS_CHOICES = (1, 2, 4, 8)
NUM_STAGES_CHOICES = (1, 2, 3, 4)
HEADS_PER_TILE_CHOICES = (1, 2, 4, 8)
TILE_QUERY_ROWS = 16
"""Query rows of one work tile's ``tl.dot`` (the GQA groups of its KV heads share them:
``heads_per_tile * H_q / H_kv <= 16``, :func:`kvsplit.kernels.decode.check_heads_per_tile`)."""
SCHEDULES = ("grid", "persistent")
ORDERS = ("natural", "heavy_first")
DTYPES = {"float16": 2, "bfloat16": 2, "float32": 4}
"""q (and output) dtypes -> bytes per element; the KV cache has the same dtype unless :data:`KV_DTYPES` says otherwise."""
DTYPE_ALIASES: dict[str, str] = {
    "bf16": "bfloat16",
    "fp16": "float16",
    "f16": "float16",
    "fp32": "float32",
    "f32": "float32",
}
"""Accepted dtype aliases -> torch's names."""
KV_DTYPES = {"float8_e4m3fn": 1}
"""KV cache dtypes other than q's -> bytes per element (FP8 K/V with per-tensor or per-KV-head scales, as FlashInfer's
``kv_data_type=torch.float8_e4m3fn``); only with a 16-bit q (:func:`check_kv_dtype`)."""
KV_DTYPE_SHORT = {"float8_e4m3fn": "fp8"}
"""The bucket key's short name of each :data:`KV_DTYPES` entry (``.kvfp8``)."""
MAX_Q_LEN = 8
"""Most query tokens per request in one step (a speculative-decoding verify step of up to 7 draft tokens)."""
MAX_TILE_ROWS = 64
"""Most query rows of one work tile, ``G * heads_per_tile * q_len`` (the rows of its ``tl.dot``). Compiled for
sm_90 at D = 128, bf16 (bench/compile_sm90.py, Triton 3.6): 64 rows (G 8 x q_len 8) keep the fp32 accumulator
in registers without spills on the (64, 8, 3), (32, 4, 3) and (64, 4, 3) tiles (176, 216 and 255 registers);
128 rows spill 272-620 bytes on every 4-warp tile (only (64, 8, 3) stays at 236 registers)."""
HEAD_DIMS = (64, 128, 256)
MAX_NUM_PROGRAMS = 1 << 20
MAX_PACK_TOKENS = 1 << 20

# The bucket key's histogram (kvsplit.kernels.buckets)
BINS_PER_OCTAVE = 2
"""Histogram bins per doubling of kv_len."""
NUM_BINS = 62
"""Bins 0..61 cover kv_len 1 .. 2^31-1."""
HIST_UNITS = 16
"""The histogram's weights are integers summing to this."""
CLASS_WEIGHT = 0.5
"""Distance added per step of batch-size class and of total-token class."""

# Shared-memory budget a CTA may ask for (bytes); the Hopper/Ampere per-block
# opt-in limits are 227/163 KB, Triton keeps some for its own use.
_SMEM_BUDGET = 200 * 1024
# Largest K (or V) tile elements per thread before register pressure makes a
# config useless (spills to local memory); configs above it are rejected.
_MAX_TILE_ELEMS_PER_THREAD = 256


@dataclass(frozen=True)
class KernelConfig:
    """Knobs of the Triton decode kernel (``kvsplit.kernels.decode``).

    Parameters
    ----------
    block_n : int
        KV tokens per inner tile, one of 16, 32, 64, 128, 256.
    num_warps : int
        Warps per CTA, one of 1, 2, 4, 8.
    num_stages : int
        Software-pipelining stages of the KV loads, 1 to 4.
    schedule : str
        ``"grid"``: one CTA per (cta, kv_head) in launch order, placed by the
        hardware block scheduler. ``"persistent"``: ``num_programs`` CTAs take
        work tiles in plan order from a global atomic counter.
    num_programs : int
        Programs of a persistent launch (ignored, and stored as 0, for ``grid``).
    prefetch : bool
        Load the next tile's page ids one iteration ahead, so Triton's software
        pipeliner keeps ``num_stages - 1`` K/V tiles in flight (without it, one
        K/V buffer for any ``num_stages``: the page-id load feeds the K/V
        addresses of its own iteration). Needs ``num_stages >= 3``; costs
        ``num_stages - 1`` K/V buffers of shared memory, which
        :func:`kvsplit.kernels.residency.resident_ctas_per_sm` counts
        (docs/decisions/look-ahead.md).
    heads_per_tile : int
        KV heads per work tile, one of 1, 2, 4, 8 (a divisor of H_kv, with
        ``heads_per_tile * G <= 16`` for the GQA group G = H_q / H_kv and
        ``heads_per_tile * G * q_len <= 64`` query rows, checked at launch:
        :func:`tile_problem`): a work tile is (CTA, ``heads_per_tile`` adjacent KV heads), the
        GQA groups of those heads fill the 16 query rows of one ``tl.dot`` that
        a single group pads, and the K/V rows the tile reads per token are
        ``heads_per_tile`` times longer (adjacent in the NHD page). Costs
        ``heads_per_tile`` times the K/V shared memory of its tile, which
        :func:`kvsplit.kernels.residency.resident_ctas_per_sm` counts
        (docs/decisions/two-heads-per-tile.md).
    next_item : bool
        Look-ahead over a CTA's work items (needs ``prefetch``): the next items'
        work entries, page-table offsets, q and first page ids are loaded while
        the current item streams, so an item's first K/V copies are issued as
        soon as it starts instead of after a chain of dependent loads (work entry
        -> page-table offset -> page ids). Pays where nothing hides an item
        boundary: one resident CTA per SM with several items per CTA (stream-K
        at ``ctas_per_sm`` 1). Costs registers (e.g. (32, 4, 3) with two heads
        per tile: 120 -> 191, 3 -> 2 CTAs per SM), which
        :func:`kvsplit.kernels.residency.resident_ctas_per_sm` counts
        (docs/decisions/look-ahead.md). Not with ``heads_per_tile`` above 2 (the
        pipeliner single-buffers that loop).
    """

    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 2
    schedule: str = "grid"
    num_programs: int = 0
    prefetch: bool = False
    heads_per_tile: int = 1
    next_item: bool = False

    def to_dict(self) -> dict[str, Any]:
        """The config as a JSON-able dict of its fields (``block_n``, ``num_warps``, ``num_stages``, ``schedule``,
        ``num_programs``, ``prefetch``, ``heads_per_tile``, ``next_item``); ``KernelConfig(**d)`` rebuilds it.
        """
        return dataclasses.asdict(self)


# Default kernel config per (head_dim, dtype). Chosen from the H200 sweep in
# docs/decisions/default-kernel-config.md; the untuned policies all use it.
_DEFAULT_CONFIGS: dict[tuple[int, str], KernelConfig] = {
    # Measured on the H200 (docs/decisions/default-kernel-config.md): over the
    # 192 training batches (B 1..1024, T 2^18..2^20, traces,
    # H_kv 1/4/8), wave-aware balanced plans with (128, 4 warps, 2 stages) run at geomean
    # 1.047x the per-batch best plan against 1.090x with (64, 4, 2); stream_k's
    # best single config is the same tile. fp16 uses the same tiles.
    (128, "bfloat16"): KernelConfig(block_n=128, num_warps=4, num_stages=2),
    (128, "float16"): KernelConfig(block_n=128, num_warps=4, num_stages=2),
}


def default_config(head_dim: int, dtype: str, *, query_rows: int = 0) -> KernelConfig:
    """The documented default :class:`KernelConfig` for ``(head_dim, dtype)``.

    ``query_rows``: a q_len > 1 work tile's query rows (``G * q_len``; 0 for q_len 1). Above 32 rows the tile's
    fp32 scores ``[rows, block_n]`` and accumulator ``[rows, head_dim]`` no longer fit beside a 128-token K/V tile:
    compiled for sm_90 at 64 rows (G = 8, q_len 8: :data:`kvsplit.kernels.residency.COMPILED_QLEN`), (128, 4, 2)
    takes 255 registers with 232 bytes of spill stores and runs 1 CTA per SM, (64, 4, 2) 241 registers without spills and 2,
    so the default takes BLOCK_N 64 there (not yet timed on the GPU); at or below 32 rows, and for q_len 1, the
    tiles below.

    head_dim 128 (fp16/bf16): BLOCK_N 128, 4 warps, 2 stages (3 resident CTAs
    per SM), measured best on the H200 (docs/decisions/default-kernel-config.md). Other shapes are not measured yet and use the same
    BLOCK_N-64 tile scaled to keep K/V tile elements per thread constant:
    head_dim 64 -> (64, 4, 2); head_dim 256 -> (32, 4, 2); float32 (CPU tests)
    -> (32, 4, 2).
    """
    cfg = _DEFAULT_CONFIGS.get((head_dim, dtype))
    if cfg is not None:
        if query_rows > 32 and cfg.block_n > 64:
            return dataclasses.replace(cfg, block_n=64)
        return cfg
    if dtype == "float32":
        return KernelConfig(block_n=32, num_warps=4, num_stages=2)
    if head_dim >= 256:
        return KernelConfig(block_n=32, num_warps=4, num_stages=2)
    return KernelConfig(block_n=64, num_warps=4, num_stages=2)


# The CUDA-graph tile per (head_dim, dtype) (DecodeWrapper(use_cuda_graph=True) with no tile knobs in its params).
# A captured graph keeps one tile for every batch, so it takes the one-CTA-per-SM look-ahead tile that streams at
# full rate alone and two KV heads per work tile: measured on the H200 (bf16, H_q 32 / H_kv 4,
# docs/decisions/graph-default.md) stream_k at one CTA per SM on (64, 8, 3) with the prefetch, the
# look-ahead and heads_per_tile 2 ran the graph path at 1.019x the time of the plan the table serves eagerly
# (geomean of 171 batches, 0.947-1.217x) against 1.251x for (128, 4, 2) with one head per tile. fp16 uses the same.
_GRAPH_CONFIGS: dict[tuple[int, str], KernelConfig] = {
    (128, dt): KernelConfig(block_n=64, num_warps=8, num_stages=3, prefetch=True, next_item=True, heads_per_tile=2)
    for dt in ("bfloat16", "float16")
}


def graph_default_config(head_dim: int, dtype: str, *, num_qo_heads: int, num_kv_heads: int) -> KernelConfig:
    """The default tile of ``DecodeWrapper(use_cuda_graph=True)`` for ``(head_dim, dtype)`` and the GQA shape.

    head_dim 128 (fp16/bf16), where two KV heads per work tile fit (H_kv even and ``2 * H_q / H_kv <= 16``):
    BLOCK_N 64, 8 warps, 3 stages, ``prefetch`` and ``next_item``, two KV heads per work tile (one resident CTA per
    SM on the H200; docs/decisions/graph-default.md). Elsewhere :func:`default_config`'s tile, one head per tile: the
    look-ahead tile with one head streams too few bytes per CTA for its one CTA per SM (at H_kv 8 it ran the graph
    path at 1.441x the served eager plan against 1.309x for (128, 4, 2) and 1.017x with two heads; docs/decisions/graph-default.md). Measured on the H200 only; other GPUs get the same tile (its residency there is
    :func:`kvsplit.kernels.residency.resident_ctas_per_sm`'s).
    """
    cfg = _GRAPH_CONFIGS.get((head_dim, dtype))
    if cfg is None or not heads_fit(cfg.heads_per_tile, num_qo_heads, num_kv_heads):
        return default_config(head_dim, dtype)
    return cfg


def next_pow2(x: int) -> int:
    """The smallest power of two >= ``x`` (1 for ``x <= 1``): a launch's block sizes, on the host.
    ``triton.next_power_of_2`` gives the same numbers, but as a ``ConstexprFunction`` a host call costs about
    2 us, twice per launch."""
    x = int(x)
    return 1 if x <= 1 else 1 << (x - 1).bit_length()


def tile_rows(heads_per_tile: int, group_size: int, q_len: int = 1) -> int:
    """Query rows of one work tile: ``heads_per_tile * G * q_len`` (the kernel's tile of ``heads_per_tile`` adjacent KV
    heads holds head j's G query heads x q_len tokens at rows ``j * G * q_len ..``, token-major within a head:
    ``row_head = row // (G * q_len)`` in kernels/decode.py, padded to ``BLOCK_H = max(16, next_pow2(rows))``)."""
    return int(heads_per_tile) * int(group_size) * int(q_len)


def tile_problem(heads_per_tile: int, num_qo_heads: int, num_kv_heads: int, q_len: int = 1) -> tuple[str, str] | None:
    """The one rule of a work tile's heads and rows: None when the launch takes ``heads_per_tile`` KV heads of GQA
    group G = H_q / H_kv at ``q_len`` tokens, else ``(argument, reason)`` with the argument to change
    (``"q_len"`` or ``"heads_per_tile"``). The launch takes a tile when

    - its :func:`tile_rows` (``heads_per_tile * G * q_len``) are at most :data:`MAX_TILE_ROWS` (64; else q_len,
      checked first as the launch does);
    - ``heads_per_tile`` divides H_kv;
    - several heads' GQA groups share the first :data:`TILE_QUERY_ROWS` rows (``heads_per_tile * G <= 16`` when
      ``heads_per_tile > 1``): the packing is measured and compiled there only (docs/decisions/two-heads-per-tile.md).

    :func:`heads_fit` is its yes/no; :func:`kvsplit.kernels.decode.check_heads_per_tile` raises its reason, at
    every launch and in ``DecodeWrapper``; the planner's refit (:func:`kvsplit.kernels.rulespec.fit_heads_per_tile`)
    picks the largest choice that fits.
    """
    h, G, q = int(heads_per_tile), num_qo_heads // num_kv_heads, int(q_len)
    rows = tile_rows(h, G, q)
    if rows > MAX_TILE_ROWS:
        return (
            "q_len",
            f"{q} tokens x GQA group G={G} x heads_per_tile={h} are {rows} query rows of one work tile, above the "
            f"{MAX_TILE_ROWS} supported: use a smaller q_len or heads_per_tile",
        )
    if h < 1 or num_kv_heads % h:
        return "heads_per_tile", f"expected a divisor of H_kv={num_kv_heads}, got {h}"
    if h > 1 and h * G > TILE_QUERY_ROWS:
        return (
            "heads_per_tile",
            f"{h} KV heads of GQA group G={G} (H_q={num_qo_heads} / H_kv={num_kv_heads}) are {h * G} query rows, "
            f"above the {TILE_QUERY_ROWS} of one work tile: use heads_per_tile <= {max(1, TILE_QUERY_ROWS // G)} "
            "(params.heads_per_tile, or params.whole_wave_heads for a whole-wave plan; a PolicyTable refits both "
            "to H_q)",
        )
    return None


def heads_fit(heads_per_tile: int, num_qo_heads: int, num_kv_heads: int, q_len: int = 1) -> bool:
    """Whether the launch takes a work tile of ``heads_per_tile`` adjacent KV heads at ``q_len`` query tokens per
    request (:func:`tile_problem` finds nothing)."""
    return tile_problem(heads_per_tile, num_qo_heads, num_kv_heads, q_len) is None


# ----------------------------------------------------------------------------
# Validation helpers
# ----------------------------------------------------------------------------


def check_kv_lens(kv_lens: Any) -> np.ndarray:
    """Validate and convert kv_lens to int64 ``[B]``."""
    if hasattr(kv_lens, "detach") and hasattr(kv_lens, "cpu"):  # torch tensor
        if getattr(kv_lens, "is_cuda", False):
            raise ValueError("kv_lens: expected a host array or CPU tensor, got a CUDA tensor")
        kv_lens = kv_lens.detach().cpu().numpy()
    if isinstance(kv_lens, (str, bytes)) or np.isscalar(kv_lens):
        raise ValueError(f"kv_lens: expected a 1-D sequence of integers, got {type(kv_lens).__name__}")
    if isinstance(kv_lens, (list, tuple)):
        # fast path: one C-level pass collects the element types (the serving hot path
        # plans lists of a few hundred ints); the per-element loop only runs to name
        # the offending index
        types = set(map(type, kv_lens))
        if not all(t is not bool and issubclass(t, (int, np.integer)) for t in types):
            for i, v in enumerate(kv_lens):
                if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                    raise ValueError(f"kv_lens[{i}]: expected a non-negative integer, got {v!r}")
        try:
            arr = np.array(kv_lens, dtype=np.int64) if kv_lens else np.zeros(0, np.int64)
        except OverflowError:  # a Python int beyond int64
            i = next(i for i, v in enumerate(kv_lens) if not -(2**63) <= v < 2**63)
            raise ValueError(f"kv_lens[{i}]: expected 0 <= kv_len <= {MAX_KV_LEN}, got {kv_lens[i]}") from None
    else:
        arr = np.asarray(kv_lens)
        if arr.dtype == bool or arr.dtype.kind not in "iu":
            raise ValueError(f"kv_lens: expected an integer array, got dtype {arr.dtype}")
        if arr.dtype.kind == "u" and arr.size and arr.max() > MAX_KV_LEN:
            i = int(np.argmax(arr > MAX_KV_LEN))
            raise ValueError(f"kv_lens[{i}]: expected 0 <= kv_len <= {MAX_KV_LEN}, got {int(arr[i])}")
        arr = arr.astype(np.int64, copy=False)
    if arr.ndim != 1:
        raise ValueError(f"kv_lens: expected a 1-D array, got shape {arr.shape}")
    if arr.shape[0] < 1:
        raise ValueError("kv_lens: expected at least one request, got an empty batch")
    if arr.shape[0] > MAX_BATCH:
        raise ValueError(f"kv_lens: expected at most {MAX_BATCH} requests, got {arr.shape[0]}")
    bad = (arr < 0) | (arr > MAX_KV_LEN)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"kv_lens[{i}]: expected 0 <= kv_len <= {MAX_KV_LEN}, got {int(arr[i])}")
    return arr


def check_batch_shape(
    kv_lens: Any, num_kv_heads: Any, head_dim: Any, page_size: Any, dtype: Any, device: Any
) -> tuple[np.ndarray, int, int, DeviceSpec]:
    """Validate what :func:`make_plan` and ``bucket_key`` share.

    Returns ``(kv_lens int64 [B], num_kv_heads, page_size, DeviceSpec)``;
    raises ValueError naming the first invalid argument.
    """
    L = check_kv_lens(kv_lens)
    num_kv_heads, _, page_size, dev = check_shape(num_kv_heads, head_dim, page_size, dtype, device)
    return L, num_kv_heads, page_size, dev


def check_shape(
    num_kv_heads: Any, head_dim: Any, page_size: Any, dtype: Any, device: Any
) -> tuple[int, int, int, DeviceSpec]:
    """Validate a plan's shape arguments: ``(num_kv_heads, head_dim, page_size, DeviceSpec)``; raises ValueError
    naming the first invalid argument."""
    num_kv_heads = check_int("num_kv_heads", num_kv_heads, 1, 1024)
    if isinstance(head_dim, bool) or head_dim not in HEAD_DIMS:
        raise ValueError(f"head_dim: expected one of {HEAD_DIMS}, got {head_dim!r}")
    page_size = check_int("page_size", page_size, 1, MAX_PAGE_SIZE)
    if dtype not in DTYPES:
        raise ValueError(f"dtype: expected one of {sorted(DTYPES)}, got {dtype!r}{kv_dtype_hint(dtype)}")
    return num_kv_heads, int(head_dim), page_size, resolve_device(device)


def kv_dtype_hint(dtype: Any) -> str:
    """What a ``dtype`` error adds when the value names an fp8 cache dtype (``"fp8"``, ``"float8_e4m3fn"``): that
    ``dtype`` is q's (and the output's) and an fp8 KV cache is the ``kv_dtype`` argument; ``""`` otherwise."""
    if kv_dtype_named(dtype) is None:
        return ""
    name = torch_dtype_name(dtype)
    return f" (dtype is q's; a KV cache of {name} is given as kv_dtype, --kv-dtype on the command line)"


def kv_elt_bytes(dtype: str, kv_dtype: str | None) -> int:
    """Bytes per K/V element: :data:`KV_DTYPES`' size for an FP8 cache, else ``dtype``'s (:data:`DTYPES`)."""
    if kv_dtype is None or kv_dtype == dtype:
        return DTYPES[dtype]
    return KV_DTYPES[kv_dtype]


def torch_dtype_name(x: Any) -> Any:
    """``"bfloat16"`` for ``torch.bfloat16`` (any ``torch.dtype``: its text without ``torch.``, so that the planner
    needs no torch import), else ``x`` itself."""
    if type(x).__module__ == "torch" and type(x).__name__ == "dtype":
        return str(x).removeprefix("torch.")
    return x


def kv_dtype_named(x: Any) -> str | None:
    """The :data:`KV_DTYPES` name that ``x`` names (that name, its short name ``"fp8"`` or its ``torch.dtype``, read
    from its text), else None."""
    name = torch_dtype_name(x)
    if not isinstance(name, str):
        return None
    kd = {v: k for k, v in KV_DTYPE_SHORT.items()}.get(name, name)
    return kd if kd in KV_DTYPES else None


def check_kv_dtype(kv_dtype: Any, dtype: str) -> str:
    """The KV cache dtype of a shape whose q dtype is ``dtype`` (already checked): ``dtype`` itself for None or
    ``dtype`` (its name, an alias or its ``torch.dtype``), or one of :data:`KV_DTYPES` (its name, its short name
    ``"fp8"`` or its ``torch.dtype``, read from its text) with a 16-bit ``dtype``. Raises ValueError naming
    ``kv_dtype``."""
    name = torch_dtype_name(kv_dtype)
    if name is None or name == dtype or (isinstance(name, str) and DTYPE_ALIASES.get(name) == dtype):
        return dtype
    kd = kv_dtype_named(name)
    if kd is not None:
        if dtype not in ("float16", "bfloat16"):
            raise ValueError(f"kv_dtype: {kd} needs a float16 or bfloat16 q (dtype), got dtype {dtype!r}")
        return kd
    kinds = ", ".join(
        f"{k!r} (or {KV_DTYPE_SHORT[k]!r})" if k in KV_DTYPE_SHORT else repr(k) for k in sorted(KV_DTYPES)
    )
    raise ValueError(f"kv_dtype: expected {dtype!r} (q's dtype, the default) or {kinds}, got {kv_dtype!r}")


def q_len_shortfall(kv_lens: np.ndarray, q_len: int) -> int:
    """Index of the first kv_len (int ``[B]``) below ``q_len``, -1 when none (always at q_len 1): a verify step's
    kv_len counts its q_len new tokens, which are in the cache before attention, so it is at least q_len (an empty
    slot, kv_len 0, exists only at q_len 1)."""
    if q_len <= 1 or not kv_lens.size or int(kv_lens.min()) >= q_len:
        return -1
    return int(np.flatnonzero(kv_lens < q_len)[0])


def cover_q_len(kv_lens: Any, q_len: int) -> np.ndarray:
    """``kv_lens`` (int ``[B]``) as int64 with every kv_len below ``q_len`` raised to ``q_len``: how a batch of
    lengths drawn without q_len in mind (a family draw, a trace's request at its first decode step) becomes a
    verify step's, whose kv_lens count its q_len new tokens (:func:`q_len_shortfall`). At q_len 1 the lengths come
    back as they are (an empty slot, kv_len 0, stays empty), as they do wherever every kv_len is at least q_len."""
    lens = np.asarray(kv_lens, dtype=np.int64)
    return np.maximum(lens, int(q_len)) if q_len > 1 else lens


def check_covers_q_len(kv_lens: np.ndarray, q_len: int, name: str = "kv_lens") -> None:
    """Raise ValueError naming ``name[i]`` for the first kv_len below ``q_len`` (:func:`q_len_shortfall`): the one
    check of the planner, the policy table, ``POST /v1/plan``, the engine wrapper and the launch."""
    i = q_len_shortfall(kv_lens, q_len)
    if i >= 0:
        raise ValueError(f"{name}[{i}]: {q_len_shortfall_message(int(kv_lens[i]), q_len)}")


def q_len_shortfall_message(kv_len: int, q_len: int) -> str:
    """Why a kv_len below q_len is refused (:func:`check_covers_q_len` prefixes the entry's name)."""
    return (
        f"{kv_len} tokens, fewer than q_len={q_len} (kv_lens count the q_len new tokens, in the cache before attention)"
    )


def check_q_len(q_len: Any, group_size: int | None = None) -> int:
    """Query tokens per request, 1..:data:`MAX_Q_LEN`; with ``group_size`` (G = H_q / H_kv) also
    ``G * q_len <= MAX_TILE_ROWS`` (one work tile's query rows). Raises ValueError naming ``q_len``."""
    q = check_int("q_len", q_len, 1, MAX_Q_LEN)
    if group_size is not None and q > 1 and group_size * q > MAX_TILE_ROWS:
        raise ValueError(
            f"q_len: {q} query tokens x GQA group {group_size} = {group_size * q} query rows per work tile, above "
            f"the kernel's {MAX_TILE_ROWS}"
        )
    return q


def check_int(name: str, v: Any, lo: int = 1, hi: int | None = None) -> int:
    """``v`` as a Python ``int`` when it is an integer (Python or NumPy, not ``bool``) in ``[lo, hi]`` (``hi=None``:
    no upper bound); else ``ValueError`` naming ``name`` and the range."""
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise ValueError(f"{name}: expected an integer, got {v!r}")
    v = int(v)
    if v < lo or (hi is not None and v > hi):
        rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ValueError(f"{name}: expected an integer {rng}, got {v}")
    return v


def check_config(cfg: KernelConfig, head_dim: int, dtype: str, kv_dtype: str | None = None) -> None:
    """Reject knob combinations the kernel cannot run well or at all (shared memory counted at the K/V element
    size, :func:`kv_elt_bytes`)."""
    if cfg.block_n not in BLOCK_N_CHOICES:
        raise ValueError(f"params.block_n: expected one of {BLOCK_N_CHOICES}, got {cfg.block_n!r}")
    if cfg.num_warps not in NUM_WARPS_CHOICES:
        raise ValueError(f"params.num_warps: expected one of {NUM_WARPS_CHOICES}, got {cfg.num_warps!r}")
    if cfg.num_stages not in NUM_STAGES_CHOICES:
        raise ValueError(f"params.num_stages: expected one of {NUM_STAGES_CHOICES}, got {cfg.num_stages!r}")
    if cfg.schedule not in SCHEDULES:
        raise ValueError(f"params.schedule: expected one of {SCHEDULES}, got {cfg.schedule!r}")
    if cfg.schedule == "persistent":
        check_int("params.num_programs", cfg.num_programs, 1, MAX_NUM_PROGRAMS)
    elif cfg.num_programs != 0:
        raise ValueError("params.num_programs: only meaningful with schedule='persistent'")
    if not isinstance(cfg.prefetch, bool):
        raise ValueError(f"params.prefetch: expected true or false, got {cfg.prefetch!r}")
    if cfg.prefetch and cfg.num_stages < 3:
        raise ValueError(
            f"params.prefetch: needs num_stages >= 3 (with {cfg.num_stages} the pipeliner keeps one K/V "
            "buffer and there is nothing to prefetch into)"
        )
    if not isinstance(cfg.next_item, bool):
        raise ValueError(f"params.next_item: expected true or false, got {cfg.next_item!r}")
    if cfg.next_item and not cfg.prefetch:
        raise ValueError(
            "params.next_item: needs prefetch=true (the look-ahead loads the next item's first page ids "
            "into the prefetching loop's carried page ids)"
        )
    if cfg.next_item and cfg.heads_per_tile > 2:
        raise ValueError(
            f"params.next_item: not with heads_per_tile={cfg.heads_per_tile} (above 2, Triton 3.6's "
            "pipeliner keeps a single K/V buffer for the look-ahead loop: sm_90 compile, "
            "docs/decisions/look-ahead.md)"
        )
    if isinstance(cfg.heads_per_tile, bool) or cfg.heads_per_tile not in HEADS_PER_TILE_CHOICES:
        raise ValueError(f"params.heads_per_tile: expected one of {HEADS_PER_TILE_CHOICES}, got {cfg.heads_per_tile!r}")
    elt = kv_elt_bytes(dtype, kv_dtype)
    smem = max(cfg.num_stages - 1, 1) * 2 * cfg.block_n * head_dim * elt * cfg.heads_per_tile
    if smem > _SMEM_BUDGET:
        heads = f" x heads_per_tile={cfg.heads_per_tile}" if cfg.heads_per_tile > 1 else ""
        raise ValueError(
            f"params: block_n={cfg.block_n} x num_stages={cfg.num_stages}{heads} needs about {smem // 1024} KB of "
            f"shared memory for head_dim={head_dim} {kv_dtype or dtype}, over the {_SMEM_BUDGET // 1024} KB budget"
        )
    per_thread = cfg.block_n * head_dim // (32 * cfg.num_warps)
    if per_thread > _MAX_TILE_ELEMS_PER_THREAD:
        raise ValueError(
            f"params: block_n={cfg.block_n} with num_warps={cfg.num_warps} puts {per_thread} K elements per "
            f"thread for head_dim={head_dim} (max {_MAX_TILE_ELEMS_PER_THREAD}): use more warps or a smaller block_n"
        )


def too_big_message(cfg: KernelConfig, q_len: int, need: str, limit: str) -> str:
    """The error of a config whose compiled kernel needs more of a per-CTA resource than the GPU has, as the planner
    (:func:`kvsplit.kernels.rulespec.shared_memory_refused`) and the launch (``kvsplit.kernels.decode``) raise it:
    ``params: <the knobs> at q_len=<q_len> <need>, over <limit>; use a smaller block_n, num_stages or
    heads_per_tile``."""
    return (
        f"params: block_n={cfg.block_n}, num_warps={cfg.num_warps}, num_stages={cfg.num_stages}, "
        f"prefetch={bool(cfg.prefetch)}, heads_per_tile={cfg.heads_per_tile} at q_len={q_len}{need}, over {limit}; "
        "use a smaller block_n, num_stages or heads_per_tile"
    )


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative integers."""
    return -(-a // b)
