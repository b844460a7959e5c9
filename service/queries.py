"""Read helpers of the plan service on top of :mod:`kvsplit.db.store`.

The store returns ORM rows; these functions turn them into the plain JSON the
service answers with (the policy-table document, bucket / run / measurement
lists) and compute the dashboard's figures from stored measurements.
"""

from __future__ import annotations

import logging
import math
import re
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import defer

from ..db import store
from ..db.models import Bucket, Measurement, Policy
from ..kernels.buckets import BucketKey, gpu_slug, key_prefix
from ..kernels.device import resolve_device
from ..kernels.plan import make_plan
from ..kernels.policy_table import SOURCE_OF_BACKEND
from ..kernels.shape import shape_family
from ..tuner.published import load_table_doc, table_entry
from ..tuner.verify import BASELINES as _VERIFY_BASELINES
from ..tuner.verify import FALLBACK_BASELINE
from .traffic import TrafficRow, traffic_summary

_log = logging.getLogger("kvsplit.service")

__all__ = [
    "table_entry",
    "load_table_doc",
    "read_version",
    "policy_detail",
    "list_buckets",
    "list_runs",
    "list_measurements",
    "canonical_gpu",
    "family_of",
    "bucket_family",
    "shape_slug",
    "BASELINES",
    "served_gain",
    "served_gain_base",
    "FAMILY_NAMES",
    "SIMULATED_SUFFIX",
    "traffic_summary",
    "TrafficRow",
]

BASELINES = (*_VERIFY_BASELINES, FALLBACK_BASELINE)
"""Baseline labels measured beside the tuned one on held-out batches (:func:`kvsplit.tuner.verify.baselines_for`),
in column order: the fixed baselines, then the family's own fallback where it is not ``balanced``."""


def served_gain(speedups: dict[str, Any]) -> float | None:
    """A bucket's gain over what its batches are served without a table: its speedup over the family's own
    fallback (:data:`kvsplit.tuner.verify.FALLBACK_BASELINE`, an FP8 family's) where that was measured, else over
    ``balanced``. None where neither was."""
    g = speedups.get(FALLBACK_BASELINE)
    return g if g is not None else speedups.get("balanced")


def served_gain_base(buckets: Sequence[dict[str, Any]]) -> str:
    """What :func:`served_gain` of these buckets is over, in words: ``"the fallback"`` where any of them was
    measured against its family's own fallback, else ``"balanced"``."""
    return "the fallback" if any(FALLBACK_BASELINE in b["speedups"] for b in buckets) else "balanced"


SIMULATED_SUFFIX = " (simulated)"
"""Appended to a dashboard series name whose points were measured on the simulator."""
_FAMILIES = ("uniform", "skewed40", "skewed60", "skewed80", "2x40")
FAMILY_NAMES = (*_FAMILIES, "trace", "other")
"""Every length family :func:`family_of` can name without a ``signature["family"]``."""


def canonical_gpu(name: str) -> str:
    """The table name of a known GPU (``"h200"`` -> ``"NVIDIA H200"``); other names unchanged."""
    try:
        return resolve_device(name).name
    except ValueError:
        return name


_iso = store.iso_utc  # ISO 8601 with its zone (SQLite gives the values back without tzinfo)


def read_version(url: str) -> int:
    """The store's ``policies_version`` (polled by the reload loop)."""
    with store.session_scope(url) as s:
        return store.policies_version(s)


def policy_detail(url: str, policy_id: int) -> dict[str, Any] | None:
    """One policy of any status with its bucket, verification and device, or None."""
    with store.session_scope(url) as s:
        p = store.get_policy(s, policy_id)
        if p is None:
            return None
        d = store.policy_to_dict(p)
    d["bucket_fields"] = d.pop("bucket")
    d["bucket"] = d["bucket_fields"]["key"]
    d["source"] = SOURCE_OF_BACKEND.get(d["backend"])
    return d


