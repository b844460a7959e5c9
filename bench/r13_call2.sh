#!/usr/bin/env bash
# Round 13, device call 2 (H200): what the merge launch costs (bench/merge_ab.py: stage 1 alone, the default
# merge, merge_dsplit 1-16, 1 and 8 merge warps) on reference batches at T = 1,048,576 and 262,144, under the
# pool's look-ahead plans; then the timeline GPU test again (call 1's ran out of its 90 s while compiling).
# Run from the repo root on the device machine; .peers/triton_cache.tgz carried.
[ -f .peers/triton_cache.tgz ] && tar xzf .peers/triton_cache.tgz
source bench/device_env.sh
python3 bench/merge_ab.py --out "$OUT" --T 1048576,262144 --B 1,8,64,128,512 --variants s1,auto,d1,d2,d4,d8,d16,w1,w8 \
    --budget-s 300 2>&1 | tee "$OUT/merge_ab.log" | tail -n 120
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_decode_gpu.py -k "timeline" \
    2>&1 | tee "$OUT/gpu_tests_r13_timeline.log" | tail -n 3
tar czf "$OUT/triton_cache.tgz" .triton_cache 2>/dev/null
