"""Speed of the host-side planner pieces (printed figures, never asserted).

    .venv/bin/python bench/bench_planner.py            # script: prints both tables
    .venv/bin/python bench/bench_planner.py --hot      # only the hot-path table
    KVSPLIT_NUMBA=0 .venv/bin/python bench/bench_planner.py --hot   # the same rules run as plain Python
    .venv/bin/python -m pytest bench/bench_planner.py --benchmark-only   # pytest-benchmark

Targets (docs/decisions/compiled-planner.md): make_plan for B=256 in tens of microseconds and
for B=4096 under a millisecond; bucket_key likewise; simulator predict in a few
ms for thousands of tiles.

Hot-path table (make_plan <= 20 µs at B = 256, <= 300 µs at B = 4096;
PolicyTable.plan <= 30 µs at B = 256): every call gets a NEW random batch
(pre-generated, lengths 1..8192), nothing about a batch is cached; p50 and p99
over the calls, per entry point, B and input form (NumPy int32 array or Python
list). The compiled core is warmed up (or loaded from numba's disk cache) first.
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
POLICIES = [
    ("no_split", {}),
    ("balanced", {}),
    ("flashinfer", {}),
    ("flashinfer", {"tensor_cores": False}),
    ("fa3", {}),
    ("tuned", {"pack_tokens": 1024, "order": "heavy_first"}),
]


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


def _hot_table() -> None:
    from kvsplit.kernels import fastplan
    from kvsplit.kernels.policy_table import load_shipped_table

    fastplan.warmup()
    core = "numba " + __import__("numba").__version__ if fastplan.ENABLED else "plain Python (numba off)"
    print(f"\nhot path, a new random batch per call, planner core: {core}")
    table = load_shipped_table()
    print(f"(PolicyTable: the shipped H200 table, {len(table)} policies)")
    print(f"{'entry point':<34}{'input':>8}{'B':>6}{'p50 µs':>10}{'p99 µs':>10}{'target':>9}")
    rng = np.random.default_rng(11)

    def row(name, fn, B, target, arrays):
        # one warm-up call, then one timed call per batch (int32 arrays, then the same batches as lists)
        for form, batches in (("int32", arrays), ("list", [a.tolist() for a in arrays])):
            fn(batches[0])
            samples = []
            for L in batches:
                t = time.perf_counter_ns()
                fn(L)
                samples.append(time.perf_counter_ns() - t)
            samples.sort()
            p50 = samples[len(samples) // 2] / 1e3
            p99 = samples[int(0.99 * (len(samples) - 1))] / 1e3
            tgt = f"{target}" if target else "-"
            print(f"{name:<34}{form:>8}{B:>6}{p50:>10.1f}{p99:>10.1f}{tgt:>9}")

    def table_plan(L):
        return table.plan(
            L, gpu="NVIDIA H200", num_qo_heads=32, num_kv_heads=4, head_dim=128, dtype="bfloat16", page_size=16
        )

    for B, reps in ((256, 2000), (4096, 300)):
        arrays = [rng.integers(1, 8193, B).astype(np.int32) for _ in range(reps)]
        cases = [
            (
                f"make_plan {pol}",
                lambda L, pol=pol: make_plan(L, num_kv_heads=4, device=H200, policy=pol),
                20 if B == 256 else 300,
            )
            for pol in ("balanced", "stream_k", "tuned")
        ]
        cases.append(
            ("bucket_key", lambda L: bucket_key(L, num_kv_heads=4, head_dim=128, dtype="bfloat16", device=H200), None)
        )
        cases.append(("PolicyTable.plan", table_plan, 30 if B == 256 else None))
        for name, fn, target in cases:
            row(name, fn, B, target, arrays)
    # near-even batches (U(0.995, 1.005) around 2,048 and 1,024 tokens) that reach a shipped policy with the
    # whole-wave rule on: the rule's check and the second compiled plan pass it takes
    for B, mean in ((128, 2048), (256, 1024)):
        arrays = [np.rint(mean * rng.uniform(0.995, 1.005, B)).astype(np.int32) for _ in range(2000)]
        p, _, info = table_plan(arrays[0])
        assert info["params"].get("whole_wave") and p.config.block_n == 64, "the batch should take the rule"
        row("PolicyTable.plan (whole-wave)", table_plan, B, 30, arrays)


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hot", action="store_true", help="only the hot-path table")
    if ap.parse_args().hot:
        _hot_table()
        return
    print(f"python {platform.python_version()}, numpy {np.__version__}, {platform.processor() or platform.machine()}")
    print(f"{'what':<34}{'B':>6}{'median µs':>12}{'p90 µs':>10}")
    for B in (256, 4096):
        L = _lens(B)
        for pol, params in POLICIES:
            med, p90 = _time(
                lambda L=L, pol=pol, params=params: make_plan(
                    L, num_kv_heads=4, device=H200, policy=pol, params=params
                ),
                300,
            )
            name = f"make_plan {pol}" + ("(notc)" if params.get("tensor_cores") is False else "")
            print(f"{name:<34}{B:>6}{med * 1e6:>12.1f}{p90 * 1e6:>10.1f}")
        med, p90 = _time(lambda L=L: bucket_key(L, num_kv_heads=4, head_dim=128, dtype="bfloat16", device=H200), 300)
        print(f"{'bucket_key':<34}{B:>6}{med * 1e6:>12.1f}{p90 * 1e6:>10.1f}")
        for pol in ("balanced", "no_split"):
            p = make_plan(L, num_kv_heads=4, device=H200, policy=pol)
            med, p90 = _time(lambda p=p: predict(p, H200), 30)
            print(f"{'predict ' + pol + f' ({p.num_work_tiles} tiles)':<34}{B:>6}{med * 1e6:>12.1f}{p90 * 1e6:>10.1f}")
    _hot_table()


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
