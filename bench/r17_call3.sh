#!/usr/bin/env bash
# Round 17, device call 3 (H200): on the graph default tile ((64, 8, 3), prefetch, look-ahead, 2 KV heads per tile;
# one resident CTA per SM), stream_k at 1, 2 and 3 CTAs per SM, and at 1 with item costs / minimum pieces of 4 and 8 blocks, for every batch: is a batch-dependent ctas_per_sm
# (re-picked on the host when the batch size changes) worth having on the graph path?
[ -f .peers/triton_cache.tgz ] && tar xzf .peers/triton_cache.tgz
source bench/device_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
G="c1=stream_k|c1|n64w8s3|pf|h2|nx,c2=stream_k|c2|n64w8s3|pf|h2|nx,c3=stream_k|c3|n64w8s3|pf|h2|nx"
G="$G,o4=stream_k|c1|n64w8s3|o4m4|pf|h2|nx,o8=stream_k|c1|n64w8s3|o8m8|pf|h2|nx"
python3 bench/graph_ab.py --out "$OUT" --sets trace,ref,jitter,untuned --T 1048576,262144 --budget-s 240 \
    --graphs "$G" --variants run 2>&1 | tee "$OUT/graph_ab_r17c.log" | tail -n 5
mv "$OUT/graph_ab.jsonl" "$OUT/graph_ab_r17c.jsonl"
ls -la "$OUT"
