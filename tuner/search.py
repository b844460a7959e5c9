"""The Optuna search for the ``tuned`` policy's parameters, one study per bucket.

Modules: :mod:`.tasks` (buckets and their batches), :mod:`.space` (search space,
baseline equivalents), :mod:`.study` (Optuna storages, heartbeats, stale and
dead trials: every Optuna internal), :mod:`.worker` (the worker loop); this
module runs them for a bucket (:func:`tune_task`, one named function per step
below) and re-exports their public names.

Flow of :func:`tune_task` (one bucket; docs/concepts/design.md §2 offline path):

1. :func:`start_run`: store rows: device, bucket (its training and held-out
   batches are stored with it the first time; a later task drawing other
   batches is refused, so a resumed study keeps one objective), a
   ``tuning_runs`` row, the timing backend.
2. :func:`open_run_study`: the study ``kvsplit-<backend>-<bucket key>`` is created or loaded
   (``load_if_exists``), TPE sampler (seeded; multivariate, constant liar for
   parallel workers). The baselines' equivalents in the tuned family
   (:func:`baseline_equivalents`), and the family's fallback where it is not ``balanced``
   (:func:`fallback_equivalent`: an FP8 cache), are enqueued once (a study attribute marks
   it; ``skip_if_exists`` guards against duplicates).
3. :func:`_search`: K workers (in this process for K = 1, else K spawned processes) run
   :func:`run_worker`: ask a trial, suggest the parameters of
   :data:`kvsplit.kernels.plan.TUNED_PARAM_SPACE` (those with ``search``, with
   their conditions), plan every training batch and time it on the backend;
   the value is the geometric mean of the kernel times (seconds). A
   ``ValueError`` from ``make_plan`` (an infeasible set) prunes the trial;
   pruned trials count as finished. A parameter set already measured in the
   study is not measured again: its stored value is reused (or the trial is
   pruned again).
4. Exactly ``n_trials`` finished (complete + pruned) trials: a worker only
   asks when ``finished + running < n_trials``, and after asking admits its
   trial only if fewer than ``n_trials`` other trials are finished or
   running; a surplus trial is marked failed (user attribute
   ``kvsplit:surplus``) and any fixed parameters it carried are re-enqueued.
   Whatever the interleaving, at most ``n_trials`` trials finish; workers
   keep going until ``n_trials`` have.
5. Faults: each running trial has a heartbeat (Optuna's for RDB storage, the
   same mechanism implemented on the journal by :class:`HeartbeatJournalStorage`)
   and records its host/pid; trials whose process is gone (same host) or
   whose heartbeat is older than the grace period are failed and re-enqueued
   with the same parameters. Ctrl-C (SIGINT) or SIGTERM stops a worker after
   its current trial; a second Ctrl-C in the parent kills the workers.
6. :func:`run_result`, :func:`_verify`, :func:`record_run`: verification on held-out batches (:mod:`kvsplit.tuner.verify`), a draft
   policy with the verification summary, and publishing when it passed and
   the store's publish rules allow.

Storage (:func:`storage_spec`): the database URL itself for one worker;
``--journal PATH`` (``JournalFileBackend``) for several processes on one host;
a PostgreSQL (any non-SQLite) URL for several hosts. One SQLite file is never
shared by parallel workers (ValueError), nor by two tuning processes: the
first holds :func:`exclusive_storage` and a later one raises
:class:`StorageBusy` naming it. Tuners sharing a PostgreSQL URL or a journal
cooperate on each study (trials claimed atomically, exact trial counts).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from ..db import store
from ..kernels.device import resolve_device
from .backends import BACKEND_NAMES, TimingBackend
from .space import (
    WARM_START,
    WARM_START_MIN_TRIALS,
    baseline_equivalents,
    fallback_equivalent,
    suggest_params,
    warm_start_equivalents,
)
from .study import (
    ATTR_ENQUEUED,
    ATTR_TASK,
    HeartbeatJournalStorage,
    StorageBusy,
    StorageSpec,
    exclusive_storage,
    fail_dead_trials,
    fail_stale,
    load_study,
    open_storage,
    storage_spec,
    study_best,
    study_counts,
    study_name,
)
from .tasks import (
    DEFAULT_HELDOUT,
    DEFAULT_TRAIN,
    LIBRARY_BATCH_SIZES,
    LIBRARY_TOTALS,
    LIBRARY_TRACES,
    TuneTask,
    backend_for_task,
    default_library,
    family_task,
    trace_tasks,
)
from .worker import Stop, WorkerJob, objective_value, run_worker, run_workers, task_params

__all__ = [
    "TuneTask",
    "TuneConfig",
    "TuneResult",
    "StorageSpec",
    "StorageBusy",
    "exclusive_storage",
    "storage_spec",
    "open_storage",
    "study_name",
    "family_task",
    "trace_tasks",
    "default_library",
    "backend_for_task",
    "baseline_equivalents",
    "warm_start_equivalents",
    "fallback_equivalent",
    "WARM_START",
    "WARM_START_MIN_TRIALS",
    "suggest_params",
    "objective_value",
    "run_worker",
    "run_workers",
    "WorkerJob",
    "tune_task",
    "check_task_batches",
    "calibration_for",
    "calibration_note",
    "task_bucket",
    "tune",
    "study_counts",
    "fail_dead_trials",
    "HeartbeatJournalStorage",
    "Stop",
    "DEFAULT_TRAIN",
    "DEFAULT_HELDOUT",
    "LIBRARY_BATCH_SIZES",
    "LIBRARY_TOTALS",
    "LIBRARY_TRACES",
]


def _enqueue_baselines(study, task: TuneTask, n_trials: int | None = None) -> None:
    # the baselines' equivalents and the family's fallback first, then (with room for them) the campaigns' plans
    if study.user_attrs.get(ATTR_ENQUEUED):
        return
    starts = {**baseline_equivalents(task), **fallback_equivalent(task)}
    if n_trials is not None and n_trials >= WARM_START_MIN_TRIALS:
        starts.update(warm_start_equivalents(task))
    for _, params in starts.items():
        study.enqueue_trial(params, skip_if_exists=True)
    study.set_user_attr(ATTR_ENQUEUED, True)


# Coordinator
# ----------------------------------------------------------------------------


@dataclass(frozen=True)
class TuneConfig:
    """Options of one ``kvsplit tune`` invocation."""

    database_url: str
    n_trials: int = 40
    backend: str = "sim"
    workers: int = 1
    timeout: float | None = None
    journal: str | None = None
    seed: int = 0
    progress: bool = True
    heartbeat_interval: int = 5
    grace_period: int = 30
    verify: bool = True
    publish: bool = True

    def __post_init__(self) -> None:
        if self.backend not in BACKEND_NAMES:
            raise ValueError(f"backend: expected one of {BACKEND_NAMES}, got {self.backend!r}")
        if isinstance(self.n_trials, bool) or not isinstance(self.n_trials, int) or self.n_trials < 1:
            raise ValueError(f"trials: expected an integer >= 1, got {self.n_trials!r}")
        if self.timeout is not None and not self.timeout > 0:
            raise ValueError(f"timeout: expected seconds > 0, got {self.timeout!r}")


@dataclass
class TuneResult:
    """What :func:`tune_task` did for one bucket."""

    bucket_key: str
    study_name: str
    run_id: int
    status: str  # finished | interrupted | failed
    n_finished: int
    best_value: float | None = None
    best_params: dict[str, Any] | None = None
    policy_id: int | None = None
    published: bool = False
    verification: dict[str, Any] | None = None
    message: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The result as a JSON-able dict of its fields (what ``kvsplit tune --json`` prints per bucket)."""
        return asdict(self)


