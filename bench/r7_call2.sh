#!/usr/bin/env bash
# Round 7, device call 2 (H200): the head-fused stage-1 prototype against today's decode (bench/hf_ab.py, issue 12).
set -o pipefail
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR="$PWD/.triton_cache"
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || { echo "install failed"; exit 1; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
python3 bench/hf_ab.py --out "$OUT" --budget-s 260 2>&1 | tee "$OUT/hf_ab.log"
