#!/usr/bin/env bash
# Round 7, device calls 1 and 4 (H200): the final table re-timed with the whole-wave rule (call 1: retime10 with the
# rule on 11 policies; call 4: retime11 with it on the H_kv 4 family; FlashInfer's kernel in a second process), and
# the evaluation batches whose served plan the rule changes timed back to back against the plan served before
# (pairs_r7 / pairs_r7b). Run from the repo root on the device machine; .peers/ carried
# (../shared/tools/flashinfer_for_device.sh .peers).
source bench/device_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
python3 bench/gpu_sweep.py --mode retime --flashinfer skip --rep-ms 10 --out "$OUT" --out-name retime11.jsonl 2>&1 | tee "$OUT/retime11.log" | tail -n 3
python3 bench/gpu_sweep.py --mode retime --flashinfer only --rep-ms 10 --out "$OUT" --out-name retime11_fi.jsonl 2>&1 | tee "$OUT/retime11_fi.log" | tail -n 3
python3 bench/gpu_sweep.py --mode pairs --flashinfer skip --pairs bench/data/pairs_r7_whole_wave.json --rep-ms 10 --out "$OUT" --out-name pairs_r7b.jsonl 2>&1 | tee "$OUT/pairs_r7b.log"
