#!/usr/bin/env bash
# Round 14, device call 2 (H200): how the overlapped merge should launch. Its GPU tests with the new default
# (trigger at each tile's last item, 500 ns between volatile polls, one acquire read after them), then
# bench/merge_ab.py back to back: stage 1 alone, today's merge, the new default (ov), without PDL (ov+np: the
# protocol's cost alone), call 1's settings (ov+aq+t0+p0), and the default with one change each: the trigger at CTA
# start (ov+t0), no back-off (ov+p0), an acquire read at every poll (ov+aq); served plan and stream_k|c2, the
# reference batches at T = 1M and 262k and the trace batches.
[ -f .peers/triton_cache.tgz ] && tar xzf .peers/triton_cache.tgz
source bench/device_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_decode_gpu.py -k overlapped -x 2>&1 \
    | tee "$OUT/gpu_tests_overlap2.log" | tail -n 3
grep -q " passed" "$OUT/gpu_tests_overlap2.log" && ! grep -q "failed\|error" "$OUT/gpu_tests_overlap2.log" || {
    echo "overlap tests did not pass: no timing"; exit 1; }
python3 bench/merge_ab.py --out "$OUT" --T 1048576,262144 --sets ref,trace --budget-s 330 \
    --variants "s1,auto,ov,ov+np,ov+aq+t0+p0,ov+t0,ov+p0,ov+aq" \
    --plans "served,stream_k|c2|n32w4s3|pf|h2|nx" 2>&1 | tee "$OUT/merge_ab_ov2.log" | tail -n 8
mv "$OUT/merge_ab.jsonl" "$OUT/merge_ab_ov2.jsonl"
tar czf "$OUT/triton_cache.tgz" .triton_cache
