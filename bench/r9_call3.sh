#!/usr/bin/env bash
# Round 9, device call 3 (H200): the final table (two-heads-per-tile pool members, the whole-wave rule kept on for
# the H_kv 4 family) re-timed on the 182 evaluation batches with the plan round 8's table served (served_prev)
# back to back, FlashInfer's kernel in a second process, then the GPU tests of the shipped table's whole-wave
# plans. Run from the repo root on the device machine; .peers/ carried (FlashInfer, the Triton cache).
[ -f .peers/triton_cache.tgz ] && tar xzf .peers/triton_cache.tgz
source bench/device_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
python3 bench/gpu_sweep.py --mode retime --flashinfer skip --rep-ms 10 --out "$OUT" --out-name retime13.jsonl 2>&1 | tee "$OUT/retime13.log" | tail -n 2
python3 bench/gpu_sweep.py --mode retime --flashinfer only --rep-ms 10 --out "$OUT" --out-name retime13_fi.jsonl 2>&1 | tee "$OUT/retime13_fi.log" | tail -n 2
python3 -m pytest -q -p no:cacheprovider tests/kernels/test_decode_gpu.py -k "whole_wave or shipped" 2>&1 | tee "$OUT/gpu_tests_r9_ww.log" | tail -n 3