def _bucket_rows(s: Any) -> list[Any]:
    """Every bucket row of session ``s``, by id, without its stored sample batches (neither :func:`list_buckets`
    nor the dashboard shows them, and decoding them was a large part of a read)."""
    return list(s.scalars(select(Bucket).options(defer(Bucket.sample_batches)).order_by(Bucket.id)))


def list_buckets(
    url: str,
    *,
    gpu: str | None = None,
    num_kv_heads: int | None = None,
    head_dim: int | None = None,
    dtype: str | None = None,
    page_size: int | None = None,
    kv_dtype: str | None = None,
    q_len: int | None = None,
) -> list[dict[str, Any]]:
    """Buckets with their published policy id and their family's KV dtype and q_len (:func:`bucket_family`),
    optionally filtered by shape fields (``kv_dtype`` by its name, ``"float8_e4m3fn"``)."""
    try:
        want_gpu = None if gpu is None else gpu_slug(gpu)
    except ValueError:  # no letters or digits: matches no bucket
        return []
    with store.session_scope(url) as s:
        rows = _bucket_rows(s)
        published = dict(s.execute(select(Policy.bucket_id, Policy.id).where(Policy.status == "published")).all())
        out = []
        for b in rows:
            fam = bucket_family(b)
            if (
                (want_gpu is not None and gpu_slug(b.gpu) != want_gpu)
                or (num_kv_heads is not None and b.num_kv_heads != num_kv_heads)
                or (head_dim is not None and b.head_dim != head_dim)
                or (dtype is not None and b.dtype != dtype)
                or (page_size is not None and b.page_size != page_size)
                or (kv_dtype is not None and fam[5] != kv_dtype)
                or (q_len is not None and fam[6] != q_len)
            ):
                continue
            pid = published.get(b.id)
            out.append(
                {
                    "id": b.id,
                    "key": b.key,
                    "gpu": b.gpu,
                    "num_kv_heads": b.num_kv_heads,
                    "head_dim": b.head_dim,
                    "dtype": b.dtype,
                    "page_size": b.page_size,
                    "kv_dtype": fam[5],
                    "q_len": fam[6],
                    "source": b.source,
                    "family": family_of(b),
                    "signature": dict(b.signature or {}),
                    "published_policy_id": pid,
                    "created_at": _iso(b.created_at),
                }
            )
    return out


def _run_dict(r: Any) -> dict[str, Any]:
    dur = None
    if r.finished_at is not None and r.started_at is not None:
        dur = (r.finished_at - r.started_at).total_seconds()
    status, message = r.status, r.message
    abandoned = store.run_abandoned(r)  # only when reap_runs could not write it
    if abandoned is not None:
        status, message = "failed", abandoned
    return {
        "id": r.id,
        "bucket": r.bucket.key if r.bucket is not None else None,
        "study_name": r.study_name,
        "storage_kind": r.storage_kind,
        "backend": r.backend,
        "status": status,
        "n_trials": r.n_trials,
        "n_finished": r.n_finished,
        "workers": r.workers,
        "best_value": r.best_value,
        "best_params": r.best_params,
        "message": message,
        "started_at": _iso(r.started_at),
        "finished_at": _iso(r.finished_at),
        "duration_s": dur,
        "host": r.host,
        "pid": r.pid,
        "heartbeat_at": _iso(r.heartbeat_at),
    }


def reap_runs(url: str) -> int:
    """Mark the store's abandoned ``running`` rows ``failed`` (:func:`kvsplit.db.store.reap_runs`); the number marked.

    Reads first and writes only when a row is abandoned; a store that cannot
    be written (read-only, busy, full) is left as it is, and the rows are
    reported failed anyway (:func:`_run_dict`).
    """
    with store.session_scope(url) as s:
        if not any(store.run_abandoned(r) for r in store.list_runs(s, status="running", limit=None)):
            return 0
    try:
        with store.session_scope(url, write=True) as s:
            return len(store.reap_runs(s))
    except Exception:  # noqa: BLE001 - sqlalchemy OperationalError: a read-only, busy or full store
        return 0


