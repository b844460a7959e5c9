"""Optuna on the GPU with and without ``prefetch`` / ``heads_per_tile`` in the searched space (H200; round 10).

    python bench/tune_space_ab.py --out $OUT [--trials 24] [--tasks skewed80:64:1048576,uniform:128:262144]

For each task (a family bucket of Qwen3-30B-A3B's shape: H_q 32, H_kv 4, D 128, bf16, page 16; 3 training and 3
held-out draws, seed 0), ``kvsplit.tuner.search.tune_task`` runs on the GPU backend twice, each in its own SQLite
store: once with the space of rounds 1-9 (``prefetch`` and ``heads_per_tile`` not searched) and once with the
space as shipped (``--spaces``: either or both). Then the held-out batches are timed, back to back in this process: each study's best
parameters, the plan the shipped table (kernels/data/h200_policies.json) serves, and ``balanced``. Time / read
floor per batch and the geomean per method are printed; one JSON line per task in OUT/tune_space_ab.jsonl.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

import numpy as np

from kvsplit.db import store
from kvsplit.kernels.plan import TUNED_PARAM_SPACE, make_plan
from kvsplit.kernels.policy_table import PolicyTable
from kvsplit.tuner import search
from kvsplit.tuner.backends import make_backend

SHAPE = dict(gpu="NVIDIA H200", num_qo_heads=32, num_kv_heads=4, head_dim=128, dtype="bfloat16", page_size=16)
NEW_KNOBS = ("prefetch", "heads_per_tile")


def _gm(xs) -> float:
    return float(math.exp(np.mean(np.log(xs))))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--trials", type=int, default=24)
    ap.add_argument("--tasks", default="skewed80:64:1048576,uniform:128:262144")
    ap.add_argument("--backend", default="gpu", help="gpu, or sim for a dry run of the script")
    ap.add_argument("--spaces", default="r9,r10", help="r9: prefetch and heads_per_tile not searched; r10: as shipped")
    args = ap.parse_args()
    t0 = time.time()
    log = open(os.path.join(args.out, "tune_space_ab.jsonl"), "a")
    backend = make_backend(args.backend, **SHAPE, max_tokens=(1 << 20) + 65536, max_batch=1024)
    table = PolicyTable.from_export(json.load(open("kernels/data/h200_policies.json")))
    searched = {k: TUNED_PARAM_SPACE[k]["search"] for k in NEW_KNOBS}
    for spec in args.tasks.split(","):
        fam, B, T = spec.split(":")
        task = search.family_task(fam, int(B), int(T), **SHAPE, num_train=3, num_heldout=3, seed=0)
        best = {}
        for space in args.spaces.split(","):
            for k in NEW_KNOBS:
                TUNED_PARAM_SPACE[k]["search"] = searched[k] if space == "r10" else False
            url = f"sqlite:///{args.out}/tune_{space}.db"
            store.upgrade(url)
            r = search.tune_task(task, search.TuneConfig(database_url=url, n_trials=args.trials, backend=args.backend,
                                                         progress=False, verify=False), backend=backend)
            best[space] = r.best_params
            print(f"{spec} space {space}: best {r.best_params} train geomean {r.best_value * 1e6:.1f} us "
                  f"[{time.time() - t0:.0f}s]", flush=True)
        for k in NEW_KNOBS:
            TUNED_PARAM_SPACE[k]["search"] = searched[k]
        rows = {**{f"tuned_{sp}": [] for sp in best}, "served": [], "balanced": []}
        served = []
        for lens in task.heldout:
            L = np.asarray(lens)
            floor = backend.hbm_floor_s(L)
            plans = {f"tuned_{s}": make_plan(L, num_kv_heads=4, head_dim=128, page_size=16, dtype="bfloat16",
                                             device=SHAPE["gpu"], policy="tuned", params=best[s]) for s in best}
            plans["served"], _, info = table.plan(L, **SHAPE)
            served.append({"policy": plans["served"].policy, "params": plans["served"].params,
                           "source": info["source"]})
            plans["balanced"] = make_plan(L, num_kv_heads=4, head_dim=128, page_size=16, dtype="bfloat16",
                                          device=SHAPE["gpu"], policy="balanced")
            for name, p in plans.items():
                rows[name].append(backend.time_plan(p) / floor)
        gm = {k: _gm(v) for k, v in rows.items()}
        log.write(json.dumps({"task": spec, "trials": args.trials, "best": best, "served": served,
                              "heldout_ratio": rows, "geomean": gm}) + "\n")
        log.flush()
        print(f"{spec} held-out time / floor, geomean: " + "  ".join(f"{k} {v:.4f}" for k, v in gm.items())
              + f"  [{time.time() - t0:.0f}s]", flush=True)


if __name__ == "__main__":
    main()
