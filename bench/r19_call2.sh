#!/usr/bin/env bash
# Round 19, device call 2 (H200): where the time above the read floor goes today at T = 262,144 (and three T = 1M
# cases), for the three plans the table serves most: the decode call, stage 1 alone (no merge), stage 1's walk
# with the attention math replaced by a sum (gather), a contiguous streaming read of the same bytes, the pages
# read whole (paged_p2w4) and by one CTA per SM (pg1cta_u4w8); bench/stream_ab.py, all back to back per case.
[ -f .peers/triton_cache.tgz ] && tar xzf .peers/triton_cache.tgz
source bench/device_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
python3 bench/stream_ab.py --out "$OUT" --budget-s 400 --rep-ms 20 \
    --variants decode,s1,gather,stream,paged_p2w4,pg1cta_u4w8,decode_b \
    --plans 'stream_k|c1|n64w8s3|pf|h2|nx,stream_k|c2|n32w4s3|pf|h2|nx,balanced|c3|n32w4s3|pf|h2|nx' \
    --cases 262144:uniform:1,262144:uniform:8,262144:uniform:64,262144:uniform:128,262144:uniform:512,262144:skewed80:8,262144:skewed80:64,262144:skewed80:512,1048576:uniform:8,1048576:uniform:512,1048576:skewed80:512 \
    2>&1 | tee "$OUT/decompose.log" | tail -n 40
ls -la "$OUT"
