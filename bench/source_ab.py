"""The same plans under two source versions of kernels/decode.py, in one process (H200; issue 12's A/B rule).

    git show 496fc37:kernels/decode.py > bench/_decode_before.py      # the version to compare against (untracked)
    python bench/source_ab.py --before bench/_decode_before.py --out $OUT [--plans NAME,...] [--budget-s 150]

For a change of the kernel's source that is meant to keep its machine code or its speed (a refactor): when
``bench/compile_sm90.py`` reports different SASS hashes for a config, the two versions are timed here. The
``--before`` file is imported as a module of its own (its relative imports pointed at ``kvsplit.kernels``), so
both versions' Triton kernels are compiled and cached side by side. Per reference case (bench/data/sweep_cases.json,
set ``ref``) and plan: ``before``, ``after`` (the installed kvsplit.kernels.decode) and ``before`` again
(``before_b``, the noise of one pair), each the median of CUDA-graph replays on the hot path timed with
``triton.testing.do_bench`` (random bf16 KV on shuffled pages, above the 60 MB L2), back to back. The two
versions' outputs of those replays are compared bit for bit (a refactor keeps the math and its order). One JSON line per
case in OUT/source_ab.jsonl; the summary prints after / before per plan (geomean, range) beside before_b / before.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import re
import sys
import tempfile
import time

import numpy as np
import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_sweep import named  # noqa: E402  (the candidate names of the sweeps)
from l2_state import graph_of  # noqa: E402  (one warm-up launch, capture, one replay)

from kvsplit.kernels import decode as after  # noqa: E402
from kvsplit.kernels.plan import make_plan  # noqa: E402
from kvsplit.tuner.gpu import GpuTimer, software_versions  # noqa: E402

GPU = "NVIDIA H200"
# the shipped table's look-ahead plans and a prefetching two-head plan (round 12)
PLANS = ["stream_k|c1|n64w8s3|pf|h2|nx", "stream_k|c1|n64w4s3|pf|h2|nx", "balanced|c2|n32w4s3|pf|h2|nx",
         "stream_k|c2|n32w4s3|pf|h2|nx", "balanced|c3|n32w4s3|pf|h2"]


def load_before(path: str):
    """``path`` (a copy of kernels/decode.py) as a module of its own: its ``from .x import`` lines point at
    ``kvsplit.kernels.x``. Triton reads a kernel's source from its file, so the module is written to a file."""
    src = re.sub(r"^from \.(\w+)", r"from kvsplit.kernels.\1", open(path).read(), flags=re.M)
    d = tempfile.mkdtemp(prefix="decode_before_")
    file = os.path.join(d, "decode_before.py")
    with open(file, "w") as f:
        f.write(src)
    spec = importlib.util.spec_from_file_location("decode_before", file)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["decode_before"] = mod
    spec.loader.exec_module(mod)
    return mod


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", required=True, help="a copy of kernels/decode.py to compare the installed one with")
    ap.add_argument("--cases", default="bench/data/sweep_cases.json")
    ap.add_argument("--plans", default=",".join(PLANS))
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--budget-s", type=float, default=150.0)
    ap.add_argument("--rep-ms", type=float, default=10.0)
    args = ap.parse_args()
    t0 = time.time()
    before = load_before(args.before)
    cases = [c for c in json.load(open(args.cases))["cases"] if c["set"] == "ref"]
    log = open(os.path.join(args.out, "source_ab.jsonl"), "a")
    log.write(json.dumps({"kind": "versions", **software_versions(), "before": args.before}) + "\n")
    timer = GpuTimer(num_qo_heads=32, num_kv_heads=4, head_dim=128, dtype="bfloat16", page_size=16,
                     max_tokens=max(sum(c["kv_lens"]) for c in cases) + 4096,
                     max_batch=max(len(c["kv_lens"]) for c in cases))
    bw = timer.read_bandwidth()
    print(f"read bandwidth {bw / 1e12:.3f} TB/s  [{time.time() - t0:.0f}s]", flush=True)
    ws = {m: m.make_workspace(32, 128, max_partials=1 << 16, max_batch=timer.max_batch, device="cuda")
          for m in (before, after)}
    names = args.plans.split(",")
    ratios: dict[str, list[float]] = {n: [] for n in names}
    noise: dict[str, list[float]] = {n: [] for n in names}
    for c in cases:
        if time.time() - t0 > args.budget_s:
            print("budget reached; stopping", flush=True)
            break
        L = np.asarray(c["kv_lens"], dtype=np.int64)
        b = timer.batch(L)
        floor = timer.hbm_floor_s(L)
        res = {}
        for name in names:
            pol, prm = named(name)[1]
            p = make_plan(L, num_kv_heads=4, device=GPU, policy=pol, params=prm)
            arrays = p.to("cuda")
            kw = p.launch_sizes()
            outs = {m: torch.empty((p.batch_size, 32, 128), dtype=torch.bfloat16, device="cuda") for m in ws}

            def run(m):
                return lambda: m.launch_decode(b["q"], timer.k_cache, timer.v_cache, b["kv_indptr"], b["kv_indices"],
                                               arrays, p.config, out=outs[m], workspace=ws[m], **kw)

            t = {}
            for label, m in (("before", before), ("after", after), ("before_b", before)):
                g = graph_of(run(m))
                t[label] = triton.testing.do_bench(g.replay, warmup=2, rep=args.rep_ms, return_mode="median") * 1e-3
                del g
            same = bool(torch.equal(outs[before], outs[after]))
            res[name] = {**t, "bit_equal": same}
            ratios[name].append(t["after"] / t["before"])
            noise[name].append(t["before_b"] / t["before"])
        log.write(json.dumps({"kind": "case", "case": c["id"], "family": c["family"], "B": c["B"], "T": c["T"],
                              "floor_s": floor, "times": res}) + "\n")
        log.flush()
        print(f"{c['family']:10s} B={c['B']:4d} T={c['T']:8d} " + " ".join(
            f"{n.split('|', 1)[1]}={r['after'] / r['before']:.3f}{'' if r['bit_equal'] else ' NOT-EQUAL'}"
            for n, r in res.items()) + f"  [{time.time() - t0:.0f}s]", flush=True)
    g = lambda x: math.exp(sum(map(math.log, x)) / len(x)) if x else float("nan")  # noqa: E731
    for n in names:
        if ratios[n]:
            print(f"{n:32s} after/before geomean {g(ratios[n]):.4f} range {min(ratios[n]):.3f}-{max(ratios[n]):.3f}  "
                  f"before_b/before {g(noise[n]):.4f} ({min(noise[n]):.3f}-{max(noise[n]):.3f})  n={len(ratios[n])}")


if __name__ == "__main__":
    main()
