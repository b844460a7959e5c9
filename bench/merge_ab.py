"""What the merge launch costs, and its variants, on the H200 (issue 12).

    python bench/merge_ab.py --out $OUT [--T 1048576] [--families ...] [--B 1,64,512] [--plans NAME,...|served]
                             [--variants s1,auto,d1,d4,d16,ov] [--sets ref,trace]

Per case (bench/data/sweep_cases.json, the sets of ``--sets``, default the reference set ``ref``) and plan, in one process and back to back: the
plan's CUDA-graph replay on the hot path (random bf16 KV on shuffled pages, above the 60 MB L2), timed with
``triton.testing.do_bench`` (median), under each variant of the merge:

- ``s1``: stage 1 alone (``num_merge=0``: no merge launch; its time only, not a correct output);
- ``auto``: ``launch_decode``'s default (``merge_dsplit`` and ``merge_warps`` by its rules; ``w4`` is round 12's
  default);
- ``dN``: ``merge_dsplit=N`` programs per (merged request, query head), each over ``D / N`` of the head dim;
- ``wN``: the default with the merge launched on ``N`` warps (``merge_warps``);
- ``ovoff``: the default with the overlapped merge off (round 13's default);
- ``ov``: the overlapped merge (``merge_overlap=True``: launched with PDL beside stage 1, each program waiting
  on its (request, query head, chunk) arrival counter);
- ``np``, ``t0``, ``t1``, ``pN`` (with ``ov``): how the overlapped merge launches (``kernels/decode.py``
  ``_OVERLAP``): no PDL (the merge after stage 1, the protocol's cost alone); the PDL trigger at each stage-1
  CTA's start or at its tile's last item; N ns of back-off between the merge's polls; ``rl`` / ``aq``: volatile
  polls and one acquire read after them, or an acquire read at every poll;
- ``A+B``: both variants' keywords (e.g. ``ov+w4``, ``ov+t0+p0``).

Every variant other than ``s1`` is checked against ``auto``'s output (the same merge math: equal to 1e-2), and
after each variant's replays the overlapped merge's counters must be back at zero.
One JSON line per (case, plan) in OUT/merge_ab.jsonl; stdout gives variant - s1 in us (the merge's cost).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_sweep import Bench, add_ref_case_args, named, ref_cases  # noqa: E402  (the sweeps' bench and names)
from l2_state import graph_of  # noqa: E402  (one warm-up launch, capture, one replay)

from kvsplit.kernels import decode as dec  # noqa: E402
from kvsplit.kernels.plan import make_plan  # noqa: E402
from kvsplit.tuner.gpu import software_versions  # noqa: E402

GPU = "NVIDIA H200"
OVERLAP_DEFAULT = dict(dec._OVERLAP)
PLANS = ["stream_k|c1|n64w8s3|pf|h2|nx", "stream_k|c2|n32w4s3|pf|h2|nx", "balanced|c2|n32w4s3|pf|h2|nx"]


def variant_kwargs(v: str, plan) -> dict:
    """launch_decode keywords of variant ``v`` (module doc)."""
    if "+" in v:
        kw: dict = {}
        for part in v.split("+"):
            got = variant_kwargs(part, plan)
            kw["_overlap"] = {**kw.get("_overlap", {}), **got.pop("_overlap", {})}
            kw.update(got)
        return kw
    if v == "ov":
        return {"merge_overlap": True}
    if v == "ovoff":
        return {"merge_overlap": False}
    # how the overlapped merge launches (kernels/decode.py _OVERLAP): np = no PDL (the merge after stage 1),
    # t0 / t1 = trigger at each stage-1 CTA's start / at its tile's last item, pN = N ns between polls
    if v == "np":
        return {"_overlap": {"pdl": False}}
    if v in ("rl", "aq"):  # volatile polls then one acquire read / every poll an acquire read
        return {"_overlap": {"poll": "relaxed" if v == "rl" else "acquire"}}
    if v in ("t0", "t1"):
        return {"_overlap": {"trigger": "start" if v == "t0" else "last_item"}}
    if v[0] == "p" and v[1:].isdigit():
        return {"_overlap": {"poll_ns": int(v[1:])}}
    if v == "s1":
        return {"num_merge": 0}
    if v == "auto":
        return {}
    if v[0] == "d":
        return {"merge_dsplit": int(v[1:])}
    if v[0] == "w":
        return {"merge_warps": int(v[1:])}
    raise ValueError(f"--variants: unknown variant {v!r}")


def main() -> None:
    ap = argparse.ArgumentParser()
    add_ref_case_args(ap)
    ap.add_argument("--plans", default=",".join(PLANS))
    ap.add_argument("--variants", default="s1,auto,d1,d2,d4,d8,d16")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--budget-s", type=float, default=200.0)
    ap.add_argument("--rep-ms", type=float, default=10.0)
    args = ap.parse_args()
    t0 = time.time()
    cases = ref_cases(args)
    variants = args.variants.split(",")
    log = open(os.path.join(args.out, "merge_ab.jsonl"), "a")
    log.write(json.dumps({"kind": "versions", **software_versions()}) + "\n")
    bench = Bench(32, 4, max_tokens=max(sum(c["kv_lens"]) for c in cases) + 4096,
                  max_batch=max(len(c["kv_lens"]) for c in cases))
    timer, ws = bench.t, bench.ws
    bw = timer.read_bandwidth()
    log.write(json.dumps({"kind": "bandwidth", "bytes_per_s": bw}) + "\n")
    print(f"read bandwidth {bw / 1e12:.3f} TB/s  [{time.time() - t0:.0f}s]", flush=True)
    cost: dict[str, list[float]] = {v: [] for v in variants if v != "s1"}
    print(f"{'case':26s} {'plan':30s} {'merged':>6s} {'max n':>5s} {'s1/fl':>6s} "
          + " ".join(f"{v:>7s}" for v in variants if v != "s1") + "   (variant - s1, us)", flush=True)
    for c in cases:
        if time.time() - t0 > args.budget_s:
            print("budget reached; stopping", flush=True)
            break
        L = np.asarray(c["kv_lens"], dtype=np.int64)
        b = timer.batch(L)
        floor = timer.hbm_floor_s(L)
        for name in args.plans.split(","):
            if c.get("num_kv_heads", 4) != 4:
                continue
            # "served": the plan the shipped table serves the case (bench/data/sweep_cases.json)
            pol, prm = (c["served"]["policy"], c["served"]["params"]) if name == "served" else named(name)[1]
            p = make_plan(L, num_kv_heads=4, device=GPU, policy=pol, params=prm)
            arrays = p.to("cuda")
            base = p.launch_sizes()
            merged = base["num_merge"]
            times, outs, diff = {}, {}, {}
            for v in variants:
                out = torch.empty((p.batch_size, 32, 128), dtype=torch.bfloat16, device="cuda")
                kw = {**base, **variant_kwargs(v, p)}
                dec._OVERLAP = {**OVERLAP_DEFAULT, **kw.pop("_overlap", {})}  # read at launch (graph capture)
                g = graph_of(lambda: dec.launch_decode(b["q"], timer.k_cache, timer.v_cache, b["kv_indptr"],
                                                       b["kv_indices"], arrays, p.config, out=out, workspace=ws,
                                                       **kw))
                times[v] = triton.testing.do_bench(g.replay, warmup=2, rep=args.rep_ms, return_mode="median") * 1e-3
                del g
                left = int(ws.sync.abs().sum())
                if left:
                    print(f"  {v}: {left} arrivals left in workspace.sync after the replays", flush=True)
                    ws.sync.zero_()
                outs[v] = out
            for v in variants:
                if v not in ("s1", "auto") and "auto" in outs and merged:
                    diff[v] = float((outs[v].float() - outs["auto"].float()).abs().max())
                    if diff[v] > 1e-2:
                        print(f"  {v}: output differs from auto by {diff[v]:.3g}", flush=True)
            rec = {"kind": "merge_ab", "case": c["id"], "family": c["family"], "B": c["B"], "T": c["T"],
                   "plan": name, "policy": pol, "params": prm, "floor_s": floor, "merged": merged,
                   "max_splits": int(p.num_splits.max()),
                   "times": times, "max_abs_diff_vs_auto": diff}
            log.write(json.dumps(rec) + "\n")
            log.flush()
            s1 = times.get("s1")
            cells = []
            for v in variants:
                if v == "s1":
                    continue
                d = (times[v] - s1) * 1e6 if s1 is not None else times[v] / floor
                cells.append(f"{d:7.2f}")
                if s1 is not None and merged:
                    cost[v].append(times[v] / s1)
            print(f"{c['family'] + ' B=' + str(c['B']) + ' T=' + str(c['T']):26s} {name:30s} {merged:6d} "
                  f"{int(p.num_splits.max()):5d} {s1 / floor if s1 else float('nan'):6.3f} " + " ".join(cells)
                  + f"  [{time.time() - t0:.0f}s]", flush=True)
    g = lambda x: math.exp(sum(map(math.log, x)) / len(x)) if x else float("nan")  # noqa: E731
    for v, x in cost.items():
        if x:
            print(f"{v:8s} time / s1 over the cases with a merge: geomean {g(x):.4f} range {min(x):.4f}-{max(x):.4f} "
                  f"n={len(x)}")


if __name__ == "__main__":
    main()
