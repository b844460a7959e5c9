"""Fit the simulator's per-config constants for kernel configs the shipped calibration has none for (CPU).

    .venv/bin/python scripts/fit_new_configs.py --out service/data/h200_calibration.json \
        --report docs/data/h200_r6/sim_fit_new_configs.json

Round 6 (docs/simulator.md): the worst held-out errors left were round 1's served plans (``served_r1``, -29 %
.. +23 %), which run the (64, 2, 3) and (64, 4, 4) tiles; no training batch had timed them, so they took the
shared constants, and kernels/residency.py estimated their residency (3 and 2 CTAs per SM; the sm_90 compile
says 4 and 3, now in ``residency.COMPILED``). ``bench/gpu_sweep.py --mode train --candidates ...`` timed
``balanced`` and ``stream_k`` plans on those two tiles at 1-4 CTAs per SM on every *training* batch
(docs/data/h200_r6/train6_r1tiles.jsonl). This script keeps every constant of the shipped calibration and, for
each config of ``--train`` that has no ``per_config`` entry and at least 20 training plans, fits
``kvsplit.tuner.simfit.CONFIG_FIT_PARAMS`` by the same coordinate search as scripts/fit_simulator.py, on that
config's training plans only, then its lone-CTA rate as scripts/fit_lone_bw.py does. It prints the held-out
error tables before and after (the evaluation batches: round 2's final grid with round 4's rebalanced plans,
and round 6's re-timing of the final table, retime9, with today's kernel) and writes the calibration document.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

from kvsplit.kernels.device import resolve_device
from kvsplit.tuner.simfit import CONFIG_FIT_PARAMS, _coord_search, _loss, _prep, by_config, sweep_samples
from kvsplit.tuner.simulate import Calibration, _simulate

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from fit_lone_bw import HELDOUT, before_after_tables, fit_arguments, fit_lone, write_outputs  # noqa: E402

TRAIN = ["docs/data/h200_r6/train6_r1tiles.jsonl"]
RETIME = "docs/data/h200_r6/retime9.jsonl"


def fit_new(cal: Calibration, samples, dev, min_samples: int = 20) -> tuple[Calibration, dict[str, dict]]:
    """``cal`` with ``CONFIG_FIT_PARAMS`` fitted for every config of ``samples`` that ``cal.per_config`` lacks;
    and per fitted config: samples, loss before and after, the constants."""
    tiles, meas, groups = by_config(samples, dev)
    out = {}
    for key, ix in groups:
        if key in cal.per_config or len(ix) < min_samples:
            continue
        tk, mk = [tiles[i] for i in ix], meas[ix]

        def loss(c: Calibration, tk=tk, mk=mk) -> float:
            return _loss(np.array([_simulate(t, c) for t in tk]), mk)

        before = loss(cal)
        cal, after = _coord_search(cal, CONFIG_FIT_PARAMS, loss, rounds=5, key=key)
        out[key] = {"n": len(ix), "loss_before": before, "loss_after": after, "constants": cal.per_config.get(key)}
        print(f"{key:10s} n={len(ix):5d} loss {before:.5f} -> {after:.5f}  {cal.per_config.get(key)}", flush=True)
    return cal, out


def main() -> None:
    ap = fit_arguments(__doc__)
    ap.add_argument("--train", nargs="+", default=TRAIN)
    ap.add_argument("--eval", nargs="*", default=[],
                    help="runs over the evaluation batches of bench/data/sweep_cases.json (round 9 on: its served "
                         "plans are today's table's), tabulated before and after as held-out sets too")
    ap.add_argument("--eval-cases", default="bench/data/sweep_cases.json",
                    help="the case file the --eval runs timed (round 9's runs: bench/data/sweep_cases_r9.json)")
    args = ap.parse_args()
    t0 = time.time()
    dev = resolve_device("NVIDIA H200")
    doc = json.loads(Path(args.calibration).read_text())
    cal0 = Calibration.from_dict(doc["constants"])
    train, _ = sweep_samples(args.train, "bench/data/train_cases.json")
    print(f"{len(train)} training plans [{time.time() - t0:.0f}s]", flush=True)
    cal, per_config = fit_new(cal0, train, dev)
    new_keys = set(per_config)
    fitted = [s for s, t in zip(train, _prep(train, dev), strict=True) if t.config_key in new_keys]
    cal, lone = fit_lone(cal, fitted, dev)
    for k, v in lone.items():
        per_config[k]["lone"] = v
    held, _ = sweep_samples(HELDOUT, "bench/data/sweep_cases_r8.json")
    r9, _ = sweep_samples([RETIME], "bench/data/sweep_cases_r8.json")
    roles = {"heldout": held, "retime9": r9, "train": train}
    for run in args.eval:
        roles[Path(run).stem], _ = sweep_samples([run], args.eval_cases)
    tabs = before_after_tables(cal0, cal, roles, dev)
    if args.train == TRAIN:
        note = ("; per-config constants of the configs without any, (64, 2, 3) and (64, 4, 4), fitted "
                "on their training plans (docs/data/h200_r6/train6_r1tiles.jsonl) by "
                "scripts/fit_new_configs.py (round 6), every other constant kept")
    else:
        note = (f"; per-config constants of the configs without any ({', '.join(sorted(per_config))}) fitted on "
                f"their training plans ({', '.join(args.train)}) by scripts/fit_new_configs.py, every other "
                "constant kept")
    write_outputs(args.out, args.report, doc, cal, tabs,
                  {"train": args.train, "heldout": HELDOUT + [RETIME] + list(args.eval), "per_config": per_config},
                  "fit_new_configs.py", note)
    print(f"done [{time.time() - t0:.0f}s]")


if __name__ == "__main__":
    main()
