"""Simulated kernel time of a split-KV plan (docs/concepts/design.md §7, "Simulator").

:func:`predict` places the plan's work tiles on SM slots and costs them:

1. **Tiles.** A plan's work tile is (CTA, kv_head) with launch order
   ``pid = cta * H_kv + kv_head`` (with ``heads_per_tile = k`` > 1, (CTA, group of
   k KV heads): ``H_kv / k`` tiles per CTA, each reading k heads' bytes); a CTA processes the work items
   ``cta_indptr[c]:cta_indptr[c+1]``. A tile reads ``tokens * D * 2 * kv_bytes``
   bytes of K and V per KV head (``kv_bytes`` the KV cache's element size: 2 for bf16/fp16, 1 for an FP8
   cache) and pays ``tile_fixed_s`` (start-up, q load, output or
   partial write) plus ``item_fixed_s`` for each item beyond its first (packed
   CTAs) plus ``persistent_tile_s`` per tile under the persistent schedule
   (fetching the next tile from the counter).
2. **Slots.** Each SM runs up to ``slots`` CTAs at once: the resident CTAs
   per SM of the plan's own kernel config (kernels/residency.py, measured on
   the H200) unless the calibration sets ``slots``. A grid launch has
   ``slots * num_SMs`` slots; a persistent launch ``min(num_programs, slots *
   num_SMs)`` resident programs. The first wave goes round-robin over the SMs
   (slot ``p`` on SM ``p % num_SMs``), as the hardware block scheduler spreads a
   grid.
3. **Dispatch.** Tiles are taken in launch order by the slot that frees first
   (a grid's CTAs are dispatched in order as slots free; persistent programs pull
   the next tile from a global counter): list scheduling with a heap.
4. **Bandwidth.** While tiles are queued every slot is busy, so an SM with ``k``
   resident CTAs gives each ``min(cta_bw, sm_bw / (k + ramp_ctas), hbm_bw / active_SMs / k)``
   bytes/s: one CTA alone cannot saturate an SM (``cta_bw``), and resident CTAs
   share their SM's bandwidth. After the last tile has started, the tiles still
   running are spread over the SMs (longest first) and each SM drains its
   residents by processor sharing with ``min(cta_bw, sm_bw / (n_running + ramp_ctas))`` per
   tile — the tail where a lone long CTA runs at ``cta_bw`` (or at ``lone_bw``, the config's
   fitted rate of the last CTA left on an SM, where the calibration sets one; with ``n > 1``
   CTAs left, up to ``tail_sm_bw / n`` each where the calibration sets ``tail_sm_bw``, and the SM's fixed
   cost before it streams shrunk by ``fixed_overlap * (m - 1) / m``, ``m`` its tiles). With these two
   constants 1 CTA per SM is slower than 4 (the Triton kernel of
   docs/concepts/design.md §8 ran 4.8x the read floor at one CTA per SM, 2.1x at four), and FlashInfer's
   threshold cliff appears once one long request is one CTA.
5. **Math.** Per KV token and KV head a tile does ``4 * R * D`` tensor-core FLOPs (``q k^T`` and ``p v``
   over ``R`` query rows, ``R`` = ``G * q_len`` padded to 16, 32 or 64: :func:`math_flops_per_byte`). The
   tensor cores of an SM are shared by its resident CTAs, so a CTA streams at most
   ``sm_flops / k / flops_per_byte`` bytes/s (``sm_flops``: :func:`default_sm_flops` unless the calibration
   sets one): this caps the bulk and tail rates of step 4 for tiles of more than
   :data:`REFERENCE_FLOPS_PER_BYTE` (16: the q_len-1 16-bit tile of up to 16 rows, on which the calibrated rates
   were measured, so its math is already in them). At 32 FLOPs per byte (q_len 4, 16-bit) the cap is about
   35 GB/s per SM on the H200, above what an SM's residents stream while every SM is busy: math hides under the
   memory stream; at G = 8 and q_len 8 (64 rows) with an FP8 cache (128 FLOPs per byte) it no longer does: the
   cap falls below an SM's share of the HBM stream, and the model turns math-bound. An FP8 cache adds its
   widening to 16 bits (``cvt`` of every K/V element before the dots) to the same SM budget: a CTA of an FP8 tile
   streams at most ``1 / (k * (flops_per_byte / sm_flops + 1 / cvt_bw))`` bytes/s (``cvt_bw``:
   :data:`FP8_CVT_BW_PER_SM` unless the calibration sets one), counting all of the tile's math since no
   fitted rate holds an FP8 tile's: the one-KV-head FP8 tile (16 padded rows for G = 8) is then slower than
   the two-head one, as measured (docs/decisions/simulator-fp8-math.md).
6. **Total.** ``launch_s + max(max_SM finish, total_bytes / hbm_bw)``, plus, when
   some request has more than one split, ``merge_launch_s + merge_partial_s *
   num_partials * H_kv * q_len + merge_split_s * max_splits`` for the LSE merge (one merge
   program per (request, query head, query token) folds its request's splits in sequence, so
   the most-split request bounds the merge's latency).

A grid of more than ``slots * num_SMs`` tiles therefore runs in waves, and a
partial last wave (say 16 tiles beyond 528 slots) costs a lone tile's time at
``cta_bw``: the wave quantization of docs/concepts/design.md §8.

The constants live in :class:`Calibration`, with optional overrides per kernel
config (``per_config``: the per-CTA and per-SM streaming rates and fixed costs
differ by BLOCK_N / warps / stages); :meth:`Calibration.default` derives
them from a :class:`~kvsplit.kernels.device.DeviceSpec` and the kernel config,
:func:`fit_calibration` fits them to GPU measurements (``kvsplit calibrate``).
docs/concepts/simulator.md compares the simulated baselines with the H200 anchors.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..kernels.device import DeviceSpec, resolve_device
from ..kernels.limits import check_kv_dtype, check_q_len, kv_elt_bytes, tile_rows
from ..kernels.plan import DTYPES, KernelConfig, Plan, default_config
from ..kernels.residency import MEASURED_GROUP, padded_rows, q_len_rows, resident_ctas_per_sm

__all__ = [
    "Calibration",
    "predict",
    "timeline",
    "Timeline",
    "hbm_floor_s",
    "fit_calibration",
    "FIT_PARAMS",
    "PER_CONFIG_PARAMS",
    "config_key",
    "resident_slots",
    "math_flops_per_byte",
    "default_sm_flops",
    "TENSOR_FLOPS_PER_SM",
    "MMA_EFFICIENCY",
    "REFERENCE_FLOPS_PER_BYTE",
    "FP8_CVT_BW_PER_SM",
]

TENSOR_FLOPS_PER_SM = {(9, 0): 989.4e12 / 132, (8, 0): 312e12 / 108}
"""Dense 16-bit tensor-core FLOP/s of one SM by compute capability: the datasheet peaks (H100/H200 SXM: 989.4
TFLOPS BF16 dense over 132 SMs; A100: 312 TFLOPS over 108 SMs). Other capabilities take the sm_80 figure."""
MMA_EFFICIENCY = 0.15
"""Fraction of :data:`TENSOR_FLOPS_PER_SM` the decode tile's math reaches (small-M ``mma.sync`` tiles and the
softmax between the two products, which scales with the same padded rows). Fitted with
:data:`FP8_CVT_BW_PER_SM` on an H100's timings of the 19 pool plans on 12 FP8 batches
(tests/data/h100_fp8_pool_timings.jsonl): 0.15 ranks them best together with 50 GB/s of widening; at or above
0.1 the q_len-4 bf16 tiles stay memory-bound, as the same H100 measured (a verify step of 4 tokens took
0.87-1.13x the q_len-1 step: docs/results.md). A calibration's ``sm_flops`` overrides it."""

