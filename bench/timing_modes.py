"""Repeatability of one plan's time on the H200: the same plan, captured and timed many times.

The final sweep (docs/data/h200_r2/retime.log) timed one stream_k plan three times per case; at
T = 1,048,576 about one timing in five ran ~14 % slower than the others. This script times a few
plans of two batches ``--reps`` times each (a fresh plan upload + CUDA-graph capture + do_bench
median every time, as bench/gpu_sweep.py does), and also as plain launches without a graph, and
prints min / median / max time over the read floor and how many repetitions were > 8 % above the
minimum. Plans: full residency (tiles == resident slots) and with one slot per SM to spare.

    python bench/timing_modes.py [--reps 12] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
import triton

sys.path.insert(0, os.path.dirname(__file__))
from gpu_sweep import Bench  # noqa: E402

from kvsplit.kernels import decode as dec  # noqa: E402
from kvsplit.kernels.plan import make_plan  # noqa: E402
from kvsplit.tuner.workloads import family_kv_lens  # noqa: E402

PLANS = [
    ("stream_k c3 (128,4,2) full", "stream_k", {"ctas_per_sm": 3, "block_n": 128, "num_warps": 4, "num_stages": 2}),
    ("stream_k c2 (128,4,2) spare", "stream_k", {"ctas_per_sm": 2, "block_n": 128, "num_warps": 4, "num_stages": 2}),
    ("stream_k c2 (128,4,3) full", "stream_k", {"ctas_per_sm": 2, "block_n": 128, "num_warps": 4, "num_stages": 3}),
    ("balanced c4 (64,4,2) full", "balanced", {"ctas_per_sm": 4, "block_n": 64, "num_warps": 4, "num_stages": 2}),
    ("balanced c3 (64,4,2) spare", "balanced", {"ctas_per_sm": 3, "block_n": 64, "num_warps": 4, "num_stages": 2}),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=12)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--cache-tokens", type=int, default=1 << 21,
                    help="KV cache size in tokens (pages shuffled over all of it): 2^21 = 4 GB, 12.3M = 25 GB "
                         "(the final sweep's cache)")
    ap.add_argument("--flashinfer", action="store_true", help="also time FlashInfer's kernel on the same batches")
    ap.add_argument("--tag", default="")
    args = ap.parse_args()
    bench = Bench(32, 4, args.cache_tokens, 1024)
    fi = None
    if args.flashinfer:
        from gpu_sweep import fi_timer

        fi = fi_timer(bench)
    bw = bench.t.read_bandwidth()
    out = []
    import time

    for fam, B in (("uniform", 8), ("skewed80", 64)):
        L = family_kv_lens(fam, B, 1 << 20)
        floor = bench.t.hbm_floor_s(L)
        graphs: dict[str, list] = {name: [] for name, _, _ in PLANS}
        stamps: dict[str, list] = {name: [] for name, _, _ in PLANS}
        fis: list[float] = []
        for _ in range(args.reps):  # plans interleaved, so a slow period of the GPU hits all of them alike
            for name, pol, prm in PLANS:
                p = make_plan(L, num_kv_heads=4, device="NVIDIA H200", policy=pol, params=prm)
                graphs[name].append(bench.time_plan(p, 10.0) / floor)
                stamps[name].append(time.time())
            if fi is not None:
                fis.append(fi(L, 10.0) / floor)
        print(f"{args.tag} cache {args.cache_tokens} tokens, {fam} B={B}: rep x plan (time / read floor), plans in "
              f"the order of PLANS{', then FlashInfer' if fis else ''}", flush=True)
        for i in range(args.reps):
            print("  " + " ".join(f"{graphs[n][i]:.3f}" for n, _, _ in PLANS)
                  + (f"  {fis[i]:.3f}" if fis else ""), flush=True)
        for name, pol, prm in PLANS:
            graph, plain = graphs[name], []
            for _ in range(max(2, args.reps // 3)):
                p = make_plan(L, num_kv_heads=4, device="NVIDIA H200", policy=pol, params=prm)
                b = bench.t.batch(p.kv_lens)
                o = bench.out[B]
                args_ = (b["q"], bench.t.k_cache, bench.t.v_cache, b["kv_indptr"], b["kv_indices"], b["kv_lens"], p)
                fn = lambda: dec.decode_attention(*args_, out=o, workspace=bench.ws, validate=False)  # noqa: E731
                fn()
                plain.append(triton.testing.do_bench(fn, warmup=2, rep=10, return_mode="median") * 1e-3 / floor)
            g = np.asarray(graph)
            rec = {"family": fam, "B": B, "plan": name, "graph": graph, "stamps": stamps[name], "plain": plain,
                   "read_bw": bw}
            out.append(rec)
            print(f"{fam:8s} B={B:3d} {name:28s} graph min {g.min():.3f} med {np.median(g):.3f} max {g.max():.3f} "
                  f"slow(>1.08 min) {int((g > 1.08 * g.min()).sum())}/{len(g)}   plain min {min(plain):.3f} "
                  f"max {max(plain):.3f}", flush=True)
    with open(os.path.join(args.out, f"timing_modes{args.tag}.json"), "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
