#!/usr/bin/env bash
# Round 13, device call 1 (H200): the GPU test of launch_decode(timeline=...), then bench/timeline.py (where
# stage 1's time goes per work tile: span, dispatch ramp, tail, fixed cost per work item) on the reference
# batches at T = 1,048,576 under the shipped pool's look-ahead plans and round 9's balanced|c3 plan.
# Run from the repo root on the device machine; .peers/triton_cache.tgz carried when there is one.
[ -f .peers/triton_cache.tgz ] && tar xzf .peers/triton_cache.tgz
source bench/device_env.sh
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_decode_gpu.py -k "timeline" \
    2>&1 | tee "$OUT/gpu_tests_r13_timeline.log" | tail -n 3
python3 bench/timeline.py --out "$OUT" --B 1,8,32,64,128,256,512 --budget-s 330 --items 32 2>&1 \
    | tee "$OUT/timeline_1m.log" | tail -n 200
gzip -f "$OUT/timeline.jsonl"
tar czf "$OUT/triton_cache.tgz" .triton_cache 2>/dev/null; ls -la "$OUT"
