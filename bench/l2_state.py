"""What the L2 holds when a timed decode step starts, and what that costs (H200; issues 9 and 12).

    python bench/l2_state.py --out $OUT [--fi] [--sets ref] [--modes do_bench,read] [--merge-ab] [--budget-s 240]

``triton.testing.do_bench`` clears the L2 before every timed repetition by *writing* a 256 MB buffer
(``cache.zero_()``, Triton 3.6 ``do_bench`` / ``CudaDriver.clear_cache``). The timed kernel then starts
with the 60 MB L2 full of dirty lines, and the first ~60 MB it reads evict them: up to 60 MB of HBM writes
inside the timed region that a real decode step does not pay (the kernels before attention in a decode
step -- QKV projection, RoPE, KV append -- write a few MB at most). This script times the same CUDA
graph replays under four L2 states, with one event-timed loop that differs only in the flush:

- ``do_bench``: ``triton.testing.do_bench(..., return_mode="median")`` itself (the project's method);
- ``zero``: the same loop as do_bench (flush = ``cache.zero_()``), reimplemented here -- must equal
  ``do_bench``;
- ``read``: flush = a streaming read of the same 256 MB (``cache.sum()``): the L2 holds clean, unrelated
  lines, as after the GEMMs of a decode step;
- ``none``: no flush (the KV data are several times the L2, so little of the previous replay survives).

Timed: the streaming-read kernel of the read floor over 4 GiB and over the KV bytes of T = 262,144 and
1,048,576 (512 MiB, 2 GiB); an empty graph (a one-CTA kernel); the served plan and the first oracle winner
of each case of ``--sets`` in bench/data/sweep_cases.json; with ``--fi`` FlashInfer 0.7.2's tensor-core
decode on the same batches; with ``--merge-ab`` each kvsplit plan with the merge over the full head dim,
with launch_decode's default merge and without the merge (stage 1 alone). Every record is a JSON line in
OUT/l2_state[_fi].jsonl; ratios are to the read floor of the 4 GiB read under the first of ``--modes``
(do_bench by default).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time

import numpy as np
import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_sweep import named  # noqa: E402

from kvsplit.kernels import decode as dec  # noqa: E402
from kvsplit.kernels.plan import make_plan  # noqa: E402
from kvsplit.tuner.gpu import GpuTimer, _stream_read_kernel, software_versions  # noqa: E402

GPU = "NVIDIA H200"
MODES = ("do_bench", "zero", "read", "none")


@triton.jit
def _one_cta(X):
    tl.store(X, 1.0)


@functools.cache
def _flush_buffer() -> torch.Tensor:
    """The 256 MB buffer the flushes write or read (the size of do_bench's own)."""
    return torch.empty(int(256e6 // 4), dtype=torch.int32, device="cuda")


def bench_flush(fn, mode: str, rep_ms: float = 10.0, warmup: int = 3) -> float:
    """Median event-timed seconds of ``fn`` with the L2 put in state ``mode`` before each repetition."""
    if mode == "do_bench":
        return triton.testing.do_bench(fn, warmup=2, rep=rep_ms, return_mode="median") * 1e-3
    cache = _flush_buffer()
    flush = {"zero": cache.zero_, "read": lambda: cache.sum(), "none": lambda: None}[mode]
    fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(3):
        flush()
        fn()
    e.record()
    torch.cuda.synchronize()
    n = max(5, int(rep_ms / max(s.elapsed_time(e) / 3, 1e-3)))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    for _ in range(warmup):
        fn()
    for i in range(n):
        flush()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in zip(starts, ends)) * 1e-3


def graph_of(fn):
    """A CUDA graph of ``fn`` (one eager launch first, so Triton compiles outside the capture), replayed once.
    The graph holds raw pointers: keep every tensor ``fn`` uses alive while it is replayed."""
    fn()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    return g


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="bench/data/sweep_cases.json")
    ap.add_argument("--sets", default="ref")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--fi", action="store_true", help="time FlashInfer's kernel instead of kvsplit's plans")
    ap.add_argument("--budget-s", type=float, default=240.0)
    ap.add_argument("--modes", default=",".join(MODES), help="L2 states to time, of " + ",".join(MODES))
    ap.add_argument("--merge-ab", action="store_true",
                    help="time each kvsplit plan with the merge over the full head dim (m1), with launch_decode's "
                         "default merge (auto) and without the merge (s1, stage 1 alone)")
    args = ap.parse_args()
    t0 = time.time()
    log = open(os.path.join(args.out, "l2_state_fi.jsonl" if args.fi else "l2_state.jsonl"), "a")

    def emit(rec: dict) -> None:
        log.write(json.dumps(rec) + "\n")
        log.flush()

    emit({"kind": "versions", **software_versions()})
    modes = args.modes.split(",")

    # the read floor's kernel under each L2 state
    bw = {}
    for nbytes in (4 << 30, 262144 * 2048, 1048576 * 2048):  # the floor's 4 GiB; the KV bytes of T = 262,144, 1M
        n = nbytes // 2
        x = torch.randn(n, dtype=torch.bfloat16, device="cuda")
        grid = (triton.cdiv(n, 4096 * 8),)
        o = torch.empty(grid[0], dtype=torch.float32, device="cuda")
        g = graph_of(lambda x=x, o=o, n=n, grid=grid: _stream_read_kernel[grid](x, o, n, BLOCK=4096, ITERS=8,
                                                                              num_warps=8))
        for m in modes:
            sec = bench_flush(g.replay, m, rep_ms=100.0)
            bw[(nbytes, m)] = nbytes / sec
            emit({"kind": "read_bw", "bytes": nbytes, "mode": m, "seconds": sec, "bytes_per_s": nbytes / sec})
            print(f"read {nbytes / 2**20:.0f} MiB {m:8s} {nbytes / sec / 1e12:.3f} TB/s  {sec * 1e6:.1f} us", flush=True)
        del g, x, o
        torch.cuda.empty_cache()
    floor_bw = bw[(4 << 30, modes[0])]

    y = torch.zeros(1, device="cuda")
    g = graph_of(lambda: _one_cta[(1,)](y))
    for m in modes:
        sec = bench_flush(g.replay, m, rep_ms=5.0)
        emit({"kind": "empty_graph", "mode": m, "seconds": sec})
        print(f"empty graph {m:8s} {sec * 1e6:.2f} us", flush=True)
    del g

    cases = [c for c in json.load(open(args.cases))["cases"] if c["set"] in set(args.sets.split(","))]
    timer = GpuTimer(num_qo_heads=32, num_kv_heads=4, head_dim=128, dtype="bfloat16", page_size=16,
                     max_tokens=max(sum(c["kv_lens"]) for c in cases) + 4096,
                     max_batch=max(len(c["kv_lens"]) for c in cases))
    ws = dec.make_workspace(32, 128, max_partials=1 << 16, max_batch=timer.max_batch, device="cuda")
    fi = None
    if args.fi:
        from kvsplit.tuner.flashinfer_kernel import load
        fi, why = load(timer)
        emit({"kind": "flashinfer", "status": why})
        print(why, flush=True)
        if fi is None:
            return
    for c in cases:
        if c["num_kv_heads"] != 4 or c["num_qo_heads"] != 32:
            continue
        if time.time() - t0 > args.budget_s:
            print("budget reached", flush=True)
            break
        lens = np.asarray(c["kv_lens"], dtype=np.int64)
        floor = timer.kv_bytes(lens) / floor_bw
        b = timer.batch(lens)
        runs = {}
        if fi is not None:
            if (lens < 1).any():
                continue
            fi.time(lens, warmup_ms=2, rep_ms=2)  # plan + compile
            w, kv = fi._wrapper, (timer.k_cache, timer.v_cache)
            out = torch.empty_like(b["q"])
            fn = lambda w=w, kv=kv, out=out: w.run(b["q"], kv, out=out)  # noqa: E731
            runs["flashinfer_kernel"] = (graph_of(fn), fn, out)  # the graph holds raw pointers: keep them alive
        else:
            plans = {"served": (c["served"]["policy"], c["served"]["params"])}
            if c.get("oracle_names"):
                plans["oracle0"] = named(c["oracle_names"][0])[1]
            # variants of the merge: over the full head dim (m1, the kernel before round 5) / launch_decode's
            # default rule (auto) / stage 1 alone (s1: no merge, its time only, not a correct output)
            variants = {"m1": 1, "auto": None, "s1": "s1"} if args.merge_ab else {"": None}
            for (label, (pol, prm)), (vname, dsplit) in [(x, y) for x in plans.items() for y in variants.items()]:
                if vname:
                    label = f"{label}_{vname}"
                p = make_plan(lens, num_kv_heads=4, device=GPU, policy=pol, params=prm)
                arrays = p.to("cuda")
                out = torch.empty((len(lens), 32, 128), dtype=torch.bfloat16, device="cuda")
                nm, ms = int(p.merge_layout()[1].shape[0]), int(p.num_splits.max())
                if dsplit == "s1":
                    if not nm:
                        continue
                    nm, dsplit = 0, None
                pf = bool(getattr(p.config, "prefetch", False))

                def fn(arrays=arrays, p=p, out=out, nm=nm, ms=ms, pf=pf, dsplit=dsplit):
                    dec.launch_decode(b["q"], timer.k_cache, timer.v_cache, b["kv_indptr"], b["kv_indices"], arrays,
                                      p.config, out=out, workspace=ws, num_tiles=p.num_work_tiles, num_merge=nm,
                                      max_splits=ms, prefetch=pf, merge_dsplit=dsplit)
                runs[label] = (graph_of(fn), fn, out)  # the graph holds raw pointers: keep them alive
                if vname != "s1" and nm and c["id"] % 16 == 0:  # output of the replayed graph vs fp32 reference
                    out.fill_(float("nan"))
                    runs[label][0].replay()
                    torch.cuda.synchronize()
                    ref = dec.reference_decode_attention(b["q"], timer.k_cache, timer.v_cache, b["kv_indptr"],
                                                         b["kv_indices"], b["kv_lens"])
                    err = float((out.float() - ref.float()).abs().max() / ref.float().abs().max())
                    emit({"kind": "check", "id": c["id"], "plan": label, "max_rel_err": err})
                    print(f"check id={c['id']} {label} max rel err {err:.2e}", flush=True)
                    if not err < 2e-2:
                        raise SystemExit(f"wrong output: {label} on case {c['id']}: {err}")
        for label, (g, _, _) in runs.items():
            rec = {"kind": "case", "id": c["id"], "set": c["set"], "family": c["family"], "B": c["B"], "T": c["T"],
                   "plan": label, "floor_s": floor}
            for m in modes:
                rec[m] = bench_flush(g.replay, m)
            emit(rec)
            print(f"{c['family']:10s} B={c['B']:5d} T={c['T']:8d} {label:17s} "
                  + " ".join(f"{m}={rec[m] / floor:.3f}" for m in modes), flush=True)
        del runs
    print(f"done [{time.time() - t0:.0f}s]", flush=True)


if __name__ == "__main__":
    main()
