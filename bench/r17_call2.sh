#!/usr/bin/env bash
# Round 17, device call 2 (H200): the refined re-pick on a multi-CTA graph tile. `t128` = the table re-picked on
# (128, 4, 2) with one head per tile (round 15's rule again for tiles of 2+ resident CTAs per SM: round 16's
# default), `f128` = stream_k at that tile's residency for every batch (the rule call 1 timed as t128), against the
# new default; then the whole GPU test suite.
[ -f .peers/triton_cache.tgz ] && tar xzf .peers/triton_cache.tgz
source bench/device_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
G="new=table,t128=table+stream_k|c3|n128w4s2,f128=stream_k|c3|n128w4s2"
python3 bench/graph_ab.py --out "$OUT" --sets trace,ref,jitter,untuned --T 1048576,262144 --budget-s 200 \
    --graphs "$G" --variants run 2>&1 | tee "$OUT/graph_ab_r17b.log" | tail -n 4
mv "$OUT/graph_ab.jsonl" "$OUT/graph_ab_r17b.jsonl"
timeout 420 python3 -m pytest -q -p no:cacheprovider -n 8 tests/kernels/test_decode_gpu.py 2>&1 \
    | tee "$OUT/gpu_tests_r17_all.log" | tail -n 3
ls -la "$OUT"
