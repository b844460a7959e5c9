#!/usr/bin/env bash
# (As run, the script asked for variants decode,nx1,nx2,decode_b of a launch_decode(next_item=N) keyword; nx2 was
# the look-ahead that became KernelConfig.next_item, which stream_ab.py now toggles as variant nx.)
# Round 11, device call 3 (H200): the look-ahead over a work tile's items (launch_decode(next_item=1|2)) against
# the item loop as shipped, the same plans back to back in one process (bench/stream_ab.py, variants decode, nx1,
# nx2 (carrying the next item's q and first page ids), decode_b; each variant's output is compared with decode's). The cases and plans of round 10's call 1 (plans of >= 3
# stages with the prefetch: one CTA per SM, where an item boundary leaves the SM without loads in flight, and 2-3).
# Run from the repo root on the device machine; .peers/ carried (the Triton cache).
[ -f .peers/triton_cache.tgz ] && tar xzf .peers/triton_cache.tgz
source bench/device_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
M=1048576; K=262144
CASES="$M:skewed60:128,$M:skewed60:32,$M:uniform:8,$M:uniform:64,$M:uniform:512,$M:skewed40:64,$M:skewed40:256,$M:skewed40:512,$M:skewed80:64"
CASES="$CASES,$M:2x40:64,$K:uniform:8,$K:uniform:64,$K:uniform:512,$K:skewed80:128,$K:skewed80:512,$K:skewed40:256"
PLANS="stream_k|c1|n64w8s3|pf|h2,balanced|c1|n64w4s3|pf|h2,stream_k|c1|n64w4s3|pf|h2"
PLANS="$PLANS,stream_k|c3|n32w4s3|pf|h2,balanced|c3|n32w4s3|pf|h2"
python3 bench/stream_ab.py --out "$OUT" --variants decode,nx,decode_b --cases "$CASES" --plans "$PLANS" --budget-s 400 \
    2>&1 | tee "$OUT/nx2_ab.log" | tail -n 120
