"""Triton kernels of the tuner's trials compiled ahead, in helper processes, while the GPU times other trials.

Why: a trial of the Optuna search times one plan per training batch (about 70 ms of GPU work on the H200), but
a plan whose kernel configuration (``block_n``, ``num_warps``, ``num_stages``, prefetch, heads per tile,
schedule, the merge's split block) was not launched before in the process first waits for Triton's JIT compile:
0.5 to 1.5 s of CPU. In a 15-minute H200 campaign of the Qwen3-30B-A3B shape those compiles were 215 s of the
search's 254 s of trials (37 % of the trials compiled a variant; the slice's store, replayed on the CPU).

How: :class:`KernelCompiler` runs ``workers`` spawned processes. Each compiles a trial's plans through the
launcher the timing uses (:func:`kvsplit.kernels.decode.launch_decode`) with the kernels' launches replaced by
Triton's ``JITFunction.warmup`` (compile, no launch) and CPU tensors of the timed tensors' dtypes, strides and
16-byte alignment, so the specialization, and therefore Triton's on-disk cache key, is the one the timing
process computes: its own launch then loads the compiled kernel from the cache instead of compiling it. The
helpers put no work on the GPU (no tensor lives there, no launch), so they never share the GPU with a timing;
they only read the device's compute capability (the compile target, and the PDL decision of the launcher).
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Mapping
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from ..kernels.decode import compile_only
from ..kernels.plan import Plan, make_plan
from .tasks import TuneTask

__all__ = ["KernelCompiler", "compile_only", "compile_plan", "default_compile_workers"]


def default_compile_workers() -> int:
    """Helper processes for a one-GPU search: the CPUs of this host less two (the timing process and the OS),
    at least 1, at most 12."""
    return max(1, min(12, (os.cpu_count() or 2) - 2))


def compile_plan(
    plan: Plan, *, num_qo_heads: int, kv_dtype: str | None = None, q_len: int = 1, device: Any = "cpu"
) -> None:
    """Run :func:`kvsplit.kernels.decode.launch_decode` for ``plan`` as :meth:`kvsplit.tuner.gpu.GpuTimer.time_plan`
    launches it (its :func:`~kvsplit.tuner.gpu.timing_kwargs`, ``q`` / ``out`` ``[B * q_len, H_q, D]`` of the
    plan's dtype, the cache in ``kv_dtype``, one page of it, a workspace for the plan's partials and batch), on
    ``device``. Inside :func:`kvsplit.kernels.decode.compile_only` this compiles the plan's kernels and launches
    nothing."""
    import torch

    from ..kernels.decode import launch_decode, make_workspace
    from .gpu import timing_kwargs

    kv_dtype = kv_dtype or plan.dtype
    B, D, H_kv = plan.batch_size, plan.head_dim, plan.num_kv_heads
    kw = timing_kwargs(plan.dtype, kv_dtype, q_len)
    q = torch.empty((B * q_len, num_qo_heads, D), dtype=getattr(torch, plan.dtype), device=device)
    cache = torch.empty((1, plan.page_size, H_kv, D), dtype=getattr(torch, plan.dtype), device=device)
    if kv_dtype != plan.dtype:
        cache = cache.to(getattr(torch, kv_dtype))
    idx = torch.zeros(B + 1, dtype=torch.int32, device=device)
    lens = torch.from_numpy(plan.kv_lens.astype("int32")).to(device)
    ws_kw = {"q_len": q_len} if q_len > 1 else {}
    ws = make_workspace(
        num_qo_heads, D, max_partials=max(plan.num_partials, 1 << 12), max_batch=B, device=device, **ws_kw
    )
    launch_decode(
        q,
        cache,
        cache,
        idx,
        idx,
        plan.to(device),
        plan.config,
        out=torch.empty_like(q),
        workspace=ws,
        kv_lens=lens,
        **plan.launch_sizes(),
        **kw,
    )


MAX_RESTARTS = 3
"""Times :class:`KernelCompiler` starts its helpers again after one died abruptly, before it gives up."""

_PDL: bool | None = None


def _helper_init() -> None:  # pragma: no cover - runs in a spawned helper
    global _PDL
    import torch

    # the launcher's PDL rule (kvsplit.kernels.decode._pdl_available) for this host's GPU: sm_90 or later
    _PDL = bool(torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9)


def _compile_task(task: TuneTask, params: Mapping[str, Any]) -> int:  # pragma: no cover - runs in a helper
    """Compile the kernels of ``params``'s plans on ``task``'s training batches; the number of plans (0 when
    ``make_plan`` refuses the set: the timing process prunes the trial itself)."""
    from .worker import task_params

    fitted = task_params(task, params)
    n = 0
    with compile_only(bool(_PDL)):
        for lens in task.train:
            try:
                plan = make_plan(list(lens), policy="tuned", params=fitted, **task.plan_kwargs)
            except ValueError:
                return n
            compile_plan(plan, num_qo_heads=task.num_qo_heads, kv_dtype=task.kv_dtype, q_len=task.q_len)
            n += 1
    return n


class KernelCompiler:
    """A pool of ``workers`` spawned processes compiling the Triton kernels of trials ahead of their timing.

    ``submit(task, params)`` returns a :class:`concurrent.futures.Future` (None without helpers) done once the kernels of ``params``'s
    plans on ``task``'s training batches are in Triton's on-disk cache (``TRITON_CACHE_DIR``, inherited by the
    helpers). A helper's failure only loses the head start: the timing process compiles the kernel itself.
    Use as a context manager (the helpers end with it).
    """

    def __init__(self, workers: int | None = None) -> None:
        n = default_compile_workers() if workers is None else int(workers)
        if n < 1:
            raise ValueError(f"workers: expected an integer >= 1, got {workers!r}")
        self.workers = n
        self.restarts = 0
        self._pool: ProcessPoolExecutor | None = self._start()

    def _start(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(
            max_workers=self.workers, mp_context=mp.get_context("spawn"), initializer=_helper_init
        )

    def submit(self, task: TuneTask, params: Mapping[str, Any]) -> Future | None:
        """The future of ``params``'s compiles; None when the helpers are gone (a helper that died abruptly breaks
        its pool: the pool is started again, at most :data:`MAX_RESTARTS` times, then the timing process compiles
        on its own)."""
        while self._pool is not None:
            try:
                return self._pool.submit(_compile_task, task, dict(params))
            except BrokenProcessPool:
                self._pool.shutdown(wait=False, cancel_futures=True)
                self.restarts += 1
                self._pool = self._start() if self.restarts <= MAX_RESTARTS else None
        return None

    def submit_job(self, job: Any, params: Mapping[str, Any]) -> Future | None:
        """:meth:`submit` for a :class:`kvsplit.tuner.worker.WorkerJob`'s task."""
        return self.submit(job.task, params)

    def close(self) -> None:
        """Stop the helpers, dropping compiles not started (a dropped compile only loses its head start)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def __enter__(self) -> KernelCompiler:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
