"""Does an L2 evict-first policy on a streaming read avoid the write-backs of do_bench's dirty L2 (issue 12)?

    python bench/evict_probe.py --out $OUT

Round 5 (docs/perf.md) found that every do_bench repetition starts with the 60 MB L2 full of dirty lines (its
flush writes 256 MB) and that the first lines a kernel reads evict them: about 8 us of HBM writes inside the timed
region. Loads marked ``L2::evict_first`` (``createpolicy.fractional.L2::evict_first`` + ``.L2::cache_hint``,
what Triton 3.6 emits for ``tl.load(..., eviction_policy="evict_first")`` on a register load) should be chosen
as victims before the dirty lines. Triton 3.6 drops that policy on the ``cp.async`` copies its software
pipeliner makes of the decode kernel's K/V loads (checked on the sm_90 PTX: no cache hint; round 6's
``evict_first`` variant of the decode kernel was therefore the same kernel), so the probe times the read floor's
own streaming-read kernel (register loads) with and without the policy, and with plain loads of lines that a
bulk L2 prefetch (``cp.async.bulk.prefetch.L2`` with the evict-first policy) allocated two iterations earlier
(``prefetch_ef``: would such a prefetch carry the policy onto lines the decode kernel's ``cp.async`` then
reads?), over the KV bytes of T = 262,144 and 1,048,576 (512 MiB, 2 GiB) and 4 GiB, under do_bench and after a
clean-L2 flush (``read``: a 256 MB read). Round 18's figures: docs/perf.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from l2_state import bench_flush, graph_of  # noqa: E402

from kvsplit.tuner.gpu import software_versions  # noqa: E402


@triton.jit
def _stream_read(X, OUT, n_elements, BLOCK: tl.constexpr, ITERS: tl.constexpr, EV: tl.constexpr):
    # the read floor's kernel (kvsplit.tuner.gpu._stream_read_kernel) with an eviction policy on its loads
    pid = tl.program_id(0)
    base = pid.to(tl.int64) * BLOCK * ITERS
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(ITERS):
        offs = base + i * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(X + offs, mask=offs < n_elements, other=0.0, eviction_policy=EV)
        acc += x.to(tl.float32)
    tl.store(OUT + pid, tl.sum(acc, axis=0))


@triton.jit
def _l2_prefetch_evict_first(ptrs):
    # one Hopper bulk prefetch into L2 (cp.async.bulk.prefetch.L2, sm_90, PTX ISA 8.0) of 32 bytes at each pointer,
    # with an L2::evict_first cache policy; returns a dummy value
    return tl.inline_asm_elementwise(
        "{ .reg .b64 pol; createpolicy.fractional.L2::evict_first.b64 pol, 1.0; "
        "cp.async.bulk.prefetch.L2.global.L2::cache_hint [$1], 32, pol; mov.u32 $0, 0; }",
        "=r,l", [ptrs], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _stream_read_pf(X, OUT, n_elements, BLOCK: tl.constexpr, ITERS: tl.constexpr, AHEAD: tl.constexpr):
    # the same read with plain loads, each BLOCK first prefetched into L2 with an evict-first policy AHEAD
    # iterations earlier: does a line allocated evict-first stay so when a load without a policy hits it?
    pid = tl.program_id(0)
    base = pid.to(tl.int64) * BLOCK * ITERS
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    chunks = tl.arange(0, BLOCK // 16) * 16  # 32-byte chunks of bf16
    for i in tl.static_range(AHEAD):
        _l2_prefetch_evict_first(X + base + i * BLOCK + chunks)
    for i in range(ITERS):
        if i + AHEAD < ITERS:
            _l2_prefetch_evict_first(X + base + (i + AHEAD) * BLOCK + chunks)
        offs = base + i * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(X + offs, mask=offs < n_elements, other=0.0)
        acc += x.to(tl.float32)
    tl.store(OUT + pid, tl.sum(acc, axis=0))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--rep-ms", type=float, default=100.0)
    args = ap.parse_args()
    log = open(os.path.join(args.out, "evict_probe.jsonl"), "a")
    log.write(json.dumps({"kind": "versions", **software_versions()}) + "\n")
    x = torch.randn((4 << 30) // 2, dtype=torch.bfloat16, device="cuda")
    BLOCK, ITERS = 4096, 8
    print(f"{'bytes':>12s} {'policy':12s} {'mode':9s} {'us':>8s} {'TB/s':>6s}", flush=True)
    for nbytes in (512 << 20, 2 << 30, 4 << 30):
        n = nbytes // 2
        grid = (triton.cdiv(n, BLOCK * ITERS),)
        out = torch.empty(grid[0], dtype=torch.float32, device="cuda")
        for ev in ("", "evict_first", "prefetch_ef"):
            if ev == "prefetch_ef":
                g = graph_of(lambda: _stream_read_pf[grid](x, out, n, BLOCK=BLOCK, ITERS=ITERS, AHEAD=2, num_warps=8))
            else:
                g = graph_of(lambda: _stream_read[grid](x, out, n, BLOCK=BLOCK, ITERS=ITERS, EV=ev, num_warps=8))
            for mode in ("do_bench", "read"):
                t = bench_flush(g.replay, mode, rep_ms=args.rep_ms)
                rec = {"kind": "probe", "bytes": nbytes, "policy": ev or "normal", "mode": mode, "time_s": t}
                log.write(json.dumps(rec) + "\n")
                print(f"{nbytes:12d} {ev or 'normal':12s} {mode:9s} {t * 1e6:8.1f} {nbytes / t / 1e12:6.3f}",
                      flush=True)
            del g


if __name__ == "__main__":
    main()
