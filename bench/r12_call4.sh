#!/usr/bin/env bash
# Round 12, device call 4 (H200): the look-ahead GPU tests with round 12's two new pool tiles (balanced and
# stream_k at 2 CTAs per SM, (32, 4, 3), two heads per tile), then the shipped table (call 3's table b, built with
# --previous) re-timed on the 182 evaluation batches with round 11's served plan (served_prev) back to back: the
# second run of that comparison. Run from the repo root on the device machine; .peers/ carried (the Triton cache).
[ -f .peers/triton_cache.tgz ] && tar xzf .peers/triton_cache.tgz
source bench/device_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
python3 -m pytest -q -p no:cacheprovider tests/kernels/test_decode_gpu.py -k "next_item" 2>&1 \
    | tee "$OUT/gpu_tests_r12_nx.log" | tail -n 3
python3 bench/gpu_sweep.py --mode retime --flashinfer skip --rep-ms 10 --out "$OUT" --out-name retime18.jsonl 2>&1 \
    | tee "$OUT/retime18.log" | tail -n 2
