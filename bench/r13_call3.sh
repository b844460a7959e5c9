#!/usr/bin/env bash
# Round 13, device call 3 (H200): the table-driven merge (kvsplit.kernels.decode.merge_table) in several shapes
# against launch_decode's default merge and its 1-warp version (bench/merge_ab.py), on reference batches at
# T = 1,048,576 and 262,144 under the pool's look-ahead plans. Run from the repo root on the device machine;
# .peers/triton_cache.tgz carried.
[ -f .peers/triton_cache.tgz ] && tar xzf .peers/triton_cache.tgz
source bench/device_env.sh
python3 bench/merge_ab.py --out "$OUT" --T 1048576,262144 --B 1,8,64,128,512 \
    --variants s1,auto,w1,t8_32_32_w1,t8_64_16_w1,t4_32_32_w1,t16_32_32_w1,t8_32_32_w2,t8_128_32_w4 \
    --budget-s 330 2>&1 | tee "$OUT/merge_ab_table.log" | tail -n 14
mv "$OUT/merge_ab.jsonl" "$OUT/merge_ab_table.jsonl"
tar czf "$OUT/triton_cache.tgz" .triton_cache 2>/dev/null
