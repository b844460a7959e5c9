#!/usr/bin/env bash
# Round 15, device call 2 (H200): the served pool (scripts/build_shipped_policies.py SERVED_POOL; call 1 timed
# gpu_sweep's default candidates instead) on the 280 training batches under round 14's kernel; DecodeWrapper's
# CUDA-graph path against the served eager plan with its merge variants (bench/graph_ab.py); the overlapped-merge
# and graph GPU tests.
# Run from the repo root on the device machine; .peers/triton_cache.tgz carried.
[ -f .peers/triton_cache.tgz ] && tar xzf .peers/triton_cache.tgz
source bench/device_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
POOL=$(python3 -c "import ast
m = ast.parse(open('scripts/build_shipped_policies.py').read())
v = next(n.value for n in m.body if isinstance(n, ast.Assign) and n.targets[0].id == 'SERVED_POOL')
print(','.join(ast.literal_eval(v)))")
[ -n "$POOL" ] || { echo "no pool"; exit 1; }
echo "pool: $POOL"
python3 bench/gpu_sweep.py --mode train --cases bench/data/train_cases.json --candidates "$POOL" --rep-ms 10 \
    --budget-s 240 --out "$OUT" --out-name train15.jsonl 2>&1 | tee "$OUT/train15.log" | tail -n 2
python3 bench/graph_ab.py --out "$OUT" --sets trace,ref --T 1048576,262144 --budget-s 130 2>&1 \
    | tee "$OUT/graph_ab.log" | tail -n 8
timeout 150 python3 -m pytest -q -p no:cacheprovider -n 4 tests/kernels/test_decode_gpu.py \
    -k "overlapped or wrapper_graph" 2>&1 | tee "$OUT/gpu_tests_r15.log" | tail -n 3
tar czf "$OUT/triton_cache.tgz" .triton_cache
ls -la "$OUT"
