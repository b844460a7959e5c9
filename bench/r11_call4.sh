#!/usr/bin/env bash
# Round 11, device call 4 (H200): KernelConfig.next_item's GPU tests, then round 9's twenty candidates and three
# with the look-ahead over items (|nx), all in one run, on the evaluation batches (bench/data/sweep_cases.json:
# issue 12's best plan per case), each batch's plans back to back with balanced.
# Run from the repo root on the device machine; .peers/ carried (the Triton cache).
[ -f .peers/triton_cache.tgz ] && tar xzf .peers/triton_cache.tgz
source bench/device_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
python3 -m pytest -q -p no:cacheprovider tests/kernels/test_decode_gpu.py -k "next_item or prefetching_loop" 2>&1 \
    | tee "$OUT/gpu_tests_nx.log" | tail -n 3
POOL="stream_k|c3|n128w4s2,stream_k|c3|n64w4s3,stream_k|c2|n128w4s3,stream_k|c3|n128w4s2|o2m4"
POOL="$POOL,balanced|c3|n128w4s2,balanced|c4|n128w4s2,balanced|c4|n64w4s2"
H2="stream_k|c1|n64w4s3|pf|h2,stream_k|c1|n64w8s3|pf|h2,balanced|c1|n64w4s3|pf|h2,stream_k|c3|n32w4s3|pf|h2"
H2="$H2,stream_k|c3|n64w4s2|h2,stream_k|c4|n32w4s2|h2,balanced|c3|n64w4s2|h2,stream_k|c2|n64w8s2|h2"
H2="$H2,balanced|c3|n32w4s3|pf|h2,stream_k|c2|n32w4s4|pf|h2,stream_k|c3|n64w4s3|h2,stream_k|c2|n64w4s3|pf|h2"
H2="$H2,balanced|c2|n64w4s3|pf|h2"
NX="stream_k|c1|n64w8s3|pf|h2|nx,stream_k|c1|n64w4s3|pf|h2|nx,balanced|c1|n64w4s3|pf|h2|nx"
python3 bench/gpu_sweep.py --mode train --cases bench/data/sweep_cases.json --candidates "$POOL,$H2,$NX" --rep-ms 10 \
    --budget-s 330 --out "$OUT" --out-name eval11_nx.jsonl 2>&1 | tee "$OUT/eval11_nx.log" | tail -n 2