def list_runs(
    url: str, *, bucket: str | None = None, status: str | None = None, limit: int = 100
) -> list[dict[str, Any]]:
    """Tuning runs, newest first; abandoned ``running`` rows are marked ``failed`` first (:func:`reap_runs`)."""
    reap_runs(url)
    with store.session_scope(url) as s:
        return [_run_dict(r) for r in store.list_runs(s, bucket_key=bucket, status=status, limit=limit)]


def _measurement_dict(m: Any, key: str) -> dict[str, Any]:
    return {
        "id": m.id,
        "bucket": key,
        "tuning_run_id": m.tuning_run_id,
        "policy_id": m.policy_id,
        "stage": m.stage,
        "policy_name": m.policy_name,
        "params": dict(m.params or {}),
        "role": m.role,
        "batch_index": m.batch_index,
        "batch_size": m.batch_size,
        "total_tokens": m.total_tokens,
        "time_s": m.time_s,
        "floor_s": m.floor_s,
        "ratio": m.ratio,
        "backend": m.backend,
        "created_at": _iso(m.created_at),
    }


def list_measurements(
    url: str, *, bucket: str | None = None, policy_name: str | None = None, stage: str | None = None, limit: int = 1000
) -> list[dict[str, Any]]:
    """Measurements (oldest first) without their kv_lens arrays."""
    with store.session_scope(url) as s:
        keys = {b.id: b.key for b in store.list_buckets(s)}
        rows = store.list_measurements(s, bucket_key=bucket, policy_name=policy_name, stage=stage, limit=limit)
        return [_measurement_dict(m, keys.get(m.bucket_id, "")) for m in rows]


def family_of(b: Any) -> str:
    """Length family of a bucket for the dashboard: ``signature["family"]``, a family
    name or ``trace`` found in ``source``, else ``other``."""
    sig = b.signature or {}
    fam = sig.get("family") if isinstance(sig, dict) else None
    if isinstance(fam, str) and fam:
        return fam
    tokens = re.split(r"[^A-Za-z0-9]+", b.source or "")
    for t in tokens:
        if t in _FAMILIES:
            return t
    if "trace" in (b.source or "").lower():
        return "trace"
    return "other"


_KEY_CLASSES = re.compile(r"\.b(\d+)\.t(\d+)(?:\.|$)")
"""Batch-size and total-token classes (round(log2 B), round(log2 tokens)) in a bucket key's string form."""


def bucket_family(b: Any) -> tuple[str, int, int, str, int, str, int]:
    """The family (:func:`kvsplit.kernels.shape.shape_family`) of a stored bucket row: its shape columns with the
    KV dtype and q_len of its key (the row has no columns of its own for them); a key that does not parse (a store
    edited by hand) counts as K/V in ``dtype`` at q_len 1."""
    try:
        k = BucketKey.parse(b.key)
        kv_dtype, q_len = k.kv_dtype, k.q_len
    except ValueError:
        kv_dtype, q_len = None, 1
    return shape_family(b.gpu, b.num_kv_heads, b.head_dim, b.dtype, b.page_size, kv_dtype, q_len)


def shape_slug(key: str) -> str:
    """The family part of a bucket key's string form (:func:`kvsplit.kernels.buckets.key_prefix`, everything before
    its ``.b<class>.t<class>.w<hist>`` signature: ``nvidia-h200.kv4.d128.bf16.p16``, with ``.kvfp8`` / ``.q4`` for
    another KV dtype or q_len), a URL-safe id of the dashboard's shape pages; a string that is no key unchanged."""
    try:
        return key_prefix(*BucketKey.parse(key).family)
    except ValueError:
        return key


_WHOLE_WAVE_KEYS = ("whole_wave", "whole_wave_heads")


