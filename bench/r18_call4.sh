#!/usr/bin/env bash
# Round 18, device call 4 (H200): the whole GPU test suite on the final tree (the shipped kernel unchanged, the
# table rebuilt from train15).
[ -f .peers/triton_cache.tgz ] && tar xzf .peers/triton_cache.tgz
source bench/device_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
timeout 420 python3 -m pytest -q -p no:cacheprovider -n 8 tests/kernels/test_decode_gpu.py 2>&1 \
    | tee "$OUT/gpu_tests_r18.log" | tail -n 3
