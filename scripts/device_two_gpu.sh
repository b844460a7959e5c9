#!/usr/bin/env bash
# On a 2-GPU H200 machine (the device tool's nvidia-h200-x2), from the repo root, with the wheels of the
# tuner/service dependencies in .whl/ and FlashInfer in .peers/ (../shared/tools/flashinfer_for_device.sh):
#   1. the decode loop of bench/decode_loop.py (issue 11: host plan, device plan, FlashInfer) on GPU 0;
#   2. the distributed tuning path of the README: `kvsplit tune --backend gpu --workers 2 --journal FILE`,
#      one Optuna worker per GPU (worker i uses cuda:i), both on one JournalFileBackend study, then export.
# Output goes to $OUT (logs, GPU utilisation samples, the export).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/fi && tar xJf .peers/fi_trim.tar.xz -C /tmp/fi && \
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .peers/deps/*.whl
[ -f .tcpkg/tcache.tgz ] && tar xzf .tcpkg/tcache.tgz  # the Triton cache of earlier runs, packed
export PYTHONPATH=/tmp/site:/tmp/fi TRITON_CACHE_DIR=$PWD/.tcache FLASHINFER_WORKSPACE_BASE=/tmp/fiws
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip -e failed"
nvidia-smi -L
nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used --format=csv -lms 500 > "$OUT/gpu_util.csv" 2>&1 &
SMI=$!
echo "== decode loop (GPU 0)"
CUDA_VISIBLE_DEVICES=0 timeout 180 python3 bench/decode_loop.py --steps 300 2>&1 | tee "$OUT/decode_loop.log" | tail -12
echo "== two Optuna workers, one per GPU, one journal"
DB=/tmp/tune.db
kvsplit db upgrade --database-url $DB
timeout 240 kvsplit tune --backend gpu --workers 2 --journal /tmp/tune.journal --database-url $DB --gpu h200 \
    --num-qo-heads 32 --num-kv-heads 8 --family skewed80 --batch-size 64 --total-tokens 1048576 --trials 24 \
    --num-train 3 --num-heldout 3 --no-progress 2>&1 | tee "$OUT/tune_2gpu.log" | tail -8
kvsplit db export --database-url $DB -o "$OUT/export_2gpu.json" && echo "exported"
python3 - "$OUT/gpu_util.csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if r and r[0] != "timestamp"]
busy = collections.Counter(r[1].strip() for r in rows if r[2].strip().split()[0].isdigit() and int(r[2].split()[0]) > 20)
print("samples with utilization > 20 % per GPU:", dict(busy), "of", len(rows) // 2)
PY
kill $SMI
