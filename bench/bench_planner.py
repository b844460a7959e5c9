"""Speed of the host-side planner pieces (printed figures, never asserted).

    .venv/bin/python bench/bench_planner.py            # script: prints both tables
    .venv/bin/python bench/bench_planner.py --hot      # only the hot-path table
    .venv/bin/python bench/bench_planner.py --wrapper  # DecodeWrapper.plan against FlashInfer's plan (CUDA)
    TRITON_INTERPRET=1 .venv/bin/python bench/bench_planner.py --wrapper --device cpu --calls 20   # CPU smoke run
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

Wrapper table (``--wrapper``; target: DecodeWrapper.plan <= FlashInfer's plan at the same B): the per-step cost an
engine pays, eager :class:`kvsplit.kernels.DecodeWrapper` with the shipped table at B = 8, 64, 256 (Qwen3-30B-A3B
attention: H_q 32, H_kv 4, D 128, bf16, page 16), kv_lens drawn from a shipped trace (a new batch per call),
``torch.cuda.synchronize()`` after each call, p50 / p99 over ``--calls`` calls after 5 warm-up calls; with the
index tensors read back from the device, with the engine's host copies of kv_lens and kv_indptr, and with its
host copy of the page ids too (no wait for the device); beside it FlashInfer's
``BatchDecodeWithPagedKVCacheWrapper.plan`` (tensor cores) on the same batches, indptr on the device and on the
host, when ``import flashinfer`` works (else "flashinfer: not installed").
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


def _wrapper_table(device: str, calls: int, batch_sizes: list[int], trace: str) -> None:
    """``--wrapper``: DecodeWrapper.plan (eager, the shipped table) against FlashInfer's
    BatchDecodeWithPagedKVCacheWrapper.plan on the same batches, each call followed by a device synchronize."""
    import torch

    from kvsplit.kernels import DecodeWrapper, fastplan, load_shipped_table
    from kvsplit.tuner.workloads import iid_trace_batches

    H_q, H_kv, D, ps = 32, 4, 128, 16  # Qwen3-30B-A3B attention
    cuda = device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device (use --device cpu with TRITON_INTERPRET=1)")
    # the interpreter refuses bfloat16 (kernels.decode.check_interpreter_dtype): the CPU run plans float16 batches,
    # which the shipped H200 table (bfloat16) answers with its fallback policy
    dtype = "bfloat16" if cuda else "float16"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    fastplan.warmup()
    table = load_shipped_table()
    print(
        f"DecodeWrapper.plan, eager, shipped table ({len(table)} policies), H_q {H_q} H_kv {H_kv} D {D} {dtype} "
        f"page {ps}, on {torch.cuda.get_device_name() if cuda else 'cpu (degraded: TRITON_INTERPRET=1)'}; "
        f"{calls} calls per row, a new batch of trace {trace!r} per call, synchronize after each call"
    )
    pages = None

    def batches(B: int):
        nonlocal pages
        out = []
        for L in iid_trace_batches(trace, B, num_batches=calls, seed=B, role="heldout"):
            L = np.maximum(L, 1)  # FlashInfer's paged layout needs one page per request
            npg = -(-L // ps)
            indptr = np.concatenate(([0], np.cumsum(npg))).astype(np.int32)
            if pages is None or pages.shape[0] < int(indptr[-1]):
                pages = torch.arange(max(int(indptr[-1]), 1 << 20), dtype=torch.int32, device=device)
            last = (L - (npg - 1) * ps).astype(np.int32)
            out.append(
                dict(
                    lens_h=L.astype(np.int32),
                    indptr_h=indptr,
                    lens=torch.from_numpy(L.astype(np.int32)).to(device),
                    indptr=torch.from_numpy(indptr).to(device),
                    indices=pages[: int(indptr[-1])],
                    indices_h=np.arange(int(indptr[-1]), dtype=np.int32),  # pages[:n] on the host
                    last=torch.from_numpy(last).to(device),
                    indptr_cpu=torch.from_numpy(indptr),
                    last_cpu=torch.from_numpy(last),
                )
            )
        return out

    def timed(fn, bs) -> tuple[float, float]:
        for b in bs[:5]:  # warm-up: compiles, first allocations
            fn(b)
            sync()
        samples = []
        for b in bs:
            t = time.perf_counter_ns()
            fn(b)
            sync()
            samples.append(time.perf_counter_ns() - t)
        samples.sort()
        return samples[len(samples) // 2] / 1e3, samples[int(0.99 * (len(samples) - 1))] / 1e3

    fi = None
    try:
        import flashinfer
    except ImportError:
        print("flashinfer: not installed")
    else:
        if cuda:
            ws = torch.empty(256 << 20, dtype=torch.uint8, device=device)
            fi = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=True)
            fi_name = f"flashinfer {getattr(flashinfer, '__version__', '?')}"
        else:
            print("flashinfer: installed, not timed on the CPU")
    print(f"{'what':<58}{'B':>5}{'p50 µs':>10}{'p99 µs':>10}")
    for B in batch_sizes:
        bs = batches(B)
        w = DecodeWrapper(
            H_q, H_kv, D, page_size=ps, dtype=dtype, device=device, max_batch_size=max(batch_sizes), table=table
        )
        rows = [
            (
                "DecodeWrapper.plan (kv_lens/kv_indptr read from the device)",
                lambda b, w=w: w.plan(b["indptr"], b["indices"], b["lens"]),
            ),
            (
                "DecodeWrapper.plan (kv_lens_host, kv_indptr_host)",
                lambda b, w=w: w.plan(
                    b["indptr"], b["indices"], b["lens"], kv_lens_host=b["lens_h"], kv_indptr_host=b["indptr_h"]
                ),
            ),
            (
                "DecodeWrapper.plan (host copies, kv_indices_host too)",
                lambda b, w=w: w.plan(
                    b["indptr"], b["indices"], b["lens"], kv_lens_host=b["lens_h"], kv_indptr_host=b["indptr_h"],
                    kv_indices_host=b["indices_h"],
                ),
            ),
            (
                "PolicyTable.plan alone (no upload, no checks)",
                lambda b: table.plan(
                    b["lens_h"], gpu="NVIDIA H200", num_qo_heads=H_q, num_kv_heads=H_kv, head_dim=D, dtype=dtype,
                    page_size=ps,
                ),
            ),
        ]  # fmt: skip
        if fi is not None:
            kw = dict(q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
            rows += [
                (
                    f"{fi_name} plan (indptr on the device)",
                    lambda b, kw=kw: fi.plan(b["indptr"], b["indices"], b["last"], H_q, H_kv, D, ps, **kw),
                ),
                (
                    f"{fi_name} plan (indptr on the host)",
                    lambda b, kw=kw: fi.plan(b["indptr_cpu"], b["indices"], b["last_cpu"], H_q, H_kv, D, ps, **kw),
                ),
            ]
        for name, fn in rows:
            p50, p99 = timed(fn, bs)
            print(f"{name:<58}{B:>5}{p50:>10.1f}{p99:>10.1f}", flush=True)


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hot", action="store_true", help="only the hot-path table")
    ap.add_argument(
        "--wrapper",
        action="store_true",
        help="only the engine's per-step cost: DecodeWrapper.plan (eager, shipped table) and FlashInfer's "
        "BatchDecodeWithPagedKVCacheWrapper.plan on the same trace batches, synchronize after each call",
    )
    ap.add_argument(
        "--device",
        default="cuda",
        choices=("cuda", "cpu"),
        help="--wrapper: where the index tensors live (cpu: a degraded run under TRITON_INTERPRET=1, kvsplit only)",
    )
    ap.add_argument("--calls", type=int, default=300, help="--wrapper: timed calls per row (a new batch each)")
    ap.add_argument("--batch-sizes", default="8,64,256", help="--wrapper: comma-separated B")
    ap.add_argument("--trace", default="sharegpt", help="--wrapper: shipped trace of the kv_lens (tuner/traces)")
    args = ap.parse_args()
    if args.wrapper:
        if args.calls < 1:
            raise SystemExit(f"--calls: expected an integer >= 1, got {args.calls}")
        _wrapper_table(args.device, args.calls, [int(b) for b in args.batch_sizes.split(",")], args.trace)
        return
    if args.hot:
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
