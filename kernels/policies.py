"""kvsplit's own split policies (``no_split``, ``fixed``, ``balanced``, ``tuned``),
the tuned family's search space as data (:data:`TUNED_PARAM_SPACE`) and
:func:`make_plan`. Importing this module registers the peer rules too
(:mod:`.peer_policies`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from .device import DeviceSpec
from .limits import MAX_WORK_ITEMS, BLOCK_N_CHOICES, NUM_WARPS_CHOICES, NUM_STAGES_CHOICES, ORDERS, SCHEDULES, \
    MAX_NUM_PROGRAMS, _pos_int, cdiv, check_batch_shape
from .registry import _POLICY_PARAMS, POLICIES, PlanContext, _knobs, _num, _register
from .workplan import Plan, _jsonable, build_work_list, pack_ctas
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
    (``num_kv_splits``; ../shared/research/policies.md §4a, §5a).
    """
    if "num_splits" not in params:
        raise ValueError("params.num_splits: required by policy 'fixed'")
    n = _pos_int("params.num_splits", params["num_splits"], 1, 65536)
    cfg, order, pack = _knobs(params, ctx, "natural")
    return np.full(L.shape, n, dtype=np.int64), cfg, order, pack


@_register("balanced", ("ctas_per_sm",))
def _policy_balanced(L: np.ndarray, ctx: PlanContext, params: Mapping[str, Any]):
    """Even chunks aimed at ``ctas_per_sm`` work tiles per SM (default 4).

    ``chunk = roundup(max(block_n, ceil(H_kv * sum(kv_len) / (ctas_per_sm * num_SMs))), block_n)``,
    ``num_splits[b] = max(1, ceil(kv_len[b] / chunk))``. Aiming at 4 CTAs per SM
    was the best untuned rule on a Triton decode kernel
    (../shared/data/anchors/policy_on_triton_kernel.md; DESIGN.md §7).
    """
    target = params.get("ctas_per_sm", 4.0)
    if isinstance(target, bool) or not isinstance(target, (int, float, np.number)) or not (0.25 <= float(target) <= 64):
        raise ValueError(f"params.ctas_per_sm: expected a number in [0.25, 64], got {target!r}")
    cfg, order, pack = _knobs(params, ctx, "natural")
    total = int(L.sum()) * ctx.num_kv_heads
    fair = cdiv(total, max(1, int(math.ceil(float(target) * ctx.device.num_sms))))
    chunk = cdiv(max(fair, cfg.block_n), cfg.block_n) * cfg.block_n
    return np.maximum(-(-L // chunk), 1), cfg, order, pack



# ---------------------------------------------------------------------------
# The tuned family (DESIGN.md §4)
# ---------------------------------------------------------------------------

TUNED_PARAM_SPACE: dict[str, dict[str, Any]] = {
    "ctas_per_sm": {
        "kind": "float", "low": 0.25, "high": 64.0, "log": True, "default": 4.0, "search": True,
        "doc": "target work tiles per SM: chunk = ceil(H_kv * sum(kv_len) / (ctas_per_sm * num_SMs))",
    },
    "min_chunk_tokens": {
        "kind": "int", "low": 16, "high": 65536, "log": True, "default": 16, "search": True,
        "doc": "smallest chunk in tokens (before rounding up to block_n)",
    },
    "max_splits": {
        "kind": "int", "low": 1, "high": 1024, "log": True, "default": 1024, "search": True,
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
        "doc": "group consecutive items shorter than this into one CTA (cta_indptr); 0 = one item per CTA. "
               "Any integer in [0, 2^20] is accepted; the choices are the search grid",
    },
}
"""Parameters of the ``tuned`` policy with their ranges, as data.

Each entry: ``kind`` (``"float"``, ``"int"`` or ``"categorical"``), ``low``/``high``/``log``
or ``choices``, ``default`` (``None``: from :func:`default_config`), ``search`` (whether
a tuner should search it), optional ``condition`` (only meaningful when the named
parameters have these values) and ``doc``. :func:`make_plan` accepts every value in
these ranges (and raises ``ValueError`` naming the parameter outside them); with all
defaults ``tuned`` gives the same plan as ``balanced``.
"""

_TUNED_RULE_PARAMS = ("ctas_per_sm", "min_chunk_tokens", "max_splits", "programs_per_sm")



@_register("tuned", _TUNED_RULE_PARAMS)
def _policy_tuned(L: np.ndarray, ctx: PlanContext, params: Mapping[str, Any]):
    """The parametric family of DESIGN.md §4, whose parameters are tuned per bucket.

    ``chunk = roundup(max(min_chunk_tokens, ceil(H_kv * sum(kv_len) / (ctas_per_sm
    * num_SMs))), block_n)``; ``num_splits[b] = clamp(cdiv(kv_len[b], chunk), 1,
    max_splits)``; plus the knobs ``block_n``, ``num_warps``, ``num_stages``,
    ``order``, ``schedule``, ``programs_per_sm`` / ``num_programs`` and
    ``pack_tokens`` (DESIGN.md §7). Ranges and defaults: :data:`TUNED_PARAM_SPACE`.
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
    S = ctx.device.num_sms
    cfg, order, pack = _knobs(params, ctx, sp["order"]["default"], default_programs=pps * S)
    total = int(L.sum()) * ctx.num_kv_heads
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
    num_splits, cfg, order, pack = POLICIES[policy](L, ctx, params)
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
    # invariants by construction (tests/test_plan_policies.py checks them for
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