def _times_served_plan(b: Any, p: Any, m: Any) -> bool:
    """Whether a ``tuned`` training measurement ``m`` timed the plan published policy ``p`` serves its batch.

    Equal params do. The shipped H_kv 4 policies got the whole-wave rule after their grid search timed them
    (docs/decisions/whole-wave-rule.md), so their params carry ``whole_wave`` /
    ``whole_wave_heads`` and their training timings do not: such a timing still is of the served plan when the
    rule leaves that batch's plan alone (same kernel config and work list with and without the two keys; the
    rule only replaces near-even batches' plans), and is not when the rule picks another plan for it.
    """
    mp, pp = dict(m.params or {}), dict(p.params or {})
    if mp == pp:
        return True
    if {k: v for k, v in pp.items() if k not in _WHOLE_WAVE_KEYS} != mp or not m.kv_lens:
        return False
    try:
        fam = bucket_family(b)
        shape = dict(
            num_kv_heads=b.num_kv_heads,
            device=resolve_device(b.gpu),
            head_dim=b.head_dim,
            page_size=b.page_size,
            dtype=b.dtype,
            kv_dtype=fam[5],
            q_len=fam[6],
        )
        served = make_plan(m.kv_lens, policy=p.name, params=pp, **shape)
        timed = make_plan(m.kv_lens, policy=p.name, params=mp, **shape)
    except ValueError:  # a GPU or a stored policy the planner refuses: nothing to match
        return False
    return served.config == timed.config and all(
        np.array_equal(getattr(served, f), getattr(timed, f))
        for f in ("num_splits", "work_request", "work_kv_start", "work_kv_end", "cta_indptr")
    )


_SERVED_PLAN_TIMED: dict[tuple, bool] = {}


def _times_served_plan_cached(b: Any, p: Any, m: Any) -> bool:
    """:func:`_times_served_plan`, remembered per (measurement id, policy id, both params): the rows' batch and
    bucket do not change once written (a new tuning makes a new policy row), so the answer does not either; the
    dashboard asks it on every view."""
    key = (int(m.id), int(p.id), repr(sorted((m.params or {}).items())), repr(sorted((p.params or {}).items())))
    hit = _SERVED_PLAN_TIMED.get(key)
    if hit is None:
        hit = _times_served_plan(b, p, m)
        if len(_SERVED_PLAN_TIMED) < 200_000:
            _SERVED_PLAN_TIMED[key] = hit
    return hit


def geomean(xs: list[float]) -> float:
    """Geometric mean of the finite, positive values of ``xs`` (``None`` and the rest skipped); NaN if none."""
    xs = [x for x in xs if x is not None and x > 0 and math.isfinite(x)]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def _own_verification(ms: list[Any], pol: Any) -> list[Any]:
    """The held-out verification timings of policy ``pol`` among its bucket's ``ms`` (empty if none).

    A policy of a tuning run: that run's timings. One verified outside a run (a campaign's verify step): its own
    ``tuned`` timings (``policy_id``) and the baselines verified outside a run on the bucket's held-out batches.
    Another tuning of the bucket is not this policy's evidence, so its figures must not stand beside it.
    """
    if pol.tuning_run_id is not None:
        return [m for m in ms if m.tuning_run_id == pol.tuning_run_id]
    own = [m for m in ms if m.tuning_run_id is None and (m.policy_id == pol.id if m.policy_name == "tuned" else True)]
    return own if any(m.policy_name == "tuned" for m in own) else []


def _policy_identity(p: Any) -> dict[str, Any]:
    """What the shape page shows of any policy row, published or draft: id, version, name, params, backend and
    the plan ``source`` its backend gives."""
    return {
        "id": p.id,
        "version": p.version,
        "name": p.name,
        "params": dict(p.params or {}),
        "backend": p.backend,
        "source": SOURCE_OF_BACKEND[p.backend],
    }


