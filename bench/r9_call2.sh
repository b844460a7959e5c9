#!/usr/bin/env bash
# Round 9, device call 2 (H200): the table rebuilt with two-heads-per-tile members in its pool, re-timed on the
# 182 evaluation batches -- per batch the served plan, the plan the table before the rebuild served (served_prev),
# the oracle's winners, the baselines (gpu_sweep --mode retime) -- then FlashInfer's kernel in a second process,
# then the whole GPU test suite. Run from the repo root on the device machine; .peers/ carried (FlashInfer and
# the Triton cache of call 1).
[ -f .peers/triton_cache.tgz ] && tar xzf .peers/triton_cache.tgz
source bench/device_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
python3 bench/gpu_sweep.py --mode retime --flashinfer skip --rep-ms 10 --out "$OUT" --out-name retime12.jsonl 2>&1 | tee "$OUT/retime12.log" | tail -n 2
python3 bench/gpu_sweep.py --mode retime --flashinfer only --rep-ms 10 --out "$OUT" --out-name retime12_fi.jsonl 2>&1 | tee "$OUT/retime12_fi.log" | tail -n 2
python3 -m pytest -q -p no:cacheprovider tests/kernels/test_decode_gpu.py 2>&1 | tee "$OUT/gpu_tests_r9.log" | tail -n 3