FP8_CVT_BW_PER_SM = {(9, 0): 50e9}
"""Bytes/s of an FP8 K/V stream one SM widens to 16 bits (``cvt.rn.f16x2.e4m3x2``, two elements an
instruction, and the per-element work around it) by compute capability, fitted with :data:`MMA_EFFICIENCY` (its
docstring says on what). Other capabilities take the sm_90 figure. A calibration's ``cvt_bw`` overrides it."""


REFERENCE_FLOPS_PER_BYTE = 16.0
"""FLOPs per K/V byte of the tiles the calibrations are fitted on (q_len 1, 16-bit K/V, 16 padded rows): their
math is part of the measured rates, so the math cap applies only to tiles of more FLOPs per byte."""


def default_sm_flops(device: DeviceSpec) -> float:
    """``MMA_EFFICIENCY * TENSOR_FLOPS_PER_SM[compute capability]``: the math rate of one SM, FLOP/s."""
    return MMA_EFFICIENCY * TENSOR_FLOPS_PER_SM.get(tuple(device.compute_capability), TENSOR_FLOPS_PER_SM[(8, 0)])


def math_flops_per_byte(kv_bytes: int, q_len: int = 1, group_size: int | None = None, heads_per_tile: int = 1) -> float:
    """Tensor-core FLOPs per byte of K/V a work tile streams: ``4 * R * D`` FLOPs per token and KV head over
    ``2 * D * kv_bytes`` bytes, i.e. ``2 * R / kv_bytes``, with ``R`` the padded query rows of one KV head's share
    of the tile's ``tl.dot`` (:func:`~kvsplit.kernels.residency.padded_rows` of ``heads_per_tile * G * q_len``,
    divided by ``heads_per_tile``; G the residency tables' 8 when not given)."""
    h = max(1, int(heads_per_tile))
    rows = padded_rows(tile_rows(h, group_size or MEASURED_GROUP, q_len)) / h
    return 2.0 * rows / kv_bytes


PER_CONFIG_PARAMS = (
    "sm_bw",
    "cta_bw",
    "ramp_ctas",
    "slots",
    "tile_fixed_s",
    "item_fixed_s",
    "persistent_tile_s",
    "lone_bw",
    "fixed_overlap",
    "tail_sm_bw",
)
"""Constants a calibration may hold per kernel config (:attr:`Calibration.per_config`)."""

_KEY_RE = re.compile(r"n(\d+)w(\d+)s(\d+)p?(?:h\d+)?x?")


def config_key(config: KernelConfig) -> str:
    """``"n{block_n}w{num_warps}s{num_stages}"`` (``...p`` with the ``prefetch`` knob, ``...h{k}`` with
    ``heads_per_tile`` k > 1, a last ``x`` with ``next_item``): the key of :attr:`Calibration.per_config`."""
    return (
        f"n{config.block_n}w{config.num_warps}s{config.num_stages}"
        + ("p" if config.prefetch else "")
        + (f"h{config.heads_per_tile}" if config.heads_per_tile != 1 else "")
        + ("x" if getattr(config, "next_item", False) else "")
    )


def resident_slots(
    device: DeviceSpec,
    config: KernelConfig,
    *,
    head_dim: int = 128,
    dtype: str = "bfloat16",
    kv_dtype: str | None = None,
    q_len: int = 1,
    group_size: int | None = None,
) -> int:
    """Resident CTAs per SM of ``config`` on ``device`` (:func:`kvsplit.kernels.residency.resident_ctas_per_sm`,
    with the KV cache's element size and the extra query rows of q_len > 1, as the planner counts them)."""
    rows, extra = q_len_rows(config.heads_per_tile, group_size, q_len)
    return int(
        resident_ctas_per_sm(
            device,
            head_dim,
            dtype,
            DTYPES[dtype],
            config.block_n,
            config.num_warps,
            config.num_stages,
            prefetch=config.prefetch,
            heads_per_tile=config.heads_per_tile,
            next_item=config.next_item,
            kv_bytes=kv_elt_bytes(dtype, kv_dtype),
            extra_rows=extra,
            rows=rows,
        )
    )


