"""Compile the head-fused stage-1 prototype (bench/kernel_hf.py) for sm_90 without a GPU and report its resources.

    python bench/compile_hf_sm90.py [--configs 16,4,2 32,8,3,pf ...] [--layouts 3d,2d] [--ttgir DIR]

(without TRITON_INTERPRET). For each (BLOCK_N, warps, stages[, pf]) the stage-1 launch of ``hf_launch`` for a
small case of the reference shape (H_q 32, H_kv 4, D 128, bf16, page 16) is recorded, compiled for
``GPUTarget("cuda", 90, 32)`` and read back with bench/compile_sm90.py's helpers: registers, spill stores,
shared memory, the CTAs per SM they allow, and from the TTGIR the MMA version of the batched dots and the
cp.async K/V loads.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernel_hf as khf  # noqa: E402
from compile_sm90 import _Recorder, compile_sm90, resources  # noqa: E402

from kvsplit.kernels import decode as dec  # noqa: E402
from kvsplit.kernels.device import DeviceSpec  # noqa: E402
from kvsplit.kernels.plan import make_plan  # noqa: E402
from kvsplit.kernels.residency import occupancy  # noqa: E402

DEFAULT = [(bn, w, s, pf) for bn in (16, 32) for w in (4, 8) for s in (2, 3) for pf in ((0, 1) if s >= 3 else (0,))]


def record(block_n, num_warps, num_stages, prefetch, layout="3d", hq=32, hkv=4, d=128, page_size=16,
           lens=(4096, 1000, 17)):
    """The stage-1 launch of ``kernel_hf.hf_launch`` for a small case of the reference shape on CPU tensors,
    recorded (not run): ``(args, kwargs)``."""
    plan = make_plan(list(lens), num_kv_heads=hkv, device="NVIDIA H200", policy="fixed", params={"num_splits": 2},
                     head_dim=d, page_size=page_size, dtype="bfloat16")
    npages = sum(-(-n // page_size) for n in lens) + 8
    k = torch.zeros((npages, page_size, hkv, d), dtype=torch.bfloat16)
    q = torch.zeros((len(lens), hq, d), dtype=torch.bfloat16)
    ws = dec.make_workspace(hq, d, max_partials=plan.num_partials, max_batch=len(lens), device="cpu")
    attr = "_hf2d_stage1_kernel" if layout == "2d" else "_hf_stage1_kernel"
    saved = getattr(khf, attr)
    rec = _Recorder(saved)
    setattr(khf, attr, rec)
    try:
        khf.hf_launch(q, k, k.clone(), torch.zeros(len(lens) + 1, dtype=torch.int32),
                      torch.zeros(npages, dtype=torch.int32), plan.to("cpu"), num_ctas=plan.num_ctas, num_merge=0,
                      max_splits=1, out=torch.empty_like(q), workspace=ws, block_n=block_n, num_warps=num_warps,
                      num_stages=num_stages, prefetch=bool(prefetch), merge=False, layout=layout)
    finally:
        setattr(khf, attr, saved)
    (_, args, kwargs), = rec.calls
    return args, kwargs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", nargs="*", default=None, help="BLOCK_N,warps,stages[,pf] ...")
    ap.add_argument("--ttgir", default=None)
    ap.add_argument("--layouts", default="3d,2d", help="kernel_hf layouts to compile: 3d, 2d")
    args = ap.parse_args()
    cfgs = DEFAULT if not args.configs else [
        tuple(int(x) for x in c.split(",")[:3]) + (int(c.endswith(",pf")),) for c in args.configs]
    dev = DeviceSpec.known("NVIDIA H200")
    print(f"{'config':17s} {'regs':>5s} {'spill':>5s} {'smem':>7s} {'CTAs/SM':>7s} {'mma':>8s} {'cp.async':>8s}",
          flush=True)
    for layout, (bn, w, s, pf) in [(lay, c) for lay in args.layouts.split(",") for c in cfgs]:
        name = f"{layout} n{bn}w{w}s{s}" + ("pf" if pf else "")
        try:
            a, kw = record(bn, w, s, pf, layout)
            kernel = compile_sm90(getattr(khf, "_hf2d_stage1_kernel" if layout == "2d" else "_hf_stage1_kernel"),
                                  a, kw)
            r = resources(kernel)
            ttgir = kernel.asm["ttgir"]
            mma = sorted(set(re.findall(r"versionMajor = (\d+)", ttgir)))
            cp = len(re.findall(r"async_copy_global_to_local", ttgir))
            if args.ttgir:
                os.makedirs(args.ttgir, exist_ok=True)
                with open(os.path.join(args.ttgir, f"hf_{name.replace(' ', '_')}.ttgir"), "w") as f:
                    f.write(ttgir)
            res = occupancy(dev, w, r["regs"], r["shared"])
            print(f"{name:17s} {r['regs']:5d} {r['spill_stores']:5d} {r['shared']:7d} {res:7d} "
                  f"{'v' + '/v'.join(mma) if mma else '-':>8s} {cp:8d}", flush=True)
        except Exception as exc:  # noqa: BLE001
            print(f"{name:17s} ERROR {exc!r}"[:400], flush=True)


if __name__ == "__main__":
    main()
