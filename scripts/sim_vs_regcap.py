"""The shipped simulator calibration against the register-cap A/B of round 5 (CPU; issue 9 item 3).

    python scripts/sim_vs_regcap.py [docs/data/h200_r5/regcap_ab.jsonl]

For every plan of bench/regcap_ab.py's H200 run at G = 4 (Llama-3.1-8B's 32/8) and G = 8 (32/4), the
prediction of :func:`kvsplit.tuner.simulate.predict` with service/data/h200_calibration.json against the
measured time of the kernel without and with the (64, 4, 2) tile's register cap (kernels/residency.py,
REGISTER_CAPS). The simulator counts 4 resident CTAs per SM for that tile at every group, which the capped
kernel has and the uncapped one (3 at G != 8) does not. Prints the median and the worst relative error
(prediction / measured - 1) per (G, plan, kernel).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from kvsplit.kernels.plan import make_plan
from kvsplit.tuner.simfit import candidate_policy
from kvsplit.tuner.simulate import Calibration, predict

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs/data/h200_r5/regcap_ab.jsonl"
    cal = Calibration.from_dict(json.loads((ROOT / "service/data/h200_calibration.json").read_text())["constants"])
    cases = {(c["family"], c["B"], c["T"]): c
             for c in json.loads((ROOT / "bench/data/sweep_cases.json").read_text())["cases"] if c["set"] == "ref"}
    errs: dict[tuple, list[float]] = {}
    for line in open(path):
        r = json.loads(line)
        if r.get("kind") != "case" or r["G"] not in (4, 8):
            continue
        c = cases[(r["family"], r["B"], r["T"])]
        pol, params = candidate_policy(r["plan"])  # bench/gpu_sweep.py's plan names
        p = make_plan(c["kv_lens"], num_kv_heads=r["H_kv"], device="NVIDIA H200", policy=pol, params=params)
        pred = predict(p, calibration=cal)
        for kernel in ("uncapped", "capped"):
            if kernel == "capped" and r["cap"] != 128:
                continue  # only the (64, 4, 2) cap ships
            errs.setdefault((r["G"], r["plan"], kernel), []).append(pred / r[kernel] - 1)
    print(f"{'G':>2s} {'plan':24s} {'kernel':9s} {'n':>3s} {'median':>8s} {'worst':>8s}")
    for (g, plan, kernel), v in sorted(errs.items()):
        print(f"{g:2d} {plan:24s} {kernel:9s} {len(v):3d} {100 * float(np.median(v)):+7.1f}% "
              f"{100 * max(v, key=abs):+7.1f}%")


if __name__ == "__main__":
    main()
