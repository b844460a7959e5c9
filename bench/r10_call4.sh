#!/usr/bin/env bash
# Round 10, device call 4 (H200): call 3's three GPU studies again with the tuner as fixed after it (the even-chunk
# parameters suggested only with partition="even_chunks", so a stream_k trial is no longer always pruned; the
# campaigns' plans enqueued after the baselines, tuner.space.WARM_START), then their held-out batches timed
# with the study's best, the shipped table's served plan and balanced (bench/tune_space_ab.py --spaces r10).
# Run from the repo root on the device machine; .peers/ carried (wheels, the Triton cache).
[ -f .peers/triton_cache.tgz ] && tar xzf .peers/triton_cache.tgz
source bench/device_env.sh
M=1048576; K=262144
python3 bench/tune_space_ab.py --out "$OUT" --trials 30 --spaces r10 \
    --tasks "skewed80:64:$M,uniform:128:$K,skewed40:256:$K" 2>&1 | tee "$OUT/tune_warm_ab.log" | tail -n 8
mv "$OUT/tune_space_ab.jsonl" "$OUT/tune_warm_ab.jsonl"
