"""Verification of a tuned parameter set against the baselines, before publishing.

On the bucket's held-out batches (never its training batches), the tuned plan
and every baseline of the bucket's family (:func:`baselines_for`: :data:`BASELINES`, ``balanced``, ``fa3``,
``flashinfer``, ``no_split``, each with its default params, and :data:`FALLBACK_BASELINE`, the family's own
fallback, where that is not ``balanced``) are timed side by side in one run:
batch by batch, every policy's plan in turn, on the same backend. Identical
plans (e.g. ``tuned`` with default params and ``balanced``) are timed once and
share the time, so timing noise cannot separate two copies of one plan. Every
measurement is stored (time, HBM floor, their ratio, params, batch, backend,
device, software versions).

The summary compares geometric means of time / HBM floor: the tuned policy
passes when its geomean is no larger than the best baseline's (times
``1 + tolerance``; tolerance 0 by default). On the simulator it must also win
by more than the simulator's own error: ``tuned · (1 + margin) <= best``, with
``margin`` the held-out median relative error of the GPU's newest stored
calibration (``kvsplit calibrate``; 3.0 % for the shipped H200 one), or
:data:`SIM_DEFAULT_MARGIN` when the store has no calibration of that GPU. A
simulated 0.2 % gain is noise next to a 4 % model error; publishing it would
replace the fallback on the strength of nothing. GPU results keep margin 0. A draft policy is then created with
the summary and, if it passed, published under the store's rules (a worse
policy never replaces a better published one; a simulated one never replaces a
GPU-measured one; see :func:`kvsplit.db.store.publish`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..db import store
from ..kernels.plan import make_plan
from .space import own_fallback

__all__ = [
    "BASELINES",
    "FALLBACK_BASELINE",
    "SIM_DEFAULT_MARGIN",
    "baselines_for",
    "geomean",
    "VerifyOutcome",
    "measure_heldout",
    "sim_margin",
    "summarize",
    "verify_and_store",
]

BASELINES: tuple[str, ...] = ("balanced", "fa3", "flashinfer", "no_split")
FALLBACK_BASELINE = "fallback"
"""The label of a family's own fallback plan among its baselines, where that fallback is not ``balanced``
(:func:`kvsplit.kernels.policy_table.default_fallback`: an FP8 cache at q_len 1). A batch of the family that no
published bucket is near is served that plan, so a tuned plan must beat it, not only ``balanced``: a plan that
merely equals it gains nothing over what is served without it."""


def baselines_for(kv_dtype: str | None = None, q_len: int = 1) -> list[tuple[str, str, dict[str, Any]]]:
    """``(label, policy, params)`` of each baseline of a family: every :data:`BASELINES` policy with its default
    params, then :data:`FALLBACK_BASELINE` with the family's own fallback (:func:`kvsplit.tuner.space.own_fallback`:
    policy and params) where it has one. ``kv_dtype``: the canonical KV dtype name (None: q's dtype); ``q_len``:
    1-8."""
    out = [(b, b, {}) for b in BASELINES]
    own = own_fallback(kv_dtype, q_len)
    if own is not None:
        out.append((FALLBACK_BASELINE, *own))
    return out


SIM_DEFAULT_MARGIN = 0.05
"""Gain over the best baseline a simulated result needs when the GPU has no stored calibration
(its error is then unknown; a calibrated H200 simulator's held-out median error is about 4 %)."""


@dataclass
class VerifyOutcome:
    """Result of :func:`verify_and_store`."""

    summary: dict[str, Any]
    policy_id: int | None
    published: bool
    note: str = ""


def measure_heldout(
    task: Any, tuned_params: Mapping[str, Any], backend: Any, baselines: Sequence[str] | None = None
) -> list[dict[str, Any]]:
    """Time ``tuned`` and each baseline on every held-out batch of ``task``.

    ``baselines``: policy names timed with their default params; None (the default): the task's family's
    baselines, :func:`baselines_for` (``task.kv_dtype``, ``task.q_len``). Returns one record per (policy, batch):
    ``policy`` (the label: ``tuned``, a policy name or :data:`FALLBACK_BASELINE`), ``params``, ``batch_index``,
    ``kv_lens``, ``time_s``, ``floor_s``, ``ratio``.
    """
    base = (
        baselines_for(getattr(task, "kv_dtype", None), getattr(task, "q_len", 1))
        if baselines is None
        else [(b, b, {}) for b in baselines]
    )
    policies = [("tuned", "tuned", dict(tuned_params))] + base
    rows: list[dict[str, Any]] = []
    for i, lens in enumerate(task.heldout):
        floor = backend.hbm_floor_s(lens)
        timed: dict[tuple, float] = {}
        for name, policy, params in policies:
            plan = make_plan(list(lens), policy=policy, params=params, **task.plan_kwargs)
            sig = plan.work_key()
            if sig not in timed:
                timed[sig] = backend.time_plan(plan)
            t = timed[sig]
            rows.append(
                {
                    "policy": name,
                    "params": params,
                    "batch_index": i,
                    "kv_lens": list(lens),
                    "time_s": t,
                    "floor_s": floor,
                    "ratio": t / floor,
                }
            )
    return rows


def geomean(xs: Sequence[float]) -> float:
    """Geometric mean of the positive numbers ``xs`` (raises ZeroDivisionError when empty, ValueError on a value
    <= 0): the mean the verify step, ``bench/table_ab.py`` and ``bench/pool_check.py`` report ratios with."""
    return float(math.exp(sum(math.log(x) for x in xs) / len(xs)))


def sim_margin(
    database_url: str, gpu: str, *, dtype: str = "bfloat16", kv_dtype: str | None = None, q_len: int = 1
) -> tuple[float, str]:
    """The gain a simulated result of ``gpu`` at this KV dtype and q_len must show to pass, and where it comes from.

    The held-out median relative error (``error["heldout"]["median"]``) of the calibration the simulator uses
    for the shape (:func:`kvsplit.tuner.calibrate.stored_calibration`: the exact KV dtype and q_len, else the
    q_len-1 fit of ``dtype``), else :data:`SIM_DEFAULT_MARGIN`.
    """
    from .calibrate import stored_calibration

    with store.session_scope(database_url) as s:
        cal, _ = stored_calibration(s, gpu, dtype=dtype, kv_dtype=kv_dtype, q_len=q_len)
        err = ((cal.error or {}).get("heldout") or {}).get("median") if cal is not None else None
    if isinstance(err, (int, float)) and not isinstance(err, bool) and math.isfinite(err) and err >= 0:
        return float(err), f"held-out median error of calibration {cal.id} (KV {cal.kv_dtype}, q_len {cal.q_len})"
    return SIM_DEFAULT_MARGIN, "the default: no calibration of this GPU stored"


def summarize(
    rows: Sequence[Mapping[str, Any]],
    *,
    backend: str,
    tolerance: float = 0.0,
    train_objective_s: float | None = None,
    margin: float = 0.0,
    margin_source: str | None = None,
) -> dict[str, Any]:
    """Geomean time / floor per policy, best baseline, speedups, pass/fail.

    ``margin``: the relative gain over the best baseline needed to pass
    (``tuned · (1 + margin) <= best · (1 + tolerance)``); 0 for GPU results,
    the simulator's error for simulated ones (:func:`sim_margin`).

    Returns
    -------
    dict
        ``policies``: {name: {geomean_ratio, geomean_time_s, worst_ratio}};
        ``tuned_geomean_ratio``; ``best_baseline`` and its
        ``best_baseline_geomean_ratio``; ``speedup_vs`` {baseline: geomean
        time of baseline / geomean time of tuned}; ``passed``; ``tolerance``;
        ``heldout_batches``; ``backend``; ``train_objective_s``; ``margin``,
        ``margin_source``; ``gain`` (best baseline geomean / tuned geomean - 1).
    """
    by: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        by.setdefault(r["policy"], []).append(r)
    pol = {
        name: {
            "geomean_ratio": geomean([r["ratio"] for r in rs]),
            "geomean_time_s": geomean([r["time_s"] for r in rs]),
            "worst_ratio": float(max(r["ratio"] for r in rs)),
        }
        for name, rs in by.items()
    }
    base = {k: v for k, v in pol.items() if k != "tuned"}
    best = min(base, key=lambda k: base[k]["geomean_ratio"])
    tuned = pol["tuned"]["geomean_ratio"]
    return {
        "backend": backend,
        "heldout_batches": len(by["tuned"]),
        "policies": pol,
        "tuned_geomean_ratio": tuned,
        "best_baseline": best,
        "best_baseline_geomean_ratio": base[best]["geomean_ratio"],
        "speedup_vs": {k: v["geomean_time_s"] / pol["tuned"]["geomean_time_s"] for k, v in base.items()},
        "passed": bool(tuned * (1.0 + margin) <= base[best]["geomean_ratio"] * (1.0 + tolerance)),
        "tolerance": tolerance,
        "margin": margin,
        "margin_source": margin_source,
        "gain": base[best]["geomean_ratio"] / tuned - 1.0,
        "train_objective_s": train_objective_s,
    }


def verify_and_store(
    task: Any,
    tuned_params: Mapping[str, Any],
    backend: Any,
    *,
    database_url: str,
    bucket_id: int,
    run_id: int | None,
    device_id: int | None,
    train_objective_s: float | None = None,
    publish: bool = True,
    tolerance: float = 0.0,
) -> VerifyOutcome:
    """Measure on held-out batches, store every measurement, create the policy, publish if allowed."""
    rows = measure_heldout(task, tuned_params, backend)
    margin, margin_source = (
        sim_margin(database_url, task.gpu, dtype=task.dtype, kv_dtype=task.kv_dtype, q_len=task.q_len)
        if backend.name == "sim"
        else (0.0, None)
    )
    summary = summarize(
        rows,
        backend=backend.name,
        tolerance=tolerance,
        train_objective_s=train_objective_s,
        margin=margin,
        margin_source=margin_source,
    )
    software = backend.software()
    note = ""
    with store.session_scope(database_url, write=True) as s:
        pol = store.create_policy(
            s,
            bucket_id=bucket_id,
            params=dict(tuned_params),
            backend=backend.name,
            score=summary["tuned_geomean_ratio"],
            verification=summary,
            tuning_run_id=run_id,
            device_id=device_id,
        )
        for r in rows:
            store.record_measurement(
                s,
                bucket_id=bucket_id,
                policy_name=r["policy"],
                params=r["params"],
                kv_lens=r["kv_lens"],
                time_s=r["time_s"],
                floor_s=r["floor_s"],
                backend=backend.name,
                role="heldout",
                batch_index=r["batch_index"],
                stage="verify",
                tuning_run_id=run_id,
                policy_id=pol.id if r["policy"] == "tuned" else None,
                device_id=device_id,
                software=software,
            )
        published = False
        if not summary["passed"] and summary["gain"] >= 0 and margin > 0:
            note = (
                f"not published: simulated gain {summary['gain']:.2%} over {summary['best_baseline']} "
                f"({summary['best_baseline_geomean_ratio']:.4f}x floor) is within the simulator's error "
                f"margin {margin:.2%} ({margin_source})"
            )
        elif not summary["passed"]:
            note = (
                f"not published: tuned {summary['tuned_geomean_ratio']:.4f}x floor is slower than "
                f"{summary['best_baseline']} {summary['best_baseline_geomean_ratio']:.4f}x"
            )
        elif publish:
            try:
                with s.begin_nested():
                    store.publish(s, pol.id)
                published = True
            except store.PublishRefused as exc:
                note = f"not published: {exc}"
        if note:
            pol.note = note[:2048]
        policy_id = pol.id
    return VerifyOutcome(summary=summary, policy_id=policy_id, published=published, note=note)
