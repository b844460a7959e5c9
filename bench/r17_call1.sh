#!/usr/bin/env bash
# Round 17, device call 1 (H200): DecodeWrapper's new CUDA-graph default (limits.graph_default_config's tile, two KV
# heads per work tile, stream_k at its residency; table entries tuned on another tile run that rule) against the
# same rule spelled out as a candidate (round 16's fla8) and the new re-pick on round 16's default tile; the engine
# decode loop against FlashInfer's CUDA-graph decode wrapper; then the graph GPU tests.
[ -f .peers/triton_cache.tgz ] && tar xzf .peers/triton_cache.tgz
source bench/device_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
G="new=table,fla8=stream_k|c1|n64w8s3|pf|h2|nx,t128=table+stream_k|c3|n128w4s2"
python3 bench/graph_ab.py --out "$OUT" --sets trace,ref,jitter,untuned --T 1048576,262144 --budget-s 300 \
    --graphs "$G" --variants run 2>&1 | tee "$OUT/graph_ab_r17.log" | tail -n 4
mv "$OUT/graph_ab.jsonl" "$OUT/graph_ab_r17.jsonl"
export FLASHINFER_WORKSPACE_BASE="$PWD/.fi_ws"
for B in 64 256; do
    timeout 150 python3 bench/decode_loop.py --steps 300 --batch "$B" 2>&1 | tee "$OUT/decode_loop_b$B.log" | tail -n 9
done
timeout 150 python3 -m pytest -q -p no:cacheprovider -n 4 tests/kernels/test_decode_gpu.py \
    -k "overlapped or graph or wrapper" 2>&1 | tee "$OUT/gpu_tests_r17.log" | tail -n 3
ls -la "$OUT"
