"""A shipped table against the campaign's current pool, bucket by bucket, on each bucket's own held-out batch: has
the pool moved past the table (then rerun the campaign), and where the table left a draft, does the pool now beat
the baseline that kept it one?

Usage (from the repository root; on a CUDA machine for ``--backend gpu``)::

    python bench/pool_check.py --gpu h100 --model-shape qwen3-30b-a3b --q-len 8 --out $OUT
    python bench/pool_check.py --gpu h100 --model-shape qwen3-30b-a3b --q-len 8 --backend sim --limit 6

The buckets are those ``kvsplit tune --campaign`` builds for the shape and family (:func:`kvsplit.tuner.campaign.
campaign_tasks` with the campaign's defaults: seed 0, one held-out batch per bucket, never trained on). On each
bucket's held-out batch, back to back in one process, after one discarded warm-up timing of the first plan:

- a bucket the table publishes (``--table``, a ``kvsplit db export`` document; default the shipped tables,
  :func:`kvsplit.kernels.policy_table.shipped_policies`): its published plan (``make_plan`` with the policy's name
  and params) and every candidate of :func:`kvsplit.tuner.pool.fitted_pool` the shape can launch;
- a bucket it does not publish (a draft of the campaign that built it): the family's baselines
  (:func:`kvsplit.tuner.verify.baselines_for`, their split rules on kvsplit's kernel) and the same candidates.

The candidates the fitted pool adds to :data:`~kvsplit.tuner.pool.SERVED_POOL` (two-head candidates restated at
one head where two heads' rows do not fit a tile: q_len 8 at GQA group 8, H_kv = 1) are reported apart: the
campaign that built the table could not time them if it predates them. Timing: ``--backend gpu``
(:class:`kvsplit.tuner.gpu.GpuTimer.time_plan`, the campaign's timing: CUDA-graph replays, ``do_bench`` median,
random data on shuffled pages far above the L2) or ``--backend sim`` (the simulator, for a CPU smoke run; its
figures are predictions).

Prints, and writes to ``OUT/pool_check.json`` (per bucket: times in seconds, the read floor, the best candidate):

- over the published buckets, the published plan's time / the best candidate's and / the best added candidate's
  (geomean, range, buckets above 1.01): above 1, the pool beats the table on batches it never trained on;
- over the drafts, the best baseline's time / the best candidate's and FlashInfer's rule / the best added
  candidate's: above 1, the pool now beats what kept the bucket a draft.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from kvsplit.kernels.plan import make_plan
from kvsplit.kernels.policy_table import read_export, shipped_policies
from kvsplit.tuner.backends import make_backend
from kvsplit.tuner.campaign import CampaignConfig, campaign_tasks, parse_model_shape
from kvsplit.tuner.pool import SERVED_POOL, fitted_pool, parse_candidate
from kvsplit.tuner.verify import baselines_for, geomean


def _stats(xs: Sequence[float]) -> dict[str, Any]:
    if not xs:
        return {"n": 0}
    return {
        "n": len(xs),
        "geomean": geomean(xs),
        "min": min(xs),
        "max": max(xs),
        "above_1.01": sum(x > 1.01 for x in xs),
    }


def summarize(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The figures of per-bucket rows (:func:`check_bucket`'s): for published buckets the ratios
    ``published / best candidate`` and ``published / best added candidate``; for drafts ``best baseline / best
    candidate`` and ``flashinfer / best added candidate``."""
    pub = [r for r in rows if r["published"]]
    drafts = [r for r in rows if not r["published"]]

    def ratio(r: Mapping[str, Any], num: str, den: str) -> float | None:
        a, b = r[num], r[den]
        return None if a is None or b is None else a / b

    def col(rs, num, den):
        return [x for x in (ratio(r, num, den) for r in rs) if x is not None]

    return {
        "buckets": len(rows),
        "published": {
            "published_over_best": _stats(col(pub, "published_s", "best_s")),
            "published_over_best_added": _stats(col(pub, "published_s", "best_added_s")),
        },
        "drafts": {
            "best_baseline_over_best": _stats(col(drafts, "best_baseline_s", "best_s")),
            "flashinfer_over_best_added": _stats(col(drafts, "flashinfer_s", "best_added_s")),
        },
    }


