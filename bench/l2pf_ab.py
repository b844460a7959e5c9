"""L2 prefetch of the K/V rows a few tiles ahead, with and without an L2 evict-first policy (issue 12; docs/perf.md,
round 18).

    python bench/l2pf_ab.py --out $OUT [--T 262144,1048576] [--plans NAME,...] [--variants off,ef3,nm3,ef5]

Two reasons to try it. (1) do_bench's flush leaves the 60 MB L2 full of dirty lines, and the first ~60 MB a timed
kernel reads evict them: about 8 us of HBM writes per call (round 5), 6-7 % of the floor at T = 262,144. Lines
allocated with an L2 evict-first policy are the first victims, so the dirty lines would stay; Triton 3.6 drops
``eviction_policy`` on the ``cp.async`` copies its pipeliner makes of the K/V loads (checked in the sm_90 PTX), so
the policy is put on the lines by a bulk L2 prefetch (``cp.async.bulk.prefetch.L2``, inline PTX) issued before the
copies. (2) The prefetch puts more bytes in flight per CTA without shared memory, where one CTA per SM streams
below the bandwidth.

Variants: ``off`` (the kernel as shipped), ``efN`` (prefetch N tiles ahead with the evict-first policy), ``nmN``
(the same without a cache hint). For each reference case and plan, in one process and back to back, CUDA-graph
replays on the hot path, ``do_bench`` median, random bf16 KV on shuffled pages above the 60 MB L2; each output is
checked against ``off``'s (the prefetch changes no value: bit-identical expected). One JSON line per (case, plan,
variant) in OUT/l2pf_ab.jsonl, a table on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_sweep import Bench, add_ref_case_args, named, ref_cases  # noqa: E402

from kvsplit.kernels import decode as dec  # noqa: E402
from kvsplit.kernels.plan import make_plan  # noqa: E402
from kvsplit.tuner.gpu import software_versions  # noqa: E402

GPU = "NVIDIA H200"
PLANS = ["stream_k|c1|n64w8s3|pf|h2|nx", "stream_k|c2|n32w4s3|pf|h2|nx", "balanced|c3|n32w4s3|pf|h2",
         "stream_k|c3|n32w4s3|pf|h2"]


def variant(v: str) -> dict:
    if v == "off":
        return {"ahead": 0, "policy": "evict_first"}
    m = re.fullmatch(r"(ef|nm)(\d+)", v)
    if not m:
        raise ValueError(f"--variants: expected off, efN or nmN, got {v!r}")
    return {"ahead": int(m[2]), "policy": "evict_first" if m[1] == "ef" else "normal"}


def main() -> None:
    ap = argparse.ArgumentParser()
    add_ref_case_args(ap)
    ap.add_argument("--plans", default=",".join(PLANS))
    ap.add_argument("--variants", default="off,ef3,nm3,ef5")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--budget-s", type=float, default=240.0)
    ap.add_argument("--rep-ms", type=float, default=15.0)
    args = ap.parse_args()
    t0 = time.time()
    cases = ref_cases(args)
    variants = [(v, variant(v)) for v in args.variants.split(",")]
    log = open(os.path.join(args.out, "l2pf_ab.jsonl"), "a")
    log.write(json.dumps({"kind": "versions", **software_versions()}) + "\n")
    bench = Bench(32, 4, max_tokens=max(sum(c["kv_lens"]) for c in cases) + 4096,
                  max_batch=max(len(c["kv_lens"]) for c in cases))
    bw = bench.t.read_bandwidth()
    log.write(json.dumps({"kind": "bandwidth", "bytes_per_s": bw}) + "\n")
    print(f"read bandwidth {bw / 1e12:.3f} TB/s  [{time.time() - t0:.0f}s]", flush=True)
    for c in cases:
        if time.time() - t0 > args.budget_s:
            print("budget reached; stopping", flush=True)
            break
        L = np.asarray(c["kv_lens"], dtype=np.int64)
        floor = bench.t.hbm_floor_s(L)
        row = []
        for name in args.plans.split(","):
            pol, prm = named(name)[1]
            p = make_plan(L, num_kv_heads=4, device=GPU, policy=pol, params=prm)
            ref_out = None
            for vname, sw in variants:
                dec._L2PF.update(sw)
                try:
                    t = bench.time_plan(p, args.rep_ms)
                finally:
                    dec._L2PF.update(variant("off"))
                out = bench.out[p.batch_size].float().clone()
                if ref_out is None:
                    ref_out, err = out, 0.0
                else:
                    err = float((out - ref_out).abs().max())
                log.write(json.dumps({"kind": "l2pf", "case": c["id"], "family": c["family"], "B": c["B"],
                                      "T": c["T"], "plan": name, "variant": vname, "time_s": t, "floor_s": floor,
                                      "max_abs_diff": err}) + "\n")
                log.flush()
                row.append(f"{vname}={t / floor:.3f}" + ("" if err == 0 else f"(diff {err:.2g})"))
            row.append("|")
        print(f"{c['family']:9s} B={c['B']:<4d} T={c['T']:<8d} " + " ".join(row) + f"  [{time.time() - t0:.0f}s]",
              flush=True)


if __name__ == "__main__":
    main()
