"""A/B timing of two versions of the decode kernel on the same plans (H200).

    python bench/kernel_ab.py   # needs kernels/_decode_v1.py (the previous version) beside decode.py

Same method as tuner/gpu.py: CUDA-graph replays, do_bench median, random data.
"""

from __future__ import annotations

import importlib
import itertools
import json
import os
import time

import torch
import triton

from kvsplit.kernels.plan import make_plan
from kvsplit.tuner.gpu import GpuTimer
from kvsplit.tuner.workloads import family_kv_lens

new = importlib.import_module("kvsplit.kernels.decode")
old = importlib.import_module("kvsplit.kernels._decode_v1")


def time_with(mod, timer, plan):
    b = timer.batch(plan.kv_lens)
    out = torch.empty_like(b["q"])
    ws = mod.make_workspace(32, 128, max_partials=plan.num_partials, max_batch=plan.batch_size, device="cuda")
    args = (b["q"], timer.k_cache, timer.v_cache, b["kv_indptr"], b["kv_indices"], b["kv_lens"], plan)
    mod.decode_attention(*args, out=out, workspace=ws)
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        mod.decode_attention(*args, out=out, workspace=ws, validate=False)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        mod.decode_attention(*args, out=out, workspace=ws, validate=False)
    g.replay()
    torch.cuda.synchronize()
    return triton.testing.do_bench(g.replay, warmup=5, rep=30, return_mode="median") * 1e-3


def main():
    out_dir = os.environ.get("OUT", ".")
    timer = GpuTimer(num_qo_heads=32, num_kv_heads=4, head_dim=128, dtype="bfloat16", page_size=16,
                     max_tokens=1 << 20, max_batch=1024)
    bw = timer.read_bandwidth()
    print(f"read bandwidth {bw / 1e12:.3f} TB/s", flush=True)
    cases = [("uniform", 1), ("uniform", 16), ("uniform", 128), ("uniform", 512), ("skewed80", 16),
             ("skewed80", 64), ("skewed80", 512), ("2x40", 64), ("skewed40", 256)]
    cfgs = [dict(block_n=64, num_warps=2, num_stages=3), dict(block_n=64, num_warps=2, num_stages=2),
            dict(block_n=64, num_warps=4, num_stages=2), dict(block_n=128, num_warps=4, num_stages=2),
            dict(block_n=32, num_warps=2, num_stages=3), dict(block_n=128, num_warps=4, num_stages=3),
            dict(block_n=64, num_warps=4, num_stages=3), dict(block_n=128, num_warps=8, num_stages=2)]
    rows = []
    t0 = time.time()
    for T in (262144,):
        for fam, B in cases:
            lens = family_kv_lens(fam, B, T)
            floor = timer.hbm_floor_s(lens)
            best_old = best_new = (9e9, None)
            for cfg, ctas in itertools.product(cfgs, (4, 8, 12)):
                try:
                    plan = make_plan(lens, num_kv_heads=4, device="NVIDIA H200", policy="balanced",
                                     params=dict(cfg, ctas_per_sm=ctas, order="heavy_first"), dtype="bfloat16")
                except ValueError:
                    continue
                tn = time_with(new, timer, plan) / floor
                if cfg == cfgs[0] or ctas == 4:
                    to = time_with(old, timer, plan) / floor
                    best_old = min(best_old, (to, (cfg, ctas)), key=lambda x: x[0])
                else:
                    to = None
                best_new = min(best_new, (tn, (cfg, ctas)), key=lambda x: x[0])
                rows.append(dict(T=T, family=fam, B=B, cfg=cfg, ctas=ctas, new=tn, old=to))
            print(f"[{time.time() - t0:.0f}s] {fam:9s} B={B:4d} old best {best_old[0]:.3f} {best_old[1]}  "
                  f"new best {best_new[0]:.3f} {best_new[1]}", flush=True)
    json.dump(rows, open(os.path.join(out_dir, "kernel_ab.json"), "w"))


if __name__ == "__main__":
    main()
