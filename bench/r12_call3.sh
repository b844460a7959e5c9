#!/usr/bin/env bash
# Round 12, device call 3 (H200): two tables rebuilt from call 2's training run (three more pool plans; the
# whole-wave rule as round 9 set it), without (served) and with (served_alt: --previous, the hysteresis) keeping
# round 11's picks within the margin, re-timed on the 182 evaluation batches: FlashInfer's kernel in its own
# process, then served, served_alt and round 11's served plan (served_prev) back to back in a second process, then
# the GPU tests of the shipped table's plans. Run from the repo root on the device machine; .peers/ carried
# (FlashInfer, the Triton cache).
[ -f .peers/triton_cache.tgz ] && tar xzf .peers/triton_cache.tgz
source bench/device_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
python3 bench/gpu_sweep.py --mode retime --flashinfer only --rep-ms 10 --out "$OUT" --out-name retime17_fi.jsonl 2>&1 \
    | tee "$OUT/retime17_fi.log" | tail -n 2
python3 bench/gpu_sweep.py --mode retime --flashinfer skip --rep-ms 10 --out "$OUT" --out-name retime17.jsonl 2>&1 \
    | tee "$OUT/retime17.log" | tail -n 2
python3 -m pytest -q -p no:cacheprovider tests/kernels/test_decode_gpu.py -k "whole_wave or shipped" 2>&1 \
    | tee "$OUT/gpu_tests_r12_table.log" | tail -n 3
