#!/usr/bin/env bash
# Round 8, device call 4 (H200): KernelConfig.heads_per_tile (two KV heads per work tile) -- its GPU tests, then ten
# candidate plans on it timed on the training batches (for the table) and on the evaluation batches (issue 12's
# best plan per case), each batch's plans back to back with balanced. Run from the repo root on the device machine.
source bench/device_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
python3 -m pytest -q -p no:cacheprovider tests/kernels/test_decode_gpu.py -k "heads_per_tile or graph_replay" 2>&1 | tail -n 3
CANDS="stream_k|c1|n64w4s3|pf|h2,stream_k|c1|n64w8s3|pf|h2,balanced|c1|n64w4s3|pf|h2,stream_k|c3|n32w4s3|pf|h2"
CANDS="$CANDS,stream_k|c3|n64w4s2|h2,stream_k|c4|n32w4s2|h2,balanced|c3|n64w4s2|h2,stream_k|c2|n64w8s2|h2"
CANDS="$CANDS,balanced|c3|n32w4s3|pf|h2,stream_k|c2|n32w4s4|pf|h2"
python3 bench/gpu_sweep.py --mode train --cases bench/data/sweep_cases.json --candidates "$CANDS" --rep-ms 10 \
    --budget-s 200 --out "$OUT" --out-name eval8_h2.jsonl 2>&1 | tee "$OUT/eval8_h2.log" | tail -n 2
python3 bench/gpu_sweep.py --mode train --cases bench/data/train_cases.json --candidates "$CANDS" --rep-ms 10 \
    --budget-s 250 --out "$OUT" --out-name train8_h2.jsonl 2>&1 | tee "$OUT/train8_h2.log" | tail -n 2
