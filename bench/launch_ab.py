"""A/B of ``launch_decode`` keyword overrides on the served plans of the evaluation batches (H200; issue 12).

    python bench/launch_ab.py --variant m1=merge_dsplit:1 [--variant nocap=maxnreg:0 ...] [--sets ref,trace] \
        [--oracle] --out $OUT

Each batch of the case file (scripts/make_sweep_cases.py; the served plan, and with ``--oracle`` also its
fastest re-timed plan, ``oracle_names[0]``) is timed with ``launch_decode``'s defaults (``base``) and with each
``--variant NAME=KW:VALUE[,KW:VALUE]`` (integers; e.g. ``m1=merge_dsplit:1``), back to back in one process,
the order of the variants rotated from batch to batch. Method (DESIGN.md §7): the hot path (``out``, a
preallocated workspace, plan uploaded, no validation) captured in a CUDA graph, replays timed with
``triton.testing.do_bench`` (median), random bf16 KV on shuffled pages (GpuTimer). Every variant's output is
compared with the base output of the same plan (bit-identical is not required: max abs difference is
recorded). One JSON line per (batch, plan) in OUT/launch_ab.jsonl; the geomean ratio variant / base per case
set is printed.

Round 6 ran it with ``--variant ip=item_prefetch:1 --oracle`` on a kernel with a temporary ``item_prefetch``
keyword (the next work item's request id loaded while the current item streams): geomean 1.000-1.001 per set
(docs/data/h200_r6/launch_ab_ip.log), so that kernel change was not kept.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
import time

import numpy as np
import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_sweep import named  # noqa: E402
from l2_state import graph_of  # noqa: E402

from kvsplit.kernels import decode as dec  # noqa: E402
from kvsplit.kernels.plan import make_plan  # noqa: E402
from kvsplit.tuner.gpu import GpuTimer, software_versions  # noqa: E402

GPU = "NVIDIA H200"


def parse_variant(text: str) -> tuple[str, dict]:
    """``NAME=KW:VALUE[,KW:VALUE]`` -> (NAME, {KW: int(VALUE)})."""
    name, _, spec = text.partition("=")
    if not name or not spec:
        raise SystemExit(f"--variant: expected NAME=KW:VALUE[,KW:VALUE], got {text!r}")
    kw = {}
    for part in spec.split(","):
        k, _, v = part.partition(":")
        kw[k] = int(v)
    return name, kw


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="bench/data/sweep_cases.json")
    ap.add_argument("--sets", default="ref,jitter,untuned,llama8b,trace")
    ap.add_argument("--variant", action="append", default=[], required=True)
    ap.add_argument("--oracle", action="store_true", help="also time each batch's fastest re-timed plan")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--rep-ms", type=float, default=10.0)
    ap.add_argument("--budget-s", type=float, default=400.0)
    args = ap.parse_args()
    variants = [parse_variant(v) for v in args.variant]
    t0 = time.time()
    log = open(os.path.join(args.out, "launch_ab.jsonl"), "a")

    def emit(rec: dict) -> None:
        log.write(json.dumps(rec) + "\n")
        log.flush()

    emit({"kind": "versions", **software_versions(), "variants": dict(variants)})
    sets = set(args.sets.split(","))
    cases = [c for c in json.load(open(args.cases))["cases"] if c["set"] in sets]
    timers = {}
    for hq, hkv in sorted({(c["num_qo_heads"], c["num_kv_heads"]) for c in cases}):
        mine = [c for c in cases if (c["num_qo_heads"], c["num_kv_heads"]) == (hq, hkv)]
        timers[(hq, hkv)] = GpuTimer(num_qo_heads=hq, num_kv_heads=hkv, head_dim=128, dtype="bfloat16",
                                     page_size=16, max_tokens=max(sum(c["kv_lens"]) for c in mine) + 4096,
                                     max_batch=max(len(c["kv_lens"]) for c in mine))
    ws = {k: dec.make_workspace(k[0], 128, max_partials=1 << 16, max_batch=4096, device="cuda") for k in timers}
    ratios: dict[tuple[str, str], list[float]] = {}
    for i, c in enumerate(cases):
        if time.time() - t0 > args.budget_s:
            print("budget reached", flush=True)
            break
        hq, hkv = c["num_qo_heads"], c["num_kv_heads"]
        t = timers[(hq, hkv)]
        lens = np.asarray(c["kv_lens"], dtype=np.int64)
        b = t.batch(lens)
        out = torch.empty((len(lens), hq, 128), dtype=torch.bfloat16, device="cuda")
        plans = [("served", (c["served"]["policy"], c["served"]["params"]))]
        if args.oracle and c.get("oracle_names"):
            plans.append(named(c["oracle_names"][0]))
        for pname, (pol, prm) in plans:
            plan = make_plan(lens, num_kv_heads=hkv, device=GPU, policy=pol, params=prm)
            arr = plan.to("cuda")
            sizes = plan.launch_sizes()
            names = ["base"] + [v for v, _ in variants]
            kws = {"base": {}, **dict(variants)}
            order = names[i % len(names):] + names[: i % len(names)]
            times, outs = {}, {}
            for v in order:
                fn = functools.partial(dec.launch_decode, b["q"], t.k_cache, t.v_cache, b["kv_indptr"],
                                       b["kv_indices"], arr, plan.config, out=out, workspace=ws[(hq, hkv)],
                                       **sizes, **kws[v])
                g = graph_of(fn)
                outs[v] = out.float().clone()
                times[v] = triton.testing.do_bench(g.replay, warmup=2, rep=args.rep_ms, return_mode="median") * 1e-3
                del g
            diff = {v: float((outs[v] - outs["base"]).abs().max()) for v in names[1:]}
            floor = t.hbm_floor_s(lens)
            emit({"kind": "case", "case": c["id"], "set": c["set"], "family": c["family"], "B": c["B"], "T": c["T"],
                  "num_kv_heads": hkv, "plan": pname, "floor_s": floor, "times": times, "max_abs_diff": diff})
            for v in names[1:]:
                ratios.setdefault((c["set"], v), []).append(times[v] / times["base"])
            print(f"{c['set']:8s} {c['family']:10s} B={c['B']:5d} T={c['T']:9d} {pname:7s} base "
                  f"{times['base'] / floor:.3f}x " + " ".join(f"{v} {times[v] / times['base']:.3f}" for v in names[1:])
                  + f"  [{time.time() - t0:.0f}s]", flush=True)
    for (s, v), r in sorted(ratios.items()):
        g = math.exp(float(np.mean(np.log(r))))
        print(f"{s:8s} {v}: geomean {g:.4f}  min {min(r):.3f}  max {max(r):.3f}  n={len(r)}", flush=True)


if __name__ == "__main__":
    main()
