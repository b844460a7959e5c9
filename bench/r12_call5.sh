#!/usr/bin/env bash
# Round 12, device call 5 (H200), run with docs/data/h200_r12/item_helpers.patch applied (removed after: it lost):
# the stage-1 kernel's per-item loads folded into three helpers (_item_entry, _item_q, _first_page_ids), which
# changes the SASS of the look-ahead configs and of (32, 4, 3) with the prefetch and two heads (bench/compile_sm90.py's
# hashes): the shipped look-ahead plans and a prefetching two-head plan under
# the version before (496fc37, bench/_decode_before.py, carried) and after, back to back on the 96 reference
# batches (bench/source_ab.py), then the GPU tests of the look-ahead and the prefetching loop.
# Run from the repo root on the device machine; .peers/ (the Triton cache) and bench/_decode_before.py carried.
[ -f .peers/triton_cache.tgz ] && tar xzf .peers/triton_cache.tgz
rm -f .peers/fi_trim.tar.xz
source bench/device_env.sh
python3 bench/source_ab.py --before bench/_decode_before.py --out "$OUT" --budget-s 70 2>&1 | tee "$OUT/source_ab.log" | tail -n 8
timeout 45 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_decode_gpu.py -k "next_item or prefetching_loop" \
    2>&1 | tee "$OUT/gpu_tests_r12_refactor.log" | tail -n 3