def check_bucket(task: Any, entry: Mapping[str, Any] | None, pool: Sequence[str], backend: Any) -> dict[str, Any]:
    """Time one bucket's held-out batch (module doc). ``entry``: the table's policy of the bucket (an export's
    entry: ``name``, ``params``) or None for a draft. Returns the row: ``times`` per plan label, and ``published_s``,
    ``best_s``, ``best``, ``best_added_s``, ``best_baseline_s``, ``flashinfer_s`` (seconds; None where absent)."""
    lens = [int(x) for x in task.heldout[0]]
    plans: dict[str, Any] = {}
    if entry is not None:
        plans["published"] = make_plan(lens, policy=entry["name"], params=dict(entry["params"]), **task.plan_kwargs)
    else:
        for label, policy, params in baselines_for(task.kv_dtype, task.q_len):
            plans[label] = make_plan(lens, policy=policy, params=params, **task.plan_kwargs)
    for name in pool:
        policy, params = parse_candidate(name)
        try:
            plans[name] = make_plan(lens, policy=policy, params=params, **task.plan_kwargs)
        except ValueError:  # a candidate the shape cannot plan
            continue
    backend.time_plan(next(iter(plans.values())))  # discarded: the first timing after a batch change
    timed: dict[tuple, float] = {}
    times: dict[str, float] = {}
    for label, plan in plans.items():
        sig = plan.work_key()
        if sig not in timed:
            try:
                timed[sig] = float(backend.time_plan(plan))
            except ValueError:  # the GPU cannot load the candidate's kernel (its launch names why)
                timed[sig] = math.nan
        if not math.isnan(timed[sig]):
            times[label] = timed[sig]
    cands = {n: t for n, t in times.items() if n in pool}
    added = {n: t for n, t in cands.items() if n not in SERVED_POOL}
    bases = {n: t for n, t in times.items() if n not in pool and n != "published"}
    best = min(cands, key=cands.get) if cands else None
    return {
        "bucket": task.key,
        "published": entry is not None,
        "B": len(lens),
        "T": sum(lens),
        "floor_s": float(backend.hbm_floor_s(lens)),
        "times": times,
        "best": best,
        "best_s": cands.get(best) if best else None,
        "best_added_s": min(added.values()) if added else None,
        "published_s": times.get("published"),
        "best_baseline_s": min(bases.values()) if bases else None,
        "flashinfer_s": times.get("flashinfer"),
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu", required=True, help="the table's GPU (a kvsplit.kernels.device name, e.g. h100)")
    ap.add_argument("--model-shape", required=True, help="a preset (qwen3-30b-a3b, ...) or H_q/H_kv/head_dim")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--kv-dtype", default=None, help="the KV cache's dtype when not --dtype (fp8)")
    ap.add_argument("--q-len", type=int, default=1, help="query tokens per request, 1-8")
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--table", default=None, help="a kvsplit db export document (default: the shipped tables)")
    ap.add_argument("--backend", choices=("gpu", "sim"), default="gpu", help="gpu (default) or sim (a CPU smoke run)")
    ap.add_argument("--limit", type=int, default=0, help="check only the first N buckets (0: all)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."), help="folder of pool_check.json (default: $OUT or .)")
    args = ap.parse_args(argv)
    try:
        hq, hkv, d = parse_model_shape(args.model_shape)
        cfg = CampaignConfig(
            database_url="sqlite://",
            gpu=args.gpu,
            num_qo_heads=hq,
            num_kv_heads=hkv,
            head_dim=d,
            dtype=args.dtype,
            page_size=args.page_size,
            kv_dtype=args.kv_dtype,
            q_len=args.q_len,
            backend=args.backend,
        )
        tasks = campaign_tasks(cfg)
        if args.table is None:
            doc = shipped_policies()
        else:
            doc = read_export(args.table, arg="--table")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.limit < 0:
        print(f"error: --limit: expected N >= 0, got {args.limit}", file=sys.stderr)
        return 2
    table = {p["bucket"]["key"]: p for p in doc["policies"] if p.get("status", "published") == "published"}
    if args.limit:
        tasks = tasks[: args.limit]
    n_pub = sum(t.key in table for t in tasks)
    if n_pub == 0:
        print(f"error: --table: no published bucket of this campaign's {len(tasks)} (shape, family)", file=sys.stderr)
        return 2
    pool = fitted_pool(SERVED_POOL, hq, hkv, args.q_len)
    print(
        f"{len(tasks)} buckets, {n_pub} published; pool of {len(pool)} candidates, "
        f"{sum(n not in SERVED_POOL for n in pool)} added by fitted_pool ({args.backend} backend)",
        flush=True,
    )
    backend = make_backend(
        args.backend,
        shape=tasks[0].shape,
        max_tokens=max(sum(t.heldout[0]) for t in tasks) + 8192,
        max_batch=max(len(t.heldout[0]) for t in tasks) + 8,
    )
    rows, t0 = [], time.time()
    for task in tasks:
        r = check_bucket(task, table.get(task.key), pool, backend)
        rows.append(r)
        ref = r["published_s"] if r["published"] else r["best_baseline_s"]
        what = "published" if r["published"] else "best baseline"
        print(
            f"{task.key:60s} B={r['B']:5d} T={r['T']:8d} {what} / best candidate "
            f"{ref / r['best_s']:.3f} ({r['best']})  [{time.time() - t0:.0f}s]",
            flush=True,
        )
    summary = summarize(rows)
    summary.update(gpu=args.gpu, model_shape=[hq, hkv, d], q_len=args.q_len, kv_dtype=args.kv_dtype)
    summary["backend"] = args.backend
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "pool_check.json"), "w") as f:
        json.dump({"summary": summary, "rows": rows}, f, indent=1)
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
