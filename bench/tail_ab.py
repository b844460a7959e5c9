"""The stream-K tail, balanced at run time: big pieces first, then small ones claimed by the persistent programs
(issue 12; docs/perf.md, round 18).

    python bench/tail_ab.py --out $OUT [--T 1048576,262144] [--bases NAME,...] [--tails F:G,...]

Round 13's stage-1 timeline (docs/data/h200_r13/timeline.jsonl.gz) shows that equal stream-K tiles at one CTA per
SM end 3-6 % apart: the SMs of a TPC pair stream at the same rate, but the TPCs' rates differ (uniform B = 1 under
``stream_k|c1|n64w8s3|pf|h2|nx``: 468-496 us for the same bytes), so the idle SM time at the end is 3-5 % of the
span. A static partition cannot know which SM is slow. Here the concatenated KV stream (stream_k_work's cost
coordinates) is cut into ``C`` big pieces of ``F`` times the even share, one per persistent program, followed by
pieces of ``G`` times the share, which the SMs take as they finish their big piece: the fast SMs take more of the
tail.

For each reference case (bench/data/sweep_cases.json, set ``ref``) and base plan, in one process and back to back:
the base plan (grid launch), the same plan on the persistent schedule (one program per resident CTA slot), and
every ``F:G`` tail plan: as a grid launch (``...g``: the hardware block scheduler hands the small CTAs to the SMs
as their big CTAs retire) and on the persistent schedule. Round 18's run also timed ``...+a``: persistent programs
that claim their next tile when they start the current one (docs/data/h200_r18/claim_ahead.patch; lost, not
kept). CUDA-graph replays on the hot path, ``do_bench`` median, random bf16 KV on shuffled pages above the 60 MB
L2; each output is checked against the base plan's.
One JSON line per (case, variant) in OUT/tail_ab.jsonl, a table on stdout.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_sweep import Bench, add_ref_case_args, named, ref_cases  # noqa: E402

from kvsplit.kernels.device import DeviceSpec  # noqa: E402
from kvsplit.kernels.plan import Plan, make_plan  # noqa: E402
from kvsplit.kernels.policies import _stream_k_params, indptr_of_runs, pieces_at_cuts, tile_heads  # noqa: E402
from kvsplit.kernels.registry import PlanContext  # noqa: E402
from kvsplit.kernels.residency import resident_ctas_per_sm  # noqa: E402
from kvsplit.tuner.gpu import software_versions  # noqa: E402

GPU = "NVIDIA H200"
BASES = ["stream_k|c1|n64w8s3|pf|h2|nx", "stream_k|c2|n32w4s3|pf|h2|nx"]
TAILS = ["0.97:0.03", "0.95:0.05", "0.95:0.025", "0.9:0.05"]


def bounded_stream_work(L: np.ndarray, heads: int, num_sms: int, block_n: int, ctas_per_sm: float, o: int,
                        big: float, small: float):
    """The work list of stream_k_work's stream (request b costs ceil(kv_len / block_n) + o blocks) cut at the
    bounds ``k * floor(big * share)`` for the first C pieces, then every ``max(1, round(small * share))`` blocks
    to the end (``share`` = stream_k_work's even share of C = floor(ctas_per_sm * num_SMs) // heads CTAs).
    Returns (num_splits, work_request, start, end, cta_indptr) in batch order."""
    nb = -(-L // block_n)
    cost = nb + o
    total = int(cost.sum())
    C = max(1, int(math.floor(ctas_per_sm * num_sms)) // heads)
    share = max(1, -(-total // C))
    bsz = max(1, int(big * share))
    ssz = max(1, int(round(small * share)))
    head_end = min(C * bsz, total)
    bounds = np.concatenate([np.arange(0, head_end, bsz), np.arange(head_end, total, ssz), [total]]).astype(np.int64)
    P = np.cumsum(cost) - cost
    lo = P + o
    hi = lo + nb
    first = np.searchsorted(bounds, lo, side="right")
    last = np.searchsorted(bounds, hi, side="left") - 1
    ncut = np.maximum(last - first + 1, 0)
    B = L.shape[0]
    creq = np.repeat(np.arange(B), ncut)
    kidx = np.arange(int(ncut.sum())) - np.repeat(np.cumsum(ncut) - ncut, ncut) + first[creq]
    cut = bounds[kidx] - lo[creq]
    n, req, _, start_blk, start, end = pieces_at_cuts(L, nb, ncut, cut, block_n)
    cta = np.searchsorted(bounds, lo[req] + start_blk, side="right") - 1
    return n, req, start, end, indptr_of_runs(cta)


def tail_plan(base: Plan, L: np.ndarray, spec: DeviceSpec, ctas_per_sm: float, o: int, big: float, small: float,
              programs: int) -> Plan:
    cfg = base.config
    ctx = PlanContext(spec, base.num_kv_heads, base.head_dim, base.page_size, base.dtype)
    n, req, start, end, cta_indptr = bounded_stream_work(L, tile_heads(ctx, cfg), spec.num_sms, cfg.block_n,
                                                         ctas_per_sm, o, big, small)
    pcfg = dataclasses.replace(cfg, schedule="persistent", num_programs=programs)
    return Plan(kv_lens=L, num_splits=n, work_request=req, work_kv_start=start, work_kv_end=end,
                cta_indptr=cta_indptr, config=pcfg, policy="tuned", params={"tail": [big, small]},
                num_kv_heads=base.num_kv_heads, head_dim=base.head_dim, page_size=base.page_size, dtype=base.dtype,
                gpu=base.gpu)


def main() -> None:
    ap = argparse.ArgumentParser()
    add_ref_case_args(ap)
    ap.add_argument("--bases", default=",".join(BASES))
    ap.add_argument("--tails", default=",".join(TAILS), help="F:G pairs: big pieces of F x the share, then G x")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--budget-s", type=float, default=240.0)
    ap.add_argument("--rep-ms", type=float, default=20.0)
    args = ap.parse_args()
    t0 = time.time()
    cases = ref_cases(args)
    log = open(os.path.join(args.out, "tail_ab.jsonl"), "a")
    log.write(json.dumps({"kind": "versions", **software_versions()}) + "\n")
    bench = Bench(32, 4, max_tokens=max(sum(c["kv_lens"]) for c in cases) + 4096,
                  max_batch=max(len(c["kv_lens"]) for c in cases))
    bw = bench.t.read_bandwidth()
    log.write(json.dumps({"kind": "bandwidth", "bytes_per_s": bw}) + "\n")
    print(f"read bandwidth {bw / 1e12:.3f} TB/s  [{time.time() - t0:.0f}s]", flush=True)
    spec = DeviceSpec.known(GPU)
    for c in cases:
        if time.time() - t0 > args.budget_s:
            print("budget reached; stopping", flush=True)
            break
        L = np.asarray(c["kv_lens"], dtype=np.int64)
        floor = bench.t.hbm_floor_s(L)
        row = []
        for bname in args.bases.split(","):
            pol, prm = named(bname)[1]
            base = make_plan(L, num_kv_heads=4, device=GPU, policy=pol, params=prm)
            cf = base.config
            slots = spec.num_sms * resident_ctas_per_sm(spec, 128, "bfloat16", 2, cf.block_n, cf.num_warps,
                                                        cf.num_stages, prefetch=cf.prefetch,
                                                        heads_per_tile=cf.heads_per_tile, next_item=cf.next_item)
            cps, o, _ = _stream_k_params(prm)
            pers = dataclasses.replace(base, config=dataclasses.replace(cf, schedule="persistent",
                                                                        num_programs=slots))
            variants = [("grid", base), ("pers", pers)]
            for tail in args.tails.split(","):
                f, g = (float(x) for x in tail.split(":"))
                tp = tail_plan(base, L, spec, cps, o, f, g, slots)
                # the grid launch of the same work list: the hardware block scheduler hands the small CTAs to the
                # SMs as their big CTAs retire
                variants += [(f"t{tail}g", dataclasses.replace(tp, config=cf)), (f"t{tail}", tp)]
            ref_out = None
            for vname, p in variants:
                t = bench.time_plan(p, args.rep_ms)
                out = bench.out[p.batch_size].float().clone()
                if ref_out is None:
                    ref_out, err = out, 0.0
                else:
                    err = float((out - ref_out).abs().max())
                rec = {"kind": "tail", "case": c["id"], "family": c["family"], "B": c["B"], "T": c["T"],
                       "base": bname, "variant": vname, "time_s": t, "floor_s": floor, "ctas": p.num_ctas,
                       "tiles": p.num_work_tiles, "programs": slots, "splits_max": int(p.num_splits.max()),
                       "max_abs_diff": err}
                log.write(json.dumps(rec) + "\n")
                log.flush()
                row.append(f"{vname}={t / floor:.3f}" + ("" if err < 0.05 else f"(ERR {err:.2g})"))
            row.append("|")
        print(f"{c['family']:9s} B={c['B']:<4d} T={c['T']:<8d} " + " ".join(row) + f"  [{time.time() - t0:.0f}s]",
              flush=True)


if __name__ == "__main__":
    main()
