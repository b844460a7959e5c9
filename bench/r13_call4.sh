#!/usr/bin/env bash
# Round 13, device call 4 (H200), with launch_decode's new default merge (one warp per merge program from 256
# merged (request, query head) pairs on): the GPU tests that merge (every knob, the look-ahead, CUDA-graph
# replays, the timeline), the best plan per reference case (round 12 call 1's 16 candidates on the 96 reference
# batches) and the served pool on the 280 training batches (for the table rebuild).
# Run from the repo root on the device machine; .peers/triton_cache.tgz carried.
[ -f .peers/triton_cache.tgz ] && tar xzf .peers/triton_cache.tgz
source bench/device_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
timeout 170 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_decode_gpu.py \
    -k "knobs or next_item or timeline or graph or round2" 2>&1 | tee "$OUT/gpu_tests_r13.log" | tail -n 3
python3 -c "import json; c = json.load(open('bench/data/sweep_cases.json'))['cases']
json.dump({'cases': [x for x in c if x['set'] == 'ref']}, open('/tmp/ref_cases.json', 'w'))"
WON="stream_k|c1|n64w4s3|pf|h2|nx,stream_k|c1|n64w8s3|pf|h2|nx,balanced|c1|n64w4s3|pf|h2|nx,balanced|c3|n32w4s3|pf|h2"
WON="$WON,balanced|c3|n64w4s2|h2,balanced|c4|n64w4s2,stream_k|c3|n32w4s3|pf|h2"
NEW="stream_k|c2|n32w4s3|pf|h2|nx,stream_k|c2|n32w8s3|pf|h2|nx,balanced|c2|n32w4s3|pf|h2|nx,stream_k|c2|n64w4s3|pf|nx"
NEW="$NEW,balanced|c2|n64w4s3|pf|nx,stream_k|c2|n32w4s4|pf|h2|nx,balanced|c3|n32w4s3|pf|nx,stream_k|c3|n32w4s3|pf|nx"
NEW="$NEW,balanced|c4|n32w4s2|h2"
python3 bench/gpu_sweep.py --mode train --cases /tmp/ref_cases.json --candidates "$WON,$NEW" --rep-ms 10 \
    --budget-s 200 --out "$OUT" --out-name ref13.jsonl 2>&1 | tee "$OUT/ref13.log" | tail -n 2
POOL="stream_k|c3|n128w4s2,stream_k|c3|n64w4s3,stream_k|c2|n128w4s3,stream_k|c3|n128w4s2|o2m4"
POOL="$POOL,balanced|c3|n128w4s2,balanced|c4|n128w4s2,balanced|c4|n64w4s2"
POOL="$POOL,balanced|c3|n32w4s3|pf|h2,balanced|c3|n64w4s2|h2,stream_k|c2|n32w4s4|pf|h2,stream_k|c2|n64w8s2|h2"
POOL="$POOL,stream_k|c3|n32w4s3|pf|h2,stream_k|c3|n64w4s2|h2,stream_k|c4|n32w4s2|h2"
POOL="$POOL,stream_k|c1|n64w8s3|pf|h2|nx,stream_k|c1|n64w4s3|pf|h2|nx"
POOL="$POOL,balanced|c2|n32w4s3|pf|h2|nx,stream_k|c2|n32w4s3|pf|h2|nx,balanced|c4|n32w4s2|h2"
python3 bench/gpu_sweep.py --mode train --cases bench/data/train_cases.json --candidates "$POOL" --rep-ms 10 \
    --budget-s 220 --out "$OUT" --out-name train13.jsonl 2>&1 | tee "$OUT/train13.log" | tail -n 2
tar czf "$OUT/triton_cache.tgz" .triton_cache
ls -la "$OUT"
