#!/usr/bin/env bash
# Round 17, device call 4 (H200): the graph default at H_kv 8 (Llama-3.1-8B: H_q 32, G = 4, two heads per tile),
# the 11 llama8b cases, against round 16's default ((128, 4, 2), one head per tile, round 15's re-pick) and the
# same look-ahead tile with one head per tile.
[ -f .peers/triton_cache.tgz ] && tar xzf .peers/triton_cache.tgz
source bench/device_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
G="new=table,r16=table+stream_k|c3|n128w4s2,h1=stream_k|c1|n64w8s3|pf|nx"
python3 bench/graph_ab.py --out "$OUT" --sets llama8b --num-kv-heads 8 --budget-s 120 \
    --graphs "$G" --variants run 2>&1 | tee "$OUT/graph_ab_r17d.log" | tail -n 4
mv "$OUT/graph_ab.jsonl" "$OUT/graph_ab_r17d.jsonl"
ls -la "$OUT"
