#!/usr/bin/env bash
# Round 12, device call 1 (H200):
# 1. the GPU tests of heads_per_tile and next_item, after d194e94's refactor of their CUDA-graph helper;
# 2. two CTAs per SM with the look-ahead over items (|nx at c2: the other CTA covers an item boundary) and the
#    unsplit two-head (32, 4, 2) tile that Optuna found for uniform B >= 256 (balanced|c4|n32w4s2|h2), against
#    round 11's winners, on the 96 reference batches (bench/gpu_sweep.py --mode train, one run);
# 3. issue 12's "<= 1.02x today's kernel": bench/kernel_ab.py, variant A (66babf4) on its one-head plans.
# Run from the repo root on the device machine; .peers/ carried (the Triton cache, when there is one).
[ -f .peers/triton_cache.tgz ] && tar xzf .peers/triton_cache.tgz
source bench/device_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
python3 -m pytest -q -p no:cacheprovider tests/kernels/test_decode_gpu.py -k "next_item or heads_per_tile" 2>&1 \
    | tee "$OUT/gpu_tests_r12.log" | tail -n 3
python3 -c "import json; c = json.load(open('bench/data/sweep_cases.json'))['cases']
json.dump({'cases': [x for x in c if x['set'] == 'ref']}, open('/tmp/ref_cases.json', 'w'))"
WON="stream_k|c1|n64w4s3|pf|h2|nx,stream_k|c1|n64w8s3|pf|h2|nx,balanced|c1|n64w4s3|pf|h2|nx,balanced|c3|n32w4s3|pf|h2"
WON="$WON,balanced|c3|n64w4s2|h2,balanced|c4|n64w4s2,stream_k|c3|n32w4s3|pf|h2"
NEW="stream_k|c2|n32w4s3|pf|h2|nx,stream_k|c2|n32w8s3|pf|h2|nx,balanced|c2|n32w4s3|pf|h2|nx,stream_k|c2|n64w4s3|pf|nx"
NEW="$NEW,balanced|c2|n64w4s3|pf|nx,stream_k|c2|n32w4s4|pf|h2|nx,balanced|c3|n32w4s3|pf|nx,stream_k|c3|n32w4s3|pf|nx"
NEW="$NEW,balanced|c4|n32w4s2|h2"
python3 bench/gpu_sweep.py --mode train --cases /tmp/ref_cases.json --candidates "$WON,$NEW" --rep-ms 10 \
    --budget-s 200 --out "$OUT" --out-name ref12_c2nx.jsonl 2>&1 | tee "$OUT/ref12_c2nx.log" | tail -n 2
python3 bench/kernel_ab.py --cases /tmp/ref_cases.json --out "$OUT" --budget-s 230 --rep-ms 8 2>&1 \
    | tee "$OUT/kernel_ab_r12.log" | tail -n 100
tar czf "$OUT/triton_cache.tgz" .triton_cache
ls -la "$OUT"
