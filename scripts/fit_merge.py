"""Refit the simulator's merge constants for round 13's merge (CPU).

    .venv/bin/python scripts/fit_merge.py --out service/data/h200_calibration.json \
        --report docs/data/h200_r13/sim_fit_merge.json

Round 13 (docs/perf.md) launches the merge with one warp per program once at least 256 merged (request, query
head) pairs are merged, which cut the merge's cost over stage 1 from a median 4.5 to 3.8 us and its worst from
14.4 to 7.9 us on the H200. The simulator charges the merge ``merge_launch_s + merge_partial_s * partials * H_kv +
merge_split_s * max_splits`` (kvsplit.tuner.simulate). This script keeps every other constant of the shipped
calibration and fits those three, by the coordinate search of scripts/fit_simulator.py, on round 13's training run
(the served pool on the 280 training batches, with the new merge). Held out: round 13's re-timed tables
(retime19) and its reference grid (ref13), both timed with the new merge; the earlier held-out sets (rounds 2, 4
and 6) were timed with the merge before and are tabulated for the record.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

from kvsplit.kernels.device import resolve_device
from kvsplit.tuner.simfit import _coord_search, _loss, _prep, sweep_samples
from kvsplit.tuner.simulate import Calibration, _simulate

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fit_lone_bw import HELDOUT, before_after_tables, fit_arguments, write_outputs  # noqa: E402

MERGE_PARAMS = ("merge_launch_s", "merge_partial_s", "merge_split_s")
TRAIN = ["docs/data/h200_r13/train13.jsonl"]
EVAL = ["docs/data/h200_r13/retime19.jsonl", "docs/data/h200_r13/ref13.jsonl"]
RETIME9 = "docs/data/h200_r6/retime9.jsonl"


def main() -> None:
    ap = fit_arguments(__doc__)
    ap.add_argument("--train", nargs="+", default=TRAIN)
    ap.add_argument("--eval", nargs="*", default=EVAL,
                    help="runs over the evaluation batches of --eval-cases, timed with round 13's merge")
    ap.add_argument("--eval-cases", default="bench/data/sweep_cases.json")
    args = ap.parse_args()
    t0 = time.time()
    dev = resolve_device("NVIDIA H200")
    doc = json.loads(Path(args.calibration).read_text())
    cal0 = Calibration.from_dict(doc["constants"])
    train, _ = sweep_samples(args.train, "bench/data/train_cases.json")
    tiles = _prep(train, dev)
    meas = np.array([s.time_s for s in train])
    print(f"{len(train)} training plans [{time.time() - t0:.0f}s]", flush=True)

    def loss_all(c: Calibration) -> float:
        return _loss(np.array([_simulate(t, c) for t in tiles]), meas)

    before = loss_all(cal0)
    cal, after = _coord_search(cal0, MERGE_PARAMS, loss_all, rounds=5)
    fitted = {n: (getattr(cal0, n), getattr(cal, n)) for n in MERGE_PARAMS}
    print(f"training loss {before:.5f} -> {after:.5f}; " + ", ".join(
        f"{n} {a:.3g} -> {b:.3g}" for n, (a, b) in fitted.items()) + f" [{time.time() - t0:.0f}s]", flush=True)
    roles = {"train": train}
    for run in args.eval:
        roles[Path(run).stem], _ = sweep_samples([run], args.eval_cases)
    roles["heldout"], _ = sweep_samples(HELDOUT, "bench/data/sweep_cases_r8.json")
    roles["retime9"], _ = sweep_samples([RETIME9], "bench/data/sweep_cases_r8.json")
    tabs = before_after_tables(cal0, cal, roles, dev)
    write_outputs(args.out, args.report, doc, cal, tabs,
                  {"train": args.train, "heldout": list(args.eval) + HELDOUT + [RETIME9],
                   "merge": {n: {"before": a, "after": b} for n, (a, b) in fitted.items()},
                   "loss": {"before": before, "after": after}},
                  "fit_merge.py", "; the merge constants (merge_launch_s, merge_partial_s, merge_split_s) refitted "
                  "on round 13's training run by scripts/fit_merge.py (one-warp merge programs), every other "
                  "constant kept")
    print(f"done [{time.time() - t0:.0f}s]")


if __name__ == "__main__":
    main()