def _draft_dict(p: Any) -> dict[str, Any]:
    """A bucket's newest draft (verified or not, never published): what it is and why it was not published, from
    its stored verification summary (:func:`kvsplit.tuner.verify.summarize`) and note."""
    ver = dict(p.verification or {})
    tuned, best, best_ratio = (
        ver.get(k) for k in ("tuned_geomean_ratio", "best_baseline", "best_baseline_geomean_ratio")
    )
    if not all(isinstance(x, (int, float)) and math.isfinite(x) for x in (tuned, best_ratio)) or not best:
        why = "no verification stored"
    else:
        why = f"tuned {tuned:.3f}× floor vs best baseline {best} {best_ratio:.3f}×"
        margin = ver.get("margin") or 0.0
        if ver.get("passed") is False and tuned <= best_ratio and margin > 0:
            why += f", a gain within the simulator's {margin:.1%} error margin"
        why += ": not published" if ver.get("passed") is False else ": passed verification, not published"
    note = (p.note or "").strip()
    if note and ver.get("passed") is not False:  # e.g. the store refused it; a failed one's note repeats the figures
        why += " (" + note.removeprefix("not published: ") + ")"
    return {
        **_policy_identity(p),
        "passed": ver.get("passed"),
        "verification": ver,
        "why": why,
    }


_HELDOUT_COLUMNS = (
    Measurement.id,
    Measurement.bucket_id,
    Measurement.tuning_run_id,
    Measurement.policy_id,
    Measurement.policy_name,
    Measurement.batch_index,
    Measurement.batch_size,
    Measurement.total_tokens,
    Measurement.time_s,
    Measurement.ratio,
    Measurement.backend,
)
"""What :func:`dashboard_data` reads of a held-out verification measurement."""


