"""The search space of the ``tuned`` policy and the baselines' equivalents in it.

:func:`suggest_params` asks an Optuna trial for the parameters of
:data:`kvsplit.kernels.plan.TUNED_PARAM_SPACE` marked ``search`` (with their
conditions); :func:`baseline_equivalents` gives the tuned-family parameters
that reproduce each baseline on a task, enqueued as the first trials;
:func:`fallback_equivalent` the plan a family gets with no bucket near, where it is not ``balanced`` (an FP8
cache); :func:`warm_start_equivalents` the plans the shipped H200 table serves most,
enqueued next when the study has room for them (:data:`WARM_START_MIN_TRIALS`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..kernels.device import resolve_device
from ..kernels.plan import TUNED_PARAM_SPACE, default_config, fa3_static_num_splits
from ..kernels.rulespec import condition_holds
from .pool import candidate_name, parse_candidate, tuned_equivalent
from .tasks import TuneTask


def _searched() -> list[tuple[str, dict[str, Any]]]:
    return [(k, v) for k, v in TUNED_PARAM_SPACE.items() if v.get("search")]


def suggest_params(trial: Any) -> dict[str, Any]:
    """Suggest one ``tuned`` parameter set from :data:`TUNED_PARAM_SPACE`.

    Float and int entries use ``low``/``high``/``log``; categorical ones their
    ``choices``; an entry with a ``condition`` is suggested only when the
    parameters it names have those values (:func:`kvsplit.kernels.policies.condition_holds`).
    The choices are the same for every task, as Optuna requires of a study (a bucket key holds H_kv, not
    H_q, so tasks of several GQA groups can share a study): a ``heads_per_tile`` above what the task's GQA
    group runs is lowered when the trial is planned (:func:`kvsplit.tuner.worker.task_params`).
    Returns ``make_plan`` params.
    """
    params: dict[str, Any] = {}
    for name, spec in _searched():
        if not condition_holds(spec.get("condition"), params):
            continue
        kind = spec["kind"]
        if kind == "float":
            params[name] = trial.suggest_float(name, float(spec["low"]), float(spec["high"]), log=bool(spec.get("log")))
        elif kind == "int":
            params[name] = trial.suggest_int(name, int(spec["low"]), int(spec["high"]), log=bool(spec.get("log")))
        elif kind == "categorical":
            params[name] = trial.suggest_categorical(name, list(spec["choices"]))
        else:  # pragma: no cover - guarded by the policies' own tests
            raise ValueError(f"TUNED_PARAM_SPACE[{name!r}]: unknown kind {kind!r}")
    return params


def complete_defaults(task: TuneTask, params: Mapping[str, Any]) -> dict[str, Any]:
    """Fill every searched parameter (respecting conditions) from the space's defaults."""
    cfg = default_config(
        task.head_dim, task.dtype, query_rows=task.shape.group_size * task.q_len if task.q_len > 1 else 0
    )
    knob_default = {"block_n": cfg.block_n, "num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    out: dict[str, Any] = {}
    for name, spec in _searched():
        if not condition_holds(spec.get("condition"), {**out, **params}):
            continue
        if name in params:
            out[name] = params[name]
        elif spec.get("default") is not None:
            out[name] = spec["default"]
        else:
            out[name] = knob_default[name]
    return out


def baseline_equivalents(task: TuneTask) -> dict[str, dict[str, Any]]:
    """The baselines restated as ``tuned`` parameter sets (the study's first trials).

    - ``balanced``: the space's defaults (``tuned`` with defaults plans as ``balanced``);
    - ``no_split``: ``max_splits = 1``;
    - ``fa3``: about one tile per SM (``ctas_per_sm = 1 / 1.1``, FA3's
      ``blocks_per_sm`` rule), chunk at least 128 tokens (kBlockN), split cap
      FA3's static heuristic for the bucket's longest request, heaviest first,
      persistent with one program per SM;
    - ``flashinfer``: the tensor-core path aims at 2 CTAs per SM with chunks of
      at least 128 tokens, and does not split once ``B * H_kv >= 2 * num_SMs``
      (``max_splits = 1`` then).

    Every set is complete over the searched parameters, so TPE sees them as
    ordinary points.
    """
    dev = resolve_device(task.gpu)
    S = dev.num_sms
    B = max(len(b) for b in task.train)
    longest = max(max(b) for b in task.train)
    fa3_cap = fa3_static_num_splits(task.num_kv_heads, max(1, -(-longest // 128)), S)
    space_hi = TUNED_PARAM_SPACE["max_splits"]["high"]
    out = {
        "balanced": complete_defaults(task, {}),
        "no_split": complete_defaults(task, {"max_splits": 1}),
        "fa3": complete_defaults(
            task,
            {
                "ctas_per_sm": 1 / 1.1,
                "min_chunk_tokens": 128,
                "max_splits": int(min(max(fa3_cap, 1), space_hi)),
                "order": "heavy_first",
                "schedule": "persistent",
                "programs_per_sm": 1,
            },
        ),
        "flashinfer": complete_defaults(
            task, {"max_splits": 1} if B * task.num_kv_heads >= 2 * S else {"ctas_per_sm": 2.0, "min_chunk_tokens": 128}
        ),
    }
    return out


WARM_START = {
    name: parse_candidate(name)
    for name in (
        # the shipped H200 table's default plan, and the plans it serves or that win the reference cases most often
        # (candidates of kvsplit.tuner.pool.SERVED_POOL)
        "stream_k|c3|n128w4s2",
        "stream_k|c3|n32w4s3|pf|h2",
        "balanced|c3|n32w4s3|pf|h2",
        "stream_k|c1|n64w8s3|pf|h2|nx",
        "stream_k|c2|n32w4s4|pf|h2",
        "balanced|c4|n64w4s2",
    )
}
"""Plans of the H200 table that :func:`warm_start_equivalents` restates in the tuned family: a 30-trial GPU
study of skewed80 B = 64, T = 1,048,576 without them kept ``balanced`` (1.160x the floor on its held-out batches)
and reached 1.064x with them (docs/decisions/tuner-search-space.md)."""

WARM_START_MIN_TRIALS = 20
"""A study enqueues :data:`WARM_START` only when it runs at least this many trials, so the sampler keeps at least
half of a budget to search."""


def own_fallback(kv_dtype: str | None = None, q_len: int = 1) -> tuple[str, dict[str, Any]] | None:
    """``(policy name, params)`` of the plan a table serves a family where no bucket is near
    (:func:`kvsplit.kernels.policy_table.default_fallback`) when it is not ``balanced`` with its default params (an
    FP8 cache at q_len 1: :data:`~kvsplit.kernels.policy_table.FP8_FALLBACK`), else None. ``kv_dtype``: the
    canonical KV dtype name (None or a 16-bit name: q's dtype); ``q_len``: 1-8. What a study starts from
    (:func:`fallback_equivalent`) and what verification times beside the baselines
    (:func:`kvsplit.tuner.verify.baselines_for`)."""
    from ..kernels.policy_table import FALLBACK_POLICY, default_fallback

    name, params = default_fallback(kv_dtype, q_len)
    return None if (name, params) == (FALLBACK_POLICY, {}) else (name, params)


def fallback_equivalent(task: TuneTask) -> dict[str, dict[str, Any]]:
    """``{"fallback": params}``: the task's family's :func:`own_fallback` restated as a ``tuned`` parameter set;
    empty where the family falls back to the ``balanced`` baseline already enqueued. A study starts from what the
    family is served without it, whatever its trial budget."""
    own = own_fallback(task.kv_dtype, task.q_len)
    if own is None:
        return {}
    return {"fallback": complete_defaults(task, tuned_equivalent(candidate_name(*own)))}


def warm_start_equivalents(task: TuneTask) -> dict[str, dict[str, Any]]:
    """:data:`WARM_START` restated as ``tuned`` parameter sets, complete over the searched parameters.

    ``stream_k`` is ``partition="stream_k"`` with its defaults (``item_cost_blocks`` 1, ``min_piece_blocks`` 1);
    ``balanced`` the tuned family's defaults (wave-aware even chunks) at its ``ctas_per_sm``. ``heads_per_tile``
    is refitted to the task's GQA group when its trial is planned (:func:`kvsplit.tuner.worker.task_params`).
    A set the task's shape cannot run (e.g. the shared memory of a tile at head_dim 256) is pruned like any
    infeasible trial.
    """
    return {name: complete_defaults(task, tuned_equivalent(name)) for name in WARM_START}
