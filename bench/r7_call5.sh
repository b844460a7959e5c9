#!/usr/bin/env bash
# Round 7, device call 5 (H200; data for the next served-plan rule, issue 9's lead): on the 42 Qwen3-30B-A3B
# *training* batches with 24-99 requests (bench/data/r7_subwave_cases.json, the shipped table's plan as "served"),
# the served plan against the prefetching (64, 4, 3) tile's plans and round 1's default tile, back to back.
source bench/device_env.sh
python3 bench/gpu_sweep.py --mode pairs --flashinfer skip --cases bench/data/r7_subwave_cases.json \
    --pairs bench/data/pairs_r7_subwave.json --rep-ms 10 --out "$OUT" --out-name pairs_r7_subwave.jsonl 2>&1 \
    | tee "$OUT/pairs_r7_subwave.log" | tail -n 45
