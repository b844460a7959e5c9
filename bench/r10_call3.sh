#!/usr/bin/env bash
# Round 10, device call 3 (H200): Optuna on the GPU with and without prefetch / heads_per_tile in the searched
# space, three buckets, then their held-out batches timed with each study's best, the shipped table's served plan
# and balanced (bench/tune_space_ab.py; call 2 had no optuna / SQLAlchemy wheels in .peers/deps). Run from the
# repo root on the device machine; .peers/ carried (wheels, the Triton cache of call 2).
[ -f .peers/triton_cache.tgz ] && tar xzf .peers/triton_cache.tgz
source bench/device_env.sh
python3 -c "import optuna, sqlalchemy, alembic, pydantic_settings; print('optuna', optuna.__version__)" || exit 1
M=1048576; K=262144
python3 bench/tune_space_ab.py --out "$OUT" --trials 30 \
    --tasks "skewed80:64:$M,uniform:128:$K,skewed40:256:$K" 2>&1 | tee "$OUT/tune_space_ab.log" | tail -n 12
tar czf "$OUT/triton_cache.tgz" .triton_cache && du -h "$OUT/triton_cache.tgz"
