"""The H200 campaign of issues 4 and 6, in one process on one GPU.

    python scripts/h200_campaign.py --out OUTDIR --database-url sqlite:///OUTDIR/kvsplit.db \
        [--stages calibrate,tune,figure,traces] [--trials 24] [--deadline-s 540]

1. ``calibrate``: fit the simulator to the kernel (tuner/calibrate.py), store it.
2. ``tune``: GPU-backend tuning + held-out verification + publishing of the
   five families at B = 64 and 256 (T = 262,144) and three trace-driven buckets,
   Qwen3-30B-A3B shape (32/4/128, bf16, page_size 16). Re-running resumes.
3. ``figure``: the reference study's figure: time / HBM floor of the served
   (tuned) plan and of every baseline for the 48 cases at T = 262,144 and
   1,048,576, into OUTDIR/figure.csv and the store (stage ``figure``).
4. ``traces``: held-out trace-driven batches (5 traces, B = 16/64/256), served
   plan vs baselines, into OUTDIR/traces.csv.

A deadline keeps the whole run inside one device call; stages stop early and
say so. docs/tuning.md and docs/results.md are made from these files by
scripts/make_reports.py.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
import traceback

import numpy as np

SHAPE = dict(gpu="NVIDIA H200", num_qo_heads=32, num_kv_heads=4, head_dim=128, dtype="bfloat16", page_size=16)
BASELINES = (
    ("fa3", {}),
    ("flashinfer", {}),
    ("flashinfer_notc", {"tensor_cores": False}),
    ("balanced", {}),
    ("no_split", {}),
)
# Kernel knobs the GPU search may use: the configs whose compiled kernels the
# earlier sweeps left in the carried Triton cache (compiling all 160 costs minutes).
KNOB_SPACE = {"block_n": [32, 64, 128], "num_warps": [2, 4], "num_stages": (2, 4)}


class _SimStandIn:
    """The simulator behind the GpuBackend/GpuTimer interface (``--dry-sim`` only)."""

    name = "gpu"

    def __init__(self) -> None:
        from kvsplit.tuner.backends import SimBackend

        self._sim = SimBackend(SHAPE["gpu"], num_kv_heads=4, head_dim=128, dtype="bfloat16")
        self.timer = self
        self.max_tokens = 3_000_000

    def read_bandwidth(self) -> float:
        return self._sim.read_bandwidth

    def time_plan(self, plan, **_: object) -> float:
        return self._sim.time_plan(plan)

    def hbm_floor_s(self, kv_lens) -> float:
        return self._sim.hbm_floor_s(kv_lens)

    def software(self) -> dict:
        return {"backend": "dry-sim"}

    def device_info(self) -> dict:
        return {"name": SHAPE["gpu"], "num_sms": 132, "hbm_bandwidth_gbps": 4800.0,
                "read_bandwidth_gbps": self.read_bandwidth() / 1e9}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--database-url", required=True)
    ap.add_argument("--stages", default="calibrate,tune,figure,traces")
    ap.add_argument("--trials", type=int, default=24)
    ap.add_argument("--deadline-s", type=float, default=540)
    ap.add_argument("--totals", default="262144,1048576")
    ap.add_argument("--dry-sim", action="store_true",
                    help="CPU dry run: the simulator stands in for the GPU (checks the script, not the kernel)")
    args = ap.parse_args()
    t0 = time.time()
    left = lambda: args.deadline_s - (time.time() - t0)  # noqa: E731
    stages = args.stages.split(",")

    from kvsplit.db import store
    from kvsplit.kernels import plan as plan_mod
    from kvsplit.kernels.plan import make_plan
    from kvsplit.tuner.backends import GpuBackend

    url = args.database_url
    store.upgrade(url)
    if args.dry_sim:
        backend = _SimStandIn()
    else:
        backend = GpuBackend(num_qo_heads=32, num_kv_heads=4, head_dim=128, dtype="bfloat16", page_size=16,
                             max_tokens=3_000_000, max_batch=4096)
    timer = backend.timer
    bw = timer.read_bandwidth()
    print(f"[{time.time() - t0:.0f}s] read bandwidth {bw / 1e12:.3f} TB/s", flush=True)
    shape_kw = {k: SHAPE[k] for k in ("num_kv_heads", "head_dim", "dtype", "page_size")}

    if "calibrate" in stages:
        from kvsplit.tuner.calibrate import calibrate

        try:
            rep = calibrate(backend, gpu=SHAPE["gpu"], seed=0, database_url=url, **shape_kw)
            json.dump(rep, open(os.path.join(args.out, "calibration.json"), "w"), indent=1)
            print(f"[{time.time() - t0:.0f}s] calibration: held-out median {rep['heldout']['median']:.3f} "
                  f"worst {rep['heldout']['worst']:.3f} (defaults {rep['default_heldout']['median']:.3f} / "
                  f"{rep['default_heldout']['worst']:.3f})", flush=True)
            for fam, e in rep["heldout"]["per_family"].items():
                print(f"   {fam:9s} median {e['median']:.3f} worst {e['worst']:.3f}", flush=True)
        except Exception:
            traceback.print_exc()

    if "tune" in stages:
        from kvsplit.tuner import search
        from kvsplit.tuner.workloads import FAMILIES

        space = plan_mod.TUNED_PARAM_SPACE
        space["block_n"]["choices"] = KNOB_SPACE["block_n"]
        space["num_warps"]["choices"] = KNOB_SPACE["num_warps"]
        space["num_stages"]["low"], space["num_stages"]["high"] = KNOB_SPACE["num_stages"]
        common = dict(SHAPE, num_train=3, num_heldout=3, seed=0)
        tasks = [search.family_task(f, B, 262_144, **common) for B in (64, 256) for f in FAMILIES]
        for name, B in (("azure_conv", 64), ("mooncake", 16), ("azure_code", 256)):
            tasks += search.trace_tasks(name, batch_sizes=(B,), **common)
        tasks += [search.family_task(f, B, 262_144, **common) for B in (16, 512) for f in FAMILIES]
        results = []
        cfg = search.TuneConfig(database_url=url, n_trials=args.trials, backend="gpu", progress=False)
        for i, task in enumerate(tasks):
            budget_for_rest = 150 if ("figure" in stages or "traces" in stages) else 20
            if left() < budget_for_rest:
                print(f"[{time.time() - t0:.0f}s] deadline: {len(tasks) - i} buckets not tuned", flush=True)
                break
            try:
                r = search.tune_task(task, cfg, backend=backend)
                results.append({"source": task.source, **r.to_dict()})
                v = r.verification or {}
                print(f"[{time.time() - t0:.0f}s] {task.source:28s} {r.status} trials={r.n_finished} "
                      f"best={r.best_value} published={r.published} {json.dumps(v)[:300]}", flush=True)
            except Exception:
                traceback.print_exc()
        json.dump(results, open(os.path.join(args.out, "tune.json"), "w"), indent=1, default=str)

    def table():
        from kvsplit.kernels.policy_table import PolicyTable
        from kvsplit.service.queries import load_table_doc

        return PolicyTable.from_json(load_table_doc(url))

    def policies_for(lens, tab):
        plans = []
        plan, binfo, pinfo = tab.plan(lens, **{k: SHAPE[k] for k in SHAPE})
        plans.append(("served", pinfo.get("source", "?"), plan))
        for name, params in BASELINES:
            pol = "flashinfer" if name.startswith("flashinfer") else name
            plans.append((name, pol, make_plan(lens, device=SHAPE["gpu"], policy=pol, params=params, **shape_kw)))
        return plans

    if "figure" in stages:
        from kvsplit.tuner.workloads import family_kv_lens, reference_cases

        tab = table()
        path = os.path.join(args.out, "figure.csv")
        with open(path, "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["T", "family", "B", "policy", "source", "time_us", "floor_us", "ratio", "work_items", "ctas"])
            for T in [int(x) for x in args.totals.split(",")]:
                for fam, B in reference_cases(T):
                    if left() < (60 if "traces" in stages else 5):
                        print(f"[{time.time() - t0:.0f}s] deadline in figure at T={T} {fam} B={B}", flush=True)
                        break
                    lens = family_kv_lens(fam, B, T)
                    floor = timer.hbm_floor_s(lens)
                    row = []
                    for name, src, plan in policies_for(lens, tab):
                        t = timer.time_plan(plan, warmup_ms=5, rep_ms=25)
                        w.writerow([T, fam, B, name, src, f"{t * 1e6:.2f}", f"{floor * 1e6:.2f}", f"{t / floor:.4f}",
                                    plan.num_work_items, plan.num_ctas])
                        row.append(f"{name}={t / floor:.2f}")
                    fh.flush()
                    print(f"[{time.time() - t0:.0f}s] T={T} {fam:9s} B={B:4d} " + " ".join(row), flush=True)

    if "traces" in stages:
        from kvsplit.tuner.workloads import trace_batches

        tab = table()
        path = os.path.join(args.out, "traces.csv")
        with open(path, "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["trace", "B_target", "batch", "B", "tokens", "policy", "source", "time_us", "floor_us", "ratio"])
            for name in ("azure_code", "azure_conv", "mooncake", "sharegpt", "arxiv"):
                for B in (16, 64, 256):
                    if left() < 5:
                        break
                    try:
                        _, held = trace_batches(name, B, num_train=1, num_heldout=3, seed=11)
                    except Exception:
                        traceback.print_exc()
                        continue
                    for j, lens in enumerate(held):
                        if int(np.sum(lens)) > timer.max_tokens:
                            continue
                        floor = timer.hbm_floor_s(lens)
                        for pname, src, plan in policies_for(lens, tab):
                            t = timer.time_plan(plan, warmup_ms=5, rep_ms=25)
                            w.writerow([name, B, j, len(lens), int(np.sum(lens)), pname, src, f"{t * 1e6:.2f}",
                                        f"{floor * 1e6:.2f}", f"{t / floor:.4f}"])
                    fh.flush()
                    print(f"[{time.time() - t0:.0f}s] trace {name} B={B} done", flush=True)
    print(f"[{time.time() - t0:.0f}s] campaign done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
