#!/usr/bin/env bash
# Round 13, device call 5 (H200): the rebuilt table (service/data) re-timed against round 12's (bench/gpu_sweep.py
# --mode retime: served and served_prev back to back on the 182 evaluation batches), FlashInfer's kernel first in
# its own process, then the GPU tests call 4's 170 s did not reach.
# Run from the repo root on the device machine; .peers/ (Triton cache, trimmed FlashInfer) carried.
[ -f .peers/triton_cache.tgz ] && tar xzf .peers/triton_cache.tgz
source bench/device_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
python3 bench/gpu_sweep.py --mode retime --flashinfer only --rep-ms 10 --out "$OUT" --out-name retime19_fi.jsonl 2>&1 \
    | tee "$OUT/retime19_fi.log" | tail -n 2
python3 bench/gpu_sweep.py --mode retime --flashinfer skip --rep-ms 10 --out "$OUT" --out-name retime19.jsonl 2>&1 \
    | tee "$OUT/retime19.log" | tail -n 2
timeout 170 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_decode_gpu.py \
    -k "next_item or timeline or heads_per_tile or whole_wave or shipped or wrapper" 2>&1 | tee "$OUT/gpu_tests_r13b.log" | tail -n 3
