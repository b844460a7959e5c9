#!/usr/bin/env bash
# Not runnable on today's tree: the two variants this call timed (nx1: entries only; nx2: with an L2 prefetch) were
# removed from the kernel after the run (docs/perf.md, round 11). To repeat it: check out 9b22536, apply
# docs/data/h200_r11/next_item_call1.patch (kernels/decode.py as timed, reconstructed after the run without its
# comments) and give bench/stream_ab.py the variants nx1 = launch(next_item=1), nx2 = launch(next_item=2).
# Round 11, device call 1 (H200): the look-ahead over a work tile's items (launch_decode(next_item=1|2)) against
# the item loop as shipped, the same plans back to back in one process (bench/stream_ab.py, variants decode, nx1,
# nx2; each variant's output is compared with decode's). The cases and plans of round 10's call 1 (plans of >= 3
# stages with the prefetch: one CTA per SM, where an item boundary leaves the SM without loads in flight, and 2-3).
# Run from the repo root on the device machine; .peers/ carried (the Triton cache).
[ -f .peers/triton_cache.tgz ] && tar xzf .peers/triton_cache.tgz
source bench/device_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
M=1048576; K=262144
CASES="$M:uniform:8,$M:uniform:64,$M:uniform:512,$M:skewed40:64,$M:skewed40:256,$M:skewed40:512,$M:skewed80:64"
CASES="$CASES,$M:2x40:64,$K:uniform:8,$K:uniform:64,$K:uniform:512,$K:skewed80:128,$K:skewed80:512,$K:skewed40:256"
PLANS="stream_k|c1|n64w8s3|pf|h2,balanced|c1|n64w4s3|pf|h2,stream_k|c1|n64w4s3|pf|h2,stream_k|c1|n128w8s3|pf"
PLANS="$PLANS,stream_k|c3|n32w4s3|pf|h2,balanced|c3|n32w4s3|pf|h2,stream_k|c2|n32w4s4|pf|h2"
python3 bench/stream_ab.py --out "$OUT" --variants decode,nx1,nx2 --cases "$CASES" --plans "$PLANS" --budget-s 400 \
    2>&1 | tee "$OUT/nx_ab.log" | tail -n 120
tar czf "$OUT/triton_cache.tgz" .triton_cache && du -h "$OUT/triton_cache.tgz"
