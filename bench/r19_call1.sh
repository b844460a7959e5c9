#!/usr/bin/env bash
# Round 19, device call 1 (H200): work tiles of all four KV heads at Qwen3-30B-A3B's G = 8 (heads_per_tile 4,
# 32 query rows) against the served plan and the two-head plans the table serves most, on the 96 reference
# batches at T = 262,144 and 1,048,576, in one process; then the same pairs in the reverse order. Names ending in
# |sub run the 32 rows as two 16-row sub-tiles (a batched tl.dot), the others as one 32-row tile.
# Lost (docs/perf.md, round 19): the kernel and bench changes it needs are kept as docs/data/h200_r19/wide_tiles.patch;
# `git apply docs/data/h200_r19/wide_tiles.patch` before running it.
[ -f .peers/triton_cache.tgz ] && tar xzf .peers/triton_cache.tgz
source bench/device_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
for order in "" _rev; do
    timeout $([ -z "$order" ] && echo 330 || echo 200) python3 bench/gpu_sweep.py --mode pairs --query-rows 32 \
        --pairs docs/data/h200_r19/h4_pairs$order.json --rep-ms 10 --out "$OUT" --out-name h4_ab$order.jsonl \
        2>&1 | tee "$OUT/h4_ab$order.log" | tail -n 8
done
tar czf "$OUT/triton_cache.tgz" .triton_cache
ls -la "$OUT"
