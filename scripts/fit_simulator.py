"""Fit the simulator (per-config constants, residency slots) to the H200 sweep and report its errors.

    .venv/bin/python scripts/fit_simulator.py \
        --sweep docs/data/h200_r2/sweep1.jsonl --cases bench/data/sweep_cases.json \
        --out service/data/h200_calibration.json --report docs/data/h200_r2/sim_fit.json

``--split even_odd`` (default) trains on the cases of even id and holds out
the odd ones (every set on both sides); ``--split sets`` trains on ``ref`` and
``jitter`` and holds out ``untuned``, ``llama8b`` and ``trace``
(kvsplit.tuner.simfit.HELDOUT_SETS), whose small trace batches (T of 10-100k
tokens) are unlike any training case. Prints the error table of
the old shipped calibration (one constant set, slots = 4) and of the new one,
per set and per policy, and writes the calibration document (format 2: the
shared constants, ``slots`` absent = measured residency per config,
``per_config`` overrides) that kvsplit's service imports into its store.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from kvsplit.kernels.device import resolve_device
from kvsplit.tuner.simfit import HELDOUT_SETS, error_table, fit_per_config, predict_samples, sweep_samples
from kvsplit.tuner.simulate import Calibration


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sweep", default="docs/data/h200_r2/sweep1.jsonl")
    ap.add_argument("--cases", default="bench/data/sweep_cases.json")
    ap.add_argument("--old", default="docs/data/h200_r2/calibration_format1.json",
                    help="calibration to compare with and start from (the format-1 one shipped before)")
    ap.add_argument("--out", default=None, help="write the new calibration document here")
    ap.add_argument("--report", default=None, help="write the error tables (JSON) here")
    ap.add_argument("--split", choices=("even_odd", "sets"), default="even_odd",
                    help="even_odd: train on even case ids, hold out odd ones (every set on both sides); "
                         "sets: train on the other sets, hold out --heldout")
    ap.add_argument("--heldout", default=",".join(HELDOUT_SETS))
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()

    t0 = time.time()
    dev = resolve_device("NVIDIA H200")
    samples, bw = sweep_samples(args.sweep, args.cases)
    if args.split == "even_odd":
        split_desc = "trained on even case ids, held out odd case ids (every set on both sides)"
        train = [s for s in samples if s.case % 2 == 0]
        held = [s for s in samples if s.case % 2 == 1]
    else:
        held_sets = set(s for s in args.heldout.split(",") if s)
        split_desc = f"trained on the sets other than {'+'.join(sorted(held_sets))}, held out those"
        train = [s for s in samples if s.set not in held_sets]
        held = [s for s in samples if s.set in held_sets]
    print(f"{len(samples)} timed plans ({len(train)} train, {len(held)} held out; {split_desc}); "
          f"read bandwidth {bw / 1e12:.3f} TB/s [{time.time() - t0:.0f}s]", flush=True)

    old_doc = json.loads(Path(args.old).read_text())
    old = Calibration.from_dict(old_doc["constants"])
    init = old if old.slots is not None else None
    cal = fit_per_config(train, device=dev.name, initial=init, read_bandwidth=bw, rounds=args.rounds)
    print(f"fitted [{time.time() - t0:.0f}s]", flush=True)

    tabs = {}
    for label, c in (("old", old), ("new", cal)):
        for role, ss in (("train", train), ("heldout", held)):
            tabs[f"{label}_{role}"] = error_table(ss, predict_samples(ss, c, dev))
            _print_table(f"{label} calibration, {role}", tabs[f"{label}_{role}"])

    report = {"sweep": args.sweep, "cases": args.cases, "split": split_desc,
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
            "error": {
                "train": {k: tabs["new_train"]["all"][k] for k in ("median", "worst")},
                "heldout": {k: h["all"][k] for k in ("median", "worst")},
                "heldout_per_set": {k: {"n": v["n"], "median": v["median"], "worst": v["worst"]}
                                    for k, v in h["per_set"].items()},
                "heldout_per_policy": {k: {"n": v["n"], "median": v["median"], "worst": v["worst"]}
                                       for k, v in h["per_policy"].items()},
            },
            "num_samples": len(train),
            "read_bandwidth_gbps": bw / 1e9,
            "source": (f"scripts/fit_simulator.py on {args.sweep} (bench/gpu_sweep.py on an H200, 2026-11-30): "
                       f"{split_desc}; "
                       "slots = measured residency per kernel config (kernels/residency.py)"),
        }
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"done [{time.time() - t0:.0f}s]")


if __name__ == "__main__":
    main()
