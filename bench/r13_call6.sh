#!/usr/bin/env bash
# Round 13, device call 6 (H200): the merge rule against round 12's default (w4: four warps always), same run, on
# the 96 reference batches under the four plans the shipped table serves most (bench/merge_ab.py).
# Run from the repo root on the device machine; .peers/triton_cache.tgz carried.
[ -f .peers/triton_cache.tgz ] && tar xzf .peers/triton_cache.tgz
rm -f .peers/fi_trim.tar.xz
source bench/device_env.sh
python3 bench/merge_ab.py --out "$OUT" --T 1048576,262144 --variants auto,w4 --budget-s 140 \
    --plans "stream_k|c1|n64w8s3|pf|h2|nx,stream_k|c1|n64w4s3|pf|h2|nx,balanced|c3|n32w4s3|pf|h2,stream_k|c3|n32w4s3|pf|h2" \
    2>&1 | tee "$OUT/merge_ab_served.log" | tail -n 4
mv "$OUT/merge_ab.jsonl" "$OUT/merge_ab_served.jsonl"
