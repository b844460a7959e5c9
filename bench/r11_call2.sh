#!/usr/bin/env bash
# Round 11, device call 2 (H200): the best plan per reference case at T = 1,048,576 by an Optuna study per case
# over the tuned family (bench/case_search.py), re-timed back to back with round 9's best named plans.
# Run from the repo root on the device machine; .peers/ carried (wheels for optuna, the Triton cache).
[ -f .peers/triton_cache.tgz ] && tar xzf .peers/triton_cache.tgz
source bench/device_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
python3 bench/case_search.py --out "$OUT" --trials "${TRIALS:-40}" --budget-s 470 ${SEED_FROM:+--seed-from $SEED_FROM} 2>&1 | tee "$OUT/case_search.log" | tail -n 60
