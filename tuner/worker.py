"""The worker loop of the search: one process asks, measures and tells trials until the study is done.

:func:`run_worker` runs in the tuning process (one worker) or in spawned
processes (:func:`run_workers`); each keeps the study at exactly ``n_trials``
finished trials (module doc of :mod:`kvsplit.tuner.search`, steps 3-5).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import multiprocessing as mp
import os
import random
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..db import store
from ..kernels.plan import make_plan
from ..kernels.rulespec import fit_heads_per_tile
from .backends import TimingBackend
from .space import suggest_params
from .study import (
    ATTR_SURPLUS,
    StorageSpec,
    claim_trial,
    fail_stale,
    frozen_trial,
    load_study,
    make_sampler,
    open_storage,
    study_counts,
    trial_heartbeat,
)
from .tasks import TuneTask, backend_for_task


class Stop:
    """A stop flag set by SIGINT/SIGTERM (the current trial finishes first)."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.count = 0
        self._old: dict[int, Any] = {}

    def set(self) -> None:
        """Ask the workers to stop after their current trial (what SIGINT / SIGTERM call); counts the requests."""
        self.count += 1
        self.event.set()

    def is_set(self) -> bool:
        """Whether a stop was asked."""
        return self.event.is_set()

    def install(self) -> Stop:
        """Route SIGINT and SIGTERM to :meth:`set` (main thread only; elsewhere a no-op); returns ``self``."""
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, lambda *_: self.set())
        return self

    def restore(self) -> None:
        """Put back the signal handlers :meth:`install` replaced."""
        for sig, h in self._old.items():
            signal.signal(sig, h)
        self._old.clear()


def _geomean(xs: Sequence[float]) -> float:
    return float(math.exp(sum(math.log(x) for x in xs) / len(xs)))


def task_params(task: TuneTask, params: Mapping[str, Any]) -> dict[str, Any]:
    """A trial's parameters as the task's shape runs them: ``heads_per_tile`` (and ``whole_wave_heads``) lowered
    by :func:`kvsplit.kernels.policies.fit_heads_per_tile` to what its H_q / H_kv allows. Optuna keeps one set
    of choices per study and a bucket key holds H_kv, not H_q, so the space offers every choice and the trial's
    plan refits it, as :class:`kvsplit.kernels.policy_table.PolicyTable` does when it serves the policy."""
    return dict(fit_heads_per_tile(params, task.num_qo_heads, task.num_kv_heads, task.q_len))


def objective_value(task: TuneTask, params: Mapping[str, Any], backend: TimingBackend) -> tuple[float, float]:
    """Geomean kernel time (s) and geomean time / HBM floor of ``params`` over the training batches.

    ``params`` are planned as :func:`task_params` refits them to the task's GQA group.

    Raises
    ------
    ValueError
        From ``make_plan`` when the parameter set is infeasible.
    """
    params = task_params(task, params)
    times, ratios = [], []
    for lens in task.train:
        plan = make_plan(list(lens), policy="tuned", params=params, **task.plan_kwargs)
        t = backend.time_plan(plan)
        times.append(t)
        ratios.append(t / backend.hbm_floor_s(lens))
    return _geomean(times), _geomean(ratios)


@dataclass(frozen=True)
class WorkerJob:
    """Everything a worker process needs (plain data; picklable for spawn)."""

    task: TuneTask
    storage: StorageSpec
    study: str
    n_trials: int
    backend: str
    seed: int
    index: int = 0
    deadline: float | None = None
    calibration: Mapping[str, Any] | None = None
    read_bandwidth_gbps: float | None = None


def _test_delay() -> float:
    # Test hook: KVSPLIT_TUNE_TRIAL_DELAY_S makes every measured trial sleep this
    # long, so tests can kill a worker mid-trial with the millisecond simulator.
    try:
        return max(0.0, float(os.environ.get("KVSPLIT_TUNE_TRIAL_DELAY_S", "0")))
    except ValueError:
        return 0.0


