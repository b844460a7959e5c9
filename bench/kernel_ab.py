"""A/B timing of decode-kernel versions on the same plans, in one process (H200; issue 12).

    python bench/kernel_ab.py --cases bench/data/sweep_cases.json --sets ref --out $OUT [--budget-s 300]

Variants:

- ``A``: the kernel before issue 12 (bench/kernel_a.py, a frozen copy of kernels/decode.py at 66babf4);
- ``B``: the current kernel, running the plan's own config (``prefetch``, ``heads_per_tile``, ``next_item``);
- ``B_pf``: the current kernel with the page ids of the next tile loaded one iteration ahead
  (``prefetch=True``), which lets Triton's pipeliner multi-buffer K/V (the one-tile section only).

Each case is timed on the plans variant A can run (one KV head per tile, no ``prefetch``, no ``next_item``:
A_PLANS, round 9's one-head pool of the shipped table, and STAGE3) under A and B, and on B's own plans (the
served plan of the cases file, round 9's served plan, and B_PLANS, the plans with two heads per tile, the
prefetch and the look-ahead that won cases in rounds 9-11) under B only. Issue 12's "<= 1.02x today's kernel"
is the best B plan's time over the best A plan's, per case. Before that: one work tile per SM (an even
partition with num_SMs tiles: ``stream_k`` at ctas_per_sm = 1 with H_kv = 4, T = 1,048,576, uniform
B = 8) under every config of ONE_TILE_CONFIGS, as a fraction of the read bandwidth, under A, B and B_pf
(B with ``prefetch=True``: the page ids of the next tile loaded one iteration ahead).

Method (DESIGN.md §7): the hot path (``out``, a preallocated workspace, plan uploaded, no validation)
captured in a CUDA graph, replays timed with ``triton.testing.do_bench`` (median); random bf16 KV on
shuffled pages spanning GBs (above the 60 MB L2); the variants of one plan are timed back to back.
Ratios are to the read floor (KV bytes / streaming-read bandwidth measured in this run). Every record
is a JSON line in OUT/kernel_ab.jsonl; a summary is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernel_a  # noqa: E402  (bench/kernel_a.py, the frozen variant A)
from gpu_sweep import named  # noqa: E402  (the candidate names of the sweeps)
from l2_state import graph_of  # noqa: E402  (one warm-up launch, capture, one replay)

from kvsplit.kernels import decode as dec  # noqa: E402
from kvsplit.kernels.plan import make_plan  # noqa: E402
from kvsplit.tuner.gpu import GpuTimer, software_versions  # noqa: E402

GPU = "NVIDIA H200"
ONE_TILE_CONFIGS = [(256, 8, 2), (128, 8, 3), (64, 4, 3), (64, 4, 4), (64, 8, 3), (64, 8, 4), (128, 4, 3),
                    (128, 8, 4), (32, 4, 4)]
# stage-3 tiles at their resident CTAs per SM (the same with and without the prefetch, except (128, 4, 3):
# 2 -> 1; registers and shared memory of the sm_90 compile)
STAGE3 = [("stream_k", 3, (64, 4, 3)), ("stream_k", 2, (64, 8, 3)), ("stream_k", 4, (32, 4, 3)),
          ("balanced", 3, (64, 4, 3)), ("stream_k", 1, (128, 8, 3))]
# the one-head plans of round 9's served pool (bench/r11_call4.sh's POOL): variant A runs these
A_PLANS = ["stream_k|c3|n128w4s2", "stream_k|c3|n64w4s3", "stream_k|c2|n128w4s3", "stream_k|c3|n128w4s2|o2m4",
           "balanced|c3|n128w4s2", "balanced|c4|n128w4s2", "balanced|c4|n64w4s2"]
# plans only B runs: the winners of the reference cases in round 11's call 4 (docs/data/h200_r11/eval11_nx.log) and
# balanced|c4|n32w4s2|h2, the unsplit two-head tile round 11's Optuna search per case found for uniform B >= 256
B_PLANS = ["stream_k|c1|n64w4s3|pf|h2|nx", "stream_k|c1|n64w8s3|pf|h2|nx", "balanced|c1|n64w4s3|pf|h2|nx",
           "stream_k|c1|n64w8s3|pf|h2", "balanced|c3|n32w4s3|pf|h2", "balanced|c3|n64w4s2|h2",
           "stream_k|c3|n32w4s3|pf|h2", "balanced|c4|n32w4s2|h2"]


def runs_on_a(config) -> bool:
    """Whether variant A (66babf4) can run a plan of this KernelConfig: it has none of issue 12's knobs."""
    return config.heads_per_tile == 1 and not config.prefetch and not config.next_item