def _progress_bar(total: int, desc: str, enabled: bool, initial: int):
    from tqdm.auto import tqdm

    return tqdm(
        total=total, initial=initial, desc=desc, unit="trial", disable=not enabled, leave=True, dynamic_ncols=True
    )


def _device_row(session, task: TuneTask, backend: TimingBackend | None, backend_name: str):
    if backend is not None:
        info, sw = backend.device_info(), backend.software()
    else:
        dev = resolve_device(task.gpu)
        info = {
            "name": dev.name,
            "num_sms": dev.num_sms,
            "hbm_bandwidth_gbps": float(dev.hbm_bandwidth_gbps),
            "read_bandwidth_gbps": None,
        }
        sw = {"backend": backend_name}
    return store.get_or_create_device(
        session,
        name=info["name"],
        num_sms=info["num_sms"],
        hbm_bandwidth_gbps=info["hbm_bandwidth_gbps"],
        software=sw,
        read_bandwidth_gbps=info.get("read_bandwidth_gbps"),
    )


def calibration_for(
    url: str, gpu: str, backend: str, *, dtype: str = "bfloat16", kv_dtype: str | None = None, q_len: int = 1
) -> tuple[dict[str, Any] | None, float | None]:
    """The stored calibration a ``sim`` backend of ``gpu`` at this KV dtype and q_len uses, and the measured read
    bandwidth (GB/s) of ``gpu``; ``(None, None)`` for another backend.

    The calibration is chosen by :func:`kvsplit.tuner.calibrate.stored_calibration` (the exact KV dtype and q_len,
    else the q_len-1 fit with K/V in ``dtype``, else none): a dict ``{"id", "kv_dtype", "q_len", "constants",
    "kernel_config", "error", "note"}`` (``note`` ``""`` for an exact match, else which fit stands in), or None
    when none applies; :func:`calibration_note` gives the note to show the user either way.
    """
    from .calibrate import stored_calibration

    if backend != "sim":
        return None, None
    with store.session_scope(url) as s:
        cal, note = stored_calibration(s, gpu, dtype=dtype, kv_dtype=kv_dtype, q_len=q_len)
        data = (
            None
            if cal is None
            else {
                "id": cal.id,
                "kv_dtype": cal.kv_dtype,
                "q_len": cal.q_len,
                "constants": dict(cal.constants),
                "kernel_config": dict(cal.kernel_config),
                "error": dict(cal.error or {}),
                "note": note,
            }
        )
        return data, store.measured_read_bandwidth(s, gpu)


