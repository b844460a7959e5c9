"""Where stage 1's time goes, per work tile: a %globaltimer timeline of the decode kernel on the H200 (issue 12).

    python bench/timeline.py --out $OUT [--T 1048576] [--families skewed40,uniform] [--plans NAME,...]

For each reference case (bench/data/sweep_cases.json, set ``ref``, the T and families asked) and plan, in one
process: the plan's CUDA-graph replay on the hot path timed with ``triton.testing.do_bench`` (median; random bf16
KV on shuffled pages, above the 60 MB L2), the same with the instrumented kernel (``launch_decode(timeline=...)``,
whose compile can differ in registers: ``instrumented / plain`` says whether the timeline is representative),
then one replay of the instrumented graph after the same 256 MB L2 flush ``do_bench`` does, whose timeline is
read back. From it (all times in us, relative to the first tile's start):

- ``span``: first tile start -> last item output of stage 1 (no launch latency, no merge);
- ``ramp``: median / max over SMs of the first tile's start (the launch's dispatch);
- ``tail``: mean over SMs of (last output anywhere - the SM's last output): the SM-time idle at the end, as a
  fraction of ``span``;
- ``fixed``: the per-item fixed cost a of the least-squares fit ``item time = a + b * tokens`` over items that
  are not a tile's first (their time is from the previous item's output; first items include the tile's
  dispatch), and ``fixed_share`` = a * items / (SM slots * span), the share of the SM slots' time it takes.
  Items overlap with the other resident CTAs' items, so the fit is only meaningful at one CTA per SM (round 13's
  run gave -8..+7 us: docs/perf.md);
- ``rest``: do_bench time - span, i.e. launch latency, the merge launch and the L2 write-backs of the flush.

One JSON line per (case, plan) in OUT/timeline.jsonl (with the raw per-tile rows), a table on stdout.
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
from gpu_sweep import Bench, add_ref_case_args, named, ref_cases  # noqa: E402  (the sweeps' bench and names)
from l2_state import graph_of  # noqa: E402  (one warm-up launch, capture, one replay)

from kvsplit.kernels import decode as dec  # noqa: E402
from kvsplit.kernels.plan import make_plan  # noqa: E402
from kvsplit.kernels.device import DeviceSpec  # noqa: E402
from kvsplit.kernels.residency import resident_ctas_per_sm  # noqa: E402
from kvsplit.tuner.gpu import software_versions  # noqa: E402

GPU = "NVIDIA H200"
PLANS = ["stream_k|c1|n64w8s3|pf|h2|nx", "stream_k|c1|n64w4s3|pf|h2|nx", "stream_k|c2|n32w4s3|pf|h2|nx",
         "balanced|c2|n32w4s3|pf|h2|nx", "balanced|c3|n32w4s3|pf|h2"]


def analyse(tl_rows: np.ndarray, plan, heads: int, slots: int) -> dict:
    """The summary of one timeline (``tl_rows`` int64 ``[num_tiles, 2 + K]``, launch_decode's layout) of ``plan``
    (``heads`` KV heads per tile; ``slots`` = SMs x resident CTAs per SM)."""
    tiles_per_cta = plan.num_kv_heads // heads
    start = tl_rows[:, 0].astype(np.float64)
    sm = tl_rows[:, 1]
    t0 = start.min()
    ends, items_x, items_y, first_y = [], [], [], []
    last = np.empty(len(tl_rows))
    for tile in range(len(tl_rows)):
        c = tile // tiles_per_cta
        lo, hi = int(plan.cta_indptr[c]), int(plan.cta_indptr[c + 1])
        n = min(hi - lo, tl_rows.shape[1] - 2)
        e = tl_rows[tile, 2:2 + n].astype(np.float64)
        prev = start[tile]
        for k in range(n):
            tok = int(plan.work_kv_end[lo + k] - plan.work_kv_start[lo + k])
            (first_y if k == 0 else items_y).append(e[k] - prev)
            if k:
                items_x.append(tok)
            prev = e[k]
        last[tile] = e[n - 1] if n else start[tile]
        ends.append(last[tile])
    end = max(ends)
    span = end - t0
    sm_ids = np.unique(sm)
    sm_last = np.array([last[sm == s].max() for s in sm_ids])
    sm_first = np.array([start[sm == s].min() for s in sm_ids])
    out = {"span_us": span * 1e-3, "sms": int(len(sm_ids)),
           "ramp_med_us": float(np.median(sm_first - t0)) * 1e-3, "ramp_max_us": float((sm_first - t0).max()) * 1e-3,
           "tail_frac": float(np.mean(end - sm_last)) / span, "tail_max_us": float((end - sm_last).max()) * 1e-3,
           "items": int(plan.cta_indptr[-1]) * tiles_per_cta, "first_item_us": float(np.median(first_y)) * 1e-3
           if first_y else None}
    if len(items_x) >= 8 and np.ptp(items_x) > 0:
        A = np.vstack([np.ones(len(items_x)), np.asarray(items_x, dtype=np.float64)]).T
        (a, b), *_ = np.linalg.lstsq(A, np.asarray(items_y), rcond=None)
        out.update(fixed_us=a * 1e-3, ns_per_token=b, fit_items=len(items_x),
                   fixed_share=a * out["items"] / (slots * span))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    add_ref_case_args(ap)
    ap.add_argument("--plans", default=",".join(PLANS))
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--budget-s", type=float, default=200.0)
    ap.add_argument("--rep-ms", type=float, default=10.0)
    ap.add_argument("--items", type=int, default=64, help="items recorded per tile (K)")
    args = ap.parse_args()
    t0 = time.time()
    cases = ref_cases(args)
    log = open(os.path.join(args.out, "timeline.jsonl"), "a")
    log.write(json.dumps({"kind": "versions", **software_versions()}) + "\n")
    bench = Bench(32, 4, max_tokens=max(sum(c["kv_lens"]) for c in cases) + 4096,
                  max_batch=max(len(c["kv_lens"]) for c in cases))
    timer, ws = bench.t, bench.ws
    bw = timer.read_bandwidth()
    log.write(json.dumps({"kind": "bandwidth", "bytes_per_s": bw}) + "\n")
    print(f"read bandwidth {bw / 1e12:.3f} TB/s  [{time.time() - t0:.0f}s]", flush=True)
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")  # do_bench's L2 flush (Triton 3.6)
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    spec = DeviceSpec.known(GPU)
    print(f"{'case':22s} {'plan':30s} {'t/floor':>7s} {'instr':>6s} {'span/fl':>7s} {'rest us':>7s} {'ramp':>5s} "
          f"{'tail%':>5s} {'fixed us':>8s} {'fixed%':>6s} {'items':>6s}", flush=True)
    for c in cases:
        if time.time() - t0 > args.budget_s:
            print("budget reached; stopping", flush=True)
            break
        L = np.asarray(c["kv_lens"], dtype=np.int64)
        b = timer.batch(L)
        floor = timer.hbm_floor_s(L)
        for name in args.plans.split(","):
            pol, prm = named(name)[1]
            p = make_plan(L, num_kv_heads=4, device=GPU, policy=pol, params=prm)
            arrays = p.to("cuda")
            kw = p.launch_sizes()
            out = torch.empty((p.batch_size, 32, 128), dtype=torch.bfloat16, device="cuda")
            tl_buf = torch.zeros((p.num_work_tiles, 2 + args.items), dtype=torch.int64, device="cuda")

            def run(timeline):
                return lambda: dec.launch_decode(b["q"], timer.k_cache, timer.v_cache, b["kv_indptr"],
                                                 b["kv_indices"], arrays, p.config, out=out, workspace=ws,
                                                 timeline=timeline, **kw)

            times = {}
            for label, tlb in (("plain", None), ("instrumented", tl_buf)):
                g = graph_of(run(tlb))
                times[label] = triton.testing.do_bench(g.replay, warmup=2, rep=args.rep_ms,
                                                       return_mode="median") * 1e-3
                if tlb is not None:
                    flush.zero_()
                    g.replay()
                    torch.cuda.synchronize()
                del g
            heads = p.config.heads_per_tile
            cf = p.config
            slots = num_sms * resident_ctas_per_sm(spec, 128, "bfloat16", 2, cf.block_n, cf.num_warps, cf.num_stages,
                                                   prefetch=cf.prefetch, heads_per_tile=heads, next_item=cf.next_item)
            per_cta = int((p.cta_indptr[1:] - p.cta_indptr[:-1]).max())
            rows = tl_buf[:, :2 + min(per_cta, args.items)].cpu().numpy()
            s = analyse(rows, p, heads, slots)
            rec = {"kind": "timeline", "case": c["id"], "family": c["family"], "B": c["B"], "T": c["T"],
                   "plan": name, "floor_s": floor, "times": times, "slots": slots, **s,
                   "tiles": rows.tolist()}
            log.write(json.dumps(rec) + "\n")
            log.flush()
            fx = f"{s['fixed_us']:8.2f} {100 * s['fixed_share']:6.2f}" if "fixed_us" in s else f"{'-':>8s} {'-':>6s}"
            print(f"{c['family'] + ' B=' + str(c['B']):22s} {name:30s} {times['plain'] / floor:7.3f} "
                  f"{times['instrumented'] / times['plain']:6.3f} {s['span_us'] * 1e-6 / floor:7.3f} "
                  f"{times['plain'] * 1e6 - s['span_us']:7.1f} {s['ramp_max_us']:5.1f} {100 * s['tail_frac']:5.2f} "
                  f"{fx} {s['items']:6d}  [{time.time() - t0:.0f}s]", flush=True)


if __name__ == "__main__":
    main()