def _same_params(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return dict(a) == dict(b)


def _prepare(study, trial, job: WorkerJob, stop: Stop):
    """Suggest ``trial``'s parameters; return ("complete", value) or ("pruned", None) when the study already
    measured the same parameter set (its result is reused), else ("measure", params)."""
    from optuna.trial import TrialState

    params = suggest_params(trial)
    planned = task_params(job.task, params)  # what this trial runs, compared with what earlier trials ran
    # a parameter set already measured in this study is not measured again
    waited = 0.0
    while True:
        twins = [
            t
            for t in study.get_trials(deepcopy=False)
            if t.number != trial.number
            and t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)
            and _same_params(task_params(job.task, t.params), planned)
        ]
        done = [t for t in twins if t.state != TrialState.RUNNING]
        if done:
            src = done[0]
            trial.set_user_attr("cached_from", src.number)
            if src.state == TrialState.PRUNED:
                trial.set_user_attr("infeasible", src.user_attrs.get("infeasible", "same as an earlier trial"))
                return "pruned", None
            for k in ("geomean_ratio",):
                if k in src.user_attrs:
                    trial.set_user_attr(k, src.user_attrs[k])
            return "complete", float(src.value)
        if not twins or waited > job.storage.grace_period or stop.is_set():
            break
        time.sleep(0.1)
        waited += 0.1
    return "measure", params


def _measure(trial, job: WorkerJob, params: Mapping[str, Any], backend: TimingBackend):
    """Time ``params`` on the training batches: ("complete", geomean seconds) or ("pruned", None) when
    ``make_plan`` refuses the set (the reason is kept as the trial's ``infeasible`` attribute)."""
    try:
        value, ratio = objective_value(job.task, params, backend)
    except ValueError as exc:
        trial.set_user_attr("infeasible", str(exc)[:500])
        return "pruned", None
    delay = _test_delay()
    if delay:
        time.sleep(delay)
    trial.set_user_attr("geomean_ratio", ratio)
    return "complete", value


def _evaluate(study, trial, job: WorkerJob, backend: TimingBackend, stop: Stop):
    """Return ("complete", value) or ("pruned", None) for one asked trial."""
    state, got = _prepare(study, trial, job, stop)
    if state != "measure":
        return state, got
    return _measure(trial, job, got, backend)


def _make_job_backend(job: WorkerJob) -> TimingBackend:
    return backend_for_task(
        job.task,
        job.backend,
        calibration=job.calibration,
        read_bandwidth_gbps=job.read_bandwidth_gbps,
        gpu_index=job.index,
    )


def _open_job_study(job: WorkerJob):
    return load_study(
        job.storage, job.study, job.seed * 1009 + job.index, job.n_trials, storage=open_storage(job.storage)
    )


def _next_trial(study, job: WorkerJob, rng: random.Random):
    """Ask the study for its next trial under the exact-count rules (module doc of :mod:`kvsplit.tuner.search`,
    step 4) and claim it for this process. Returns the trial; ``"done"`` when ``job.n_trials`` trials are finished;
    None when the caller should ask again (other workers' trials fill the study, or a surplus trial was handed
    back)."""
    import optuna
    from optuna.trial import TrialState

    n = job.n_trials
    fail_stale(study)
    c = study_counts(study)
    finished = c["COMPLETE"] + c["PRUNED"]
    if finished >= n:
        return "done"
    if finished + c["RUNNING"] >= n:
        time.sleep(0.1 + 0.2 * rng.random())
        return None
    # the sampler's random state follows from the seed and the number of finished trials, so a study resumed
    # after a crash (kill -9) suggests what an uninterrupted one would have (one worker; TPE is deterministic
    # given its seed and the finished trials)
    study.sampler = make_sampler(job.seed * 1009 + job.index + 7919 * finished, n)
    trial = study.ask()
    # admission: at most n trials may be finished or running, whatever the interleaving
    others = sum(
        1
        for t in study.get_trials(deepcopy=False)
        if t.number != trial.number and t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)
    )
    if others >= n:
        frozen = frozen_trial(study, trial)
        fixed = frozen.system_attrs.get("fixed_params")
        carried = {k: v for k, v in frozen.system_attrs.items() if not k.startswith("kvsplit:")}
        trial.set_user_attr(ATTR_SURPLUS, True)
        study.tell(trial, state=TrialState.FAIL)
        if fixed is not None:
            study.enqueue_trial(dict(fixed))
        elif frozen.params and "failed_trial" in carried:
            study.add_trial(
                optuna.create_trial(
                    state=TrialState.WAITING,
                    params=frozen.params,
                    distributions=frozen.distributions,
                    system_attrs=carried,
                )
            )
        time.sleep(0.05 + 0.3 * rng.random())
        return None
    claim_trial(study, trial)
    return trial


