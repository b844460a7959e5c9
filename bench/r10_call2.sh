#!/usr/bin/env bash
# Needs docs/data/h200_r10/flat_items.patch applied (git apply): the flat loop was removed after round 10 lost it.
# Round 10, device call 2 (H200): (1) the flat item loop with q loaded in every iteration (flat3) beside call 1's
# flat loop and the shipped loop, same plans back to back; (2) Optuna on the GPU with and without prefetch /
# heads_per_tile in the searched space, three buckets, then their held-out batches timed with each study's best,
# the shipped table's served plan and balanced (bench/tune_space_ab.py). Run from the repo root on the device
# machine; .peers/ carried (the Triton cache of call 1).
[ -f .peers/triton_cache.tgz ] && tar xzf .peers/triton_cache.tgz
source bench/device_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
M=1048576; K=262144
CASES="$M:uniform:8,$M:uniform:64,$M:uniform:512,$M:skewed40:256,$K:uniform:512,$K:skewed80:512"
PLANS="stream_k|c1|n64w8s3|pf|h2,balanced|c1|n64w4s3|pf|h2,stream_k|c1|n128w8s3|pf"
python3 bench/stream_ab.py --out "$OUT" --variants decode,flat,flat3 --cases "$CASES" --plans "$PLANS" --budget-s 120 \
    2>&1 | tee "$OUT/flat3_ab.log" | tail -n 20
python3 bench/tune_space_ab.py --out "$OUT" --trials 30 \
    --tasks "skewed80:64:$M,uniform:128:$K,skewed40:256:$K" 2>&1 | tee "$OUT/tune_space_ab.log" | tail -n 12
tar czf "$OUT/triton_cache.tgz" .triton_cache && du -h "$OUT/triton_cache.tgz"
