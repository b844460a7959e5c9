"""Per case, the fastest plan under each variant of a ``bench/stream_ab.py`` run (time / read floor).

    python scripts/stream_ab_summary.py docs/data/h200_r8/heads2_ab.jsonl [--variants decode,h2]

``bench/stream_ab.py`` times every (case, plan) under several variants of the kernel; this prints, for each case,
the best plan of each variant and the ratio of the bests (variant / first variant), and the geomean of those
ratios. Cases are (family, B, T) of the run's ``case`` records.
"""

from __future__ import annotations

import argparse
import json
import math


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run", help="stream_ab.jsonl of one run")
    ap.add_argument("--variants", default=None, help="comma-separated variants (default: all in the file)")
    args = ap.parse_args()
    recs = [json.loads(line) for line in open(args.run)]
    cases: dict[tuple, dict[str, tuple[float, str]]] = {}
    names: list[str] = []
    for r in recs:
        if r.get("kind") != "case":
            continue
        key = (r["family"], r["B"], r["T"])
        best = cases.setdefault(key, {})
        for v, t in r["times"].items():
            if v not in names:
                names.append(v)
            ratio = t / r["floor_s"]
            if v not in best or ratio < best[v][0]:
                best[v] = (ratio, r["plan"])
    variants = args.variants.split(",") if args.variants else names
    print(f"{'case':26s} " + "  ".join(f"{v:>10s} {'(plan)':28s}" for v in variants)
          + "".join(f"  {v + '/' + variants[0]:>12s}" for v in variants[1:]))
    logs = {v: [] for v in variants[1:]}
    for (fam, B, T), best in cases.items():
        row = "  ".join(f"{best[v][0]:10.4f} {best[v][1]:28s}" if v in best else f"{'-':>10s} {'':28s}"
                        for v in variants)
        ratios = ""
        for v in variants[1:]:
            if v in best and variants[0] in best:
                q = best[v][0] / best[variants[0]][0]
                logs[v].append(math.log(q))
                ratios += f"  {q:12.4f}"
            else:
                ratios += f"  {'-':>12s}"
        print(f"{fam + ' B=' + str(B) + ' T=' + str(T):26s} {row}{ratios}")
    for v, lg in logs.items():
        if lg:
            print(f"geomean best {v} / best {variants[0]}: {math.exp(sum(lg) / len(lg)):.4f} over {len(lg)} cases, "
                  f"range {math.exp(min(lg)):.4f}-{math.exp(max(lg)):.4f}")


if __name__ == "__main__":
    main()
