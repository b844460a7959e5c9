"""Errors of the shipped simulator calibration on H200 re-timing runs (CPU; issue 9 item 3).

    python scripts/sim_on_run.py docs/data/h200_r4/retime7.jsonl docs/data/h200_r5/retime8.jsonl
    python scripts/sim_on_run.py --per-set docs/data/h200_r2/final.jsonl,docs/data/h200_r4/rebalanced_eval.jsonl
    python scripts/sim_on_run.py --cases bench/data/sweep_cases.json docs/data/h200_r9/retime14.jsonl

For each run (bench/gpu_sweep.py's JSON lines over the case file it timed: ``--cases``, default
bench/data/sweep_cases_r8.json, the file every run before round 9 timed; round 9's runs timed
bench/data/sweep_cases.json, whose served plans are round 9's table's), the median and worst relative
error |prediction / measured - 1| of service/data/h200_calibration.json over every timed plan, overall and per
policy (:func:`kvsplit.tuner.simfit.error_table`). retime7 was timed with round 4's kernel, retime8 with round
5's (register cap, merge over head-dim chunks), so the pair shows how far the kernel change moved the model.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from kvsplit.kernels.device import resolve_device
from kvsplit.tuner.simfit import error_table, predict_samples, sweep_samples
from kvsplit.tuner.simulate import Calibration

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    args = sys.argv[1:]
    per_set = "--per-set" in args  # also print each (set, policy): e.g. the reference cases and traces alone
    args = [a for a in args if a != "--per-set"]
    cases = ROOT / "bench/data/sweep_cases_r8.json"
    if "--cases" in args:
        i = args.index("--cases")
        cases = Path(args[i + 1])
        del args[i:i + 2]
    runs = args or ["docs/data/h200_r4/retime7.jsonl", "docs/data/h200_r5/retime8.jsonl"]
    cal = Calibration.from_dict(json.loads((ROOT / "service/data/h200_calibration.json").read_text())["constants"])
    h200 = resolve_device("NVIDIA H200")
    for run in runs:
        # "a.jsonl,b.jsonl": one run in several files, merged per batch (simfit.merged_case_records)
        samples, _ = sweep_samples([Path(r) for r in run.split(",")], cases)
        tab = error_table(samples, predict_samples(samples, cal, h200))
        print(f"{run}: {len(samples)} timed plans, median {100 * tab['all']['median']:.1f} %, "
              f"worst {100 * tab['all']['worst']:.1f} %")
        for pol, st in sorted(tab["per_policy"].items()):
            print(f"  {pol:14s} median {100 * st['median']:5.1f} %  worst {100 * st['worst']:5.1f} %")
        if per_set:
            for key, st in sorted(tab["per_set_policy"].items()):
                print(f"  {key:24s} median {100 * st['median']:5.1f} %  worst {100 * st['worst']:5.1f} %")


if __name__ == "__main__":
    main()
