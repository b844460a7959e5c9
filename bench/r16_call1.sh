#!/usr/bin/env bash
# Round 16, device call 1 (H200): DecodeWrapper's CUDA-graph path with GQA-packed work tiles (heads_per_tile 2,
# new in graph mode) against the default one-head tile, on the reference, trace, jittered and untuned-size
# batches (the table re-picks the rule's parameters on each graph's tile); then the graph GPU tests.
[ -f .peers/triton_cache.tgz ] && tar xzf .peers/triton_cache.tgz
source bench/device_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
G="new=table,h2=table+stream_k|c3|n128w4s2|h2,la8=table+stream_k|c1|n64w8s3|pf|h2|nx"
G="$G,la4=table+stream_k|c1|n64w4s3|pf|h2|nx,s32=table+stream_k|c3|n32w4s3|pf|h2"
G="$G,la8r=table+stream_k|c1|n64w8s3|pf|h2|nx@r,fla8=stream_k|c1|n64w8s3|pf|h2|nx"
python3 bench/graph_ab.py --out "$OUT" --sets trace,ref,jitter,untuned --T 1048576,262144 --budget-s 420 \
    --graphs "$G" --variants run 2>&1 | tee "$OUT/graph_ab_r16.log" | tail -n 9
mv "$OUT/graph_ab.jsonl" "$OUT/graph_ab_r16.jsonl"
timeout 120 python3 -m pytest -q -p no:cacheprovider -n 4 tests/kernels/test_decode_gpu.py \
    -k "overlapped or graph or wrapper" 2>&1 | tee "$OUT/gpu_tests_r16.log" | tail -n 3
ls -la "$OUT"
