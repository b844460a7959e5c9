"""Speed of the host-side planner pieces (printed figures, never asserted).

    .venv/bin/python bench/bench_planner.py            # script: prints a table
    .venv/bin/python -m pytest bench/bench_planner.py --benchmark-only   # pytest-benchmark

Targets (DESIGN.md / issue 3): make_plan for B=256 in tens of microseconds and
for B=4096 under a millisecond; bucket_key likewise; simulator predict in a few
ms for thousands of tiles.
"""

from __future__ import annotations

import platform
import statistics
import time

import numpy as np

from kvsplit.kernels.buckets import bucket_key
from kvsplit.kernels.device import DeviceSpec
from kvsplit.kernels.plan import make_plan
from kvsplit.tuner.simulate import predict

H200 = DeviceSpec.known("NVIDIA H200")
POLICIES = [("no_split", {}), ("balanced", {}), ("flashinfer", {}), ("flashinfer", {"tensor_cores": False}),
            ("fa3", {}), ("tuned", {"pack_tokens": 1024, "order": "heavy_first"})]


def _lens(B: int) -> np.ndarray:
    return np.random.default_rng(B).integers(1, 8192, B)


def _time(fn, reps: int) -> tuple[float, float]:
    fn()
    samples = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    samples.sort()
    return statistics.median(samples), samples[int(0.9 * (len(samples) - 1))]


def main() -> None:
    print(f"python {platform.python_version()}, numpy {np.__version__}, {platform.processor() or platform.machine()}")
    print(f"{'what':<34}{'B':>6}{'median µs':>12}{'p90 µs':>10}")
    for B in (256, 4096):
        L = _lens(B)
        for pol, params in POLICIES:
            med, p90 = _time(lambda: make_plan(L, num_kv_heads=4, device=H200, policy=pol, params=params), 300)
            name = f"make_plan {pol}" + ("(notc)" if params.get("tensor_cores") is False else "")
            print(f"{name:<34}{B:>6}{med * 1e6:>12.1f}{p90 * 1e6:>10.1f}")
        med, p90 = _time(lambda: bucket_key(L, num_kv_heads=4, head_dim=128, dtype="bfloat16", device=H200), 300)
        print(f"{'bucket_key':<34}{B:>6}{med * 1e6:>12.1f}{p90 * 1e6:>10.1f}")
        for pol in ("balanced", "no_split"):
            p = make_plan(L, num_kv_heads=4, device=H200, policy=pol)
            med, p90 = _time(lambda: predict(p, H200), 30)
            print(f"{'predict ' + pol + f' ({p.num_work_tiles} tiles)':<34}{B:>6}{med * 1e6:>12.1f}{p90 * 1e6:>10.1f}")


# pytest-benchmark entry points
def test_make_plan_b256(benchmark):
    L = _lens(256)
    benchmark(make_plan, L, num_kv_heads=4, device=H200, policy="balanced")


def test_make_plan_b4096(benchmark):
    L = _lens(4096)
    benchmark(make_plan, L, num_kv_heads=4, device=H200, policy="balanced")


def test_bucket_key_b256(benchmark):
    L = _lens(256)
    benchmark(bucket_key, L, num_kv_heads=4, head_dim=128, dtype="bfloat16", device=H200)


def test_predict_b4096(benchmark):
    p = make_plan(_lens(4096), num_kv_heads=4, device=H200, policy="balanced")
    benchmark(predict, p, H200)


if __name__ == "__main__":
    main()
