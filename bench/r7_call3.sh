#!/usr/bin/env bash
# Round 7, device call 3 (H200; issue 12's "<= 1.02x FlashInfer's kernel on every reference case"): the two
# reference cases whose best re-timed plan was above 1.02x FlashInfer's kernel in retime10 (uniform B=64 and
# skewed40 B=32, T=262,144) x the whole oracle grid and its prefetching tiles with today's kernel, then FlashInfer's
# kernel on them in a second process.
source bench/device_env.sh
python3 bench/gpu_sweep.py --mode train --cases bench/data/r7_fi_cases.json --grid-sample 100000 --rep-ms 10 \
    --out "$OUT" --out-name grid_fi_cases.jsonl 2>&1 | tee "$OUT/grid_fi_cases.log" | tail -n 4
python3 bench/gpu_sweep.py --mode retime --flashinfer only --cases bench/data/r7_fi_cases.json --rep-ms 10 \
    --out "$OUT" --out-name grid_fi_cases_fi.jsonl 2>&1 | tee "$OUT/grid_fi_cases_fi.log" | tail -n 3