def _tell(study, trial, state: str, value: float | None) -> None:
    from optuna.trial import TrialState

    if state == "pruned":
        study.tell(trial, state=TrialState.PRUNED)
    else:
        study.tell(trial, value)


def run_worker(
    job: WorkerJob,
    *,
    stop: Stop | None = None,
    backend: TimingBackend | None = None,
    on_trial: Callable[[], None] | None = None,
) -> int:
    """Run trials of one study until it has ``job.n_trials`` finished trials.

    Stops early on ``stop`` (after the current trial) or at ``job.deadline``
    (wall-clock seconds). Returns the number of trials this worker finished.
    """
    from optuna.trial import TrialState

    stop = stop or Stop()
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
    backend = backend or _make_job_backend(job)
    study = _open_job_study(job)
    rng = random.Random(job.seed * 7919 + job.index + os.getpid())
    mine = 0
    consecutive_failures = 0
    while not stop.is_set():
        if job.deadline is not None and time.time() >= job.deadline:
            break
        trial = _next_trial(study, job, rng)
        if trial == "done":
            break
        if trial is None:
            continue
        try:
            with trial_heartbeat(study, trial):
                state, value = _evaluate(study, trial, job, backend, stop)
        except Exception as exc:
            trial.set_user_attr("error", f"{type(exc).__name__}: {exc}"[:500])
            with contextlib.suppress(Exception):
                study.tell(trial, state=TrialState.FAIL)
            consecutive_failures += 1
            if consecutive_failures >= 3:
                raise
            continue
        consecutive_failures = 0
        _tell(study, trial, state, value)
        mine += 1
        if on_trial is not None:
            on_trial()
    return mine


@dataclass
class _InFlight:
    """A trial of :func:`run_interleaved` asked and waiting for its kernels (then the GPU)."""

    job: WorkerJob
    study: Any
    trial: Any
    params: dict[str, Any]
    ready: Any  # a Future (kernels compiling in a helper process) or None
    heartbeat: Any


