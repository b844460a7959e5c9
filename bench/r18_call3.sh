#!/usr/bin/env bash
# Round 18, device call 3 (H200): the table rebuilt from round 15's training run (train15, under round 14's kernel;
# docs/data/h200_r18/h200_policies_train15.json) against the shipped one, on the 15 of the 182 evaluation batches
# where they serve different plans (bench/data/sweep_cases_r18alt.json: served = shipped, served_alt = rebuilt),
# back to back in both orders.
[ -f .peers/triton_cache.tgz ] && tar xzf .peers/triton_cache.tgz
source bench/device_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
for order in "" _rev; do
    python3 bench/gpu_sweep.py --mode pairs --cases bench/data/sweep_cases_r18alt.json \
        --pairs docs/data/h200_r18/retime_pairs$order.json --rep-ms 20 --out "$OUT" --out-name retime_alt$order.jsonl \
        2>&1 | tee "$OUT/retime_alt$order.log" | tail -n 16
done
ls -la "$OUT"
