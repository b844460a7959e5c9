"""A/B on the H200: today's decode vs the head-fused stage-1 prototype (bench/kernel_hf.py).

    python bench/hf_ab.py --out $OUT [--budget-s 240] [--rep-ms 10]

Hypothesis (docs/perf.md, round 6): today's stage 1 runs one work tile per (CTA, KV head) and reads 256-byte
fragments of the NHD cache rows (D = 128, bf16; row stride H_kv x D x 2 = 1 KB), the other heads' fragments
being read by other CTAs at other times; a read-only walk of the plan's tiles over shuffled pages reaches 94 %
of the read bandwidth at one CTA per SM. A CTA that processes all H_kv heads of its items reads whole pages
(16 KB of K and 16 KB of V per page at H_kv 4, page 16) and should stream closer to the contiguous floor.

Shape: Qwen3-30B-A3B (H_q 32, H_kv 4, D 128, bf16, page 16). For each case and base plan (``PLANS``, built by
bench/gpu_sweep.py's ``named``), timed back to back in one process, CUDA-graph replays under
``triton.testing.do_bench`` (median), out / workspace preallocated, plans uploaded, KV cache of 2 x 2 GiB
(far above the 60 MB L2) on shuffled pages (``kvsplit.tuner.gpu.GpuTimer``):

- ``decode``: today's kernel on the base plan (``launch_decode``'s defaults, as bench/stream_ab.py);
- ``{3d|2d} n{BLOCK_N}w{warps}s{stages}[pf]``: the fused stage 1 (``kernel_hf.hf_launch``'s layout: batched
  per-head dots or block-diagonal 2-D dots) + today's merge on a plan of the same policy and parameters with
  ``ctas_per_sm x H_kv`` (as many CTAs as the base plan has work tiles, up to the planner's rounding and at
  least one CTA per item: both counts, ``tiles`` and ``ctas``, are printed and recorded);
- ``stream``: the read floor's streaming-read kernel over the same number of contiguous bytes.

Before timing, every fused config is checked against the fp32 reference in bf16 on a mixed batch (a stream_k
and a balanced plan, split and unsplit requests; max rel. error < 2e-2 as the GPU tests); one that fails or does
not compile is printed and skipped. Its compiled registers, spills and shared memory are printed (with the CTAs
per SM that ``kvsplit.kernels.residency.occupancy`` gives). Ratios are to the read floor (KV bytes / the 4 GiB
streaming-read bandwidth measured in this run). One JSON line per record in OUT/hf_ab.jsonl; no new case is
started once ``--budget-s`` seconds have passed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

import numpy as np
import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernel_hf as khf  # noqa: E402
from gpu_sweep import named  # noqa: E402  (candidate names of the sweeps)
from l2_state import graph_of  # noqa: E402

from kvsplit.kernels import decode as dec  # noqa: E402
from kvsplit.kernels.device import DeviceSpec  # noqa: E402
from kvsplit.kernels.plan import make_plan  # noqa: E402
from kvsplit.kernels.residency import occupancy  # noqa: E402
from kvsplit.tuner.gpu import GpuTimer, _stream_read_kernel, software_versions  # noqa: E402
from kvsplit.tuner.workloads import family_kv_lens  # noqa: E402

GPU = "NVIDIA H200"
DEVICE, DTYPE = "cuda", "bfloat16"  # a CPU dry run under the interpreter sets "cpu", "float16"
HQ, HKV, D = 32, 4, 128
CASES = [(1 << 20, "uniform", 1), (1 << 20, "uniform", 8), (1 << 20, "uniform", 64), (1 << 20, "skewed80", 64),
         (1 << 20, "skewed80", 512),
         (1 << 18, "uniform", 8), (1 << 18, "uniform", 128), (1 << 18, "skewed80", 128), (1 << 18, "skewed80", 512)]
PLANS = ["stream_k|c3|n128w4s2", "balanced|c4|n64w4s2", "stream_k|c1|n128w8s3|pf"]
# fused configs: (layout, BLOCK_N, warps, stages, prefetch); prefetch only where stages >= 3. Layout "3d": the
# batched per-head dots (the full grid); "2d": the block-diagonal 2-D dots, configs that compile for sm_90 without
# spills (docs/data/hf7/compile_hf_sm90.log)
HF_CONFIGS = ([("3d", bn, w, s, pf) for bn in (16, 32) for w in (4, 8) for s in (2, 3)
               for pf in ((False, True) if s >= 3 else (False,))]
              + [("2d", 16, 4, 2, False), ("2d", 16, 4, 3, True), ("2d", 16, 8, 2, False), ("2d", 16, 8, 3, True),
                 ("2d", 32, 4, 2, False), ("2d", 32, 8, 2, False), ("2d", 32, 8, 3, True)])
REL_TOL = 2e-2


def cfg_name(c: tuple[str, int, int, int, bool]) -> str:
    return f"{c[0]} n{c[1]}w{c[2]}s{c[3]}" + ("pf" if c[4] else "")


def fused_plan(lens: np.ndarray, name: str):
    """The plan of ``name`` with ``ctas_per_sm x H_kv`` (same policy and other parameters)."""
    pol, params = named(name)[1]
    return make_plan(lens, num_kv_heads=HKV, head_dim=D, page_size=16, dtype=DTYPE, device=GPU, policy=pol,
                     params={**params, "ctas_per_sm": float(params["ctas_per_sm"]) * HKV})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--budget-s", type=float, default=240.0)
    ap.add_argument("--rep-ms", type=float, default=10.0)
    ap.add_argument("--plans", default=",".join(PLANS))
    args = ap.parse_args()
    t0 = time.time()
    log = open(os.path.join(args.out, "hf_ab.jsonl"), "a")

    def emit(rec: dict) -> None:
        log.write(json.dumps(rec) + "\n")
        log.flush()

    emit({"kind": "versions", **software_versions()})
    dev = DeviceSpec.known(GPU)
    t = GpuTimer(num_qo_heads=HQ, num_kv_heads=HKV, head_dim=D, dtype=DTYPE, page_size=16,
                 max_tokens=1 << 20, max_batch=1024)
    bw = t.read_bandwidth()
    emit({"kind": "bandwidth", "bytes_per_s": bw})
    print(f"read bandwidth {bw / 1e12:.3f} TB/s  [{time.time() - t0:.0f}s]", flush=True)
    ws = dec.make_workspace(HQ, D, max_partials=1 << 16, max_batch=1024, device=DEVICE)

    # ---- correctness (bf16 vs the fp32 reference) and compiled resources of every fused config ----
    rng = np.random.default_rng(0)
    clens = np.concatenate([[30001, 0, 1, 17], rng.integers(0, 3000, 36)]).astype(np.int64)
    cb = t.batch(clens)
    ref = dec.reference_decode_attention(cb["q"], t.k_cache, t.v_cache, cb["kv_indptr"], cb["kv_indices"],
                                         cb["kv_lens"]).float()
    scale = float(ref.abs().max().clamp_min(1e-6))
    cplans = [fused_plan(clens, "stream_k|c3|n128w4s2"), fused_plan(clens, "balanced|c4|n64w4s2")]
    assert all(int(p.num_splits.max()) > 1 and int(p.num_splits.min()) == 1 for p in cplans)
    good = []
    print(f"{'fused config':16s} {'max_rel_err':>11s} {'regs':>5s} {'spills':>6s} {'smem':>7s} {'CTAs/SM':>7s}",
          flush=True)
    for c in HF_CONFIGS:
        try:
            errs, kernel = [], None
            for p in cplans:
                o = torch.full_like(cb["q"], float("nan"))
                o, kernel = khf.hf_launch(
                    cb["q"], t.k_cache, t.v_cache, cb["kv_indptr"], cb["kv_indices"], p.to(DEVICE),
                    num_ctas=p.num_ctas, num_merge=int(p.merge_layout()[1].shape[0]),
                    max_splits=int(p.num_splits.max()), out=o, workspace=ws, block_n=c[1], num_warps=c[2],
                    num_stages=c[3], prefetch=c[4], layout=c[0])
                errs.append(float((o.float() - ref).abs().max()) / scale)  # NaN (never written) fails below
            err = float("nan") if any(e != e for e in errs) else max(errs)
            if kernel is not None:  # None under the interpreter
                kernel._init_handles()  # no-op after a launch; loads the binary, which sets n_regs / n_spills
                regs, spills, shared = int(kernel.n_regs), int(kernel.n_spills), int(kernel.metadata.shared)
                res = occupancy(dev, c[2], regs, shared)
            else:
                regs = spills = shared = res = -1
            ok = bool(err < REL_TOL)  # False for NaN
            emit({"kind": "check", "config": list(c), "max_rel_err": err, "ok": ok, "n_regs": regs,
                  "n_spills": spills, "shared": shared, "resident_ctas_per_sm": res})
            print(f"{cfg_name(c):16s} {err:11.2e} {regs:5d} {spills:6d} {shared:7d} {res:7d}"
                  + ("" if ok else "  FAILED: skipped"), flush=True)
            if ok:
                good.append(c)
        except Exception as exc:  # noqa: BLE001  (a config that does not compile / launch is skipped)
            emit({"kind": "error", "config": list(c), "stage": "check", "error": repr(exc)})
            print(f"{cfg_name(c):16s} ERROR (skipped): {exc!r}", flush=True)
            traceback.print_exc(limit=2)
    print(f"checked {len(good)}/{len(HF_CONFIGS)} fused configs  [{time.time() - t0:.0f}s]", flush=True)

    # ---- timing ----
    sbuf = torch.randn(max(t.kv_bytes(family_kv_lens(f, n, T)) for T, f, n in CASES) // 2, dtype=getattr(torch, DTYPE),
                       device=DEVICE)

    def bench(fn) -> float:
        g = graph_of(fn)
        try:
            return triton.testing.do_bench(g.replay, warmup=2, rep=args.rep_ms, return_mode="median") * 1e-3
        finally:
            del g

    variants = ["decode"] + [cfg_name(c) for c in good]
    print(f"{'case':26s} {'plan':24s} {'tiles':>5s} {'ctas':>5s} {'stream':>7s} "
          + " ".join(f"{v:>13s}" for v in variants), flush=True)
    for T, fam, B in CASES:
        if time.time() - t0 > args.budget_s:
            print("budget reached", flush=True)
            break
        lens = family_kv_lens(fam, B, T)
        b = t.batch(lens)
        out = torch.empty((B, HQ, D), dtype=getattr(torch, DTYPE), device=DEVICE)
        floor = t.hbm_floor_s(lens)
        nbytes = t.kv_bytes(lens)
        n_el = nbytes // 2
        blk, iters = 4096, 8
        sgrid = (triton.cdiv(n_el, blk * iters),)
        sout = torch.empty(sgrid[0], dtype=torch.float32, device=DEVICE)
        try:
            t_stream = bench(lambda: _stream_read_kernel[sgrid](sbuf, sout, n_el, BLOCK=blk, ITERS=iters,
                                                                num_warps=8))
        except Exception as exc:  # noqa: BLE001
            emit({"kind": "error", "case": [T, fam, B], "variant": "stream", "error": repr(exc)})
            t_stream = float("nan")
        base = (b["q"], t.k_cache, t.v_cache, b["kv_indptr"], b["kv_indices"])
        for name in args.plans.split(","):
            try:
                pol, params = named(name)[1]
                plan = make_plan(lens, num_kv_heads=HKV, head_dim=D, page_size=16, dtype=DTYPE, device=GPU,
                                 policy=pol, params=params)
                fplan = fused_plan(lens, name)
            except ValueError as exc:  # a plan the planner refuses: record it, go on
                emit({"kind": "error", "case": [T, fam, B], "plan": name, "stage": "plan", "error": repr(exc)})
                print(f"{name}: no plan ({exc})", flush=True)
                continue
            if max(plan.num_partials, fplan.num_partials) > ws.max_partials:
                print(f"{name}: too many partials, skipped", flush=True)
                continue
            arr, farr = plan.to(DEVICE), fplan.to(DEVICE)
            sizes = dict(num_tiles=plan.num_ctas * HKV, num_merge=int(plan.merge_layout()[1].shape[0]),
                         max_splits=int(plan.num_splits.max()))
            fsizes = dict(num_ctas=fplan.num_ctas, num_merge=int(fplan.merge_layout()[1].shape[0]),
                          max_splits=int(fplan.num_splits.max()))
            fns = {"decode": lambda: dec.launch_decode(*base, arr, plan.config, out=out, workspace=ws, **sizes)}
            for c in good:
                fns[cfg_name(c)] = (lambda c=c: khf.hf_launch(*base, farr, out=out, workspace=ws, block_n=c[1],
                                                              num_warps=c[2], num_stages=c[3], prefetch=c[4],
                                                              layout=c[0], **fsizes))
            times = {}
            for v, fn in fns.items():
                try:
                    times[v] = bench(fn)
                except Exception as exc:  # noqa: BLE001  (record and go on: one variant must not end the run)
                    emit({"kind": "error", "case": [T, fam, B], "plan": name, "variant": v, "error": repr(exc)})
            emit({"kind": "case", "T": T, "family": fam, "B": B, "plan": name, "floor_s": floor, "kv_bytes": nbytes,
                  "tiles": plan.num_ctas * HKV, "fused_ctas": fplan.num_ctas, "stream_s": t_stream, "times": times})
            row = " ".join(f"{times[v] / floor:13.4f}" if v in times else f"{'-':>13s}" for v in variants)
            print(f"{fam + ' B=' + str(B) + ' T=' + str(T):26s} {name:24s} {plan.num_ctas * HKV:5d} "
                  f"{fplan.num_ctas:5d} {t_stream / floor:7.4f} {row}  [{time.time() - t0:.0f}s]", flush=True)
    print(f"done [{time.time() - t0:.0f}s]", flush=True)


if __name__ == "__main__":
    main()
