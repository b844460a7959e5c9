#!/usr/bin/env bash
# Round 18, device call 1 (H200): the stream-K tail balanced at run time (bench/tail_ab.py): big pieces first,
# then small ones the persistent programs claim (or the block scheduler hands out) as SMs finish, against the grid
# launch and the plain persistent one, on the 48 reference batches at T = 1,048,576. The run also timed a
# claim-ahead kernel variant (--ahead, since removed with it: docs/data/h200_r18/claim_ahead.patch).
[ -f .peers/triton_cache.tgz ] && tar xzf .peers/triton_cache.tgz
source bench/device_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
python3 bench/tail_ab.py --out "$OUT" --T 1048576 --budget-s 300 --rep-ms 15 \
    --tails "0.97:0.03,0.95:0.05,0.95:0.025,0.9:0.05" 2>&1 | tee "$OUT/tail_ab.log" | tail -n 120
tar czf "$OUT/triton_cache.tgz" .triton_cache
ls -la "$OUT"
