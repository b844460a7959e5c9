#!/usr/bin/env bash
# Round 12, device call 2 (H200): the served pool (scripts/build_shipped_policies.py's SERVED_POOL) and three
# candidates that won reference cases in call 1 (docs/data/h200_r12/ref12_c2nx.log): two CTAs per SM with the
# look-ahead over items (balanced and stream_k, (32, 4, 3) with two heads per tile) and the unsplit (32, 4, 2) tile
# with two heads per tile at 4 CTAs per SM; all in one run on the training batches (bench/data/train_cases.json),
# each batch's plans back to back with balanced. Run from the repo root on the device machine; .peers/ carried
# (the Triton cache of call 1).
[ -f .peers/triton_cache.tgz ] && tar xzf .peers/triton_cache.tgz
source bench/device_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
POOL="stream_k|c3|n128w4s2,stream_k|c3|n64w4s3,stream_k|c2|n128w4s3,stream_k|c3|n128w4s2|o2m4"
POOL="$POOL,balanced|c3|n128w4s2,balanced|c4|n128w4s2,balanced|c4|n64w4s2"
POOL="$POOL,balanced|c3|n32w4s3|pf|h2,balanced|c3|n64w4s2|h2,stream_k|c2|n32w4s4|pf|h2,stream_k|c2|n64w8s2|h2"
POOL="$POOL,stream_k|c3|n32w4s3|pf|h2,stream_k|c3|n64w4s2|h2,stream_k|c4|n32w4s2|h2"
POOL="$POOL,stream_k|c1|n64w8s3|pf|h2|nx,stream_k|c1|n64w4s3|pf|h2|nx"
NEW="balanced|c2|n32w4s3|pf|h2|nx,stream_k|c2|n32w4s3|pf|h2|nx,balanced|c4|n32w4s2|h2"
python3 bench/gpu_sweep.py --mode train --cases bench/data/train_cases.json --candidates "$POOL,$NEW" --rep-ms 10 \
    --budget-s 400 --out "$OUT" --out-name train12.jsonl 2>&1 | tee "$OUT/train12.log" | tail -n 2
tar czf "$OUT/triton_cache.tgz" .triton_cache
