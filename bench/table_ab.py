"""Two policy tables A/B on the evaluation batches, re-timed in one run: is the new table as good as the old one?

Usage (from the repository root; on a CUDA machine for ``--backend gpu``)::

    python bench/table_ab.py --tables kernels/data/h200_policies.json campaign.json --cases eval --out $OUT
    python bench/table_ab.py --tables kernels/data/h200_policies.json campaign.json --backend sim --limit 12

``--tables A B``: two ``kvsplit db export`` documents (format ``kvsplit.policies``, e.g. the shipped
``kernels/data/h200_policies.json`` and ``kvsplit db export`` of a campaign's store), each loaded with
:meth:`kvsplit.kernels.policy_table.PolicyTable.from_export` and asked for its plan per batch as the service
serves it. ``--cases``: ``eval`` (the 182 evaluation batches of
:func:`kvsplit.tuner.workloads.evaluation_cases`, never trained on), ``train`` or a JSON case file
(``{"cases": [...]}``, the same dict form); only the batches whose shape (H_q, H_kv) table B has buckets for
are compared (the others are counted and named).

Per batch, in one process, back to back: A's plan, B's plan and every candidate of
:data:`kvsplit.tuner.pool.SERVED_POOL` as a campaign times it for the batch's shape (:func:`~kvsplit.tuner.pool.fitted_pool`:
a two-head candidate at one head where two do not fit, as with Llama-3.1-70B's one KV head at TP 8; plans
identical to another are timed once), after one discarded warm-up
timing of A's plan (the first timing after a batch change runs slow). Timing: ``--backend gpu``
(:class:`kvsplit.tuner.gpu.GpuTimer.time_plan`, the campaign's own timing: CUDA-graph replays, ``do_bench``
median, random data on shuffled pages far above the L2) or ``--backend sim`` (the simulator with the GPU's
datasheet defaults, no calibration: a CPU smoke run of this script; its figures are an uncalibrated model's
predictions, labelled so, and say nothing about either table's quality). The oracle of a batch is the fastest of everything
timed on it in this run.

Prints, and writes to ``OUT/table_ab.json`` (per batch: times, the two plans' record names, ratios):

- geomean over batches of B's time / A's time (the quality target: <= 1.00);
- the worst batch of B / A (target: <= 1.03), and how many batches exceed 1.03;
- the worst B / oracle and A / oracle (target for B: <= 1.05 on every batch), and how many exceed 1.05.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from kvsplit.kernels.plan import make_plan
from kvsplit.kernels.policy_table import PolicyTable, read_export
from kvsplit.tuner.backends import make_backend
from kvsplit.tuner.pool import SERVED_POOL, fitted_pool, parse_candidate
from kvsplit.tuner.verify import geomean


def load_table(path: str) -> tuple[PolicyTable, set[tuple[int, int, str, int]]]:
    """A ``kvsplit.policies`` export as the service serves it, and the (H_kv, head_dim, dtype, page_size) of its
    buckets. Raises ValueError naming the file."""
    raw = read_export(path, arg="--tables")
    shapes = {
        (
            int(p["bucket"]["num_kv_heads"]),
            int(p["bucket"]["head_dim"]),
            str(p["bucket"]["dtype"]),
            int(p["bucket"]["page_size"]),
        )
        for p in raw.get("policies", [])
    }
    return PolicyTable.from_export(raw, version=int(raw.get("policies_version") or 1)), shapes


def load_cases(spec: str) -> list[dict[str, Any]]:
    """The cases of ``--cases`` (module doc)."""
    from kvsplit.tuner.workloads import evaluation_cases, training_cases

    if spec == "eval":
        return evaluation_cases()
    if spec == "train":
        return training_cases()
    try:
        return list(json.load(open(spec))["cases"])
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(
            f"--cases: expected eval, train or a JSON file {{'cases': [...]}}, got {spec!r} ({exc})"
        ) from None


def summarize(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The A/B figures of per-batch rows (``a_s``, ``b_s``, ``oracle_s`` seconds, ``case``): geomean and worst of
    B / A, worst B / oracle and A / oracle, and the counts over the targets (1.03 and 1.05)."""
    if not rows:
        raise ValueError("no batch was compared")
    ba = [r["b_s"] / r["a_s"] for r in rows]
    bo = [r["b_s"] / r["oracle_s"] for r in rows]
    ao = [r["a_s"] / r["oracle_s"] for r in rows]
    worst = int(np.argmax(ba))
    return {
        "batches": len(rows),
        "geomean_b_over_a": geomean(ba),
        "worst_b_over_a": float(ba[worst]),
        "worst_b_over_a_case": rows[worst]["case"],
        "batches_b_over_a_above_1.03": sum(1 for x in ba if x > 1.03),
        "worst_b_over_oracle": float(max(bo)),
        "batches_b_over_oracle_above_1.05": sum(1 for x in bo if x > 1.05),
        "worst_a_over_oracle": float(max(ao)),
        "batches_a_over_oracle_above_1.05": sum(1 for x in ao if x > 1.05),
        "geomean_b_over_oracle": geomean(bo),
        "geomean_a_over_oracle": geomean(ao),
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tables", nargs=2, required=True, metavar=("A", "B"), help="the old and the new table (exports)")
    ap.add_argument("--cases", default="eval", help="eval (default), train or a JSON case file")
    ap.add_argument("--backend", choices=("gpu", "sim"), default="gpu", help="gpu (default) or sim (a CPU smoke run)")
    ap.add_argument("--gpu", default="NVIDIA H200", help="the GPU the tables are for (default: NVIDIA H200)")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--limit", type=int, default=0, help="compare only the first N batches (0: all)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."), help="folder of table_ab.json (default: $OUT or .)")
    args = ap.parse_args(argv)
    try:
        (tab_a, _), (tab_b, shapes_b) = (load_table(p) for p in args.tables)
        cases = load_cases(args.cases)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.limit < 0:
        print(f"error: --limit: expected N >= 0, got {args.limit}", file=sys.stderr)
        return 2
    todo = [c for c in cases if (c["num_kv_heads"], args.head_dim, args.dtype, args.page_size) in shapes_b]
    left_out = sorted(
        {(c["num_qo_heads"], c["num_kv_heads"]) for c in cases} - {(c["num_qo_heads"], c["num_kv_heads"]) for c in todo}
    )
    if args.limit:
        todo = todo[: args.limit]
    if not todo:
        print(f"error: --tables: B has no bucket of the batches' shapes {left_out}", file=sys.stderr)
        return 2
    print(
        f"{len(todo)} batches of {len(cases)} compared ({args.backend} backend)"
        + (f"; shapes (H_q, H_kv) B has no bucket for, left out: {left_out}" if left_out else ""),
        flush=True,
    )
    backends: dict[tuple[int, int], Any] = {}
    for hq, hkv in sorted({(c["num_qo_heads"], c["num_kv_heads"]) for c in todo}):
        mine = [c for c in todo if (c["num_qo_heads"], c["num_kv_heads"]) == (hq, hkv)]
        backends[(hq, hkv)] = make_backend(
            args.backend,
            gpu=args.gpu,
            num_qo_heads=hq,
            num_kv_heads=hkv,
            head_dim=args.head_dim,
            dtype=args.dtype,
            page_size=args.page_size,
            max_tokens=max(sum(c["kv_lens"]) for c in mine) + 4096,
            max_batch=max(len(c["kv_lens"]) for c in mine),
        )
    t0 = time.time()
    rows = []
    for c in todo:
        be = backends[(c["num_qo_heads"], c["num_kv_heads"])]
        lens = np.asarray(c["kv_lens"], dtype=np.int64)
        shape = dict(
            gpu=args.gpu,
            num_qo_heads=c["num_qo_heads"],
            num_kv_heads=c["num_kv_heads"],
            head_dim=args.head_dim,
            dtype=args.dtype,
            page_size=args.page_size,
        )
        served = {}
        for label, tab in (("A", tab_a), ("B", tab_b)):
            plan, bucket, _ = tab.plan(lens, **shape)
            served[label] = (plan, bucket.get("matched"))
        plans = {"A": served["A"][0], "B": served["B"][0]}
        for name in fitted_pool(SERVED_POOL, c["num_qo_heads"], c["num_kv_heads"]):  # as a campaign times it
            policy, params = parse_candidate(name)
            try:
                plans[name] = make_plan(
                    lens,
                    num_kv_heads=c["num_kv_heads"],
                    device=args.gpu,
                    policy=policy,
                    params=params,
                    head_dim=args.head_dim,
                    page_size=args.page_size,
                    dtype=args.dtype,
                )
            except ValueError:
                continue
        be.time_plan(plans["A"])  # discarded: the first timing after a batch change
        timed: dict[tuple, float] = {}
        times = {}
        for name, plan in plans.items():
            sig = plan.work_key()
            if sig not in timed:
                timed[sig] = float(be.time_plan(plan))
            times[name] = timed[sig]
        oracle = min(times.values())
        floor = float(be.hbm_floor_s(lens))
        row = {
            "case": c["id"],
            "set": c["set"],
            "family": c["family"],
            "B": c["B"],
            "T": c["T"],
            "num_kv_heads": c["num_kv_heads"],
            "a_bucket": served["A"][1],
            "b_bucket": served["B"][1],
            "a_s": times["A"],
            "b_s": times["B"],
            "oracle_s": oracle,
            "oracle": min(times, key=times.get),
            "floor_s": floor,
            "times": times,
        }
        rows.append(row)
        print(
            f"{c['id']:4d} {c['set']:7s} {c['family']:12s} B={c['B']:5d} T={c['T']:8d} H_kv={c['num_kv_heads']} "
            f"A {times['A'] / floor:.3f}x B {times['B'] / floor:.3f}x of the floor  B/A {times['B'] / times['A']:.3f} "
            f"B/oracle {times['B'] / oracle:.3f}  [{time.time() - t0:.0f}s]",
            flush=True,
        )
    summary = summarize(rows)
    summary.update(
        tables=list(args.tables), backend=args.backend, cases=args.cases, left_out_shapes=[list(s) for s in left_out]
    )
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "table_ab.json"), "w") as f:
        json.dump({"summary": summary, "batches": rows}, f, indent=1)
    label = (
        " (simulated with the GPU's uncalibrated datasheet defaults: a smoke run, not a measure of either table)"
        if args.backend == "sim"
        else ""
    )
    print(f"\nB = {args.tables[1]} against A = {args.tables[0]} on {summary['batches']} batches{label}:")
    print(f"  geomean B/A {summary['geomean_b_over_a']:.4f} (target <= 1.00)")
    print(
        f"  worst B/A {summary['worst_b_over_a']:.4f} on case {summary['worst_b_over_a_case']} (target <= 1.03; "
        f"{summary['batches_b_over_a_above_1.03']} batches above)"
    )
    print(
        f"  B/oracle worst {summary['worst_b_over_oracle']:.4f}, geomean {summary['geomean_b_over_oracle']:.4f} "
        f"(target <= 1.05 on every batch; {summary['batches_b_over_oracle_above_1.05']} above)"
    )
    print(
        f"  A/oracle worst {summary['worst_a_over_oracle']:.4f}, geomean {summary['geomean_a_over_oracle']:.4f} "
        f"({summary['batches_a_over_oracle_above_1.05']} above 1.05)"
    )
    print(f"  per batch: {os.path.join(args.out, 'table_ab.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