def dashboard_data(url: str) -> dict[str, Any]:
    """Everything the dashboard shows, from one read transaction.

    Returns ``{"shapes": [...], "runs": [...], "version": int}``; each shape
    is one bucket family (:func:`bucket_family`: gpu, H_kv, head_dim, dtype, page_size, ``kv_dtype`` and
    ``q_len``; ``slug`` its key prefix, :func:`shape_slug`) and has its ``buckets`` (published
    policy, params, held-out geomean time / HBM floor per policy, speedup of
    the tuned policy over each baseline = geomean over held-out batches of
    baseline time / tuned time, paired by batch, ``measured_on`` = the
    backends of those measurements, ``gpu`` and / or ``sim``) and
    ``families``: per length family, per series, the (batch size, geomean time
    / HBM floor) points. A series is a policy name, with `` (simulated)``
    appended for points measured on the simulator; ``tuned`` points come only
    from buckets with a published policy (a tuning that was not published is
    not what the service serves).

    A bucket without a published policy shows its newest draft (``draft``:
    id, version, name, params, backend, ``passed`` and ``why`` it is not
    published, from its verification summary): ``ratios``, ``speedups`` and
    ``n_heldout`` are then the draft's own verification timings, never another
    tuning's. ``evidence`` is ``held-out``, ``training`` (a published policy's
    tuning batch) or ``none``; ``n_heldout`` counts the held-out batches the
    figures come from, so it is 0 wherever no figure is shown.
    """
    reap_runs(url)
    with store.session_scope(url) as s:
        version = store.policies_version(s)
        buckets = _bucket_rows(s)
        # published policies without their verification summaries and notes (shown for drafts only) or their
        # buckets (read above)
        published = {
            p.bucket_id: p
            for p in s.scalars(
                select(Policy)
                .options(defer(Policy.verification), defer(Policy.note))
                .where(Policy.status == "published")
            )
        }
        drafts: dict[int, Any] = {}  # the newest draft of each bucket
        for p in store.list_policies(s, status="draft"):  # newest first
            drafts.setdefault(p.bucket_id, p)
        runs = [_run_dict(r) for r in store.list_runs(s, limit=200)]
        # held-out verification measurements per bucket; a published policy shows its own run's only. Read as
        # plain rows of the columns shown (no ORM objects, no params or kv_lens JSON decoded): building and
        # decoding thousands of measurement objects was most of the page's time
        by_bucket: dict[int, list[Any]] = defaultdict(list)
        for m in s.execute(
            select(*_HELDOUT_COLUMNS)
            .where(Measurement.role == "heldout", Measurement.stage == "verify")
            .order_by(Measurement.id)
        ):
            by_bucket[m.bucket_id].append(m)
        # training-batch measurements (the shipped H200 set was tuned by a grid search whose timings are of
        # training batches): shown, labelled, for a published policy without held-out ones; ORM rows with their
        # params, the kv_lens array loaded only where a plan must be rebuilt (_times_served_plan)
        train_by_bucket: dict[int, list[Any]] = defaultdict(list)
        for m in s.scalars(
            select(Measurement)
            .options(defer(Measurement.kv_lens))
            .where(Measurement.role == "train")
            .order_by(Measurement.id)
        ):
            train_by_bucket[m.bucket_id].append(m)
        shapes: dict[tuple, dict[str, Any]] = {}
        for b in buckets:
            fam = bucket_family(b)  # one card / page per family: a batch is served only its own family's policies
            sh = shapes.setdefault(
                fam,
                {
                    "gpu": b.gpu,
                    "num_kv_heads": b.num_kv_heads,
                    "head_dim": b.head_dim,
                    "dtype": b.dtype,
                    "page_size": b.page_size,
                    "kv_dtype": fam[5],
                    "q_len": fam[6],
                    "slug": key_prefix(*fam),
                    "buckets": [],
                    "series": defaultdict(lambda: defaultdict(list)),
                },
            )
            p = published.get(b.id)
            ms = by_bucket.get(b.id, [])
            # the bucket's own batch (B and tokens): from any of its measurements, timed plan or not
            own_batches = ms or train_by_bucket.get(b.id, [])
            evidence = "held-out"
            time_note = ""
            draft = drafts.get(b.id) if p is None else None
            if p is not None:
                # only the published policy's own verification: another (unpublished) tuning of the bucket is not
                # what the service serves, so its figures must not stand beside the published policy
                ms = _own_verification(ms, p)
                if not ms:
                    # the published policy's own training timings (its params) and the baselines beside them
                    own = [
                        m
                        for m in train_by_bucket.get(b.id, [])
                        if m.policy_name != "tuned" or _times_served_plan_cached(b, p, m)
                    ]
                    if any(m.policy_name == "tuned" for m in own):
                        ms, evidence = own, "training"
                    elif train_by_bucket.get(b.id):
                        # timed, but with params that give this batch another plan than the served one (the
                        # whole-wave rule was added to the shipped policies after their timing)
                        ms, evidence = [], "none"
                        added = {
                            k
                            for m in train_by_bucket[b.id]
                            if m.policy_name == "tuned"
                            for k in set(p.params or {}) - set(m.params or {})
                        }
                        time_note = "served plan not timed: the timed plans differ from it " + (
                            "(whole-wave rule added later)"
                            if added and added <= {"whole_wave", "whole_wave_heads"}
                            else "(its params changed after the timing)"
                        )
                    else:
                        evidence = "none"
            elif draft is not None:
                # no published policy: the newest draft's own verification, shown as the draft's (not served)
                ms = _own_verification(ms, draft)
                if not ms:
                    evidence = "none"
                    time_note = (
                        "draft: its verification's timings are not in this store"
                        if (draft.verification or {}).get("heldout_batches")
                        else "draft: not verified"
                    )
            else:  # no policy to show the timings of: no evidence claimed
                ms, evidence = [], "none"
            # latest measurement per (policy, batch)
            cell: dict[tuple[str, int], Any] = {}
            for m in ms:
                cell[(m.policy_name, m.batch_index)] = m
            per_policy: dict[str, dict[int, Any]] = defaultdict(dict)
            for (name, idx), m in cell.items():
                per_policy[name][idx] = m
            ratios = {name: geomean([m.ratio for m in d.values()]) for name, d in per_policy.items()}
            tuned = per_policy.get("tuned", {})
            if evidence == "held-out" and not tuned:  # baselines alone are no evidence of the policy
                evidence = "none"
            speedups = {}
            for base in sorted(
                set(per_policy) - {"tuned"}, key=lambda n: (BASELINES.index(n) if n in BASELINES else 99, n)
            ):
                pairs = [per_policy[base][i].time_s / tuned[i].time_s for i in tuned if i in per_policy[base]]
                speedups[base] = geomean(pairs) if pairs else None
            bsz = sorted(m.batch_size for m in own_batches)
            batch_size = bsz[len(bsz) // 2] if bsz else None
            tok = sorted(m.total_tokens for m in own_batches)
            classes = _KEY_CLASSES.search(b.key)
            family = family_of(b)
            measured_on = sorted({m.backend for m in ms})
            sh["buckets"].append(
                {
                    "id": b.id,
                    "key": b.key,
                    "family": family,
                    "source": b.source,
                    "batch_size": batch_size,
                    "total_tokens": tok[len(tok) // 2] if tok else None,
                    "b_class": int(classes.group(1)) if classes else None,
                    "t_class": int(classes.group(2)) if classes else None,
                    "time_note": time_note,
                    "policy": None
                    if p is None
                    else {
                        **_policy_identity(p),
                        "score": p.score,
                        "published_at": _iso(p.published_at),
                    },
                    "draft": None if draft is None else _draft_dict(draft),
                    "ratios": ratios,
                    "speedups": speedups,
                    "n_heldout": len(tuned) if evidence == "held-out" and tuned else 0,
                    "n_train": len(tuned) if evidence == "training" else 0,
                    "evidence": evidence,
                    "measured_on": measured_on,
                }
            )
            if ms and batch_size is not None:
                for name, r in ratios.items():
                    if not math.isfinite(r) or (name == "tuned" and p is None):
                        continue
                    sim = all(m.backend == "sim" for m in per_policy[name].values())
                    sh["series"][family][name + (SIMULATED_SUFFIX if sim else "")].append((batch_size, r))
        out_shapes = []
        for sh in shapes.values():
            fams = {}
            for fam, pol in sh["series"].items():

                def rank(n: str) -> tuple:
                    base = n.removesuffix(SIMULATED_SUFFIX)
                    return (base != "tuned", BASELINES.index(base) if base in BASELINES else 99, base, n != base)

                order = sorted(pol, key=rank)
                fams[fam] = [(n, _merge_points(pol[n])) for n in order]
            sh["families"] = dict(
                sorted(
                    fams.items(),
                    key=lambda kv: (
                        (_FAMILIES + ("trace", "other")).index(kv[0]) if kv[0] in _FAMILIES + ("trace", "other") else 99
                    ),
                )
            )
            del sh["series"]
            sh["buckets"].sort(
                key=lambda d: (
                    (_FAMILIES + ("trace", "other")).index(d["family"])
                    if d["family"] in _FAMILIES + ("trace", "other")
                    else 99,
                    d["batch_size"] or 0,
                    d["key"],
                )
            )
            out_shapes.append(sh)
    out_shapes.sort(key=lambda sh: -len(sh["buckets"]))  # the best-covered shape (the main model) first
    return {"version": version, "shapes": out_shapes, "runs": runs}


def _merge_points(pts: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """One point per batch size (geomean of buckets sharing it), sorted."""
    acc: dict[int, list[float]] = defaultdict(list)
    for x, y in pts:
        acc[x].append(y)
    return sorted((x, geomean(ys)) for x, ys in acc.items())
