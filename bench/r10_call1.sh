#!/usr/bin/env bash
# Needs docs/data/h200_r10/flat_items.patch applied (git apply): the flat loop was removed after round 10 lost it.
# Round 10, device call 1 (H200): the flat item loop (launch_decode(flat=True): one pipelined loop over every
# block of a work tile's items) against the item-by-item loop, the same plans back to back in one process
# (bench/stream_ab.py, variants decode and flat; its output is compared with decode's). Plans of >= 3 stages,
# at one CTA per SM (where an item boundary leaves the SM without loads in flight) and at 2-3. Run from the repo
# root on the device machine; .peers/ carried (FlashInfer is not used here; the Triton cache is).
[ -f .peers/triton_cache.tgz ] && tar xzf .peers/triton_cache.tgz
source bench/device_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
M=1048576; K=262144
CASES="$M:uniform:8,$M:uniform:64,$M:uniform:512,$M:skewed40:64,$M:skewed40:256,$M:skewed40:512,$M:skewed80:64"
CASES="$CASES,$M:2x40:64,$K:uniform:8,$K:uniform:64,$K:uniform:512,$K:skewed80:128,$K:skewed80:512,$K:skewed40:256"
PLANS="stream_k|c1|n64w8s3|pf|h2,balanced|c1|n64w4s3|pf|h2,stream_k|c1|n64w4s3|pf|h2,stream_k|c1|n128w8s3|pf"
PLANS="$PLANS,stream_k|c3|n32w4s3|pf|h2,balanced|c3|n32w4s3|pf|h2,stream_k|c2|n32w4s4|pf|h2"
python3 bench/stream_ab.py --out "$OUT" --variants decode,flat --cases "$CASES" --plans "$PLANS" --budget-s 330 \
    2>&1 | tee "$OUT/flat_ab.log" | tail -n 120
tar czf "$OUT/triton_cache.tgz" .triton_cache && du -h "$OUT/triton_cache.tgz"
