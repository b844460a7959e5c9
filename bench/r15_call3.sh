#!/usr/bin/env bash
# Round 15, device call 3 (H200): DecodeWrapper's CUDA-graph path, its tile, rule and persistent program count
# (bench/graph_ab.py --graphs), against the served eager plan; call 2 found it at 1.63x the served plan's time.
# Run from the repo root on the device machine; .peers/triton_cache.tgz carried.
[ -f .peers/triton_cache.tgz ] && tar xzf .peers/triton_cache.tgz
source bench/device_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
G="cur=table,curR=table@r,sk3=stream_k|c3|n128w4s2@r,sk3p4=stream_k|c3|n128w4s2"
G="$G,nx2=stream_k|c2|n32w4s3|pf|nx@r,nx1=stream_k|c1|n64w8s3|pf|nx@r,tnx2=table+stream_k|c2|n32w4s3|pf|nx@r"
python3 bench/graph_ab.py --out "$OUT" --sets trace,ref --T 1048576,262144 --B 1,8,32,128,512 --budget-s 240 \
    --graphs "$G" --variants g4,b1ov 2>&1 | tee "$OUT/graph_ab2.log" | tail -n 16
mv "$OUT/graph_ab.jsonl" "$OUT/graph_ab2.jsonl"
ls -la "$OUT"
