#!/usr/bin/env bash
# Round 18, device call 2 (H200): does an L2 evict-first policy avoid do_bench's write-backs (bench/evict_probe.py,
# the read floor's kernel), and the decode kernel with an L2 prefetch of the K/V rows a few tiles ahead, with and
# without that policy (bench/l2pf_ab.py), on the reference batches at T = 262,144 and 1,048,576. Lost: the kernel
# switch and bench/l2pf_ab.py were removed after the run; `git apply docs/data/h200_r18/l2pf.patch` restores them.
[ -f .peers/triton_cache.tgz ] && tar xzf .peers/triton_cache.tgz
source bench/device_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
python3 bench/evict_probe.py --out "$OUT" 2>&1 | tee "$OUT/evict_probe.log"
python3 bench/l2pf_ab.py --out "$OUT" --T 262144,1048576 --B 1,8,64,128,512 --variants off,ef3,nm3,ef6 \
    --budget-s 300 2>&1 | tee "$OUT/l2pf_ab.log" | tail -n 100
tar czf "$OUT/triton_cache.tgz" .triton_cache
ls -la "$OUT"
