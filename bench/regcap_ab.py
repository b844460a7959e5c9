"""A/B: the stage-1 kernel with its registers capped at what its G = 8 residency needs, per GQA group (H200).

    python bench/regcap_ab.py --out $OUT [--budget-s 150]

kernels/residency.py holds the resident CTAs per SM of each tile measured at G = H_q / H_kv = 8; other groups
compile to more registers for some tiles (docs/perf.md round 4: (64, 4, 2) takes 164-166 registers and 3 CTAs per
SM at G = 1-7, 118 and 4 at G = 8; (128, 4, 2) takes 238 and 2 at G = 16, 168 and 3 at G = 8). Capping the
registers (Triton's ``maxnreg``) at ``65536 / (R * 32 * num_warps)`` (rounded down to 8) keeps the measured
residency R for every group, at the price of some spills. This script times the same plans with and without the
cap: ``stream_k`` and ``balanced`` at 4 CTAs per SM on (64, 4, 2) and at 3 on (128, 4, 2), on the reference length
mixes (uniform and skewed80, B 8 / 64 / 256, both totals), for G = 4 (H_q 32, H_kv 8: Llama-3.1-8B), G = 8 (32/4:
Qwen3-30B-A3B) and G = 16 (64/4). Method as bench/l2_state.py (CUDA-graph replays, ``do_bench`` median, random bf16
KV on shuffled pages); every record is a JSON line in OUT/regcap_ab.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_sweep import cand_name, cand_params  # noqa: E402  (the sweeps' plan names and params)
from l2_state import bench_flush, graph_of  # noqa: E402

from kvsplit.kernels import decode as dec  # noqa: E402
from kvsplit.kernels.plan import make_plan  # noqa: E402
from kvsplit.tuner.gpu import GpuTimer, software_versions  # noqa: E402

GPU = "NVIDIA H200"
PLANS = [("stream_k", 4, (64, 4, 2), 128), ("balanced", 4, (64, 4, 2), 128), ("stream_k", 3, (128, 4, 2), 168)]
SHAPES = [(32, 8), (32, 4), (64, 4)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--budget-s", type=float, default=150.0)
    args = ap.parse_args()
    t0 = time.time()
    log = open(os.path.join(args.out, "regcap_ab.jsonl"), "a")
    log.write(json.dumps({"kind": "versions", **software_versions()}) + "\n")
    cases = [c for c in json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "data",
                                                    "sweep_cases.json")))["cases"]
             if c["set"] == "ref" and c["family"] in ("uniform", "skewed80") and c["B"] in (8, 64, 256)]
    for hq, hkv in SHAPES:
        timer = GpuTimer(num_qo_heads=hq, num_kv_heads=hkv, head_dim=128, dtype="bfloat16", page_size=16,
                         max_tokens=(1 << 20) + 4096, max_batch=1024)
        bw = timer.read_bandwidth()
        ws = dec.make_workspace(hq, 128, max_partials=1 << 16, max_batch=1024, device="cuda")
        for c in cases:
            if time.time() - t0 > args.budget_s:
                break
            lens = np.asarray(c["kv_lens"], dtype=np.int64)
            b = timer.batch(lens)
            floor = timer.kv_bytes(lens) / bw
            for pol, cps, (bn, w, s), cap in PLANS:
                p = make_plan(lens, num_kv_heads=hkv, device=GPU, policy=pol,
                              params=cand_params(pol, cps, (bn, w, s))[1])
                arrays = p.to("cuda")
                nm, ms = int(p.merge_layout()[1].shape[0]), int(p.num_splits.max())
                rec = {"kind": "case", "G": hq // hkv, "H_kv": hkv, "family": c["family"], "B": c["B"],
                       "T": int(lens.sum()), "plan": cand_name(pol, cps, (bn, w, s)), "cap": cap, "floor_s": floor}
                keep = []
                # maxnreg 0: no cap (None would be launch_decode's default, which caps this tile at G != 8)
                for label, mr in (("uncapped", 0), ("capped", cap)):
                    out = torch.empty((len(lens), hq, 128), dtype=torch.bfloat16, device="cuda")

                    def fn(out=out, mr=mr):
                        dec.launch_decode(b["q"], timer.k_cache, timer.v_cache, b["kv_indptr"], b["kv_indices"],
                                          arrays, p.config, out=out, workspace=ws, num_tiles=p.num_work_tiles,
                                          num_merge=nm, max_splits=ms, maxnreg=mr)
                    g = graph_of(fn)
                    keep.append((g, fn, out))
                    rec[label] = bench_flush(g.replay, "do_bench")
                    rec[label + "_read"] = bench_flush(g.replay, "read")
                rec["max_abs_diff"] = float((keep[0][2].float() - keep[1][2].float()).abs().max())
                log.write(json.dumps(rec) + "\n")
                log.flush()
                print(f"G={hq // hkv:2d} {c['family']:9s} B={c['B']:4d} T={rec['T']:8d} {rec['plan']:22s} "
                      f"uncapped {rec['uncapped'] / floor:.3f} capped {rec['capped'] / floor:.3f} "
                      f"(clean L2 {rec['uncapped_read'] / floor:.3f} / {rec['capped_read'] / floor:.3f}) "
                      f"diff {rec['max_abs_diff']:.1e}", flush=True)
                del keep
        timer = ws = None  # free this shape's KV cache before the next one's
        torch.cuda.empty_cache()
    print(f"done [{time.time() - t0:.0f}s]", flush=True)


if __name__ == "__main__":
    main()
