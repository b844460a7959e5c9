#!/usr/bin/env bash
# Round 15, device call 1 (H200): #7's timing runs re-run under round 14's kernel (launch_decode's default now
# overlaps the merge with stage 1 from 256 merged (request, query head) pairs on): the served pool
# (scripts/build_shipped_policies.py SERVED_POOL) on the 280 training batches (for the simulator's merge refit and
# the table rebuild) and round 13's 16 best-plan candidates on the 96 reference batches (held out).
# Run from the repo root on the device machine; .peers/triton_cache.tgz carried when there is one.
[ -f .peers/triton_cache.tgz ] && tar xzf .peers/triton_cache.tgz
source bench/device_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
POOL=$(python3 -c "import sys; sys.path.insert(0, 'scripts'); from build_shipped_policies import SERVED_POOL; print(','.join(SERVED_POOL))")
python3 bench/gpu_sweep.py --mode train --cases bench/data/train_cases.json --candidates "$POOL" --rep-ms 10 \
    --budget-s 300 --out "$OUT" --out-name train15.jsonl 2>&1 | tee "$OUT/train15.log" | tail -n 2
python3 -c "import json; c = json.load(open('bench/data/sweep_cases.json'))['cases']
json.dump({'cases': [x for x in c if x['set'] == 'ref']}, open('/tmp/ref_cases.json', 'w'))"
WON="stream_k|c1|n64w4s3|pf|h2|nx,stream_k|c1|n64w8s3|pf|h2|nx,balanced|c1|n64w4s3|pf|h2|nx,balanced|c3|n32w4s3|pf|h2"
WON="$WON,balanced|c3|n64w4s2|h2,balanced|c4|n64w4s2,stream_k|c3|n32w4s3|pf|h2"
NEW="stream_k|c2|n32w4s3|pf|h2|nx,stream_k|c2|n32w8s3|pf|h2|nx,balanced|c2|n32w4s3|pf|h2|nx,stream_k|c2|n64w4s3|pf|nx"
NEW="$NEW,balanced|c2|n64w4s3|pf|nx,stream_k|c2|n32w4s4|pf|h2|nx,balanced|c3|n32w4s3|pf|nx,stream_k|c3|n32w4s3|pf|nx"
NEW="$NEW,balanced|c4|n32w4s2|h2"
python3 bench/gpu_sweep.py --mode train --cases /tmp/ref_cases.json --candidates "$WON,$NEW" --rep-ms 10 \
    --budget-s 150 --out "$OUT" --out-name ref15.jsonl 2>&1 | tee "$OUT/ref15.log" | tail -n 2
tar czf "$OUT/triton_cache.tgz" .triton_cache
ls -la "$OUT"
