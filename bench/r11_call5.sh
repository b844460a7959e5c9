#!/usr/bin/env bash
# Round 11, device call 5 (H200): the served pool (scripts/build_shipped_policies.py's SERVED_POOL) and the three
# plans with the look-ahead over items (|nx), all in one run, on the training batches (bench/data/train_cases.json:
# the shipped table), each batch's plans back to back with balanced.
# Run from the repo root on the device machine; .peers/ carried (the Triton cache).
[ -f .peers/triton_cache.tgz ] && tar xzf .peers/triton_cache.tgz
source bench/device_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
POOL="stream_k|c3|n128w4s2,stream_k|c3|n64w4s3,stream_k|c2|n128w4s3,stream_k|c3|n128w4s2|o2m4"
POOL="$POOL,balanced|c3|n128w4s2,balanced|c4|n128w4s2,balanced|c4|n64w4s2"
POOL="$POOL,balanced|c3|n32w4s3|pf|h2,balanced|c3|n64w4s2|h2,stream_k|c2|n32w4s4|pf|h2,stream_k|c2|n64w8s2|h2"
POOL="$POOL,stream_k|c3|n32w4s3|pf|h2,stream_k|c3|n64w4s2|h2,stream_k|c4|n32w4s2|h2"
NX="stream_k|c1|n64w8s3|pf|h2|nx,stream_k|c1|n64w4s3|pf|h2|nx,balanced|c1|n64w4s3|pf|h2|nx"
python3 bench/gpu_sweep.py --mode train --cases bench/data/train_cases.json --candidates "$POOL,$NX" --rep-ms 10 \
    --budget-s 400 --out "$OUT" --out-name train11_nx.jsonl 2>&1 | tee "$OUT/train11_nx.log" | tail -n 2
