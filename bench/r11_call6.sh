#!/usr/bin/env bash
# Round 11, device call 6 (H200): the rebuilt table (the served pool plus the two one-CTA stream-K plans with the
# look-ahead over items, built from call 5's training run; the whole-wave rule as round 9 set it) re-timed on the
# 182 evaluation batches with the plan round 9's table served (served_prev) back to back, then the GPU tests of the
# shipped table's whole-wave plans. Run from the repo root on the device machine; .peers/ carried (the Triton cache).
[ -f .peers/triton_cache.tgz ] && tar xzf .peers/triton_cache.tgz
source bench/device_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
python3 bench/gpu_sweep.py --mode retime --flashinfer skip --rep-ms 10 --out "$OUT" --out-name retime15.jsonl 2>&1 | tee "$OUT/retime15.log" | tail -n 2
python3 -m pytest -q -p no:cacheprovider tests/kernels/test_decode_gpu.py -k "whole_wave or shipped" 2>&1 | tee "$OUT/gpu_tests_r11_ww.log" | tail -n 3