def parse_name(name: str) -> tuple[str, dict]:
    """``policy|c<ctas>|n<block_n>w<warps>s<stages>[|o<item_cost>m<min_piece>]`` -> (policy, params)
    (bench/gpu_sweep.py's candidate names)."""
    return named(name)[1]


class AB:
    def __init__(self, hq: int, hkv: int, max_tokens: int, max_batch: int, rep_ms: float):
        self.t = GpuTimer(num_qo_heads=hq, num_kv_heads=hkv, head_dim=128, dtype="bfloat16", page_size=16,
                          max_tokens=max_tokens, max_batch=max_batch)
        self.hq, self.hkv, self.rep_ms = hq, hkv, rep_ms
        self.ws_a = kernel_a.make_workspace(hq, 128, max_partials=1 << 16, max_batch=max_batch, device="cuda")
        self.ws_b = dec.make_workspace(hq, 128, max_partials=1 << 16, max_batch=max_batch, device="cuda")

    def _graph_time(self, fn) -> float:
        g = graph_of(fn)
        ms = triton.testing.do_bench(g.replay, warmup=2, rep=self.rep_ms, return_mode="median")
        del g
        return ms * 1e-3

    def time_variants(self, plan, variants: list[str]) -> dict[str, float]:
        b = self.t.batch(plan.kv_lens)
        out = torch.empty((plan.batch_size, self.hq, 128), dtype=torch.bfloat16, device="cuda")
        arrays = plan.to("cuda")
        n_merge = int(plan.merge_layout()[1].shape[0])
        max_splits = int(plan.num_splits.max())
        args = (b["q"], self.t.k_cache, self.t.v_cache, b["kv_indptr"], b["kv_indices"])

        def run(v: str):
            if v == "A":
                return lambda: kernel_a.decode_attention(*args, b["kv_lens"], plan, out=out, workspace=self.ws_a,
                                                         validate=False)
            return lambda: dec.launch_decode(*args, arrays, plan.config, out=out, workspace=self.ws_b,
                                             num_tiles=plan.num_work_tiles, num_merge=n_merge,
                                             max_splits=max_splits, prefetch=True if v == "B_pf" else None)

        return {v: self._graph_time(run(v)) for v in variants}

    def max_error(self, plan, prefetch: bool) -> float:
        b = self.t.batch(plan.kv_lens)
        out = torch.full((plan.batch_size, self.hq, 128), float("nan"), dtype=torch.bfloat16, device="cuda")
        dec.launch_decode(b["q"], self.t.k_cache, self.t.v_cache, b["kv_indptr"], b["kv_indices"], plan.to("cuda"),
                          plan.config, out=out, workspace=self.ws_b, **plan.launch_sizes(), prefetch=prefetch)
        ref = dec.reference_decode_attention(b["q"], self.t.k_cache, self.t.v_cache, b["kv_indptr"], b["kv_indices"],
                                             b["kv_lens"])
        return float((out.float() - ref.float()).abs().max() / ref.float().abs().max())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="bench/data/sweep_cases.json")
    ap.add_argument("--sets", default="ref", help="comma-separated case sets of the cases file")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--budget-s", type=float, default=300.0)
    ap.add_argument("--rep-ms", type=float, default=10.0)
    args = ap.parse_args()
    t0 = time.time()
    log = open(os.path.join(args.out, "kernel_ab.jsonl"), "a")

    def emit(rec: dict) -> None:
        log.write(json.dumps(rec) + "\n")
        log.flush()

    sets = set(args.sets.split(","))
    cases = [c for c in json.load(open(args.cases))["cases"] if c["set"] in sets]
    emit({"kind": "versions", **software_versions()})
    ab = AB(32, 4, max(max(sum(c["kv_lens"]) for c in cases), 1 << 20) + 4096,
            max(len(c["kv_lens"]) for c in cases), args.rep_ms)
    bw = ab.t.read_bandwidth()
    emit({"kind": "bandwidth", "bytes_per_s": bw})
    print(f"read bandwidth {bw / 1e12:.3f} TB/s  [{time.time() - t0:.0f}s]", flush=True)

    # correctness of the prefetching loop on a skewed batch, bf16
    rng = np.random.default_rng(0)
    lens = np.concatenate([[50000], rng.integers(0, 4000, 200)])
    for pol, prm in (("stream_k", {"ctas_per_sm": 2, "block_n": 64, "num_stages": 4}),
                     ("balanced", {"ctas_per_sm": 8, "block_n": 32, "num_stages": 3})):
        p = make_plan(lens, num_kv_heads=4, device=GPU, policy=pol, params=prm)
        errs = {f: ab.max_error(p, f) for f in (False, True)}
        emit({"kind": "check", "policy": pol, "params": prm, "max_rel_err": errs})
        print(f"check {pol} {prm}: max rel err {errs[False]:.2e} prefetch {errs[True]:.2e}", flush=True)
        assert max(errs.values()) < 2e-2

    # one work tile per SM: T = 1M uniform B = 8, stream_k with 132 tiles in all
    lens = np.full(8, (1 << 20) // 8)
    floor = ab.t.hbm_floor_s(lens)
    for cfg in ONE_TILE_CONFIGS:
        prm = {"ctas_per_sm": 1.0, "block_n": cfg[0], "num_warps": cfg[1], "num_stages": cfg[2]}
        p = make_plan(lens, num_kv_heads=4, device=GPU, policy="stream_k", params=prm)
        times = ab.time_variants(p, ["A", "B", "B_pf"])
        emit({"kind": "one_tile", "config": cfg, "tiles": p.num_work_tiles, "floor_s": floor, "times": times})
        print(f"one tile/SM {cfg}: {p.num_work_tiles} tiles: " +
              "  ".join(f"{k} {floor / v * 100:.1f}% of bw" for k, v in times.items()) +
              f"  [{time.time() - t0:.0f}s]", flush=True)

    # every case: A's plans under A and B, B's own plans (served, round 9's served, B_PLANS) under B
    for c in cases:
        if time.time() - t0 > args.budget_s:
            print("budget reached; stopping", flush=True)
            break
        L = np.asarray(c["kv_lens"], dtype=np.int64)
        floor = ab.t.hbm_floor_s(L)
        names = [(n, parse_name(n)) for n in A_PLANS]
        names += [(f"{pol}|c{cps}|n{cfg[0]}w{cfg[1]}s{cfg[2]}", (pol, {"ctas_per_sm": float(cps), "block_n": cfg[0],
                   "num_warps": cfg[1], "num_stages": cfg[2]})) for pol, cps, cfg in STAGE3]
        names += [(k, (c[k]["policy"], c[k]["params"])) for k in ("served", "served_prev") if k in c]
        names += [(n, parse_name(n)) for n in B_PLANS]
        res = {}
        for name, (pol, prm) in names:
            p = make_plan(L, num_kv_heads=c["num_kv_heads"], device=GPU, policy=pol, params=prm)
            res[name] = ab.time_variants(p, ["A", "B"] if runs_on_a(p.config) else ["B"])
        emit({"kind": "case", "case": c["id"], "set": c["set"], "family": c["family"], "B": c["B"], "T": c["T"],
              "floor_s": floor, "times": res})
        best_a = min((r["A"], k) for k, r in res.items() if "A" in r)
        best_b = min((r["B"], k) for k, r in res.items())
        same = [r["B"] / r["A"] for r in res.values() if "A" in r]
        print(f"{c['family']:10s} B={c['B']:4d} T={c['T']:8d} best A {best_a[0] / floor:.3f}x ({best_a[1]})  "
              f"best B {best_b[0] / floor:.3f}x ({best_b[1]})  B/A {best_b[0] / best_a[0]:.3f}  same plan B/A "
              f"{min(same):.3f}-{max(same):.3f}  [{time.time() - t0:.0f}s]", flush=True)


if __name__ == "__main__":
    main()
