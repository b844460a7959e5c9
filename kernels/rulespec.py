"""Named policies resolved to the arguments of their split rule: :class:`RuleSpec` and :func:`resolve`.

:func:`resolve` is the one place where a policy's parameters and the kernel knobs are parsed and checked
(errors are ``ValueError`` naming the argument, ``params.<name>``). What it returns depends on the policy, its
parameters and the batch's shape, never on a batch: the host planner (:mod:`.hostplan`), the NumPy oracle of the
tests and the device planner (:mod:`.device_plan`) all plan from the same :class:`RuleSpec`.

Rules (``RuleSpec.partition``):

- ``even_chunks``: per-request split counts of one chunk (``chunk_rule``: a constant count, the wave-aware
  chunk, or the fair chunk ``roundup(max(cdiv(H * sum(kv_len), chunk_arg), min_chunk), block_n)``), then the
  even work list (block-aligned cuts where a request has at least as many blocks as splits);
- ``stream_k``: the even partition of the concatenated KV stream over ``ctas`` CTAs per group of KV heads
  (docs/decisions/stream-k-partition.md);
- ``flashinfer``, ``fa3``: the peers' split counts (:mod:`.peer_policies`), then the even work list.

``whole_wave`` > 0 adds the whole-wave rule (docs/decisions/whole-wave-rule.md): a batch that fills whole resident
waves of one of ``whole_wave_specs``' tiles with one work tile per request is planned with that spec instead.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .device import DeviceSpec
from .limits import (
    BLOCK_N_CHOICES,
    DTYPES,
    HEADS_PER_TILE_CHOICES,
    MAX_NUM_PROGRAMS,
    MAX_PACK_TOKENS,
    NUM_STAGES_CHOICES,
    NUM_WARPS_CHOICES,
    ORDERS,
    SCHEDULES,
    TILE_QUERY_ROWS,
    KernelConfig,
    check_config,
    check_int,
    check_kv_dtype,
    check_q_len,
    check_shape,
    default_config,
    heads_fit,
    kv_elt_bytes,
    tile_problem,
    too_big_message,
)
from .limits import tile_rows as limit_tile_rows
from .peer_policies import flashinfer_decode_occupancy
from .residency import MEASURED_GROUP, occupancy, q_len_rows, tile_resources
from .workplan import jsonable

__all__ = [
    "RuleSpec",
    "resolve",
    "PlanContext",
    "POLICIES",
    "KNOB_PARAMS",
    "policy_params",
    "TUNED_PARAM_SPACE",
    "condition_holds",
    "STREAM_K_DEFAULTS",
    "WHOLE_WAVE_TILES",
    "WHOLE_WAVE_HEADS_TILES",
    "WHOLE_WAVE_MAX_WAVES",
    "fit_heads_per_tile",
    "whole_wave_tiles",
    "resident_slots",
    "shared_memory_refused",
    "tile_heads",
    "wave_target",
    "wave_tile_cost",
    "RULE_CONST",
    "RULE_WAVE",
    "RULE_FAIR",
    "RULE_WAVE1",
    "RULE_WAVE2",
    "tile_rows",
    "extra_rows",
]


@dataclass(frozen=True)
class PlanContext:
    """The shape a plan is made for besides the lengths (all validated).

    ``kv_dtype`` None means ``dtype`` (:func:`~kvsplit.kernels.limits.kv_elt_bytes` gives the bytes per K/V
    element); ``q_len`` query tokens per request; ``group_size`` the GQA group H_q / H_kv, 0 when the caller did
    not give H_q (the residency tables' :data:`~kvsplit.kernels.residency.MEASURED_GROUP` is assumed).
    """

    device: DeviceSpec
    num_kv_heads: int
    head_dim: int
    page_size: int
    dtype: str
    kv_dtype: str | None = None
    q_len: int = 1
    group_size: int = 0

    @property
    def kv_bytes(self) -> int:
        """Bytes per K/V element (1 for an FP8 cache)."""
        return kv_elt_bytes(self.dtype, self.kv_dtype)


# ----------------------------------------------------------------------------
# Policies and their parameters (as data)
# ----------------------------------------------------------------------------

KNOB_PARAMS = (
    "block_n",
    "num_warps",
    "num_stages",
    "schedule",
    "num_programs",
    "order",
    "pack_tokens",
    "prefetch",
    "heads_per_tile",
    "next_item",
)
"""Parameters every policy accepts (kernel knobs, launch order, CTA packing)."""

_TUNED_RULE_PARAMS = (
    "ctas_per_sm",
    "min_chunk_tokens",
    "max_splits",
    "programs_per_sm",
    "partition",
    "wave_aware",
    "item_cost_blocks",
    "min_piece_blocks",
    "whole_wave",
    "whole_wave_heads",
)

POLICIES: dict[str, tuple[str, ...]] = {
    name: own + KNOB_PARAMS
    for name, own in (
        ("flashinfer", ("tensor_cores", "resident_ctas_per_sm", "group_size")),
        ("fa3", ("num_splits_static",)),
        ("no_split", ()),
        ("fixed", ("num_splits",)),
        ("balanced", ("ctas_per_sm", "whole_wave", "whole_wave_heads")),
        ("stream_k", ("ctas_per_sm", "item_cost_blocks", "min_piece_blocks", "whole_wave", "whole_wave_heads")),
        ("tuned", _TUNED_RULE_PARAMS),
    )
}
"""The named policies (docs/concepts/design.md §3), each with the parameters it accepts (its own, then :data:`KNOB_PARAMS`)."""


def policy_params(policy: str) -> tuple[str, ...]:
    """Names of the parameters ``policy`` accepts; ValueError naming ``policy`` for an unknown one."""
    if policy not in POLICIES:
        raise ValueError(f"policy: unknown policy {policy!r}; known: {sorted(POLICIES)}")
    return POLICIES[policy]


STREAM_K_DEFAULTS = {"ctas_per_sm": 2.0, "item_cost_blocks": 1, "min_piece_blocks": 1}
"""Defaults of ``stream_k``'s rule parameters."""

TUNED_PARAM_SPACE: dict[str, dict[str, Any]] = {
    "ctas_per_sm": {
        "kind": "float",
        "low": 0.25,
        "high": 64.0,
        "log": True,
        "default": 4.0,
        "search": True,
        "doc": "target work tiles per SM: chunk = ceil(H_kv * sum(kv_len) / (ctas_per_sm * num_SMs))",
    },
    "partition": {
        "kind": "categorical",
        "choices": ["even_chunks", "stream_k"],
        "default": "even_chunks",
        "search": True,
        "doc": "even_chunks: per-request splits of one chunk size (min_chunk_tokens, max_splits apply); "
        "stream_k: even partition of the concatenated KV stream (item_cost_blocks, min_piece_blocks apply)",
    },
    "min_chunk_tokens": {
        "kind": "int",
        "low": 16,
        "high": 65536,
        "log": True,
        "default": 16,
        "search": True,
        "condition": {"partition": "even_chunks"},
        "doc": "smallest chunk in tokens (before rounding up to block_n)",
    },
    "max_splits": {
        "kind": "int",
        "low": 1,
        "high": 1024,
        "log": True,
        "default": 1024,
        "search": True,
        "condition": {"partition": "even_chunks"},
        "doc": "cap on splits per request",
    },
    "block_n": {
        "kind": "categorical",
        "choices": list(BLOCK_N_CHOICES),
        "default": None,
        "search": True,
        "doc": "KV tokens per inner tile; None -> default_config(head_dim, dtype); some (block_n, "
        "num_warps, num_stages) combinations are rejected for large head_dim (ValueError)",
    },
    "num_warps": {
        "kind": "categorical",
        "choices": list(NUM_WARPS_CHOICES),
        "default": None,
        "search": True,
        "doc": "warps per CTA; None -> default_config",
    },
    "num_stages": {
        "kind": "int",
        "low": min(NUM_STAGES_CHOICES),
        "high": max(NUM_STAGES_CHOICES),
        "log": False,
        "default": None,
        "search": True,
        "doc": "pipeline stages; None -> default_config",
    },
    "prefetch": {
        "kind": "categorical",
        "choices": [False, True],
        "default": False,
        "search": True,
        "condition": {"num_stages": [n for n in NUM_STAGES_CHOICES if n >= 3]},
        "doc": "load the next tile's page ids one iteration ahead so the pipeliner keeps num_stages - 1 K/V tiles in "
        "flight (KernelConfig.prefetch; needs num_stages >= 3)",
    },
    "next_item": {
        "kind": "categorical",
        "choices": [False, True],
        "default": False,
        "search": True,
        "condition": {"prefetch": True},
        "doc": "look-ahead over a CTA's work items: the next items' entries, q and first page ids loaded while the "
        "current one streams (KernelConfig.next_item; needs prefetch)",
    },
    "heads_per_tile": {
        "kind": "categorical",
        "choices": list(HEADS_PER_TILE_CHOICES),
        "default": 1,
        "search": True,
        "doc": "KV heads per work tile (KernelConfig.heads_per_tile), at most: the tuner plans a choice through "
        "fit_heads_per_tile for its task's H_q / H_kv and q_len (the largest choice the launch takes, "
        "limits.heads_fit: a divisor of H_kv whose GQA groups fit the 16 query rows and whose heads x G x q_len "
        "rows fit 64), as the policy table does at serving",
    },
    "order": {
        "kind": "categorical",
        "choices": list(ORDERS),
        "default": "natural",
        "search": True,
        "doc": "launch order of requests: batch order or kv_len descending",
    },
    "schedule": {
        "kind": "categorical",
        "choices": list(SCHEDULES),
        "default": "grid",
        "search": True,
        "doc": "grid launch or persistent programs pulling tiles from a counter",
    },
    "programs_per_sm": {
        "kind": "int",
        "low": 1,
        "high": 32,
        "log": True,
        "default": 4,
        "search": True,
        "condition": {"schedule": "persistent"},
        "doc": "persistent programs per SM (num_programs = programs_per_sm * num_SMs unless num_programs is given)",
    },
    "num_programs": {
        "kind": "int",
        "low": 1,
        "high": MAX_NUM_PROGRAMS,
        "log": True,
        "default": None,
        "search": False,
        "condition": {"schedule": "persistent"},
        "doc": "absolute number of persistent programs (overrides programs_per_sm); not searched",
    },
    "pack_tokens": {
        "kind": "categorical",
        "choices": [0, 128, 256, 512, 1024, 2048, 4096, 8192],
        "default": 0,
        "search": True,
        "condition": {"partition": "even_chunks"},
        "doc": "group consecutive items shorter than this into one CTA (cta_indptr); 0 = one item per CTA. "
        "Any integer in [0, 2^20] is accepted; the choices are the search grid",
    },
    "wave_aware": {
        "kind": "categorical",
        "choices": [True, False],
        "default": True,
        "search": False,
        "doc": "even_chunks: grow the chunk until the rounded tiles fit wave_target(ctas_per_sm) "
        "(the wave-aware chunk); False is the fair chunk alone",
    },
    "whole_wave": {
        "kind": "float",
        "low": 0.0,
        "high": 1.0,
        "log": False,
        "default": 0.0,
        "search": False,
        "doc": "one work tile per request on a WHOLE_WAVE_TILES tile when that fills whole resident waves "
        "within this excess (the whole-wave rule); 0 = off. Set per bucket from GPU timings, not searched",
    },
    "whole_wave_heads": {
        "kind": "int",
        "low": 1,
        "high": 16,
        "log": False,
        "default": 1,
        "search": False,
        "doc": "the most KV heads per work tile the whole-wave rule may run (WHOLE_WAVE_HEADS_TILES); 1 = the "
        "one-head tiles only. Set with whole_wave, refitted to the GQA group by the policy table "
        "(fit_heads_per_tile), not searched",
    },
    "item_cost_blocks": {
        "kind": "int",
        "low": 0,
        "high": 64,
        "log": False,
        "default": 1,
        "search": True,
        "condition": {"partition": "stream_k"},
        "doc": "stream_k: fixed cost of a request's piece, in block_n blocks",
    },
    "min_piece_blocks": {
        "kind": "int",
        "low": 1,
        "high": 4096,
        "log": True,
        "default": 1,
        "search": True,
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
``doc``. :func:`resolve` accepts every value in these ranges (and raises ``ValueError`` naming the parameter
outside them); with all defaults ``tuned`` gives the same plan as ``balanced``.
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


# ----------------------------------------------------------------------------
# Residency-derived rule arguments
# ----------------------------------------------------------------------------

WHOLE_WAVE_TILES: tuple[tuple[int, int, int], ...] = ((64, 4, 2), (128, 4, 2))
"""(block_n, num_warps, num_stages) tiles the whole-wave rule may run: the two multi-resident tiles that stream
fastest on the H200 (4 and 3 CTAs per SM at D = 128, 16-bit K/V; 1.064-1.079x the read floor at T = 1,048,576 as
single plans; docs/decisions/whole-wave-rule.md)."""
WHOLE_WAVE_HEADS_TILES: tuple[KernelConfig, ...] = (KernelConfig(64, 4, 3, prefetch=True, heads_per_tile=2),)
"""Tiles of several KV heads the whole-wave rule also considers when the policy's ``whole_wave_heads`` allows
their ``heads_per_tile`` (after :data:`WHOLE_WAVE_TILES`, so ties keep the one-head tiles): (64, 4, 3) with the
page-id prefetch and two heads per tile, one resident CTA per SM (218 registers, 134 KB of shared memory at
D = 128). Measured on the H200: on every batch where the rule takes it (near-even B = 64 at H_kv = 4 and B = 32 at
H_kv = 8: 128 work tiles on 132 SMs) its one tile per request was the fastest of the 20 timed plans, 7 of 7
training and 3 of 3 evaluation batches (docs/decisions/whole-wave-rule.md)."""
WHOLE_WAVE_MAX_WAVES = 2
"""The whole-wave rule considers at most this many resident waves of whole requests: more waves of near-even
batches lost 1-5 % to the even partition on the training batches (docs/decisions/whole-wave-rule.md)."""


def _tile_resources(ctx: PlanContext, cfg: KernelConfig) -> tuple[int, int]:
    """``(registers per thread, shared bytes per CTA)`` of ``cfg``'s kernel for ``ctx``
    (:func:`~kvsplit.kernels.residency.tile_resources`: KV dtype, q_len rows)."""
    return tile_resources(
        ctx.device,
        ctx.head_dim,
        ctx.dtype,
        DTYPES[ctx.dtype],
        cfg.block_n,
        cfg.num_warps,
        cfg.num_stages,
        prefetch=cfg.prefetch,
        heads_per_tile=cfg.heads_per_tile,
        next_item=cfg.next_item,
        kv_bytes=ctx.kv_bytes,
        extra_rows=extra_rows(ctx, cfg.heads_per_tile),
        rows=q_len_rows(cfg.heads_per_tile, ctx.group_size, ctx.q_len)[0],
    )


def resident_slots(ctx: PlanContext, cfg: KernelConfig) -> int:
    """Work tiles of one resident wave: ``resident_ctas_per_sm(cfg) * num_SMs``
    (:mod:`.residency`; measured data where known)."""
    return occupancy(ctx.device, cfg.num_warps, *_tile_resources(ctx, cfg)) * ctx.device.num_sms


def shared_memory_refused(ctx: PlanContext, cfg: KernelConfig) -> str | None:
    """Why ``cfg``'s kernel cannot load on ``ctx``'s GPU, else None: its shared memory per CTA as the residency
    tables count it (:func:`_tile_resources`; the compiled figure where the tables hold the config) above the
    device's per-block limit (``DeviceSpec.smem_per_block_bytes``, 227 KB on Hopper). E.g. (128, 4, 2) with two
    heads per tile at q_len 4 and G = 8 compiles to 279,552 B for sm_90. Configs the tables lack are estimated and
    can still be refused by the launch (``kvsplit.kernels.decode``), which names them the same way.

    Returns
    -------
    str or None
        The error text (``params: ...`` with the knobs, q_len, the bytes needed and the device's limit), or None."""
    smem = _tile_resources(ctx, cfg)[1]
    if smem <= ctx.device.smem_per_block_bytes:
        return None
    return too_big_message(
        cfg,
        ctx.q_len,
        f" needs {smem} bytes of shared memory per CTA",
        f"{ctx.device.name}'s {ctx.device.smem_per_block_bytes}",
    )


def tile_rows(ctx: PlanContext, heads_per_tile: int = 1) -> int:
    """Query rows of one work tile, :func:`kvsplit.kernels.limits.tile_rows` (``heads_per_tile * G * q_len``; G the
    GQA group, the residency tables' :data:`~kvsplit.kernels.residency.MEASURED_GROUP` when the context does not know
    H_q)."""
    return limit_tile_rows(heads_per_tile, ctx.group_size or MEASURED_GROUP, ctx.q_len)


def tile_refused(ctx: PlanContext, heads_per_tile: int) -> str | None:
    """Why the launch would refuse a q_len > 1 work tile of ``heads_per_tile`` KV heads for ``ctx``
    (:func:`kvsplit.kernels.limits.tile_problem`, G as :func:`tile_rows`), else None. At q_len 1, and for one head
    per tile, None: there the planner keeps an explicit ``heads_per_tile`` as given and the launch names it (q_len-1
    plans unchanged); one head's ``G * q_len`` rows are checked with the shape (:func:`check_q_len`)."""
    if ctx.q_len <= 1 or heads_per_tile <= 1:
        return None
    G = ctx.group_size or MEASURED_GROUP
    problem = tile_problem(heads_per_tile, G * ctx.num_kv_heads, ctx.num_kv_heads, ctx.q_len)
    return None if problem is None else problem[1]


def extra_rows(ctx: PlanContext, heads_per_tile: int = 1) -> int:
    """Query rows a q_len > 1 work tile's ``tl.dot`` adds over the same tile at q_len 1 (both padded to 16, 32 or
    64 rows, :func:`~kvsplit.kernels.residency.padded_rows`): what the residency adds registers for. 0 at
    q_len 1, so q_len-1 plans count the tables' residency as they are."""
    return q_len_rows(heads_per_tile, ctx.group_size, ctx.q_len)[1]


def tile_heads(ctx: PlanContext, cfg: KernelConfig) -> int:
    """Work tiles per work item: ``H_kv / cfg.heads_per_tile`` (one tile per group of ``heads_per_tile`` KV
    heads). The partitions count a batch's tiles with it wherever docs/concepts/design.md §4 writes H_kv."""
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


def wave_tile_cost(ctx: PlanContext, cfg: KernelConfig, target_tiles: int) -> int:
    """Fixed cost per work tile, in tokens, that the wave-aware chunk charges: one ``block_n``
    block of a 16-bit cache when ``target_tiles`` is exactly one resident wave of ``cfg`` (:func:`resident_slots`),
    where a tile more waits for a slot; 0 otherwise (a target below the residency leaves slots free,
    and more tiles run side by side: measured 1.2-1.7x slower with the charge at ``ctas_per_sm`` 1;
    docs/decisions/flat-work-list.md).

    The fixed cost is a time (a tile's q load, output or partial write and merge share); in tokens it is that time
    times the token rate, which doubles when a token's K/V bytes halve: two ``block_n`` blocks for an FP8 cache
    (``2 * block_n / kv_bytes``; one block for 16-bit K/V, as before)."""
    if target_tiles != resident_slots(ctx, cfg):
        return 0
    return cfg.block_n * max(1, 2 // ctx.kv_bytes)


def fit_heads_per_tile(
    params: Mapping[str, Any], num_qo_heads: int, num_kv_heads: int, q_len: int = 1
) -> Mapping[str, Any]:
    """``params`` with ``heads_per_tile`` lowered to the largest of the kernel's choices (1, 2, 4, 8) that the launch
    takes (:func:`kvsplit.kernels.limits.heads_fit`: divides H_kv, ``h * H_q / H_kv <= TILE_QUERY_ROWS``, and
    ``h * G * q_len <= MAX_TILE_ROWS`` query rows), and ``whole_wave_heads`` to the largest count whose rows fit the
    same way; ``params`` itself when both fit.

    A policy table keys its buckets by H_kv, not H_q (docs/concepts/design.md §8), so a policy tuned at one GQA group
    (Qwen3-30B-A3B's 32/4, G = 8: two KV heads per tile) also serves models of a larger group (Qwen3-235B-A22B's
    64/4, G = 16), where the launch would refuse it (:func:`kvsplit.kernels.decode.check_heads_per_tile`):
    :class:`kvsplit.kernels.policy_table.PolicyTable` plans its policies through this. An explicit
    ``heads_per_tile`` given to :func:`make_plan` is not refitted (the launch names it instead).

    Parameters
    ----------
    params : Mapping
        A policy's parameters (validated by :func:`resolve` afterwards; a non-integer ``heads_per_tile`` is
        returned unchanged for it to name).
    num_qo_heads, num_kv_heads : int
        H_q and H_kv (H_q a multiple of H_kv).
    q_len : int
        Query tokens per request: a tile of ``h`` heads holds ``h * G * q_len`` rows, at most
        :data:`~kvsplit.kernels.limits.MAX_TILE_ROWS` (64; the kernel's limit), so e.g. G = 16 at q_len 8 takes one
        head per tile.
    """
    G = max(1, num_qo_heads // max(1, num_kv_heads))
    q = max(1, int(q_len))
    out = params
    for name in ("heads_per_tile", "whole_wave_heads"):
        h = params.get(name, 1)
        if isinstance(h, bool) or not isinstance(h, (int, np.integer)) or h <= 1:
            continue
        if name == "heads_per_tile":  # one of the kernel's choices that the launch takes (limits.heads_fit)
            fit = max(
                c
                for c in HEADS_PER_TILE_CHOICES
                if c == 1 or (c <= h and heads_fit(c, G * num_kv_heads, num_kv_heads, q))
            )
        else:  # a bound: the whole-wave rule skips the tiles whose heads do not divide H_kv itself (heads_fit with
            # every count a divisor: G * c rows of c heads, the rows and 16-row packing of the same rule)
            fit = max(c for c in range(1, int(h) + 1) if c == 1 or heads_fit(c, G * c, c, q))
        if fit != h:
            out = {**out, name: fit}
    return out


def whole_wave_tiles(
    ctx: PlanContext, heads: int = 1, tiles: tuple[tuple[int, int, int], ...] = WHOLE_WAVE_TILES
) -> list[KernelConfig]:
    """The tiles the whole-wave rule considers, in its order: ``(block_n, num_warps, num_stages)`` of
    ``tiles``, then the :data:`WHOLE_WAVE_HEADS_TILES` configs of at most ``heads`` KV heads that divide H_kv;
    those the kernel refuses for ``ctx``'s head_dim and dtype left out."""
    cands = [KernelConfig(bn, nw, ns) for bn, nw, ns in tiles]
    cands += [
        c for c in WHOLE_WAVE_HEADS_TILES if c.heads_per_tile <= heads and ctx.num_kv_heads % c.heads_per_tile == 0
    ]
    out = []
    for cfg in cands:
        try:
            check_config(cfg, ctx.head_dim, ctx.dtype, ctx.kv_dtype)
        except ValueError:
            continue
        if tile_refused(ctx, cfg.heads_per_tile) or shared_memory_refused(ctx, cfg):
            continue
        out.append(cfg)
    return out


# ----------------------------------------------------------------------------
# The resolved form
# ----------------------------------------------------------------------------

RULE_CONST, RULE_WAVE, RULE_FAIR, RULE_WAVE1, RULE_WAVE2 = 0, 1, 2, 3, 4
"""``RuleSpec.chunk_rule`` of the ``even_chunks`` partition: a constant split count (``chunk_arg``); the
wave-aware chunk for ``chunk_arg`` target tiles without / with one ``block_n`` block of fixed cost per tile
(:func:`wave_tile_cost`); the fair chunk over ``chunk_arg`` CTAs; the wave-aware chunk with two blocks of fixed
cost per tile (an FP8 cache: the same fixed time is twice the tokens)."""

PARTITIONS = ("even_chunks", "stream_k", "flashinfer", "fa3")


@dataclass(frozen=True, eq=False)
class RuleSpec:
    """A named policy with its parameters, resolved for one shape (immutable; made by :func:`resolve`).

    Attributes
    ----------
    policy, params
        The policy's name and its parameters as given (JSON-able): what a Plan records.
    config : KernelConfig
        The kernel knobs, completed from :func:`~kvsplit.kernels.limits.default_config`.
    num_kv_heads, head_dim, page_size, dtype, device
        The shape (validated).
    partition : str
        ``"even_chunks"``, ``"stream_k"``, ``"flashinfer"`` or ``"fa3"`` (module doc).
    chunk_rule, chunk_arg, min_chunk, max_splits
        ``even_chunks``: the chunk rule (:data:`RULE_CONST` ...) and its argument (a split count, target tiles
        or target CTAs), the smallest chunk in tokens and the most splits per request.
    heavy_first : bool
        Launch requests by kv_len descending (stable) instead of batch order.
    pack_tokens : int
        Group consecutive items shorter than this into one CTA (0: one item per CTA).
    ctas, item_cost_blocks, min_piece_blocks
        ``stream_k``: CTAs per group of ``config.heads_per_tile`` KV heads, the fixed cost of a request's piece
        and the shortest piece at a request's ends, in ``block_n`` blocks.
    tensor_cores, max_grid
        ``flashinfer``: the tensor-core path, and its grid bound (``2 * num_SMs``, or resident CTAs per SM times
        num_SMs for the CUDA-core path).
    static_splits
        ``fa3``: the static cap of splits per request (0: FA3's heuristic for each batch's longest request).
    whole_wave : float
        The whole-wave rule's allowed excess (0: off); ``whole_wave_specs`` the specs of one work item per
        request on each tile it considers, ``whole_wave_slots`` their resident slots and
        ``whole_wave_tile_heads`` their work tiles per request (int64 arrays).
    kv_dtype, q_len, group_size
        The KV cache dtype (None: ``dtype``), query tokens per request and the GQA group (0: not given), as
        :class:`PlanContext`; the work list does not depend on them beyond the rule arguments above.
    """

    policy: str
    params: dict
    config: KernelConfig
    num_kv_heads: int
    head_dim: int
    page_size: int
    dtype: str
    device: DeviceSpec
    partition: str = "even_chunks"
    chunk_rule: int = RULE_CONST
    chunk_arg: int = 1
    min_chunk: int = 1
    max_splits: int = 1 << 62
    heavy_first: bool = False
    pack_tokens: int = 0
    ctas: int = 1
    item_cost_blocks: int = 0
    min_piece_blocks: int = 1
    tensor_cores: bool = True
    max_grid: int = 0
    static_splits: int = 0
    whole_wave: float = 0.0
    whole_wave_specs: tuple = ()
    whole_wave_slots: Any = None
    whole_wave_tile_heads: Any = None
    kv_dtype: str | None = None
    q_len: int = 1
    group_size: int = 0
    fields: dict = field(init=False, repr=False)
    """The Plan's fields that do not depend on the batch (config, policy and what the plan is made for)."""

    def __post_init__(self) -> None:
        object.__setattr__(
            self,
            "fields",
            {
                "config": self.config,
                "policy": self.policy,
                "num_kv_heads": self.num_kv_heads,
                "head_dim": self.head_dim,
                "page_size": self.page_size,
                "dtype": self.dtype,
                "gpu": self.device.name,
                "kv_dtype": self.kv_dtype,
                "q_len": self.q_len,
            },
        )

    @property
    def tile_heads(self) -> int:
        """Work tiles per work item, ``H_kv / config.heads_per_tile``: what the partitions count."""
        return self.num_kv_heads // self.config.heads_per_tile

    @property
    def gpu(self) -> str:
        """The name of the GPU the spec plans for (``device.name``), as a Plan's ``gpu`` holds it."""
        return self.device.name

    @property
    def context(self) -> PlanContext:
        """What the spec plans for besides the lengths: device, H_kv, head_dim, page size, dtype, KV dtype,
        q_len and the GQA group."""
        return PlanContext(
            self.device,
            self.num_kv_heads,
            self.head_dim,
            self.page_size,
            self.dtype,
            self.kv_dtype,
            self.q_len,
            self.group_size,
        )

    def whole_request(self, cfg: KernelConfig) -> RuleSpec:
        """This spec planning one work item per request (batch order, no packing) on ``cfg``: what the policy
        plans when the whole-wave rule takes a batch (same policy name and params)."""
        return dataclasses.replace(
            self,
            config=cfg,
            partition="even_chunks",
            chunk_rule=RULE_CONST,
            chunk_arg=1,
            min_chunk=1,
            max_splits=1 << 62,
            heavy_first=False,
            pack_tokens=0,
            ctas=1,
            item_cost_blocks=0,
            min_piece_blocks=1,
            whole_wave=0.0,
            whole_wave_specs=(),
            whole_wave_slots=None,
            whole_wave_tile_heads=None,
        )


# ----------------------------------------------------------------------------
# Parsing (the one place params are checked)
# ----------------------------------------------------------------------------


def _flag(params: Mapping[str, Any], name: str) -> bool:
    v = params.get(name, False)
    if isinstance(v, np.bool_):
        v = bool(v)
    if not isinstance(v, bool):
        raise ValueError(f"params.{name}: expected true or false, got {v!r}")
    return v


def _num(name: str, v: Any, lo: float, hi: float) -> float:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise ValueError(f"params.{name}: expected a number in [{lo}, {hi}], got {v!r}")
    f = float(v)
    if not (lo <= f <= hi):  # also rejects NaN
        raise ValueError(f"params.{name}: expected a number in [{lo}, {hi}], got {v!r}")
    return f


def _ctas_per_sm(params: Mapping[str, Any], default: float) -> float:
    target = params.get("ctas_per_sm", default)
    if isinstance(target, bool) or not isinstance(target, (int, float, np.number)) or not (0.25 <= float(target) <= 64):
        raise ValueError(f"params.ctas_per_sm: expected a number in [0.25, 64], got {target!r}")
    return float(target)


def _knobs(
    params: Mapping[str, Any],
    ctx: PlanContext,
    default_order: str,
    default_schedule: str | None = None,
    default_programs: int | None = None,
) -> tuple[KernelConfig, str, int]:
    base = default_config(ctx.head_dim, ctx.dtype, query_rows=tile_rows(ctx) if ctx.q_len > 1 else 0)
    block_n = params.get("block_n", base.block_n)
    num_warps = params.get("num_warps", base.num_warps)
    num_stages = params.get("num_stages", base.num_stages)
    schedule = params.get("schedule", default_schedule or base.schedule)
    for name, v in (("block_n", block_n), ("num_warps", num_warps), ("num_stages", num_stages)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise ValueError(f"params.{name}: expected an integer, got {v!r}")
    if schedule not in SCHEDULES:
        raise ValueError(f"params.schedule: expected one of {SCHEDULES}, got {schedule!r}")
    if schedule == "persistent":
        default_np = default_programs if default_programs is not None else 4 * ctx.device.num_sms
        num_programs = check_int("params.num_programs", params.get("num_programs", default_np), 1, MAX_NUM_PROGRAMS)
    else:
        if "num_programs" in params and params["num_programs"] not in (0, None):
            raise ValueError("params.num_programs: only meaningful with schedule='persistent'")
        num_programs = 0
    order = params.get("order", default_order)
    if order not in ORDERS:
        raise ValueError(f"params.order: expected one of {ORDERS}, got {order!r}")
    pack = check_int("params.pack_tokens", params.get("pack_tokens", 0), 0, MAX_PACK_TOKENS)
    prefetch, next_item = _flag(params, "prefetch"), _flag(params, "next_item")
    heads = params.get("heads_per_tile", 1)
    if isinstance(heads, bool) or not isinstance(heads, (int, np.integer)):
        raise ValueError(f"params.heads_per_tile: expected an integer, got {heads!r}")
    cfg = KernelConfig(
        int(block_n), int(num_warps), int(num_stages), str(schedule), int(num_programs), prefetch, int(heads), next_item
    )
    check_config(cfg, ctx.head_dim, ctx.dtype, ctx.kv_dtype)
    if ctx.num_kv_heads % cfg.heads_per_tile:
        raise ValueError(
            f"params.heads_per_tile: expected a divisor of num_kv_heads={ctx.num_kv_heads}, got {cfg.heads_per_tile}"
        )
    why = tile_refused(ctx, cfg.heads_per_tile)
    if why:
        raise ValueError(f"params.heads_per_tile: {why}")
    why = shared_memory_refused(ctx, cfg)
    if why:
        raise ValueError(why)
    return cfg, order, pack


def _stream_k_params(params: Mapping[str, Any], space: Mapping[str, Any] | None = None) -> tuple[float, int, int]:
    """``(ctas_per_sm, item_cost_blocks, min_piece_blocks)`` checked against the ``stream_k`` policy's ranges,
    or against ``space`` (:data:`TUNED_PARAM_SPACE`, whose documented ranges ``tuned`` enforces)."""
    o_lo, o_hi = (space["item_cost_blocks"]["low"], space["item_cost_blocks"]["high"]) if space else (0, 1024)
    m_lo, m_hi = (space["min_piece_blocks"]["low"], space["min_piece_blocks"]["high"]) if space else (1, 1 << 20)
    target = _ctas_per_sm(params, STREAM_K_DEFAULTS["ctas_per_sm"])
    o = check_int(
        "params.item_cost_blocks", params.get("item_cost_blocks", STREAM_K_DEFAULTS["item_cost_blocks"]), o_lo, o_hi
    )
    mp = check_int(
        "params.min_piece_blocks", params.get("min_piece_blocks", STREAM_K_DEFAULTS["min_piece_blocks"]), m_lo, m_hi
    )
    return target, o, mp


def _whole_wave(params: Mapping[str, Any]) -> tuple[float, int]:
    """``(whole_wave, whole_wave_heads)`` checked: a number in [0, 1] (default 0: off) and an integer in
    [1, 16] (default 1)."""
    h = params.get("whole_wave_heads", 1)
    if isinstance(h, (bool, np.bool_)) or not isinstance(h, (int, np.integer)) or not 1 <= h <= TILE_QUERY_ROWS:
        raise ValueError(f"params.whole_wave_heads: expected an integer in [1, {TILE_QUERY_ROWS}], got {h!r}")
    if "whole_wave" not in params:
        return 0.0, int(h)
    return _num("whole_wave", params["whole_wave"], 0.0, 1.0), int(h)


def _wave_rule(ctx: PlanContext, cfg: KernelConfig, target: float) -> tuple[int, int]:
    tt = wave_target(ctx, cfg, target)
    cost = wave_tile_cost(ctx, cfg, tt)
    return ({0: RULE_WAVE, cfg.block_n: RULE_WAVE1, 2 * cfg.block_n: RULE_WAVE2}[cost]), tt


def _sk_ctas(ctx: PlanContext, cfg: KernelConfig, target: float) -> int:
    return max(1, int(math.floor(target * ctx.device.num_sms)) // tile_heads(ctx, cfg))


def _parse(policy: str, params: dict, ctx: PlanContext) -> dict[str, Any]:
    """The RuleSpec fields of ``policy`` with ``params`` for ``ctx`` (policy and params checked here)."""
    S = ctx.device.num_sms
    ww = None
    if policy == "no_split":
        cfg, order, pack = _knobs(params, ctx, "natural")
        rule = {}
    elif policy == "fixed":
        if "num_splits" not in params:
            raise ValueError("params.num_splits: required by policy 'fixed'")
        n = check_int("params.num_splits", params["num_splits"], 1, 65536)
        cfg, order, pack = _knobs(params, ctx, "natural")
        rule = {"chunk_arg": n}
    elif policy == "balanced":
        target = _ctas_per_sm(params, 4.0)
        cfg, order, pack = _knobs(params, ctx, "natural")
        ww = _whole_wave(params)
        r, tt = _wave_rule(ctx, cfg, target)
        rule = {"chunk_rule": r, "chunk_arg": tt}
    elif policy == "stream_k":
        if params.get("pack_tokens", 0):
            raise ValueError("params.pack_tokens: not used by policy 'stream_k' (its CTAs already walk runs of items)")
        target, o, mp = _stream_k_params(params)
        cfg, order, pack = _knobs(params, ctx, "natural")
        ww = _whole_wave(params)
        rule = {
            "partition": "stream_k",
            "ctas": _sk_ctas(ctx, cfg, target),
            "item_cost_blocks": o,
            "min_piece_blocks": mp,
        }
    elif policy == "tuned":
        sp = TUNED_PARAM_SPACE
        target = _num(
            "ctas_per_sm",
            params.get("ctas_per_sm", sp["ctas_per_sm"]["default"]),
            sp["ctas_per_sm"]["low"],
            sp["ctas_per_sm"]["high"],
        )
        min_chunk = _tuned_int(params, "min_chunk_tokens")
        max_splits = _tuned_int(params, "max_splits")
        pps = _tuned_int(params, "programs_per_sm")
        if "programs_per_sm" in params and params.get("schedule", "grid") != "persistent":
            raise ValueError("params.programs_per_sm: only meaningful with schedule='persistent'")
        partition = params.get("partition", sp["partition"]["default"])
        if partition not in sp["partition"]["choices"]:
            raise ValueError(f"params.partition: expected one of {sp['partition']['choices']}, got {partition!r}")
        wave_aware = params.get("wave_aware", sp["wave_aware"]["default"])
        if not isinstance(wave_aware, (bool, np.bool_)):
            raise ValueError(f"params.wave_aware: expected a boolean, got {wave_aware!r}")
        cfg, order, pack = _knobs(params, ctx, sp["order"]["default"], default_programs=pps * S)
        if partition == "stream_k":
            for name in ("min_chunk_tokens", "max_splits", "pack_tokens"):
                if params.get(name):
                    raise ValueError(f"params.{name}: not used with partition='stream_k'")
            _, o, mp = _stream_k_params(params, TUNED_PARAM_SPACE)
            rule = {
                "partition": "stream_k",
                "ctas": _sk_ctas(ctx, cfg, target),
                "item_cost_blocks": o,
                "min_piece_blocks": mp,
            }
        else:
            for name in ("item_cost_blocks", "min_piece_blocks"):
                if name in params:
                    raise ValueError(f"params.{name}: only used with partition='stream_k'")
            if wave_aware:
                r, arg = _wave_rule(ctx, cfg, target)
            else:
                r, arg = RULE_FAIR, max(1, int(math.ceil(target * S)))
            rule = {"chunk_rule": r, "chunk_arg": arg, "min_chunk": min_chunk, "max_splits": max_splits}
        ww = _whole_wave(params)
    elif policy == "flashinfer":
        tc = params.get("tensor_cores", True)
        if not isinstance(tc, (bool, np.bool_)):
            raise ValueError(f"params.tensor_cores: expected a boolean, got {tc!r}")
        group_size = check_int("params.group_size", params.get("group_size", 8), 1, 128)
        cfg, order, pack = _knobs(params, ctx, "natural")
        if tc:
            if "resident_ctas_per_sm" in params:
                raise ValueError("params.resident_ctas_per_sm: only used with tensor_cores=False")
            grid = 2 * S
        elif "resident_ctas_per_sm" in params:
            grid = check_int("params.resident_ctas_per_sm", params["resident_ctas_per_sm"], 1, 64) * S
        else:
            grid = flashinfer_decode_occupancy(ctx.head_dim, ctx.dtype, group_size, ctx.device) * S
        rule = {"partition": "flashinfer", "tensor_cores": bool(tc), "max_grid": grid}
    elif policy == "fa3":
        cfg, order, pack = _knobs(params, ctx, "heavy_first", default_schedule="persistent", default_programs=S)
        static = 0
        if "num_splits_static" in params:
            static = check_int("params.num_splits_static", params["num_splits_static"], 1, 255)
        rule = {"partition": "fa3", "static_splits": static}
    else:  # pragma: no cover - resolve checks the name
        raise AssertionError(policy)
    out = dict(config=cfg, heavy_first=order == "heavy_first", pack_tokens=int(pack), **rule)
    if ww is not None and ww[0] > 0:
        out["whole_wave"], out["_ww_heads"] = ww
    return out


_SPECS: dict[tuple, RuleSpec] = {}
_MEMO_MAX = 512


def _params_key(params: Mapping[str, Any] | None) -> tuple | None:
    if not params:
        return ()
    try:
        key = tuple((k, type(v), v) for k, v in sorted(params.items()))
        hash(key)
    except TypeError:
        return None
    return key


def _tuned_int(params: Mapping[str, Any], name: str) -> int:
    """The integer parameter ``name`` of a ``tuned`` policy (its :data:`TUNED_PARAM_SPACE` default when absent),
    checked against its range; raises ValueError naming ``params.<name>``."""
    space = TUNED_PARAM_SPACE[name]
    return check_int(f"params.{name}", params.get(name, space["default"]), space["low"], space["high"])


def resolve(
    policy: str = "balanced",
    params: Mapping[str, Any] | None = None,
    *,
    num_kv_heads: int,
    device: DeviceSpec | str,
    head_dim: int = 128,
    page_size: int = 16,
    dtype: str = "bfloat16",
    kv_dtype: str | None = None,
    q_len: int = 1,
    num_qo_heads: int | None = None,
) -> RuleSpec:
    """Resolve a named policy and its parameters for one shape (the arguments of
    :func:`kvsplit.kernels.plan.make_plan` other than the lengths).

    Parameters
    ----------
    policy : str
        One of :data:`POLICIES`.
    params : dict, optional
        The policy's parameters plus the kernel knobs of :data:`KNOB_PARAMS`; knobs not given come from
        :func:`~kvsplit.kernels.limits.default_config`.
    num_kv_heads, device, head_dim, page_size, dtype, kv_dtype, q_len, num_qo_heads
        As :func:`~kvsplit.kernels.plan.make_plan`.

    Returns
    -------
    RuleSpec
        The same object for equal arguments (memoized by value; nothing about a batch is kept).

    Raises
    ------
    ValueError
        On an unknown policy (``policy``), an unknown or invalid parameter (``params.<name>``) or an invalid
        shape argument, naming it.
    """
    pk = _params_key(params)
    key = None
    if pk is not None and type(num_kv_heads) is int and type(head_dim) is int and type(page_size) is int:
        key = (
            policy,
            pk,
            num_kv_heads,
            head_dim,
            page_size,
            dtype,
            device if type(device) is str else id(device),
            kv_dtype,
            q_len,
            num_qo_heads,
        )
        hit = _SPECS.get(key)
        if hit is not None and (type(device) is str or hit.device is device):
            return hit
    num_kv_heads, head_dim, page_size, dev = check_shape(num_kv_heads, head_dim, page_size, dtype, device)
    if not isinstance(policy, str) or policy not in POLICIES:
        raise ValueError(f"policy: unknown policy {policy!r}; known: {sorted(POLICIES)}")
    params = dict(params or {})
    allowed = POLICIES[policy]
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise ValueError(f"params: unknown parameters {unknown} for policy {policy!r}; allowed: {list(allowed)}")
    kd = check_kv_dtype(kv_dtype, dtype)
    group = 0
    if num_qo_heads is not None:
        hq = check_int("num_qo_heads", num_qo_heads, 1)
        if hq % num_kv_heads:
            raise ValueError(f"num_qo_heads: expected a multiple of num_kv_heads ({num_kv_heads}), got {hq}")
        group = hq // num_kv_heads
    ql = check_q_len(q_len, group or None)
    ctx = PlanContext(dev, num_kv_heads, head_dim, page_size, dtype, None if kd == dtype else kd, ql, group)
    fields = _parse(policy, params, ctx)
    ww_heads = fields.pop("_ww_heads", 1)
    spec = RuleSpec(
        policy=policy,
        params=jsonable(params),
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        page_size=page_size,
        dtype=dtype,
        device=dev,
        kv_dtype=ctx.kv_dtype,
        q_len=ql,
        group_size=group,
        **fields,
    )
    if spec.whole_wave > 0:
        tiles = whole_wave_tiles(ctx, ww_heads)
        spec = dataclasses.replace(
            spec,
            whole_wave_specs=tuple(spec.whole_request(c) for c in tiles),
            whole_wave_slots=np.array([resident_slots(ctx, c) for c in tiles], np.int64),
            whole_wave_tile_heads=np.array([tile_heads(ctx, c) for c in tiles], np.int64),
        )
    if key is not None:
        if len(_SPECS) >= _MEMO_MAX:
            _SPECS.clear()
        _SPECS[key] = spec
    return spec
