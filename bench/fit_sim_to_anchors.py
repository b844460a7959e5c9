"""Fit the simulator to FlashInfer's measured H200 times (h200_peers.csv) under the
``flashinfer`` policy, and print the fit error and the threshold-cliff ratios.

    .venv/bin/python bench/fit_sim_to_anchors.py [path/to/h200_peers.csv] [--out docs/sim]

This checks the simulator's structure (slots, per-CTA bandwidth cap, tail) on a
real kernel's curves: the constants are FlashInfer's, not kvsplit's kernel's.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

from kvsplit.kernels.device import resolve_device
from kvsplit.kernels.plan import make_plan
from kvsplit.tuner.simulate import fit_calibration, predict
from kvsplit.tuner.workloads import family_kv_lens, reference_cases

T = 262_144
IMPLS = (("flashinfer_decode_tc", {"tensor_cores": True}), ("flashinfer_decode_notc", {"tensor_cores": False}))


def main(argv: list[str]) -> None:
    args = [a for a in argv if not a.startswith("--")]
    anchors = Path(args[0]) if args else Path(__file__).resolve().parents[1] / "docs" / "data" / "anchors" / "h200_peers.csv"
    out = Path(argv[argv.index("--out") + 1]) if "--out" in argv else None
    meas = {}
    with open(anchors, newline="") as f:
        for r in csv.DictReader(f):
            meas[(r["impl"], int(r["T"]), r["dist"], int(r["B"]))] = float(r["time_us"]) * 1e-6
    dev = resolve_device("NVIDIA H200")
    for impl, params in IMPLS:
        cases = reference_cases(T)
        plans = {c: make_plan(family_kv_lens(c[0], c[1], T), num_kv_heads=4, device=dev, policy="flashinfer",
                              params=params) for c in cases}
        samples = [(plans[c], meas[(impl, T, c[0], c[1])]) for c in cases]
        cal, rep = fit_calibration(samples, dev)
        print(f"{impl}: n={rep['n']} median |rel err| {rep['median_rel_err']:.3f} (before {rep['median_rel_err_before']:.3f}), "
              f"worst {rep['worst_rel_err']:.3f} (before {rep['worst_rel_err_before']:.3f})")
        print("  constants:", json.dumps({k: float(f"{v:.4g}") for k, v in cal.to_dict().items()}))
        sim = {c: predict(plans[c], dev, calibration=cal) for c in cases}
        Bs = sorted({b for _, b in cases})
        print("  skewed80/uniform  B:     " + " ".join(f"{b:>6}" for b in Bs))
        print("  simulated (fitted):      " + " ".join(f"{sim[('skewed80', b)] / sim[('uniform', b)]:6.2f}" for b in Bs))
        print("  measured:                " + " ".join(
            f"{meas[(impl, T, 'skewed80', b)] / meas[(impl, T, 'uniform', b)]:6.2f}" for b in Bs))
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            (out / f"calibration_{impl}.json").write_text(json.dumps(cal.to_dict(), indent=2) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