def run_interleaved(
    jobs: Iterable[WorkerJob],
    *,
    backend: TimingBackend,
    stop: Stop | None = None,
    window: int = 1,
    prepare: Callable[[WorkerJob], None] | None = None,
    compile_ahead: Callable[[WorkerJob, Mapping[str, Any]], Any] | None = None,
    may_ask: Callable[[], bool] | None = None,
    on_trial: Callable[[WorkerJob, bool], None] | None = None,
    on_done: Callable[[WorkerJob], None] | None = None,
) -> list[WorkerJob]:
    """Run the studies of ``jobs`` in this process, up to ``window`` of them at once, one trial of each in flight.

    Each study runs as :func:`run_worker` runs it alone: it asks its next trial only after its previous one is
    told, with the sampler seeded by its finished count, so its trials do not depend on ``window`` or on the
    other studies. What the interleaving buys: while one trial is timed, ``compile_ahead(job, params)`` (a
    :class:`concurrent.futures.Future`, or None) prepares the others (their Triton kernels compiled in helper
    processes, :class:`kvsplit.tuner.precompile.KernelCompiler`); a trial is timed once its future is done,
    the oldest first when none is. Timing stays sequential on the one ``backend``.

    ``jobs`` is consumed lazily: a job is drawn only when its study opens (a generator may size it then).
    ``prepare(job)`` runs before a study is opened (warm starts, bookkeeping rows).
    ``may_ask()`` False (budget or slice over) or ``stop`` set: no new trial is asked and the trials in flight
    are finished. ``on_trial(job, measured)`` after each told trial (``measured``: the backend timed it);
    ``on_done(job)`` once a study has ``job.n_trials`` finished trials. Returns the jobs whose study is done.
    Raises the third consecutive exception of a timing (each failed trial is marked FAIL first).
    """
    from optuna.trial import TrialState

    stop = stop or Stop()
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
    queue = iter(jobs)
    ahead: list[WorkerJob] = []  # the next job, drawn from ``jobs`` only when a study may open

    def pending() -> bool:
        if not ahead:
            ahead.extend(itertools.islice(queue, 1))
        return bool(ahead)

    open_: list[tuple[WorkerJob, Any, random.Random]] = []
    busy: set[str] = set()
    flight: list[_InFlight] = []
    done: list[WorkerJob] = []
    failures = 0

    def asking() -> bool:
        return not stop.is_set() and (may_ask is None or may_ask())

    def tell(item: _InFlight, state: str, value: float | None, measured: bool) -> None:
        _tell(item.study, item.trial, state, value)
        item.heartbeat.__exit__(None, None, None)
        busy.discard(item.job.study)
        if on_trial is not None:
            on_trial(item.job, measured)

    while True:
        while asking() and len(open_) < max(1, window) and pending():
            job = ahead.pop()
            if prepare is not None:
                prepare(job)
            open_.append((job, _open_job_study(job), random.Random(job.seed * 7919 + job.index + os.getpid())))
        for entry in list(open_):
            job, study, rng = entry
            while job.study not in busy and asking():
                trial = _next_trial(study, job, rng)
                if trial == "done":
                    open_.remove(entry)
                    done.append(job)
                    if on_done is not None:
                        on_done(job)
                    break
                if trial is None:
                    continue
                hb = trial_heartbeat(study, trial)
                hb.__enter__()
                busy.add(job.study)
                item = _InFlight(job, study, trial, {}, None, hb)
                state, got = _prepare(study, trial, job, stop)
                if state != "measure":  # the study measured these parameters before
                    tell(item, state, got, False)
                    continue
                item.params = got
                item.ready = compile_ahead(job, got) if compile_ahead is not None else None
                flight.append(item)
        if not flight:
            if not asking() or (not open_ and not pending()):
                break
            continue
        item = next((f for f in flight if f.ready is None or f.ready.done()), flight[0])
        flight.remove(item)
        try:
            if item.ready is not None:
                with contextlib.suppress(Exception):  # a helper's failure: the timing below compiles in-process
                    item.ready.result()
            state, value = _measure(item.trial, item.job, item.params, backend)
        except Exception as exc:
            item.trial.set_user_attr("error", f"{type(exc).__name__}: {exc}"[:500])
            with contextlib.suppress(Exception):
                item.study.tell(item.trial, state=TrialState.FAIL)
            item.heartbeat.__exit__(None, None, None)
            busy.discard(item.job.study)
            failures += 1
            if failures >= 3:
                for f in flight:  # hand the others back: a resumed run asks them again (dead-trial rule)
                    f.heartbeat.__exit__(None, None, None)
                raise
            continue
        failures = 0
        tell(item, state, value, state == "complete")
    return done


def _worker_entry(job: WorkerJob) -> None:  # pragma: no cover - runs in a spawned process
    stop = Stop().install()
    try:
        run_worker(job, stop=stop)
    except KeyboardInterrupt:
        sys.exit(130)


def run_workers(jobs: list[WorkerJob], study, n: int, bar, stop: Stop) -> None:
    """Run ``jobs`` in spawned processes; first Ctrl-C: forward it (finish the trial), second: kill."""
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_worker_entry, args=(j,), name=f"kvsplit-tune-{j.index}") for j in jobs]
    store.dispose_engines()
    for p in procs:
        p.start()
    forwarded = killed = False
    try:
        while any(p.is_alive() for p in procs):
            if stop.count >= 1 and not forwarded:
                for p in procs:
                    if p.is_alive() and p.pid:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(p.pid, signal.SIGINT)
                forwarded = True
            if stop.count >= 2 and not killed:
                for p in procs:
                    if p.is_alive():
                        p.kill()
                killed = True
            c = study_counts(study)
            bar.n = min(n, c["COMPLETE"] + c["PRUNED"])
            bar.refresh()
            procs[0].join(timeout=0.25)
    finally:
        for p in procs:
            p.join()
    bad = [p.exitcode for p in procs if p.exitcode not in (0, 130, -signal.SIGINT)]
    if bad and not stop.is_set():
        raise RuntimeError(f"tuning workers exited with codes {bad}")
