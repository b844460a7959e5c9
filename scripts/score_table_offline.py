"""Score a policy table offline: the plan it serves each evaluation batch, timed in a full-grid GPU run (CPU).

    python scripts/score_table_offline.py                          # the shipped table (service/data)
    python scripts/score_table_offline.py --policies r8.json       # another export
    python scripts/score_table_offline.py --sweeps docs/data/h200_r6/train6.jsonl \
        [--pool 'stream_k|c3|n128w4s2,...']                        # a table rebuilt from these training sweeps

The table (the shipped export, or one built by scripts/build_shipped_policies.py from ``--sweeps`` with
``--pool`` into a temporary folder) serves every batch of bench/data/sweep_cases.json through
:class:`kvsplit.kernels.policy_table.PolicyTable`, as ``POST /v1/plan`` would; the served plan's time is looked
up in ``--grid`` (default docs/data/h200_r2/final.jsonl: the oracle's full search space on every evaluation
batch, about 150 plans each, timed on the H200 in round 2) and divided by that batch's fastest plan there. The
grid was timed with round 2's kernel, so the figures are a proxy for choosing between tables before re-timing
the winner on the GPU: on the shipped table it gives geomean 1.007 and worst 1.068, against 1.007 / 1.059 in
round 6's re-timing with today's kernel (docs/results.md). Prints the geomean / worst / count above 1.03 and
1.05, the served plans' mix and the worst batches.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np

from kvsplit.db import store
from kvsplit.kernels.policy_table import PolicyTable
from kvsplit.tuner.published import load_table_doc

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "bench"))
import build_shipped_policies as bsp  # noqa: E402
from gpu_sweep import plan_cand_name  # noqa: E402

GPU = "NVIDIA H200"


def served_names(policies_doc: dict, cases: list[dict]) -> dict[int, str]:
    """Case id -> candidate name (bench/gpu_sweep.py's naming) of the plan the table serves it."""
    with tempfile.TemporaryDirectory() as d:
        url = f"sqlite:///{d}/s.db"
        store.upgrade(url)
        with store.session_scope(url, write=True) as s:
            store.import_policies(s, policies_doc)
        table = PolicyTable.from_json(load_table_doc(url))
    out = {}
    for c in cases:
        p, _, _ = table.plan(np.asarray(c["kv_lens"]), gpu=GPU, num_qo_heads=c["num_qo_heads"],
                             num_kv_heads=c["num_kv_heads"], head_dim=128, dtype="bfloat16", page_size=16)
        out[c["id"]] = plan_cand_name(p.policy, p.params)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sweeps", default=None, help="comma-separated training sweeps to build the table from")
    ap.add_argument("--pool", default=None, help="comma-separated candidate names (default: SERVED_POOL)")
    ap.add_argument("--grid", default="docs/data/h200_r2/final.jsonl")
    ap.add_argument("--policies", default=None,
                    help="a policies export to score instead of the shipped one (e.g. an earlier round's: "
                         "git show 1eb581a:service/data/h200_policies.json > r8.json)")
    ap.add_argument("--cases", default="bench/data/sweep_cases.json")
    args = ap.parse_args()
    cases = json.load(open(args.cases))["cases"]
    if args.sweeps:
        pool = tuple(args.pool.split(",")) if args.pool else bsp.SERVED_POOL
        with tempfile.TemporaryDirectory() as d:
            bsp.main(args.sweeps.split(","), "bench/data/train_cases.json", data_dir=Path(d), pool=pool)
            doc = json.loads((Path(d) / "h200_policies.json").read_text())
    else:
        doc = json.loads(Path(args.policies or ROOT / "service/data/h200_policies.json").read_text())
    names = served_names(doc, cases)
    grid = {}
    for line in open(args.grid):
        r = json.loads(line)
        if r["kind"] == "case":
            grid[r["case"]] = {k: v for k, v in r["times"].items() if v and "|" in k}
    ratio = {}
    for cid, n in names.items():
        t = grid[cid]
        if n not in t:
            print(f"case {cid}: served plan {n} not in the grid run; skipped")
            continue
        ratio[cid] = t[n] / min(t.values())
    r = np.array(list(ratio.values()))
    print(f"{len(r)} batches: served / best of the grid: geomean {np.exp(np.log(r).mean()):.4f}, worst {r.max():.3f}, "
          f"> 1.03: {(r > 1.03).sum()}, > 1.05: {(r > 1.05).sum()}")
    print("served plans:", Counter(names.values()).most_common(8))
    by = {c["id"]: c for c in cases}
    for cid in sorted(ratio, key=ratio.get, reverse=True)[:6]:
        c = by[cid]
        print(f"  {c['set']:7s} {c['family']:10s} B={c['B']:5d} T={c['T']:8d} {names[cid]:28s} {ratio[cid]:.3f}")


if __name__ == "__main__":
    main()
