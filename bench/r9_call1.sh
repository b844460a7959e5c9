#!/usr/bin/env bash
# Round 9, device call 1 (H200): KernelConfig.heads_per_tile's GPU tests, then the served pool (one KV head per
# work tile) and thirteen candidates with two heads per tile, all in one run, on the evaluation batches
# (bench/data/sweep_cases.json: issue 12's best plan per case) and on the training batches
# (bench/data/train_cases.json: the shipped table), each batch's plans back to back with balanced.
# Run from the repo root on the device machine; writes into $OUT.
source bench/device_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
python3 -m pytest -q -p no:cacheprovider tests/kernels/test_decode_gpu.py -k "heads_per_tile or graph_replay" 2>&1 \
    | tee "$OUT/gpu_tests_h2.log" | tail -n 3
POOL="stream_k|c3|n128w4s2,stream_k|c3|n64w4s3,stream_k|c2|n128w4s3,stream_k|c3|n128w4s2|o2m4"
POOL="$POOL,balanced|c3|n128w4s2,balanced|c4|n128w4s2,balanced|c4|n64w4s2"
H2="stream_k|c1|n64w4s3|pf|h2,stream_k|c1|n64w8s3|pf|h2,balanced|c1|n64w4s3|pf|h2,stream_k|c3|n32w4s3|pf|h2"
H2="$H2,stream_k|c3|n64w4s2|h2,stream_k|c4|n32w4s2|h2,balanced|c3|n64w4s2|h2,stream_k|c2|n64w8s2|h2"
H2="$H2,balanced|c3|n32w4s3|pf|h2,stream_k|c2|n32w4s4|pf|h2,stream_k|c3|n64w4s3|h2,stream_k|c2|n64w4s3|pf|h2"
H2="$H2,balanced|c2|n64w4s3|pf|h2"
python3 bench/gpu_sweep.py --mode train --cases bench/data/sweep_cases.json --candidates "$POOL,$H2" --rep-ms 10 \
    --budget-s 200 --out "$OUT" --out-name eval9_h2.jsonl 2>&1 | tee "$OUT/eval9_h2.log" | tail -n 2
python3 bench/gpu_sweep.py --mode train --cases bench/data/train_cases.json --candidates "$POOL,$H2" --rep-ms 10 \
    --budget-s 280 --out "$OUT" --out-name train9_h2.jsonl 2>&1 | tee "$OUT/train9_h2.log" | tail -n 2
tar czf "$OUT/triton_cache.tgz" .triton_cache && du -h "$OUT/triton_cache.tgz"