@dataclass(frozen=True)
class Calibration:
    """Constants of the simulator for one (device, head_dim, dtype, kernel config).

    Attributes
    ----------
    hbm_bw : float
        Read bandwidth of the whole GPU, bytes/s (measured: the streaming-read
        kernel; default 0.94 x the datasheet peak, as the H200 measured 4.52 of 4.8 TB/s).
    sm_bw : float
        Most bytes/s one SM pulls when the HBM is not saturated (default 1.5 x
        ``hbm_bw / num_SMs``; FlashInfer's lone long CTA reached about 1.15 x on the H200).
    cta_bw : float
        Most bytes/s one CTA pulls (default 0.5 x ``hbm_bw / num_SMs``: a Triton
        decode CTA reaches about half its SM's share, policy_on_triton_kernel.md).
    slots : int or None
        Concurrent CTAs per SM. None (the fitted H200 calibration): the plan's
        own config's residency, :func:`resident_slots` (measured on the H200,
        kernels/residency.py); an integer overrides it for every config.
    tile_fixed_s : float
        Seconds per work tile besides its bytes.
    item_fixed_s : float
        Seconds per work item beyond the first in a packed CTA.
    launch_s : float
        Seconds per kernel launch (inside a CUDA graph).
    merge_launch_s : float
        Seconds for the merge launch, paid when some request has > 1 split.
    merge_partial_s : float
        Seconds per (partial, kv_head) merged, for the whole GPU.
    persistent_tile_s : float
        Extra seconds per tile under the persistent schedule (atomic fetch, loop).
    merge_split_s : float
        Seconds per split of the most-split merged request (the merge's serial
        latency; 0 in format 1).
    lone_bw : float
        Bytes/s of a CTA draining alone on its SM after the last wave started (the tail, or a plan of fewer
        tiles than SMs), when the rest of the GPU is mostly idle; 0 (default): the bulk formula
        ``min(cta_bw, sm_bw / (1 + ramp_ctas))``. Fitted per config on the H200: a lone long CTA of the
        (128, 4, 2) tile streams ~12 % faster than the bulk formula says, lone 64-token tiles slower.
    fixed_overlap : float
        Fraction (0..1) of an SM's fixed cost in the drain that its other resident CTAs hide
        (docs/concepts/simulator.md). The drain charges each SM the largest remaining fixed cost of its ``m`` tiles
        (``tile_fixed_s`` + ``item_fixed_s`` per extra packed item) before any of them streams; with this
        field it charges ``max_fixed * (1 - fixed_overlap * (m - 1) / m)``: one CTA's item prologues and
        partial writes stall only that CTA while the ``m - 1`` others keep streaming; a lone CTA (``m = 1``)
        hides nothing. 0 (default): charged in full, as before.
    tail_sm_bw : float
        Bytes/s one SM pulls in the drain after the last tile started, when the rest of the GPU is idling:
        a tail phase with ``n > 1`` CTAs left on an SM streams each at
        ``max(bulk, min(lone, tail_sm_bw / n))`` (``bulk`` = ``min(cta_bw, sm_bw / (n + ramp_ctas))``,
        ``lone`` = ``lone_bw`` or the bulk rate at ``n = 1``), where the bulk rate was fitted with every
        SM busy (HBM contended). 0 (default): the bulk rate, as before.
    ramp_ctas : float
        Latency term of an SM's streaming rate: with ``k`` resident CTAs each
        streams ``min(cta_bw, sm_bw / (k + ramp_ctas))``, so the SM's rate
        ``k sm_bw / (k + ramp_ctas)`` ramps up with residency (loads in flight,
        Little's law) instead of jumping to ``sm_bw`` (0: the plain
        ``min(cta_bw, sm_bw / k)`` of format 1).
    sm_flops : float
        Tensor-core FLOP/s of one SM for the decode tile's math (step 5 of the module doc); 0 (default):
        :func:`default_sm_flops` of the device.
    cvt_bw : float
        Bytes/s of an FP8 K/V stream one SM widens to 16 bits (step 5); 0 (default):
        :data:`FP8_CVT_BW_PER_SM` of the device. Used for an FP8 cache only.
    per_config : mapping
        ``{config_key: {name: value}}`` overrides of :data:`PER_CONFIG_PARAMS`
        for plans of that kernel config (``"n64w4s2"``: BLOCK_N 64, 4 warps, 2
        stages); configs not listed use the fields above.
    """

    hbm_bw: float
    sm_bw: float
    cta_bw: float
    slots: int | None = None
    tile_fixed_s: float = 1.5e-6
    item_fixed_s: float = 0.3e-6
    launch_s: float = 3.0e-6
    merge_launch_s: float = 2.5e-6
    merge_partial_s: float = 2.0e-9
    persistent_tile_s: float = 0.2e-6
    ramp_ctas: float = 0.0
    merge_split_s: float = 0.0
    lone_bw: float = 0.0
    fixed_overlap: float = 0.0
    tail_sm_bw: float = 0.0
    sm_flops: float = 0.0
    cvt_bw: float = 0.0
    per_config: Mapping[str, Mapping[str, float]] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name == "per_config":
                self._check_per_config(v)
                continue
            if f.name == "slots":
                if v is None:
                    continue
                if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 1 <= int(v) <= 64:
                    raise ValueError(f"Calibration.slots: expected an integer in [1, 64], got {v!r}")
                object.__setattr__(self, "slots", int(v))
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not math.isfinite(v):
                raise ValueError(f"Calibration.{f.name}: expected a finite number, got {v!r}")
            positive = f.name in ("hbm_bw", "sm_bw", "cta_bw")
            if (positive and v <= 0) or v < 0:
                raise ValueError(f"Calibration.{f.name}: expected a number {'> 0' if positive else '>= 0'}, got {v!r}")
            if f.name == "fixed_overlap" and v > 1:
                raise ValueError(f"Calibration.fixed_overlap: expected a fraction in [0, 1], got {v!r}")
            object.__setattr__(self, f.name, float(v))
        object.__setattr__(self, "_resolved", {})

    def _check_per_config(self, pc: Any) -> None:
        if not isinstance(pc, Mapping):
            raise ValueError(f"Calibration.per_config: expected an object, got {type(pc).__name__}")
        out = {}
        for key, over in pc.items():
            if not isinstance(key, str) or not _KEY_RE.fullmatch(key):
                raise ValueError(
                    f"Calibration.per_config: keys are like 'n64w4s2', 'n128w4s3p' (prefetch), "
                    f"'n64w4s2h2' (heads_per_tile) or 'n64w8s3ph2x' (next_item), got {key!r}"
                )
            if not isinstance(over, Mapping):
                raise ValueError(f"Calibration.per_config[{key!r}]: expected an object, got {type(over).__name__}")
            bad = sorted(set(over) - set(PER_CONFIG_PARAMS))
            if bad:
                raise ValueError(
                    f"Calibration.per_config[{key!r}]: unknown fields {bad}; known: {list(PER_CONFIG_PARAMS)}"
                )
            try:
                c = dataclasses.replace(self, per_config={}, **dict(over))
            except ValueError as e:
                raise ValueError(f"Calibration.per_config[{key!r}]: {e}") from None
            out[key] = {k: getattr(c, k) for k in over}
        object.__setattr__(self, "per_config", out)

    def for_config(self, config: KernelConfig | str) -> Calibration:
        """The constants that apply to plans of ``config`` (its :attr:`per_config`
        overrides applied, ``per_config`` empty). A prefetching config without its own
        entry (``n128w4s3p``) takes its tile's (``n128w4s3``), a config of several KV heads per tile without
        its own (``n64w4s2h2``) its one-head tile's. A look-ahead config (``n64w8s3ph2x``) takes the constants
        of the config without the look-ahead (``n64w8s3ph2``, resolved as above), overlaid by its own entry
        where it has one: a look-ahead entry holds only what was fitted for it (its lone-CTA
        rate), not a full set. Cached per key."""
        key = config if isinstance(config, str) else config_key(config)
        got = self._resolved.get(key)  # type: ignore[attr-defined]
        if got is None:
            if key.endswith("x"):
                over = {**(self._entry(key[:-1]) or {}), **(self.per_config.get(key) or {})} or None
            else:
                over = self._entry(key)
            got = (
                dataclasses.replace(self, per_config={}, **over)
                if over
                else (self if not self.per_config else dataclasses.replace(self, per_config={}))
            )
            self._resolved[key] = got  # type: ignore[attr-defined]
        return got

    def _entry(self, key: str) -> Mapping[str, float] | None:
        """The :attr:`per_config` entry of a config key without the look-ahead suffix: its own, else its one-head
        tile's (``h<k>`` dropped), else, for a prefetching config, its tile's (``p`` dropped)."""
        over = self.per_config.get(key)
        base = re.sub(r"h\d+$", "", key)
        if over is None and base != key:
            over = self.per_config.get(base)
        if over is None and base.endswith("p"):
            over = self.per_config.get(base[:-1])
        return over

    @staticmethod
    def default(
        device: DeviceSpec | str,
        *,
        head_dim: int = 128,
        dtype: str = "bfloat16",
        config: KernelConfig | None = None,
        kv_dtype: str | None = None,
        q_len: int = 1,
        group_size: int | None = None,
    ) -> Calibration:
        """Defaults derived from the device's vendor figures and the kernel config.

        ``slots`` is the config's residency, :func:`resident_slots` (measured
        on the H200 where kernels/residency.py has the config, else its
        occupancy estimate), for the KV dtype and q_len given.
        """
        dev = resolve_device(device)
        rows = (group_size or MEASURED_GROUP) * q_len if q_len > 1 else 0
        cfg = config or default_config(head_dim, dtype, query_rows=rows)
        slots = resident_slots(
            dev, cfg, head_dim=head_dim, dtype=dtype, kv_dtype=kv_dtype, q_len=q_len, group_size=group_size
        )
        hbm = 0.94 * dev.hbm_bandwidth_gbps * 1e9
        share = hbm / dev.num_sms
        return Calibration(hbm_bw=hbm, sm_bw=1.5 * share, cta_bw=0.5 * share, slots=slots)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON form (SI units: bytes/s and seconds); ``slots`` only when set,
        ``ramp_ctas``, ``merge_split_s``, ``lone_bw``, ``fixed_overlap``
        and ``tail_sm_bw`` only when > 0 and ``per_config`` only when not empty (so a
        format-1 calibration writes back its single-config form)."""
        d: dict[str, Any] = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if d["slots"] is None:
            del d["slots"]
        for name in ("ramp_ctas", "merge_split_s", "lone_bw", "fixed_overlap", "tail_sm_bw", "sm_flops", "cvt_bw"):
            if d[name] == 0.0:
                del d[name]
        if d["per_config"]:
            d["per_config"] = {k: dict(v) for k, v in d["per_config"].items()}
        else:
            del d["per_config"]
        return d

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> Calibration:
        """Inverse of :meth:`to_dict`; reads the single-config form (``slots``
        required there, format 1) and the per-config form (``slots`` absent or
        null: residency per config; ``per_config``).

        Raises
        ------
        ValueError
            Unknown or missing fields, or invalid values.
        """
        if not isinstance(d, Mapping):
            raise ValueError(f"calibration: expected an object, got {type(d).__name__}")
        names = {f.name for f in dataclasses.fields(Calibration)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"calibration: unknown fields {sorted(unknown)}")
        missing = [n for n in ("hbm_bw", "sm_bw", "cta_bw") if n not in d]
        if missing:
            raise ValueError(f"calibration: missing fields {missing}")
        return Calibration(**dict(d))


def hbm_floor_s(plan: Plan, calibration: Calibration, *, kv_dtype: str | None = None) -> float:
    """``sum(kv_len) * H_kv * D * 2 * kv_bytes / hbm_bw`` in seconds (docs/concepts/design.md §1; ``kv_bytes`` 1 for an FP8
    cache, else the plan's dtype's size)."""
    kvb = kv_elt_bytes(plan.dtype, kv_dtype)
    return float(plan.kv_lens.sum()) * plan.num_kv_heads * plan.head_dim * 2 * kvb / calibration.hbm_bw


@dataclass(frozen=True)
class SimTiles:
    """Per-plan quantities that do not depend on the calibration."""

    tile_bytes: np.ndarray  # float64 [N], launch order
    tile_items: np.ndarray  # int64 [N]
    persistent: bool
    num_programs: int
    num_sms: int
    total_bytes: float
    merge_units: int  # num_partials * H_kv
    max_splits: int  # splits of the most-split request (0 when no request is split)
    resident: int  # resident CTAs per SM of the plan's config (slots when the calibration leaves them None)
    config_key: str
    flops_per_byte: float = 0.0  # tensor-core FLOPs per K/V byte (math_flops_per_byte); 0: no math cap
    sm_flops_default: float = 0.0  # default_sm_flops of the device
    cvt_bw_default: float = 0.0  # FP8_CVT_BW_PER_SM of the device for an FP8 cache; 0: nothing to widen


def prepare_tiles(
    plan: Plan, device: DeviceSpec, kv_dtype: str | None = None, q_len: int = 1, group_size: int | None = None
) -> SimTiles:
    H = plan.num_kv_heads
    h = plan.config.heads_per_tile  # KV heads per work tile: H / h tiles per CTA, each reading h heads' bytes
    length = (plan.work_kv_end - plan.work_kv_start).astype(np.float64)
    ci = plan.cta_indptr
    cta_tokens = np.add.reduceat(length, ci[:-1]) if length.shape[0] else np.zeros(0)
    cta_items = np.diff(ci).astype(np.int64)
    kvb = kv_elt_bytes(plan.dtype, kv_dtype)
    bpt = plan.head_dim * 2 * kvb
    tile_bytes = np.repeat(cta_tokens * (bpt * h), H // h)
    tile_items = np.repeat(cta_items, H // h)
    persistent = plan.config.schedule == "persistent"
    return SimTiles(
        tile_bytes=tile_bytes,
        tile_items=tile_items,
        persistent=persistent,
        num_programs=int(plan.config.num_programs) if persistent else 0,
        num_sms=device.num_sms,
        total_bytes=float(plan.kv_lens.sum()) * H * bpt,
        merge_units=plan.num_partials * H * q_len,
        max_splits=int(plan.num_splits.max()) if plan.num_partials and plan.num_splits.size else 0,
        resident=resident_slots(
            device,
            plan.config,
            head_dim=plan.head_dim,
            dtype=plan.dtype,
            kv_dtype=kv_dtype,
            q_len=q_len,
            group_size=group_size,
        ),
        config_key=config_key(plan.config),
        flops_per_byte=fpb
        if (fpb := math_flops_per_byte(kvb, q_len, group_size, h)) > REFERENCE_FLOPS_PER_BYTE or kvb == 1
        else 0.0,
        sm_flops_default=default_sm_flops(device),
        cvt_bw_default=_default_cvt_bw(device) if kvb == 1 else 0.0,
    )


def _default_cvt_bw(device: DeviceSpec) -> float:
    return FP8_CVT_BW_PER_SM.get(tuple(device.compute_capability), FP8_CVT_BW_PER_SM[(9, 0)])


def _sm_math_rate(t: SimTiles, c: Calibration) -> float:
    """Bytes/s one SM's math lets its residents stream together (module doc, step 5): inf where nothing caps it."""
    sec_per_byte = 0.0
    if t.flops_per_byte:
        sec_per_byte += t.flops_per_byte / (c.sm_flops or t.sm_flops_default)
    if t.cvt_bw_default:
        sec_per_byte += 1.0 / (c.cvt_bw or t.cvt_bw_default)
    return 1.0 / sec_per_byte if sec_per_byte else math.inf


