#!/usr/bin/env bash
# Round 11, device call 7 (H200): FlashInfer's kernel on the 182 evaluation batches in its own process, then the
# rebuilt table's served plans (and round 9's, served_prev) in a second process of the same call, as round 9's
# call 4 did. Run from the repo root on the device machine; .peers/ carried (FlashInfer, the Triton cache).
[ -f .peers/triton_cache.tgz ] && tar xzf .peers/triton_cache.tgz
source bench/device_env.sh
python3 bench/gpu_sweep.py --mode retime --flashinfer only --rep-ms 10 --out "$OUT" --out-name retime16_fi.jsonl 2>&1 | tee "$OUT/retime16_fi.log" | tail -n 2
python3 bench/gpu_sweep.py --mode retime --flashinfer skip --rep-ms 10 --out "$OUT" --out-name retime16.jsonl 2>&1 | tee "$OUT/retime16.log" | tail -n 2
