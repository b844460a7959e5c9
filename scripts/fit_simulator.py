"""Fit the simulator (per-config constants, residency slots) to H200 timings and report its held-out errors.

    .venv/bin/python scripts/fit_simulator.py \
        --out service/data/h200_calibration.json --report docs/data/h200_r4/sim_fit.json

(the defaults: trained on docs/data/h200_r2/train.jsonl, docs/data/h200_r4/train4.jsonl (a random sample of the
full grid, incl. prefetching tiles, on every training batch), train_even.jsonl and rebalanced_train.jsonl,
merged per batch; held out docs/data/h200_r2/final.jsonl with rebalanced_eval.jsonl; about 15 minutes)

Fits on every timed plan of ``--train`` (the training batches of
bench/data/train_cases.json, timed with today's planner) and holds out every
timed plan of ``--heldout`` (the evaluation batches of bench/data/sweep_cases.json:
the full grid, ``served``, ``served_r1``, ``balanced``, ``fa3``, FlashInfer's rule
on our kernel). ``hbm_bw`` is the training file's measured read bandwidth.
docs/data/h200_r2/sweep1.jsonl is not used: it was timed before two planner
changes (balanced's wave-aware growth bug, the head_dim-128 default tile 64/4/2 ->
128/4/2), so today's make_plan rebuilds other plans than the ones it timed.
Prints the error table of the old single-config calibration (slots = 4) and
of the new one, per set, per policy and per wave class, and writes the
calibration document (format 2: the shared constants, ``slots`` absent =
measured residency per config, ``per_config`` overrides) that kvsplit's service
imports into its store.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


from kvsplit.kernels.device import resolve_device
from kvsplit.tuner.simfit import best_of, error_summary, error_table, fit_per_config, predict_samples, sweep_samples
from kvsplit.tuner.simulate import Calibration, config_key


def _fmt(st: dict) -> str:
    if not st.get("n"):
        return "-"
    return f"{st['median']:.1%} / {st['worst']:.1%} (n={st['n']}, >20%: {st['over_20pct']})"


def _print_table(title: str, tab: dict) -> None:
    print(f"\n{title}: all {_fmt(tab['all'])}")
    for k, v in tab["per_set"].items():
        print(f"  set    {k:14s} {_fmt(v)}")
    for k, v in tab["per_policy"].items():
        print(f"  policy {k:14s} {_fmt(v)}")
    for k, v in tab["per_wave"].items():
        print(f"  waves  {k:17s} {_fmt(v)}")
    for k, v in tab["per_config"].items():
        print(f"  config {k:14s} {_fmt(v)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", nargs="+", default=["docs/data/h200_r2/train.jsonl", "docs/data/h200_r4/train4.jsonl",
                                                   "docs/data/h200_r4/train_even.jsonl",
                                                   "docs/data/h200_r4/rebalanced_train.jsonl"],
                    help="sweep files of the training batches (timed plans of --train-cases), merged per batch (a "
                         "later file's timing of a plan replaces an earlier one); the read bandwidth is the first's")
    ap.add_argument("--train-cases", default="bench/data/train_cases.json")
    ap.add_argument("--heldout", nargs="+", default=["docs/data/h200_r2/final.jsonl",
                                                     "docs/data/h200_r4/rebalanced_eval.jsonl"],
                    help="sweep files of the evaluation batches, merged as --train")
    ap.add_argument("--heldout-cases", default="bench/data/sweep_cases_r8.json")
    ap.add_argument("--retime", default="docs/data/h200_r2/retime.jsonl",
                    help="a repeat run of the held-out cases: also tabulate the held-out errors against the best "
                         "of the repeated timings of each plan ('' to skip)")
    ap.add_argument("--old", default="docs/data/h200_r2/calibration_format1.json",
                    help="calibration to compare with (the format-1 one shipped before)")
    ap.add_argument("--out", default=None, help="write the new calibration document here")
    ap.add_argument("--report", default=None, help="write the error tables (JSON) here")
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()

    t0 = time.time()
    dev = resolve_device("NVIDIA H200")
    train, bw = sweep_samples(args.train, args.train_cases)
    held, bw_held = sweep_samples(args.heldout, args.heldout_cases)
    split_desc = (f"trained on {' + '.join(args.train)} (batches of {args.train_cases}), "
                  f"held out {' + '.join(args.heldout)} (batches of {args.heldout_cases})")
    print(f"{len(train)} training and {len(held)} held-out timed plans; read bandwidth "
          f"{bw / 1e12:.3f} TB/s (held-out run {bw_held / 1e12:.3f}) [{time.time() - t0:.0f}s]", flush=True)

    old_doc = json.loads(Path(args.old).read_text())
    old = Calibration.from_dict(old_doc["constants"])
    # start from the device defaults (Calibration.default: launch and merge costs of a few us), not from the
    # old fit, whose launch and merge constants had collapsed to ~0.1 us
    cal = fit_per_config(train, device=dev.name, read_bandwidth=bw, rounds=args.rounds)
    print(f"fitted [{time.time() - t0:.0f}s]", flush=True)

    trained_keys = {config_key(s.plan.config) for s in train}
    roles = [("train", train), ("heldout", held),
             ("heldout_trained_configs", [s for s in held if config_key(s.plan.config) in trained_keys])]
    if args.retime:
        rep, _ = sweep_samples(args.retime, args.heldout_cases)
        roles.append(("heldout_best_of_retime", best_of(held, rep)))
    tabs = {}
    for label, c in (("old", old), ("new", cal)):
        for role, ss in roles:
            tabs[f"{label}_{role}"] = error_table(ss, predict_samples(ss, c, dev))
            _print_table(f"{label} calibration, {role}", tabs[f"{label}_{role}"])

    report = {"train": args.train, "train_cases": args.train_cases, "heldout": args.heldout,
              "heldout_cases": args.heldout_cases, "split": split_desc,
              "retime": args.retime or None, "trained_configs": sorted(trained_keys),
              "read_bandwidth_bytes_per_s": bw, "constants": cal.to_dict(), "tables": tabs}
    if args.report:
        Path(args.report).write_text(json.dumps(report, indent=1) + "\n")
    if args.out:
        h = tabs["new_heldout"]
        doc = {
            "format": "kvsplit.calibration", "format_version": 2,
            "gpu": dev.name, "num_kv_heads": 4, "head_dim": 128, "dtype": "bfloat16", "page_size": 16,
            "kernel_config": {},
            "constants": cal.to_dict(),
            "error": {**error_summary(tabs["new_train"], h), "trained_configs": sorted(trained_keys)},
            "num_samples": len(train),
            "read_bandwidth_gbps": bw / 1e9,
            "source": (f"scripts/fit_simulator.py (bench/gpu_sweep.py on an H200, 2026-11-30 to 2026-12-01): {split_desc}; "
                       "slots = measured residency per kernel config (kernels/residency.py)"),
        }
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"done [{time.time() - t0:.0f}s]")


if __name__ == "__main__":
    main()