def describe_calibration(cal: Mapping[str, Any] | None, bw: float | None, gpu: str) -> str:
    """One line naming the calibration a simulator of ``gpu`` runs on, from :func:`calibration_for`'s ``(cal, bw)``:
    ``"stored calibration 4 of NVIDIA H100 80GB HBM3 (KV float8_e4m3fn, q_len 1)"``, or the defaults of the
    GPU's :class:`~kvsplit.kernels.device.DeviceSpec` (scaled to the measured read bandwidth ``bw``, GB/s, if any)."""
    if cal is not None:
        return f"stored calibration {cal['id']} of {gpu} (KV {cal['kv_dtype']}, q_len {cal['q_len']})"
    return f"none stored: the simulator's defaults from the DeviceSpec of {gpu}" + (
        f" scaled to {bw:.0f} GB/s" if bw else ""
    )


def calibration_note(url: str, task: TuneTask, backend: str) -> str:
    """What :func:`calibration_for` says about ``task``'s calibration on ``backend``: ``""`` when the store holds
    one of the task's GPU, KV dtype and q_len (or the backend is not ``sim``), else the one-line note of
    :func:`kvsplit.tuner.calibrate.stored_calibration` (which fit is used instead, and the ``kvsplit calibrate``
    command that stores the exact one)."""
    from .calibrate import stored_calibration

    if backend != "sim":
        return ""
    with store.session_scope(url) as s:
        return stored_calibration(s, task.gpu, dtype=task.dtype, kv_dtype=task.kv_dtype, q_len=task.q_len)[1]


def check_same_batches(task: TuneTask, bucket: Any) -> None:
    """Refuse a task whose batches differ from those its bucket was first tuned on.

    A bucket's study resumes on the bucket's stored training and held-out
    batches; a later task with other draws (another ``--seed``,
    ``--total-tokens``, ``--num-train``, ...) would silently tune on the old
    ones, so it is refused, naming the bucket's first source.
    """
    sb = bucket.sample_batches or {}
    if not (sb.get("train") and sb.get("heldout")):
        return
    stored = (
        tuple(tuple(int(v) for v in x) for x in sb["train"]),
        tuple(tuple(int(v) for v in x) for x in sb["heldout"]),
    )
    if stored != (task.train, task.heldout):
        raise ValueError(
            f"bucket {task.key} keeps the batches of its first tune ({bucket.source or 'another task'}); this run "
            f"({task.source}) draws other ones: the bucket's study resumes only on its own batches, so use the "
            "first run's --seed, --total-tokens, --num-train, --num-heldout and trace options, or tune into "
            "another store (--database-url)"
        )


def task_bucket(session: Any, task: TuneTask) -> Any:
    """The bucket row of ``task``, created with its signature, source and training / held-out batches when
    missing; raises ValueError (:func:`check_same_batches`) when the bucket was first tuned on other batches."""
    b = store.get_or_create_bucket(
        session,
        key=task.key,
        gpu=task.gpu,
        num_kv_heads=task.num_kv_heads,
        head_dim=task.head_dim,
        dtype=task.dtype,
        page_size=task.page_size,
        signature=dict(task.signature),
        source=task.source,
        sample_batches={"train": [list(x) for x in task.train], "heldout": [list(x) for x in task.heldout]},
    )
    check_same_batches(task, b)
    return b


