"""Turn the whole-wave rule on per shipped policy where the H200 training timings say it wins (CPU; issue 9).

    python scripts/enable_whole_wave.py [--timings docs/data/h200_r6/train6.jsonl] [--eps 0.05] [--write]
        [--on-kv-heads 4]

(round 7: docs/data/h200_r7/enable_whole_wave.log; round 9: docs/data/h200_r9/enable_whole_wave.log)

The rule (``params.whole_wave``, :func:`kvsplit.kernels.policies.whole_wave_config`) plans one work tile per
request on the (64, 4, 2) or (128, 4, 2) tile when those tiles fill at most two resident waves within an excess
``eps``. Whether that beats a policy's own plan depends on the shape and the lengths (measured, round 7:
near-even batches of the Qwen3-30B-A3B shape gain up to 3.6 %, the Llama-3.1-8B shape's lose up to 3 % on
(64, 4, 2)), so it is decided per published policy, from timings only:

1. every *training* batch of ``bench/data/train_cases.json`` timed in ``--timings`` (a ``bench/gpu_sweep.py
   --mode train`` run with today's kernel; the evaluation batches are never read) is served by the shipped
   table (``service/data/h200_policies.json``) as a user would be: the nearest published policy;
2. for each such batch the rule would act on, the time of the policy that serves it and of the whole-request
   plan on the rule's tile, in that same run (some timed candidate makes exactly that plan: one split per
   request on that tile), gathered per shape family (GPU, H_kv, head_dim, dtype, page size);
3. the rule is written into the params of every policy of a family when at least one such batch exists, every
   one has both timings, and the whole-request plans are faster in geomean with none more than :data:`WORST`
   slower. The decision is per family, not per policy: the rule's outcome is a property of the tiles'
   residency and streaming rate at the shape's GQA group, each policy serves one or two near-even training
   batches at most, and near-even batches straddle the key's length bins (128 requests of 2,048 +- 0.5 %
   tokens reach another key than 128 of exactly 2,048), so a per-policy switch would leave most of them out.

Without ``--write`` it prints the decision per family with the evidence per policy; with it, rewrites the
shipped policies file (each enabled policy's params gain ``"whole_wave": eps``, and ``"whole_wave_heads"`` with
``--heads`` above 1; nothing else changes).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from kvsplit.kernels.buckets import bucket_key
from kvsplit.kernels.device import DeviceSpec
from kvsplit.kernels.plan import make_plan
from kvsplit.kernels.policies import fit_heads_per_tile, whole_wave_config
from kvsplit.kernels.policy_table import PolicyTable
from kvsplit.kernels.registry import PlanContext
from kvsplit.tuner.simfit import candidate_policy

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from gpu_sweep import plan_cand_name  # noqa: E402

GPU = "NVIDIA H200"
WORST = 1.01
"""A policy keeps the rule off if any training batch it serves runs its whole-request plan more than this much
slower than its own plan (ten-repetition timings vary by < 1 %, docs/perf.md round 3)."""


def decide(doc: dict, cases: list[dict], timings: Path, eps: float, heads: int = 1) -> dict[int, dict]:
    """Per published policy id: the batches the rule acts on and their whole-request / own-plan time ratios."""
    dev = DeviceSpec.known(GPU)
    table = PolicyTable.from_export(doc)
    by_id = {c["id"]: c for c in cases}
    out: dict[int, dict] = defaultdict(lambda: {"ratios": [], "missing": [], "batches": 0})
    for line in open(timings):
        r = json.loads(line)
        if r.get("kind") != "case":
            continue
        c = by_id[r["case"]]
        L = np.asarray(c["kv_lens"], dtype=np.int64)
        hkv = c["num_kv_heads"]
        key = bucket_key(L, num_kv_heads=hkv, head_dim=128, dtype="bfloat16", device=GPU)
        entry, _ = table.lookup(key)
        if entry is None:
            continue
        rec = out[entry.id]
        rec["batches"] += 1
        # the rule's tiles of up to ``heads`` KV heads, as the table refits them to the batch's GQA group
        h = fit_heads_per_tile({"whole_wave_heads": heads}, c["num_qo_heads"], hkv)["whole_wave_heads"]
        tile = whole_wave_config(L, PlanContext(dev, hkv, 128, 16, "bfloat16"), eps, heads=h)
        if tile is None:
            continue
        t = r["times"]
        own = t.get(plan_cand_name(entry.name, dict(entry.params)))
        whole = None
        for name, v in t.items():
            cp = candidate_policy(name)
            if cp is None or v is None:
                continue
            p = make_plan(L, num_kv_heads=hkv, device=dev, policy=cp[0], params=cp[1])
            if int(p.num_splits.max()) == 1 and p.config == tile:
                whole = v if whole is None else min(whole, v)
        label = f"{c['set']}:{c['family']}:B{len(L)}:T{int(L.sum())}:H{hkv}"
        if own is None or whole is None:
            rec["missing"].append(label)
        else:
            rec["ratios"].append((label, (tile.block_n, tile.num_warps, tile.num_stages)
                                  + ((f"pf h{tile.heads_per_tile}",) if tile.heads_per_tile > 1 else ()), whole / own))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--timings", default="docs/data/h200_r6/train6.jsonl")
    ap.add_argument("--cases", default="bench/data/train_cases.json")
    ap.add_argument("--policies", default="service/data/h200_policies.json")
    ap.add_argument("--eps", type=float, default=0.05)
    ap.add_argument("--heads", type=int, default=1,
                    help="whole_wave_heads of the enabled policies: the rule may also run WHOLE_WAVE_HEADS_TILES "
                         "tiles of up to this many KV heads (round 9: 2)")
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--on-kv-heads", default="",
                    help="comma-separated H_kv whose family gets the rule whatever these timings decide (a decision "
                         "made on other evidence: round 9 keeps round 7's for H_kv 4, docs/perf.md)")
    args = ap.parse_args()
    doc = json.loads((ROOT / args.policies).read_text())
    cases = json.loads((ROOT / args.cases).read_text())["cases"]
    dec = decide(doc, cases, ROOT / args.timings, args.eps, args.heads)
    family_of = {p["id"]: tuple(p["bucket"][k] for k in ("gpu", "num_kv_heads", "head_dim", "dtype", "page_size"))
                 for p in doc["policies"]}
    per_family: dict[tuple, dict] = defaultdict(lambda: {"ratios": [], "missing": []})
    for p in doc["policies"]:
        rec = dec.get(p["id"])
        if rec is None or not (rec["ratios"] or rec["missing"]):
            continue
        fam = per_family[family_of[p["id"]]]
        fam["ratios"] += [x for _, _, x in rec["ratios"]]
        fam["missing"] += rec["missing"]
        print(f"policy {p['id']:4d} {p['bucket']['key']:55s} {p['name']:9s} serves {rec['batches']:3d}")
        for label, tile, x in rec["ratios"]:
            print(f"      {label:40s} tile {tile}: whole-request / own plan {x:.3f}")
        for label in rec["missing"]:
            print(f"      {label:40s} no timing of one of the two plans")
    on = set()
    forced_kv = {int(x) for x in args.on_kv_heads.split(",") if x.strip()}
    for fam, rec in sorted(per_family.items()):
        rs = rec["ratios"]
        geo = math.exp(sum(math.log(x) for x in rs) / len(rs)) if rs else float("nan")
        ok = bool(rs) and not rec["missing"] and geo < 1.0 and max(rs) <= WORST
        print(f"family {fam}: {len(rs)} batches taken, geomean {geo:.4f}, worst {max(rs) if rs else float('nan'):.4f}, "
              f"{len(rec['missing'])} untimed -> {'ON' if ok else 'off'}")
        forced = fam[1] in forced_kv
        if forced and not ok:
            print(f"    -> ON by --on-kv-heads {fam[1]}")
        if ok or forced:
            on.add(fam)
    enabled = [p["id"] for p in doc["policies"] if family_of[p["id"]] in on]
    print(f"{len(enabled)} policies get whole_wave = {args.eps} (families {sorted(on)})")
    if args.write:
        for p in doc["policies"]:
            if p["id"] in enabled:
                p["params"] = {**p["params"], "whole_wave": args.eps}
                if args.heads > 1:
                    p["params"]["whole_wave_heads"] = args.heads
        (ROOT / args.policies).write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {args.policies}")


if __name__ == "__main__":
    main()
