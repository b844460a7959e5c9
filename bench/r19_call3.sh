#!/usr/bin/env bash
# Round 19, device call 3 (H200): the same plans over the same K/V values stored HND (one KV head's page rows
# contiguous) against today's NHD, with stage 1 alone and the gather walk in both layouts (bench/stream_ab.py).
[ -f .peers/triton_cache.tgz ] && tar xzf .peers/triton_cache.tgz
source bench/device_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
python3 bench/stream_ab.py --out "$OUT" --budget-s 400 --rep-ms 20 \
    --variants decode,hnd,s1,hnd_s1,gather,gather_hnd,paged_p2w4,decode_b \
    --plans 'stream_k|c1|n64w8s3|pf|h2|nx,stream_k|c2|n32w4s3|pf|h2|nx,balanced|c3|n32w4s3|pf|h2|nx,stream_k|c1|n128w8s3|pf' \
    --cases 262144:uniform:1,262144:uniform:8,262144:uniform:64,262144:uniform:128,262144:uniform:512,262144:skewed80:8,262144:skewed80:64,262144:skewed80:512,1048576:uniform:8,1048576:uniform:512,1048576:skewed80:512,1048576:skewed40:256,1048576:2x40:512 \
    2>&1 | tee "$OUT/hnd_ab.log" | tail -n 60
ls -la "$OUT"