def check_task_batches(task: TuneTask, database_url: str) -> None:
    """Raise ValueError when ``task``'s bucket exists in the store with other batches (see ``tune_task``)."""
    with store.session_scope(database_url) as s:
        b = store.get_bucket(s, task.key)
        if b is not None:
            check_same_batches(task, b)


@dataclass
class SearchRun:
    """What the steps of :func:`tune_task` share for one bucket."""

    task: TuneTask
    cfg: TuneConfig
    url: str
    spec: StorageSpec
    study: str
    calibration: dict[str, Any] | None
    read_bandwidth_gbps: float | None
    backend: TimingBackend | None  # None with several workers: each worker makes its own
    bucket_id: int = 0
    run_id: int = 0
    device_id: int = 0

    def make_backend(self) -> TimingBackend:
        return backend_for_task(
            self.task, self.cfg.backend, calibration=self.calibration, read_bandwidth_gbps=self.read_bandwidth_gbps
        )


def start_run(task: TuneTask, cfg: TuneConfig, backend: TimingBackend | None) -> SearchRun:
    """Step 1: storage, calibration, the bucket row (refusing other batches), the backend, a run row."""
    url = store.resolve_url(cfg.database_url)
    spec = storage_spec(
        url,
        journal=cfg.journal,
        workers=cfg.workers,
        heartbeat_interval=cfg.heartbeat_interval,
        grace_period=cfg.grace_period,
    )
    calibration, bw = calibration_for(
        url, task.gpu, cfg.backend, dtype=task.dtype, kv_dtype=task.kv_dtype, q_len=task.q_len
    )
    run = SearchRun(task, cfg, url, spec, study_name(task, cfg.backend), calibration, bw, backend)
    with store.session_scope(url, write=True) as s:
        run.bucket_id = task_bucket(s, task).id
    if cfg.workers == 1 and run.backend is None:
        run.backend = run.make_backend()
    with store.session_scope(url, write=True) as s:
        dev_row = _device_row(s, task, run.backend, cfg.backend)
        row = store.start_run(
            s,
            bucket_id=run.bucket_id,
            study_name=run.study,
            backend=cfg.backend,
            n_trials=cfg.n_trials,
            workers=cfg.workers,
            storage_kind=spec.kind,
            device_id=dev_row.id,
            stale_after_s=cfg.grace_period,
        )
        run.run_id, run.device_id = row.id, dev_row.id
    return run


def open_run_study(run: SearchRun):
    """Step 2: create or load the study, enqueue the baselines once, fail stale and dead trials."""
    study = load_study(run.spec, run.study, run.cfg.seed, run.cfg.n_trials, storage=open_storage(run.spec))
    study.set_user_attr(
        ATTR_TASK, {"key": run.task.key, "source": run.task.source, "num_qo_heads": run.task.num_qo_heads}
    )
    _enqueue_baselines(study, run.task, run.cfg.n_trials)
    fail_stale(study)
    return study


def _best_of(run: SearchRun, study) -> tuple[float | None, dict[str, Any] | None]:
    """The study's best value and parameters, refitted to the task's shape as its trials were planned
    (:func:`kvsplit.tuner.worker.task_params`): what is verified, stored and served."""
    value, params = study_best(study)
    return value, (task_params(run.task, params) if params is not None else None)


def _finished(study) -> int:
    c = study_counts(study)
    return c["COMPLETE"] + c["PRUNED"]


def _search(run: SearchRun, study, stop: Stop, on_trial=None) -> None:
    """Step 3: run the workers until the study has ``n_trials`` finished trials (or stop / timeout).

    A failure or Ctrl-C records the run as failed / interrupted and re-raises.
    """
    cfg = run.cfg
    bar = _progress_bar(
        cfg.n_trials, f"{run.task.source} [{cfg.backend}]", cfg.progress, min(cfg.n_trials, _finished(study))
    )
    job = WorkerJob(
        task=run.task,
        storage=run.spec,
        study=run.study,
        n_trials=cfg.n_trials,
        backend=cfg.backend,
        seed=cfg.seed,
        deadline=time.time() + cfg.timeout if cfg.timeout else None,
        calibration=run.calibration,
        read_bandwidth_gbps=run.read_bandwidth_gbps,
    )
    try:
        if cfg.workers == 1:

            def tick() -> None:
                bar.n = min(cfg.n_trials, _finished(study))
                bar.refresh()
                if on_trial is not None:
                    on_trial(bar.n)

            run_worker(job, stop=stop, backend=run.backend, on_trial=tick)
        else:
            run_workers([replace(job, index=i) for i in range(cfg.workers)], study, cfg.n_trials, bar, stop)
    except BaseException as exc:
        status = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
        best_value, best_params = _best_of(run, study)
        with store.session_scope(run.url, write=True) as s:
            store.finish_run(
                s,
                run.run_id,
                status=status,
                n_finished=_finished(study),
                best_value=best_value,
                best_params=best_params,
                message=f"{type(exc).__name__}: {exc}"[:2000],
            )
        bar.close()
        raise
    bar.n = min(cfg.n_trials, _finished(study))
    bar.refresh()
    bar.close()


