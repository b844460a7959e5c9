#!/usr/bin/env bash
# Round 14, device call 1 (H200): the overlapped merge (launch_decode(merge_overlap=True)): its GPU tests
# (bit-identical to the merge after stage 1, 40 CUDA-graph replays, counters back at zero), then bench/merge_ab.py
# with stage 1 alone (s1), today's default merge (auto) and the overlapped one (ov), back to back, on the
# reference batches at T = 1M and 262k and the held-out trace batches, under the served plan and two others.
# Run from the repo root on the device machine; .peers/ carried (Triton cache when there is one).
[ -f .peers/triton_cache.tgz ] && tar xzf .peers/triton_cache.tgz
source bench/device_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_decode_gpu.py -k overlapped -x 2>&1 \
    | tee "$OUT/gpu_tests_overlap.log" | tail -n 5
grep -q " passed" "$OUT/gpu_tests_overlap.log" && ! grep -q "failed\|error" "$OUT/gpu_tests_overlap.log" || {
    echo "overlap tests did not pass: no timing"; tar czf "$OUT/triton_cache.tgz" .triton_cache; exit 1; }
python3 bench/merge_ab.py --out "$OUT" --T 1048576,262144 --sets ref,trace --variants s1,auto,ov --budget-s 260 \
    --plans "served,stream_k|c2|n32w4s3|pf|h2|nx,balanced|c3|n32w4s3|pf|h2" 2>&1 | tee "$OUT/merge_ab_ov.log" | tail -n 4
mv "$OUT/merge_ab.jsonl" "$OUT/merge_ab_ov.jsonl"
tar czf "$OUT/triton_cache.tgz" .triton_cache
