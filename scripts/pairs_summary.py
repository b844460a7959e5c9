"""Summarise ``bench/gpu_sweep.py --mode pairs`` runs: per case and record name the time over the read floor, and
per group of names (``--groups A=n1,n2 B=n3``) the best of the group per case and the ratio of two groups.

    python scripts/pairs_summary.py RUN.jsonl [RUN_rev.jsonl] --groups h2=...,... h4=...,... [--vs h4/h2]

With two runs (the same pairs in both orders) a (case, name) time is the geometric mean of the two.
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict


def load(paths) -> tuple[dict[tuple[int, str], float], dict[int, tuple[int, str, int, float]]]:
    """``({(case id, record name): time s}, {case id: (T, family, B, floor s)})`` of the ``case`` records of
    ``paths``; a (case, name) timed in several runs gets the geometric mean of its times."""
    times = defaultdict(list)
    meta = {}
    for p in paths:
        for line in open(p):
            r = json.loads(line)
            if r.get("kind") != "case":
                continue
            meta[r["case"]] = (r["T"], r["family"], r["B"], r["floor_s"])
            for k, v in r["times"].items():
                if v:
                    times[(r["case"], k)].append(v)
    return {k: math.exp(sum(map(math.log, v)) / len(v)) for k, v in times.items()}, meta


def best_of(t: dict[tuple[int, str], float], ids, members) -> dict[int, float]:
    """Per case id of ``ids``: the fastest time among the record names ``members`` timed on it (cases where none
    was timed are left out)."""
    out = {}
    for c in ids:
        v = [t[(c, n)] for n in members if (c, n) in t]
        if v:
            out[c] = min(v)
    return out


def geomean(xs) -> float:
    xs = list(xs)
    return math.exp(sum(map(math.log, xs)) / len(xs))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--groups", nargs="*", default=[])
    ap.add_argument("--vs", nargs="*", default=[], help="A/B: best of group A over best of group B per case")
    args = ap.parse_args()
    t, meta = load(args.runs)
    groups = {g.split("=", 1)[0]: g.split("=", 1)[1].split(",") for g in args.groups}
    names = sorted({k[1] for k in t})
    for T in sorted({m[0] for m in meta.values()}):
        ids = sorted(c for c, m in meta.items() if m[0] == T)
        print(f"\nT = {T}: time / read floor (best of each group; per name geomean over {len(ids)} cases)")
        for n in names:
            r = [t[(c, n)] / meta[c][3] for c in ids if (c, n) in t]
            if r:
                print(f"  {n:34s} geomean {geomean(r):.4f}  min {min(r):.3f} "
                      f"max {max(r):.3f}  ({len(r)} cases)")
        best = {(g, c): v for g, members in groups.items() for c, v in best_of(t, ids, members).items()}
        hdr = " ".join(f"{g:>8s}" for g in groups)
        print(f"  {'family':10s} {'B':>5s} {hdr}")
        for c in ids:
            T_, fam, B, fl = meta[c]
            print(f"  {fam:10s} {B:5d} " + " ".join(f"{best[(g, c)] / fl:8.3f}" if (g, c) in best else f"{'-':>8s}"
                                                  for g in groups))
        for g in groups:
            r = [best[(g, c)] / meta[c][3] for c in ids if (g, c) in best]
            if r:
                print(f"  group {g}: best per case {min(r):.3f}-{max(r):.3f}; <= 1.05: {sum(x <= 1.05 for x in r)}, "
                      f"<= 1.15: {sum(x <= 1.15 for x in r)} of {len(r)}")
        for vs in args.vs:
            a, b = vs.split("/")
            r = [best[(a, c)] / best[(b, c)] for c in ids if (a, c) in best and (b, c) in best]
            if r:
                print(f"  {a}/{b}: geomean {geomean(r):.4f} min {min(r):.3f} "
                      f"max {max(r):.3f}; faster on {sum(x < 1 for x in r)} of {len(r)}")


if __name__ == "__main__":
    main()