def run_result(run: SearchRun, study, stop: Stop) -> TuneResult:
    """Step 4: the study's best and how the search ended (finished, interrupted, timed out)."""
    finished = _finished(study)
    best_value, best_params = _best_of(run, study)
    status, message = "finished", ""
    if stop.is_set():
        status, message = "interrupted", "stopped by signal after the current trial"
    elif finished < run.cfg.n_trials:
        message = f"timeout after {finished} of {run.cfg.n_trials} finished trials"
    return TuneResult(run.task.key, run.study, run.run_id, status, finished, best_value, best_params, message=message)


def _note(result: TuneResult, text: str) -> None:
    result.message = (result.message + "; " if result.message else "") + text


def _verify(run: SearchRun, result: TuneResult) -> None:
    """Step 5: verify the best on held-out batches and publish it, unless an earlier run already did."""
    from . import verify as _verify_mod

    if result.status != "finished":
        return
    if result.best_params is None:
        result.message = "no feasible trial"
        return
    if not run.cfg.verify:
        return
    with store.session_scope(run.url) as s:
        existing = next(
            (
                p
                for p in store.list_policies(s, bucket_key=run.task.key)
                if p.backend == run.cfg.backend and p.params == result.best_params and p.verification
            ),
            None,
        )
    if existing is not None:  # a resumed, already finished study: its best was verified before
        result.policy_id = existing.id
        result.published = existing.status == "published"
        result.verification = dict(existing.verification)
        _note(result, f"already verified as policy {existing.id} ({existing.status})")
        return
    outcome = _verify_mod.verify_and_store(
        run.task,
        result.best_params,
        run.backend or run.make_backend(),
        database_url=run.url,
        bucket_id=run.bucket_id,
        run_id=run.run_id,
        device_id=run.device_id,
        train_objective_s=result.best_value,
        publish=run.cfg.publish,
    )
    result.policy_id = outcome.policy_id
    result.published = outcome.published
    result.verification = outcome.summary
    if outcome.note:
        _note(result, outcome.note)


def record_run(run: SearchRun, result: TuneResult) -> None:
    """Step 6: close the run row."""
    with store.session_scope(run.url, write=True) as s:
        store.finish_run(
            s,
            run.run_id,
            status=result.status,
            n_finished=result.n_finished,
            best_value=result.best_value,
            best_params=result.best_params,
            message=result.message,
        )


def tune_task(
    task: TuneTask, cfg: TuneConfig, *, stop: Stop | None = None, backend: TimingBackend | None = None, on_trial=None
) -> TuneResult:
    """Tune, verify and (if it passes) publish the ``tuned`` policy of one bucket.

    Re-running with the same arguments resumes the study: it ends with exactly
    ``cfg.n_trials`` finished trials in total. Returns a :class:`TuneResult`;
    ``status`` is ``interrupted`` after Ctrl-C (no verification then). Steps:
    module doc. ``on_trial(finished)``: called after each trial of a one-worker search (progress display).
    """
    stop = stop or Stop()
    # one process at a time on a SQLite study storage (StorageBusy otherwise); the run row's heartbeat, and
    # an exception marks the row failed (a killed process's row: store.reap_runs)
    with exclusive_storage(storage_spec(cfg.database_url, journal=cfg.journal, workers=cfg.workers)):
        run = start_run(task, cfg, backend)
        with store.run_heartbeat(run.url, run.run_id, cfg.heartbeat_interval):
            study = open_run_study(run)
            _search(run, study, stop, on_trial)
            result = run_result(run, study, stop)
            _verify(run, result)
            record_run(run, result)
    return result


def tune(tasks: Sequence[TuneTask], cfg: TuneConfig, *, stop: Stop | None = None) -> list[TuneResult]:
    """Tune several buckets one after the other (each with ``cfg.workers`` workers).

    Stops between buckets when ``stop`` is set.
    """
    stop = stop or Stop()
    out = []
    for t in tasks:
        if stop.is_set():
            break
        out.append(tune_task(t, cfg, stop=stop))
    return out
