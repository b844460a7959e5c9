#!/usr/bin/env bash
# Round 15, device call 4 (H200): DecodeWrapper's CUDA-graph path with this round's re-pick (ctas_per_sm raised to
# the graph tile's residency for entries tuned on another tile with < 2 CTAs per SM) and its default merge
# (overlapped, one warp, grid held to B), against round 14's re-pick and merge (tableold, g4) and the served eager
# plan, on the reference, trace, jittered and untuned-size batches; then the graph and overlap GPU tests.
[ -f .peers/triton_cache.tgz ] && tar xzf .peers/triton_cache.tgz
source bench/device_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
python3 bench/graph_ab.py --out "$OUT" --sets trace,ref,jitter,untuned --T 1048576,262144 --budget-s 200 \
    --graphs "new=table,old=tableold" --variants run,g4 2>&1 | tee "$OUT/graph_ab3.log" | tail -n 6
mv "$OUT/graph_ab.jsonl" "$OUT/graph_ab3.jsonl"
timeout 200 python3 -m pytest -q -p no:cacheprovider -n 4 tests/kernels/test_decode_gpu.py \
    -k "overlapped or graph or wrapper" 2>&1 | tee "$OUT/gpu_tests_r15b.log" | tail -n 3
ls -la "$OUT"