def simulate_tiles(t: SimTiles, c: Calibration, record: dict[str, Any] | None = None) -> float:
    """Predicted seconds of the tiles ``t`` under ``c``; with ``record`` (a dict) also each tile's SM, start and end
    (the placement the total is computed from: :func:`timeline`)."""
    if c.per_config:
        c = c.for_config(t.config_key)
    S = t.num_sms
    N = t.tile_bytes.shape[0]
    capacity = (c.slots if c.slots is not None else t.resident) * S
    P = min(t.num_programs, capacity) if t.persistent else capacity
    active_sms = min(S, P)
    k_bulk = P / active_sms  # resident CTAs per busy SM while tiles are queued
    r_bulk = min(c.cta_bw, c.sm_bw / (k_bulk + c.ramp_ctas), c.hbm_bw / active_sms / k_bulk)
    sm_math = _sm_math_rate(t, c)
    r_bulk = min(r_bulk, sm_math / k_bulk)  # the SM's tensor cores shared by its residents (module doc, step 5)
    fixed = c.tile_fixed_s + c.item_fixed_s * (t.tile_items - 1)
    if t.persistent:
        fixed = fixed + c.persistent_tile_s
    if N <= P:
        t_last = 0.0
        run_fixed = fixed
        run_bytes = t.tile_bytes
        if record is not None:
            record.update(start=np.zeros(N), end=np.zeros(N), slot=np.arange(N), running=np.ones(N, dtype=bool))
    else:
        dur = fixed + t.tile_bytes / r_bulk
        if np.ndim(dur) == 0:
            dur = np.full(N, float(dur))
        slot = None
        if dur.min() == dur.max():
            # identical tiles: list scheduling is plain waves of P tiles
            starts = (np.arange(N) // P) * float(dur[0])
            t_last = float(starts[-1])
            slot = np.arange(N) % P
        elif record is None:
            starts = np.empty(N)
            starts[:P] = 0.0
            heap = dur[:P].tolist()
            heapq.heapify(heap)
            rest = dur[P:].tolist()
            st = [0.0] * len(rest)
            replace = heapq.heapreplace
            for i, d in enumerate(rest):
                t0 = heap[0]
                st[i] = t0
                replace(heap, t0 + d)
            starts[P:] = st
            t_last = st[-1]
        else:  # the same list scheduling, keeping which slot takes each tile (same start times)
            starts = np.zeros(N)
            slot = np.arange(N)
            sheap = [(float(d), p) for p, d in enumerate(dur[:P])]
            heapq.heapify(sheap)
            for i in range(P, N):
                t0, p = sheap[0]
                starts[i], slot[i] = t0, p
                heapq.heapreplace(sheap, (t0 + float(dur[i]), p))
            t_last = float(starts[-1])
        ends = starts + dur
        running = ends > t_last
        if record is not None:
            record.update(start=starts, end=ends.copy(), slot=slot, running=running)
        # tiles still running at t_last: remaining fixed time and bytes
        elapsed = t_last - starts[running]
        f = fixed[running] if np.ndim(fixed) else np.full(int(running.sum()), fixed)
        run_fixed = np.maximum(f - elapsed, 0.0)
        run_bytes = np.maximum(t.tile_bytes[running] - np.maximum(elapsed - f, 0.0) * r_bulk, 0.0)
    return _finish(t, c, t_last, run_fixed, run_bytes, r_bulk, sm_math, record)


def _finish(
    t: SimTiles,
    c: Calibration,
    t_last: float,
    run_fixed: np.ndarray,
    run_bytes: np.ndarray,
    r_bulk: float,
    sm_math: float = math.inf,
    record: dict[str, Any] | None = None,
) -> float:
    """Drain the tiles running at ``t_last`` and add launch, floor and merge terms (``record``: see simulate_tiles)."""
    S = t.num_sms
    # tail: spread the running tiles over SMs (longest first, round-robin), drain by processor sharing
    if np.ndim(run_fixed) == 0:
        run_fixed = np.full(run_bytes.shape[0], float(run_fixed))
    n = run_bytes.shape[0]
    if n == 0:
        finish = t_last
    else:
        rem_time = run_fixed + run_bytes / r_bulk
        order = np.argsort(-rem_time, kind="stable")
        m = -(-n // S)
        pad = m * S - n
        b = np.concatenate([run_bytes[order], np.zeros(pad)]).reshape(m, S).T  # [S, m]
        fx = np.concatenate([run_fixed[order], np.zeros(pad)]).reshape(m, S).T
        if record is not None:
            pos = np.argsort(b, axis=1, kind="stable")  # [S, m]: drain phase j of SM s ends tile (s, pos[s, j])
        b = np.sort(b, axis=1)
        diffs = np.diff(b, axis=1, prepend=0.0)
        active = np.arange(m, 0, -1, dtype=np.float64)  # residents still draining in phase j
        rate = np.minimum(c.cta_bw, c.sm_bw / (active + c.ramp_ctas))
        if c.tail_sm_bw > 0.0:  # the drain with the rest of the GPU idling: up to the lone rate, capped per SM
            lone = c.lone_bw if c.lone_bw > 0.0 else min(c.cta_bw, c.sm_bw / (1.0 + c.ramp_ctas))
            rate = np.maximum(rate, np.minimum(lone, c.tail_sm_bw / active))
        if c.lone_bw > 0.0:
            rate[-1] = c.lone_bw  # the last phase: one CTA left on the SM
        rate = np.minimum(rate, sm_math / active)  # the SM's math shared by the residents left (step 5)
        fx_sm = fx.max(axis=1)
        if c.fixed_overlap > 0.0:  # the other residents of the SM stream while one pays its fixed cost
            m_sm = np.full(S, float(m))  # tiles on each SM in the drain (the last `pad` SMs hold one fewer)
            if pad:
                m_sm[S - pad :] -= 1.0
            fx_sm = fx_sm * (1.0 - c.fixed_overlap * (m_sm - 1.0) / np.maximum(m_sm, 1.0))
        sm_time = fx_sm + (diffs / rate).sum(axis=1)
        finish = t_last + float(sm_time.max())
        if record is not None:
            # the drain spreads the running tiles over the SMs longest first: rank r on SM r % S, column r // S
            phase_end = t_last + fx_sm[:, None] + np.cumsum(diffs / rate, axis=1)  # [S, m]
            col_end = np.empty((S, m))
            np.put_along_axis(col_end, pos, phase_end, axis=1)
            ranks = np.arange(n)
            idx = np.flatnonzero(record["running"])[order]
            record["end"][idx] = col_end[ranks % S, ranks // S]
            record["drain_sm"] = (idx, ranks % S)
    main = max(finish, t.total_bytes / c.hbm_bw)
    total = c.launch_s + main
    merge = 0.0
    if t.merge_units:
        merge = c.merge_launch_s + c.merge_partial_s * t.merge_units + c.merge_split_s * t.max_splits
        total += merge
    if record is not None:
        record.update(launch_s=c.launch_s, main_s=main, floor_s=t.total_bytes / c.hbm_bw, merge_s=merge, total_s=total)
    return total


def _checked(plan, device, calibration, kv_dtype, q_len, group_size) -> tuple[SimTiles, Calibration]:
    """The arguments of :func:`predict` and :func:`timeline`, checked (ValueError naming the argument): the
    plan's tiles and the calibration to simulate them under."""
    if not isinstance(plan, Plan):
        raise ValueError(f"plan: expected a Plan, got {type(plan).__name__}")
    kd = check_kv_dtype(kv_dtype, plan.dtype)
    q_len = check_q_len(q_len, group_size)
    kd = None if kd == plan.dtype else kd
    dev = resolve_device(device if device is not None else plan.gpu)
    cal = calibration or Calibration.default(
        dev,
        head_dim=plan.head_dim,
        dtype=plan.dtype,
        config=plan.config,
        kv_dtype=kd,
        q_len=q_len,
        group_size=group_size,
    )
    if not isinstance(cal, Calibration):
        raise ValueError(f"calibration: expected a Calibration, got {type(cal).__name__}")
    return prepare_tiles(plan, dev, kd, q_len, group_size), cal


def predict(
    plan: Plan,
    device: DeviceSpec | str | None = None,
    *,
    calibration: Calibration | None = None,
    kv_dtype: str | None = None,
    q_len: int = 1,
    group_size: int | None = None,
) -> float:
    """Predicted kernel time of ``plan`` on ``device``, in seconds.

    Parameters
    ----------
    plan : Plan
    device : DeviceSpec or str, optional
        Defaults to the GPU the plan was made for (``plan.gpu``).
    calibration : Calibration, optional
        Defaults to :meth:`Calibration.default` for the device and the plan's config.
    kv_dtype : str, optional
        The KV cache's dtype (None: the plan's dtype; ``"float8_e4m3fn"``: 1 byte per element).
    q_len : int
        Query tokens per request, 1..8: ``G * q_len`` query rows per KV head of a tile (math, residency) and
        ``q_len`` merged rows per (partial, query head).
    group_size : int, optional
        G = H_q / H_kv (default: the residency tables' 8).

    Returns
    -------
    float
        Seconds (main kernel + launch + merge; module docstring for the model).

    Raises
    ------
    ValueError
        ``plan`` is not a Plan, the device is unknown, or ``kv_dtype`` / ``q_len`` is invalid (named).
    """
    return simulate_tiles(*_checked(plan, device, calibration, kv_dtype, q_len, group_size))


@dataclass(frozen=True)
class Timeline:
    """Where and when :func:`predict`'s model runs each work tile of a plan (the placement its total comes from).

    Attributes
    ----------
    tile_cta, tile_heads : int64 ndarray ``[N]``
        CTA index (into ``plan.cta_indptr``) and KV-head group (``0 .. H_kv / heads_per_tile - 1``) of each work
        tile, in launch order (tile ``i`` = CTA ``i // (H_kv / heads_per_tile)``).
    sm : int64 ndarray ``[N]``
        SM the tile runs on: slot ``p`` of the first wave is on SM ``p % num_SMs`` and a later tile takes the slot
        that frees first; a tile still running when the last tile has started is drained on the SM the model
        spreads it to (longest first, round-robin: the module docstring's step 4).
    start_s, end_s : float64 ndarray ``[N]``
        Seconds from the main kernel's start (after ``launch_s``).
    num_sms, slots : int
        SMs of the device and resident CTAs per SM of the plan's config.
    launch_s, main_s, floor_s, merge_s, total_s : float
        Launch overhead, main kernel (``max(last tile end, floor_s)``), HBM floor of the batch, LSE merge
        (0 without splits) and ``predict(plan)`` (= launch + main + merge), in seconds.
    """

    tile_cta: np.ndarray
    tile_heads: np.ndarray
    sm: np.ndarray
    start_s: np.ndarray
    end_s: np.ndarray
    num_sms: int
    slots: int
    launch_s: float
    main_s: float
    floor_s: float
    merge_s: float
    total_s: float


def timeline(
    plan: Plan,
    device: DeviceSpec | str | None = None,
    *,
    calibration: Calibration | None = None,
    kv_dtype: str | None = None,
    q_len: int = 1,
    group_size: int | None = None,
) -> Timeline:
    """Per-tile SM, start and end of ``plan`` under the simulator's model (a Gantt chart's data).

    Runs the code :func:`predict` runs, keeping the placement, so ``timeline(plan).total_s == predict(plan)`` for
    the same device, calibration, KV dtype and q_len. Parameters and errors as :func:`predict`.
    """
    t, cal = _checked(plan, device, calibration, kv_dtype, q_len, group_size)
    rec: dict[str, Any] = {}
    total = simulate_tiles(t, cal, rec)
    S = t.num_sms
    sm = np.asarray(rec["slot"], dtype=np.int64) % S
    if "drain_sm" in rec:
        idx, drain = rec["drain_sm"]
        sm[idx] = drain
    per_cta = plan.num_kv_heads // plan.config.heads_per_tile
    n = t.tile_bytes.shape[0]
    c = cal.for_config(t.config_key) if cal.per_config else cal
    return Timeline(
        tile_cta=np.arange(n, dtype=np.int64) // per_cta,
        tile_heads=np.arange(n, dtype=np.int64) % per_cta,
        sm=sm,
        start_s=np.asarray(rec["start"], dtype=np.float64),
        end_s=np.asarray(rec["end"], dtype=np.float64),
        num_sms=S,
        slots=int(c.slots if c.slots is not None else t.resident),
        launch_s=float(rec["launch_s"]),
        main_s=float(rec["main_s"]),
        floor_s=float(rec["floor_s"]),
        merge_s=float(rec["merge_s"]),
        total_s=float(total),
    )


FIT_PARAMS = (
    "hbm_bw",
    "sm_bw",
    "cta_bw",
    "slots",
    "tile_fixed_s",
    "item_fixed_s",
    "launch_s",
    "merge_launch_s",
    "merge_partial_s",
    "persistent_tile_s",
    "ramp_ctas",
    "merge_split_s",
)
"""Constants :func:`fit_calibration` can fit (all by default)."""


def _rel_errors(tiles: Sequence[SimTiles], measured: np.ndarray, c: Calibration) -> np.ndarray:
    pred = np.array([simulate_tiles(t, c) for t in tiles])
    return pred / measured - 1.0


def fit_calibration(
    samples: Sequence[tuple[Plan, float]],
    device: DeviceSpec | str,
    *,
    initial: Calibration | None = None,
    params: Sequence[str] = FIT_PARAMS,
    rounds: int = 8,
    kv_dtype: str | None = None,
    q_len: int = 1,
    group_size: int | None = None,
) -> tuple[Calibration, dict[str, Any]]:
    """Fit the simulator's constants to measured kernel times.

    Minimises the mean squared log error ``mean(log(pred / measured)^2)`` by a
    coordinate search in log space (each constant multiplied by factors that
    shrink from 2x to about 1.03x over ``rounds`` rounds; ``slots`` moves by
    +-1), starting from ``initial`` or :meth:`Calibration.default` for the first
    plan's config. NumPy only.

    Parameters
    ----------
    samples : sequence of (Plan, seconds)
        Plans of one (device, head_dim, dtype, kernel config) with measured times (> 0).
    device : DeviceSpec or str
    initial : Calibration, optional
    params : sequence of str
        Names from :data:`FIT_PARAMS` to fit; the others stay at ``initial``.
    rounds : int
        Coordinate-search rounds (>= 1).
    kv_dtype, q_len, group_size
        The shape the samples were timed at, as :func:`predict` takes them (KV cache dtype, query tokens per
        request, G = H_q / H_kv): the fit simulates the plans with them.

    Returns
    -------
    (Calibration, dict)
        The fitted constants and a report: ``n``, ``median_rel_err``,
        ``worst_rel_err`` (absolute relative errors after the fit),
        ``median_rel_err_before``, ``worst_rel_err_before``, ``rel_errors`` (signed,
        per sample) and ``params``.

    Raises
    ------
    ValueError
        No samples, a non-positive or non-finite time, an unknown parameter name.
    """
    if not samples:
        raise ValueError("samples: expected at least one (plan, seconds) pair")
    unknown = [p for p in params if p not in FIT_PARAMS]
    if unknown:
        raise ValueError(f"params: unknown calibration constants {unknown}; known: {list(FIT_PARAMS)}")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds: expected an integer >= 1, got {rounds!r}")
    dev = resolve_device(device)
    plans = []
    times = []
    for i, item in enumerate(samples):
        try:
            plan, sec = item
        except (TypeError, ValueError):
            raise ValueError(f"samples[{i}]: expected a (Plan, seconds) pair") from None
        if not isinstance(plan, Plan):
            raise ValueError(f"samples[{i}]: expected a Plan, got {type(plan).__name__}")
        if (
            isinstance(sec, bool)
            or not isinstance(sec, (int, float, np.floating))
            or not (math.isfinite(sec) and sec > 0)
        ):
            raise ValueError(f"samples[{i}]: expected a time in seconds > 0, got {sec!r}")
        plans.append(plan)
        times.append(float(sec))
    measured = np.array(times)
    p0 = plans[0]
    kd = check_kv_dtype(kv_dtype, p0.dtype)
    kd = None if kd == p0.dtype else kd
    q_len = check_q_len(q_len, group_size)
    tiles = [prepare_tiles(p, dev, kd, q_len, group_size) for p in plans]
    cal = initial or Calibration.default(
        dev, head_dim=p0.head_dim, dtype=p0.dtype, config=p0.config, kv_dtype=kd, q_len=q_len, group_size=group_size
    )

    def loss(c: Calibration) -> float:
        e = _rel_errors(tiles, measured, c)
        return float(np.mean(np.log1p(e) ** 2))

    before = np.abs(_rel_errors(tiles, measured, cal))
    best = loss(cal)
    for r in range(rounds):
        step = 2.0 ** (1.0 / (1.6**r))  # 2, 1.54, 1.31, ... 1.03
        for name in params:
            cur = getattr(cal, name)
            if name == "slots":
                if cur is None:  # residency per config: not a free constant
                    continue
                cands = [cur - 1, cur + 1]
                cands = [v for v in cands if 1 <= v <= 64]
            else:
                base = cur if cur > 0 else 1e-7
                cands = [base * step, base / step, base * step * step, base / (step * step)]
                if cur > 0 and name not in ("hbm_bw", "sm_bw", "cta_bw"):
                    cands.append(0.0)
            for v in cands:
                try:
                    trial = dataclasses.replace(cal, **{name: v})
                except ValueError:
                    continue
                val = loss(trial)
                if val < best - 1e-15:
                    best, cal = val, trial
    errs = _rel_errors(tiles, measured, cal)
    report = {
        "n": len(plans),
        "median_rel_err": float(np.median(np.abs(errs))),
        "worst_rel_err": float(np.max(np.abs(errs))),
        "median_rel_err_before": float(np.median(before)),
        "worst_rel_err_before": float(np.max(before)),
        "rel_errors": errs.tolist(),
        "params": list(params),
    }
    return cal, report
