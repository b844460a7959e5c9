"""The one-process interleaved search (:func:`kvsplit.tuner.worker.run_interleaved`) and the Triton kernels
compiled ahead in helper processes (:mod:`kvsplit.tuner.precompile`).

On the CPU: interleaving studies leaves every study's trials exactly what a lone worker gives it (real Optuna
studies on SQLite, the simulator backend). On a GPU: a plan compiled by a helper process is launched by the
timing process without a compile (Triton's cache gains no file) and computes the reference attention, while a
plan no helper compiled does add files (the check can fail).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvsplit.tuner import search
from kvsplit.tuner.backends import SimBackend
from kvsplit.tuner.worker import run_interleaved

SHAPE = dict(gpu="h200", num_qo_heads=32, num_kv_heads=4, head_dim=128, dtype="bfloat16", page_size=16)


def _job(url, task, n, seed=5):
    spec = search.storage_spec(url)
    return search.WorkerJob(
        task=task, storage=spec, study=search.study_name(task, "sim"), n_trials=n, backend="sim", seed=seed
    )


def _trials(url, job):
    study = search.load_study(job.storage, job.study, job.seed, job.n_trials)
    return [(t.state.name, t.params, t.value) for t in study.get_trials(deepcopy=False)]


def test_interleaved_studies_get_the_trials_a_lone_worker_gives(tmp_path):
    a = search.family_task("skewed80", 16, 262_144, num_train=2, num_heldout=1, seed=1, **SHAPE)
    b = search.family_task("uniform", 64, 262_144, num_train=1, num_heldout=1, seed=1, **SHAPE)
    be = SimBackend("h200", num_kv_heads=4, head_dim=128, dtype="bfloat16")
    alone = f"sqlite:///{tmp_path}/alone.db"
    both = f"sqlite:///{tmp_path}/both.db"
    search.run_worker(_job(alone, a, 14), backend=be)
    search.run_worker(_job(alone, b, 9), backend=be)
    told, finished = [], []
    done = run_interleaved(
        [_job(both, a, 14), _job(both, b, 9)],
        backend=be,
        window=2,
        on_trial=lambda job, measured: told.append(job.task.key),
        on_done=lambda job: finished.append(job.task.key),
    )
    assert [j.task.key for j in done] == finished and sorted(finished) == sorted([a.key, b.key])
    # the two studies really alternated (not one after the other) and every finished trial was reported once
    assert told.count(a.key) == 14 and told.count(b.key) == 9
    assert told.index(b.key) < len(told) - 1 - told[::-1].index(a.key)
    for task, n in ((a, 14), (b, 9)):
        ref, got = _trials(alone, _job(alone, task, n)), _trials(both, _job(both, task, n))
        assert len(ref) == n and got == ref


def test_interleaved_search_stops_asking_when_told_and_finishes_what_it_asked(tmp_path):
    a = search.family_task("skewed80", 16, 262_144, num_train=1, num_heldout=1, seed=2, **SHAPE)
    b = search.family_task("skewed40", 64, 262_144, num_train=1, num_heldout=1, seed=2, **SHAPE)
    be = SimBackend("h200", num_kv_heads=4, head_dim=128, dtype="bfloat16")
    url = f"sqlite:///{tmp_path}/s.db"
    told = []
    done = run_interleaved(
        [_job(url, a, 20), _job(url, b, 20)],
        backend=be,
        window=2,
        may_ask=lambda: len(told) < 7,
        on_trial=lambda job, measured: told.append(job.task.key),
    )
    assert done == []
    states = [s for t in (a, b) for s, _, _ in _trials(url, _job(url, t, 20))]
    # at most one trial per study was in flight when asking stopped: all are told, none left running
    assert 7 <= len(told) <= 8 and states.count("RUNNING") == 0
    assert states.count("COMPLETE") + states.count("PRUNED") == len(told)


def _cache_files(root: Path) -> set[str]:
    """Triton's cached compile artifacts (PTX, cubin, metadata). The ``__triton_launcher`` modules are left out:
    the host-side launch stub of a kernel signature is built at the first launch, whoever compiled the kernel."""
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and "__triton_launcher" not in p.name}


@pytest.mark.gpu
def test_a_plan_compiled_by_a_helper_launches_without_compiling(tmp_path, monkeypatch):
    import torch

    from kvsplit.kernels.plan import make_plan
    from kvsplit.tuner.gpu import GpuTimer
    from kvsplit.tuner.precompile import KernelCompiler

    cache = tmp_path / "triton"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache))
    gpu = torch.cuda.get_device_name()
    task = search.family_task("skewed80", 16, 262_144, num_train=1, num_heldout=1, seed=3, **{**SHAPE, "gpu": gpu})
    # a configuration no other test launches, so this process has not compiled it
    params = {
        **search.baseline_equivalents(task)["balanced"],
        "block_n": 16,
        "num_warps": 2,
        "num_stages": 3,
        "prefetch": True,
    }
    other = {**params, "num_warps": 1, "prefetch": False}
    with KernelCompiler(workers=1) as kc:
        assert kc.submit(task, params).result(timeout=600) == 1
    after_helper = _cache_files(cache)
    assert after_helper  # the helper wrote the compiled kernels
    timer = GpuTimer(num_qo_heads=32, num_kv_heads=4, head_dim=128, max_tokens=262_144, max_batch=64)
    for p, compiled in ((params, True), (other, False)):
        plan = make_plan(
            list(task.train[0]),
            num_kv_heads=4,
            device=gpu,
            policy="tuned",
            params=search.task_params(task, p),
            head_dim=128,
        )
        before = _cache_files(cache)
        assert timer.time_plan(plan, warmup_ms=1, rep_ms=5) > 0  # the campaign's timing path
        added = _cache_files(cache) - before
        assert (not added) == compiled, (compiled, sorted(added)[:4])
        assert timer.max_error(plan) < 2e-2


def test_a_helper_that_dies_is_replaced_and_the_search_goes_on():
    import concurrent.futures as cf
    import multiprocessing as mp
    import signal
    import time

    from kvsplit.tuner.precompile import KernelCompiler

    task = search.family_task("skewed80", 16, 262_144, num_train=1, num_heldout=1, seed=3, **SHAPE)
    params = search.baseline_equivalents(task)["balanced"]
    before = {p.pid for p in mp.active_children()}
    with KernelCompiler(workers=1) as kc:
        cf.wait([kc.submit(task, params)], timeout=300)  # compiled, or (no CUDA here) a compile error: done
        helpers = [p for p in mp.active_children() if p.pid not in before]
        assert helpers
        for p in helpers:
            os.kill(p.pid, signal.SIGKILL)
        deadline = time.time() + 120
        while kc.restarts == 0 and time.time() < deadline:  # the pool notices the death at a later submit
            cf.wait([kc.submit(task, params)], timeout=60)
        assert kc.restarts == 1
        f = kc.submit(task, params)
        cf.wait([f], timeout=300)
        assert f.done() and not isinstance(f.exception(), cf.process.BrokenProcessPool)
