#!/usr/bin/env bash
# Round 14, device call 3 (H200): the overlapped merge's default rule (on from 256 merged (request, query head)
# pairs, with PDL) against the same default with it off (ovoff: round 13's) and with 250 / 2000 ns between polls,
# the served plans on the reference,
# jittered, untuned-size and trace batches (bench/merge_ab.py, back to back); then the whole GPU test suite
# (pytest-xdist, 6 workers on the one GPU).
[ -f .peers/triton_cache.tgz ] && tar xzf .peers/triton_cache.tgz
source bench/device_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
python3 bench/merge_ab.py --out "$OUT" --T 1048576,262144 --sets ref,jitter,untuned,trace --budget-s 130 \
    --variants "auto,ovoff,ov+p250,ov+p2000" --plans served 2>&1 | tee "$OUT/merge_ab_rule.log" | tail -n 2
mv "$OUT/merge_ab.jsonl" "$OUT/merge_ab_rule.jsonl"
timeout 330 python3 -m pytest -q -p no:cacheprovider -n 6 tests/kernels/test_decode_gpu.py 2>&1 \
    | tee "$OUT/gpu_tests_r14.log" | tail -n 4
tar czf "$OUT/triton_cache.tgz" .triton_cache
