"""Split-KV plans for GQA decode attention, made on the host without torch.

A :class:`Plan` says, for one decode batch, how many contiguous KV chunks
(``num_splits``) each request is cut into, the flat work list of those chunks in
launch order, how work items are grouped into CTAs (``cta_indptr``) and the
kernel knobs (:class:`KernelConfig`). :func:`make_plan` builds one from a batch's
``kv_lens`` and a named policy. No torch import: servers plan in-process.

Terms: a *work item* is one contiguous KV range ``[kv_start, kv_end)`` of one
request; a *work tile* is (CTA, kv_head); a CTA processes the work items
``cta_indptr[c]:cta_indptr[c+1]`` one after the other for one KV head.

This module is the public entry point (docs/concepts/design.md §3); the code lives in
:mod:`.limits` (limits, KernelConfig, argument checks), :mod:`.workplan` (Plan),
:mod:`.rulespec` (the policies and their parameters, :func:`resolve` to a :class:`RuleSpec`,
TUNED_PARAM_SPACE), :mod:`.fastplan` (every rule in loop form, compiled by numba or plain Python),
:mod:`.policies` (make_plan) and :mod:`.peer_policies` (FlashInfer's and FA3's constants and occupancy).
"""

from __future__ import annotations

from .fastplan import fa3_static_num_splits  # noqa: F401
from .limits import (  # noqa: F401
    BLOCK_N_CHOICES,
    DTYPES,
    HEAD_DIMS,
    MAX_BATCH,
    MAX_KV_LEN,
    MAX_NUM_PROGRAMS,
    MAX_PACK_TOKENS,
    MAX_PAGE_SIZE,
    MAX_WORK_ITEMS,
    NUM_STAGES_CHOICES,
    NUM_WARPS_CHOICES,
    ORDERS,
    SCHEDULES,
    KernelConfig,
    cdiv,
    check_batch_shape,
    check_config,
    check_int,
    check_kv_lens,
    default_config,
)
from .peer_policies import FA3_BLOCK_N, FLASHINFER_REGS_PER_THREAD, flashinfer_decode_occupancy  # noqa: F401
from .policies import make_plan  # noqa: F401
from .rulespec import (  # noqa: F401
    KNOB_PARAMS,
    POLICIES,
    TUNED_PARAM_SPACE,
    PlanContext,
    RuleSpec,
    policy_params,
    resolve,
)
from .workplan import Plan, check_plan_invariants  # noqa: F401

__all__ = [
    "KernelConfig",
    "Plan",
    "PlanContext",
    "RuleSpec",
    "resolve",
    "make_plan",
    "default_config",
    "POLICIES",
    "TUNED_PARAM_SPACE",
    "policy_params",
    "flashinfer_decode_occupancy",
    "fa3_static_num_splits",
    "KNOB_PARAMS",
    "MAX_BATCH",
    "MAX_KV_LEN",
    "BLOCK_N_CHOICES",
    "NUM_WARPS_CHOICES",
    "NUM_STAGES_CHOICES",
    "SCHEDULES",
    "ORDERS",
    "DTYPES",
    "HEAD_DIMS",
]
