"""The Optuna search for the ``tuned`` policy's parameters, one study per bucket.

Flow of :func:`tune_task` (one bucket; DESIGN.md §2 offline path):

1. Store rows: device, bucket (its training and held-out batches are stored
   with it the first time and reused on every later run, so a resumed study
   keeps one objective), a ``tuning_runs`` row.
2. The study ``kvsplit-<backend>-<bucket key>`` is created or loaded
   (``load_if_exists``), TPE sampler (seeded; multivariate, constant liar for
   parallel workers). The baselines' equivalents in the tuned family
   (:func:`baseline_equivalents`) are enqueued once (a study attribute marks
   it; ``skip_if_exists`` guards against duplicates).
3. K workers (in this process for K = 1, else K spawned processes) run
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
6. Verification on held-out batches (:mod:`kvsplit.tuner.verify`), a draft
   policy with the verification summary, and publishing when it passed and
   the store's publish rules allow.

Storage (:func:`storage_spec`): the database URL itself for one worker;
``--journal PATH`` (``JournalFileBackend``) for several processes on one host;
a PostgreSQL (any non-SQLite) URL for several hosts. One SQLite file is never
shared by parallel workers (ValueError).
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing as mp
import os
import random
import signal
import socket
import sys
import threading
import time
import warnings
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..db import store
from ..kernels.buckets import bucket_key
from ..kernels.device import DeviceSpec, resolve_device
from ..kernels.plan import TUNED_PARAM_SPACE, default_config, fa3_static_num_splits, make_plan
from .backends import BACKEND_NAMES, TimingBackend, make_backend
from .workloads import FAMILIES, family_batches, family_kv_lens, trace_batches, TRACES

__all__ = [
    "TuneTask",
    "TuneConfig",
    "TuneResult",
    "StorageSpec",
    "storage_spec",
    "open_storage",
    "study_name",
    "family_task",
    "trace_tasks",
    "default_library",
    "baseline_equivalents",
    "suggest_params",
    "objective_value",
    "run_worker",
    "tune_task",
    "check_task_batches",
    "tune",
    "study_counts",
    "HeartbeatJournalStorage",
    "Stop",
]

DEFAULT_TRAIN = 8
DEFAULT_HELDOUT = 8
_ATTR_PROC = "kvsplit:proc"
_ATTR_HEARTBEAT = "kvsplit:heartbeat"
_ATTR_SURPLUS = "kvsplit:surplus"
_ATTR_ENQUEUED = "kvsplit:baselines_enqueued"
_ATTR_TASK = "kvsplit:task"


# ----------------------------------------------------------------------------
# Tasks (buckets with their batches)
# ----------------------------------------------------------------------------


@dataclass(frozen=True)
class TuneTask:
    """One bucket to tune: its key and shape, and its training / held-out batches.

    ``train`` and ``heldout`` are lists of kv_lens lists (plain ints, never the
    same batch in both).
    """

    key: str
    gpu: str
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    dtype: str
    page_size: int
    source: str
    train: tuple[tuple[int, ...], ...]
    heldout: tuple[tuple[int, ...], ...]
    signature: Mapping[str, Any] = field(default_factory=dict)

    @property
    def max_tokens(self) -> int:
        return max(sum(b) for b in self.train + self.heldout)

    @property
    def max_batch(self) -> int:
        return max(len(b) for b in self.train + self.heldout)


def _shape_check(gpu: str, num_qo_heads: int, num_kv_heads: int) -> DeviceSpec:
    dev = resolve_device(gpu)
    for name, v in (("num_qo_heads", num_qo_heads), ("num_kv_heads", num_kv_heads)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{name}: expected an integer >= 1, got {v!r}")
    if num_qo_heads % num_kv_heads:
        raise ValueError(f"num_qo_heads: expected a multiple of num_kv_heads ({num_kv_heads}), got {num_qo_heads}")
    return dev


def _key_of(kv_lens: Sequence[int], *, dev: DeviceSpec, num_kv_heads: int, head_dim: int, dtype: str,
            page_size: int):
    return bucket_key(np.asarray(kv_lens, dtype=np.int64), num_kv_heads=num_kv_heads, head_dim=head_dim,
                      dtype=dtype, device=dev, page_size=page_size)


def _signature(k) -> dict[str, Any]:
    return {"batch_class": k.batch_class, "tokens_class": k.tokens_class, "hist": [list(p) for p in k.hist]}


def family_task(
    family: str,
    batch_size: int,
    total_tokens: int,
    *,
    gpu: str,
    num_qo_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: str,
    page_size: int,
    num_train: int = DEFAULT_TRAIN,
    num_heldout: int = DEFAULT_HELDOUT,
    seed: int = 0,
) -> TuneTask:
    """The bucket of a synthetic family batch, with jittered training and held-out draws.

    The key is that of the family's nominal batch (:func:`family_kv_lens`);
    training and held-out batches are independent draws around it
    (:func:`family_batches`, DESIGN.md §6).
    """
    dev = _shape_check(gpu, num_qo_heads, num_kv_heads)
    nominal = family_kv_lens(family, batch_size, total_tokens)
    k = _key_of(nominal, dev=dev, num_kv_heads=num_kv_heads, head_dim=head_dim, dtype=dtype, page_size=page_size)
    tr = family_batches(family, batch_size, total_tokens, num_batches=num_train, seed=seed, role="train")
    ho = family_batches(family, batch_size, total_tokens, num_batches=num_heldout, seed=seed, role="heldout")
    return TuneTask(
        key=str(k), gpu=dev.name, num_qo_heads=int(num_qo_heads), num_kv_heads=int(num_kv_heads),
        head_dim=int(head_dim), dtype=dtype, page_size=int(page_size),
        source=f"family:{family}:B{batch_size}:T{total_tokens}",
        train=tuple(tuple(int(x) for x in b) for b in tr), heldout=tuple(tuple(int(x) for x in b) for b in ho),
        signature=_signature(k),
    )


def trace_tasks(
    trace: str,
    *,
    gpu: str,
    num_qo_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: str,
    page_size: int,
    batch_sizes: Sequence[int] = (16, 64, 256),
    num_train: int = DEFAULT_TRAIN,
    num_heldout: int = DEFAULT_HELDOUT,
    seed: int = 0,
    rate_scale: float | None = None,
    token_budget: int | None = None,
    max_batch_size: int | None = None,
    max_kv_len: int | None = None,
    max_buckets: int | None = None,
) -> list[TuneTask]:
    """The buckets of a trace: one per batch size, around the batches' medoid key.

    For each ``B`` in ``batch_sizes``, a pool of 3x the wanted training and
    held-out batches is drawn (:func:`kvsplit.tuner.workloads.trace_batches`:
    continuous-batching replay for timed traces, i.i.d. for length-only ones).
    Real batches rarely share an exact key, so the bucket is the pool's medoid
    key (least total :func:`kvsplit.kernels.buckets.distance` to the others)
    and its training / held-out batches are the pool's batches within
    :data:`~kvsplit.kernels.buckets.DISTANCE_LIMIT` of it, nearest first (the
    batches a server would serve with this bucket's policy). A batch size
    whose medoid is already a bucket is merged into it; a bucket without a
    held-out batch is skipped. ``max_buckets`` keeps the buckets with the
    most batches.
    """
    from ..kernels.buckets import DISTANCE_LIMIT, distance

    if trace not in TRACES:
        raise ValueError(f"trace: unknown trace {trace!r}; known: {sorted(TRACES)}")
    dev = _shape_check(gpu, num_qo_heads, num_kv_heads)
    found: dict[str, dict[str, Any]] = {}
    for B in batch_sizes:
        tr, ho = trace_batches(trace, int(B), num_train=3 * num_train, num_heldout=3 * num_heldout, seed=seed,
                               rate_scale=rate_scale, token_budget=token_budget,
                               max_batch_size=max_batch_size, max_kv_len=max_kv_len)
        kt = [_key_of(b, dev=dev, num_kv_heads=num_kv_heads, head_dim=head_dim, dtype=dtype,
                      page_size=page_size) for b in tr]
        kh = [_key_of(b, dev=dev, num_kv_heads=num_kv_heads, head_dim=head_dim, dtype=dtype,
                      page_size=page_size) for b in ho]
        keys = kt + kh
        D = np.array([[distance(a, b) for b in keys] for a in keys])
        medoid = keys[int(np.argmin(D.sum(axis=1)))]
        ent = found.setdefault(str(medoid), {"train": [], "heldout": [], "sig": _signature(medoid), "B": []})
        ent["B"].append(int(B))
        for pool, ks, role in ((tr, kt, "train"), (ho, kh, "heldout")):
            near = sorted((distance(k, medoid), i) for i, k in enumerate(ks))
            ent[role] += [tuple(int(x) for x in pool[i]) for d, i in near if d <= DISTANCE_LIMIT]
    tasks = []
    for key, ent in found.items():
        if not ent["train"] or not ent["heldout"]:
            continue
        tasks.append(TuneTask(
            key=key, gpu=dev.name, num_qo_heads=int(num_qo_heads), num_kv_heads=int(num_kv_heads),
            head_dim=int(head_dim), dtype=dtype, page_size=int(page_size),
            source=f"trace:{trace}:B{'/'.join(map(str, ent['B']))}",
            train=tuple(ent["train"][:num_train]), heldout=tuple(ent["heldout"][:num_heldout]),
            signature=ent["sig"],
        ))
    tasks.sort(key=lambda t: -(len(t.train) + len(t.heldout)))
    if max_buckets is not None:
        tasks = tasks[: int(max_buckets)]
    return tasks


LIBRARY_BATCH_SIZES = (16, 64, 256, 1024)
LIBRARY_TOTALS = (262_144, 1_048_576)
LIBRARY_TRACES = ("azure_code", "azure_conv", "mooncake", "sharegpt", "arxiv")


def default_library(*, gpu: str, num_qo_heads: int, num_kv_heads: int, head_dim: int, dtype: str,
                    page_size: int, num_train: int = DEFAULT_TRAIN, num_heldout: int = DEFAULT_HELDOUT,
                    seed: int = 0) -> list[TuneTask]:
    """The default bucket library of ``--all`` for one shape.

    Every family of :data:`FAMILIES` at B in (16, 64, 256, 1024) and T in
    (262,144, 1,048,576), plus the buckets of every shipped trace at B in
    (16, 64, 256); duplicate keys are tuned once (the first source wins).
    """
    shape = dict(gpu=gpu, num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, dtype=dtype,
                 page_size=page_size, num_train=num_train, num_heldout=num_heldout, seed=seed)
    tasks: dict[str, TuneTask] = {}
    for T in LIBRARY_TOTALS:
        for fam in FAMILIES:
            for B in LIBRARY_BATCH_SIZES:
                t = family_task(fam, B, T, **shape)
                tasks.setdefault(t.key, t)
    for tr in LIBRARY_TRACES:
        for t in trace_tasks(tr, **shape):
            tasks.setdefault(t.key, t)
    return list(tasks.values())


# ----------------------------------------------------------------------------
# Search space and baselines
# ----------------------------------------------------------------------------


def _searched() -> list[tuple[str, dict[str, Any]]]:
    return [(k, v) for k, v in TUNED_PARAM_SPACE.items() if v.get("search")]


def suggest_params(trial: Any) -> dict[str, Any]:
    """Suggest one ``tuned`` parameter set from :data:`TUNED_PARAM_SPACE`.

    Float and int entries use ``low``/``high``/``log``; categorical ones their
    ``choices``; an entry with a ``condition`` is suggested only when the
    parameters it names have those values. Returns ``make_plan`` params.
    """
    params: dict[str, Any] = {}
    for name, spec in _searched():
        cond = spec.get("condition") or {}
        if any(params.get(k) != v for k, v in cond.items()):
            continue
        kind = spec["kind"]
        if kind == "float":
            params[name] = trial.suggest_float(name, float(spec["low"]), float(spec["high"]),
                                               log=bool(spec.get("log")))
        elif kind == "int":
            params[name] = trial.suggest_int(name, int(spec["low"]), int(spec["high"]), log=bool(spec.get("log")))
        elif kind == "categorical":
            params[name] = trial.suggest_categorical(name, list(spec["choices"]))
        else:  # pragma: no cover - guarded by the policies' own tests
            raise ValueError(f"TUNED_PARAM_SPACE[{name!r}]: unknown kind {kind!r}")
    return params


def _complete_defaults(task: TuneTask, params: Mapping[str, Any]) -> dict[str, Any]:
    """Fill every searched parameter (respecting conditions) from the space's defaults."""
    cfg = default_config(task.head_dim, task.dtype)
    knob_default = {"block_n": cfg.block_n, "num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    out: dict[str, Any] = {}
    for name, spec in _searched():
        cond = spec.get("condition") or {}
        merged = {**out, **params}
        if any(merged.get(k) != v for k, v in cond.items()):
            continue
        if name in params:
            out[name] = params[name]
        elif spec.get("default") is not None:
            out[name] = spec["default"]
        else:
            out[name] = knob_default[name]
    return out


def baseline_equivalents(task: TuneTask) -> dict[str, dict[str, Any]]:
    """The baselines restated as ``tuned`` parameter sets (the study's first trials).

    - ``balanced``: the space's defaults (``tuned`` with defaults plans as ``balanced``);
    - ``no_split``: ``max_splits = 1``;
    - ``fa3``: about one tile per SM (``ctas_per_sm = 1 / 1.1``, FA3's
      ``blocks_per_sm`` rule), chunk at least 128 tokens (kBlockN), split cap
      FA3's static heuristic for the bucket's longest request, heaviest first,
      persistent with one program per SM;
    - ``flashinfer``: the tensor-core path aims at 2 CTAs per SM with chunks of
      at least 128 tokens, and does not split once ``B * H_kv >= 2 * num_SMs``
      (``max_splits = 1`` then).

    Every set is complete over the searched parameters, so TPE sees them as
    ordinary points.
    """
    dev = resolve_device(task.gpu)
    S = dev.num_sms
    B = max(len(b) for b in task.train)
    longest = max(max(b) for b in task.train)
    fa3_cap = fa3_static_num_splits(task.num_kv_heads, max(1, -(-longest // 128)), S)
    space_hi = TUNED_PARAM_SPACE["max_splits"]["high"]
    out = {
        "balanced": _complete_defaults(task, {}),
        "no_split": _complete_defaults(task, {"max_splits": 1}),
        "fa3": _complete_defaults(task, {"ctas_per_sm": 1 / 1.1, "min_chunk_tokens": 128,
                                         "max_splits": int(min(max(fa3_cap, 1), space_hi)),
                                         "order": "heavy_first", "schedule": "persistent",
                                         "programs_per_sm": 1}),
        "flashinfer": _complete_defaults(
            task, {"max_splits": 1} if B * task.num_kv_heads >= 2 * S else {"ctas_per_sm": 2.0,
                                                                             "min_chunk_tokens": 128}),
    }
    return out


# ----------------------------------------------------------------------------
# Storage
# ----------------------------------------------------------------------------


@dataclass(frozen=True)
class StorageSpec:
    """Where the Optuna studies live (picklable, rebuilt in each worker)."""

    kind: str  # "rdb" | "journal"
    location: str  # URL or journal path
    heartbeat_interval: int = 5
    grace_period: int = 30

    def describe(self) -> str:
        if self.kind == "journal":
            return f"journal:{self.location}"
        from sqlalchemy.engine import make_url

        return make_url(self.location).render_as_string(hide_password=True)


def storage_spec(database_url: str, *, journal: str | os.PathLike | None = None, workers: int = 1,
                 heartbeat_interval: int = 5, grace_period: int = 30) -> StorageSpec:
    """Choose the Optuna storage for ``workers`` processes.

    ``journal`` given: a ``JournalFileBackend`` file (several processes, one
    host). Otherwise the database URL: fine for one worker; for several it must
    be a server database (PostgreSQL, ...).

    Raises
    ------
    ValueError
        Several workers on a SQLite URL without ``journal``; a heartbeat
        interval < 1 or a grace period not above it.
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers: expected an integer >= 1, got {workers!r}")
    if heartbeat_interval < 1 or grace_period <= heartbeat_interval:
        raise ValueError(f"grace_period: expected > heartbeat_interval ({heartbeat_interval}), got {grace_period}")
    if journal is not None:
        p = Path(journal).expanduser().resolve()
        if not p.parent.is_dir():
            raise ValueError(f"journal: folder {str(p.parent)!r} does not exist")
        return StorageSpec("journal", str(p), heartbeat_interval, grace_period)
    url = store.resolve_url(database_url)
    from sqlalchemy.engine import make_url

    if make_url(url).get_backend_name() == "sqlite" and workers > 1:
        raise ValueError(
            f"workers: {workers} parallel workers cannot share one SQLite file for the Optuna study "
            "(SQLite serialises writers and Optuna does not support it for parallel optimisation); "
            "pass --journal PATH (several processes on this host) or a PostgreSQL --database-url (several hosts)"
        )
    return StorageSpec("rdb", url, heartbeat_interval, grace_period)


def _journal_heartbeat_cls():
    from optuna.storages import JournalStorage
    from optuna.storages._heartbeat import BaseHeartbeat
    from optuna.trial import TrialState

    class _HeartbeatJournalStorage(JournalStorage, BaseHeartbeat):
        """JournalStorage with Optuna's heartbeat protocol (RDB has it built in).

        The heartbeat is a trial system attribute ``kvsplit:heartbeat``
        (wall-clock seconds, one host); a RUNNING trial whose newest heartbeat
        (or start, before the first one) is older than ``grace_period`` is stale.
        """

        def __init__(self, backend, *, heartbeat_interval: int, grace_period: int, stale_callback=None):
            super().__init__(backend)
            self._hb_interval = int(heartbeat_interval)
            self._grace = int(grace_period)
            self._stale_cb = stale_callback

        def record_heartbeat(self, trial_id: int) -> None:
            from optuna.exceptions import UpdateFinishedTrialError

            with contextlib.suppress(UpdateFinishedTrialError, KeyError):
                self.set_trial_system_attr(trial_id, _ATTR_HEARTBEAT, time.time())

        def _get_stale_trial_ids(self, study_id: int) -> list[int]:
            now = time.time()
            stale = []
            for t in self.get_all_trials(study_id, deepcopy=False, states=(TrialState.RUNNING,)):
                start = t.datetime_start.timestamp() if t.datetime_start is not None else now
                hb = t.system_attrs.get(_ATTR_HEARTBEAT)
                last = float(hb) if isinstance(hb, (int, float)) else start
                if now - last > self._grace:
                    stale.append(t._trial_id)
            return stale

        def get_heartbeat_interval(self) -> int | None:
            return self._hb_interval

        def get_heartbeat_stale_trial_callback(self):
            return self._stale_cb

    return _HeartbeatJournalStorage


def HeartbeatJournalStorage(path: str, *, heartbeat_interval: int = 5, grace_period: int = 30,
                            stale_callback=None):
    """A ``JournalStorage(JournalFileBackend(path))`` with heartbeats (see :func:`open_storage`)."""
    from optuna.storages.journal import JournalFileBackend

    cls = _journal_heartbeat_cls()
    return cls(JournalFileBackend(path), heartbeat_interval=heartbeat_interval, grace_period=grace_period,
               stale_callback=stale_callback)


def _retry_callback(study, trial) -> None:
    """Re-enqueue a failed (stale or dead) trial with the same parameters, at most 3 times."""
    import optuna

    sys_attrs = {k: v for k, v in trial.system_attrs.items() if not k.startswith("kvsplit:")}
    history = list(sys_attrs.get("retry_history", [])) + [trial.number]
    if len(history) > 3:
        return
    sys_attrs.update({"failed_trial": trial.number, "retry_history": history})
    study.add_trial(optuna.create_trial(state=optuna.trial.TrialState.WAITING, params=trial.params,
                                        distributions=trial.distributions, system_attrs=sys_attrs))


def open_storage(spec: StorageSpec):
    """The Optuna storage object for ``spec`` (heartbeats and stale-trial retry on)."""
    import optuna

    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    if spec.kind == "journal":
        return HeartbeatJournalStorage(spec.location, heartbeat_interval=spec.heartbeat_interval,
                                       grace_period=spec.grace_period, stale_callback=_retry_callback)
    url = spec.location
    kwargs: dict[str, Any] = {}
    from sqlalchemy.engine import make_url

    if make_url(url).get_backend_name() == "sqlite":
        kwargs["connect_args"] = {"timeout": 60}
    else:
        kwargs["pool_pre_ping"] = True
    return optuna.storages.RDBStorage(url, engine_kwargs=kwargs, heartbeat_interval=spec.heartbeat_interval,
                                      grace_period=spec.grace_period,
                                      heartbeat_stale_trial_callback=_retry_callback)


def study_name(task: TuneTask, backend: str) -> str:
    """``kvsplit-<backend>-<bucket key>``: one study per bucket and backend."""
    return f"kvsplit-{backend}-{task.key}"


def _sampler(seed: int, n_trials: int):
    import optuna

    return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True, constant_liar=True,
                                      n_startup_trials=max(4, min(10, n_trials // 3)))


def _load_study(spec: StorageSpec, name: str, seed: int, n_trials: int, storage=None):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = storage if storage is not None else open_storage(spec)
    for attempt in range(20):  # several workers creating the study at the same instant
        try:
            return optuna.create_study(storage=storage, study_name=name, direction="minimize",
                                       sampler=_sampler(seed, n_trials), load_if_exists=True)
        except Exception as exc:  # IntegrityError / DuplicatedStudyError races
            if attempt == 19:
                raise
            if "exist" not in str(exc).lower() and "integrity" not in type(exc).__name__.lower() \
                    and "unique" not in str(exc).lower():
                raise
            time.sleep(0.05 + 0.1 * random.random())
    raise AssertionError("unreachable")


def study_counts(study) -> dict[str, int]:
    """Trials of a study by state name (``COMPLETE``, ``PRUNED``, ``RUNNING``, ``WAITING``, ``FAIL``)."""
    c = Counter(t.state.name for t in study.get_trials(deepcopy=False))
    return {s: c.get(s, 0) for s in ("COMPLETE", "PRUNED", "RUNNING", "WAITING", "FAIL")}


# ----------------------------------------------------------------------------
# Dead-worker detection (same host)
# ----------------------------------------------------------------------------


def _proc_start(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def _me() -> dict[str, Any]:
    pid = os.getpid()
    return {"host": socket.gethostname(), "pid": pid, "start": _proc_start(pid)}


def _alive(owner: Mapping[str, Any]) -> bool:
    if owner.get("host") != socket.gethostname():
        return True  # another host: only its heartbeat can tell
    pid = int(owner.get("pid", -1))
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    start = owner.get("start")
    return not start or _proc_start(pid) == start


def fail_dead_trials(study) -> int:
    """Fail RUNNING trials whose worker process on this host is gone, then re-enqueue them.

    Optuna's heartbeat catches every stale trial after the grace period; this
    catches a killed local worker at once (a resumed run does not wait).
    Returns the number of trials failed.
    """
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState

    n = 0
    storage = study._storage
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        owner = t.system_attrs.get(_ATTR_PROC)
        if not isinstance(owner, Mapping) or owner.get("number") != t.number or _alive(owner):
            continue
        try:
            if storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL):
                n += 1
                _retry_callback(study, storage.get_trial(t._trial_id))
        except UpdateFinishedTrialError:
            pass
    return n


def _fail_stale(study) -> None:
    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        optuna.storages.fail_stale_trials(study)
    fail_dead_trials(study)


# ----------------------------------------------------------------------------
# Objective and worker loop
# ----------------------------------------------------------------------------


class Stop:
    """A stop flag set by SIGINT/SIGTERM (the current trial finishes first)."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.count = 0
        self._old: dict[int, Any] = {}

    def set(self) -> None:
        self.count += 1
        self.event.set()

    def is_set(self) -> bool:
        return self.event.is_set()

    def install(self) -> "Stop":
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, lambda *_: self.set())
        return self

    def restore(self) -> None:
        for sig, h in self._old.items():
            signal.signal(sig, h)
        self._old.clear()


def _geomean(xs: Sequence[float]) -> float:
    return float(math.exp(sum(math.log(x) for x in xs) / len(xs)))


def objective_value(task: TuneTask, params: Mapping[str, Any], backend: TimingBackend) -> tuple[float, float]:
    """Geomean kernel time (s) and geomean time / HBM floor of ``params`` over the training batches.

    Raises
    ------
    ValueError
        From ``make_plan`` when the parameter set is infeasible.
    """
    times, ratios = [], []
    for lens in task.train:
        plan = make_plan(list(lens), num_kv_heads=task.num_kv_heads, device=task.gpu, policy="tuned",
                         params=dict(params), head_dim=task.head_dim, page_size=task.page_size, dtype=task.dtype)
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


def _evaluate(study, trial, job: WorkerJob, backend: TimingBackend, stop: Stop):
    """Return ("complete", value) or ("pruned", None) for one asked trial."""
    from optuna.trial import TrialState

    params = suggest_params(trial)
    # a parameter set already measured in this study is not measured again
    waited = 0.0
    while True:
        twins = [t for t in study.get_trials(deepcopy=False)
                 if t.number != trial.number and t.state in (TrialState.COMPLETE, TrialState.PRUNED,
                                                             TrialState.RUNNING)
                 and _same_params(t.params, params)]
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


def _make_job_backend(job: WorkerJob) -> TimingBackend:
    t = job.task
    return make_backend(job.backend, gpu=t.gpu, num_qo_heads=t.num_qo_heads, num_kv_heads=t.num_kv_heads,
                        head_dim=t.head_dim, dtype=t.dtype, page_size=t.page_size, max_tokens=t.max_tokens,
                        max_batch=t.max_batch, calibration=job.calibration,
                        read_bandwidth_gbps=job.read_bandwidth_gbps, gpu_index=job.index)


def run_worker(job: WorkerJob, *, stop: Stop | None = None, backend: TimingBackend | None = None,
               on_trial: Callable[[], None] | None = None) -> int:
    """Run trials of one study until it has ``job.n_trials`` finished trials.

    Stops early on ``stop`` (after the current trial) or at ``job.deadline``
    (wall-clock seconds). Returns the number of trials this worker finished.
    """
    import optuna
    from optuna.storages._heartbeat import get_heartbeat_thread
    from optuna.trial import TrialState

    stop = stop or Stop()
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
    backend = backend or _make_job_backend(job)
    storage = open_storage(job.storage)
    study = _load_study(job.storage, job.study, job.seed * 1009 + job.index, job.n_trials, storage=storage)
    rng = random.Random(job.seed * 7919 + job.index + os.getpid())
    mine = 0
    consecutive_failures = 0
    n = job.n_trials
    while not stop.is_set():
        if job.deadline is not None and time.time() >= job.deadline:
            break
        _fail_stale(study)
        c = study_counts(study)
        finished = c["COMPLETE"] + c["PRUNED"]
        if finished >= n:
            break
        if finished + c["RUNNING"] >= n:
            time.sleep(0.1 + 0.2 * rng.random())
            continue
        trial = study.ask()
        # admission: at most n trials may be finished or running, whatever the interleaving
        others = sum(1 for t in study.get_trials(deepcopy=False)
                     if t.number != trial.number
                     and t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING))
        if others >= n:
            frozen = study._storage.get_trial(trial._trial_id)
            fixed = frozen.system_attrs.get("fixed_params")
            carried = {k: v for k, v in frozen.system_attrs.items() if not k.startswith("kvsplit:")}
            trial.set_user_attr(_ATTR_SURPLUS, True)
            study.tell(trial, state=TrialState.FAIL)
            if fixed is not None:
                study.enqueue_trial(dict(fixed))
            elif frozen.params and "failed_trial" in carried:
                study.add_trial(optuna.create_trial(state=TrialState.WAITING, params=frozen.params,
                                                    distributions=frozen.distributions, system_attrs=carried))
            time.sleep(0.05 + 0.3 * rng.random())
            continue
        study._storage.set_trial_system_attr(trial._trial_id, _ATTR_PROC, {**_me(), "number": trial.number})
        try:
            with get_heartbeat_thread(trial._trial_id, study._storage):
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
        if state == "pruned":
            study.tell(trial, state=TrialState.PRUNED)
        else:
            study.tell(trial, value)
        mine += 1
        if on_trial is not None:
            on_trial()
    return mine


def _worker_entry(job: WorkerJob) -> None:  # pragma: no cover - runs in a spawned process
    stop = Stop().install()
    try:
        run_worker(job, stop=stop)
    except KeyboardInterrupt:
        sys.exit(130)


# ----------------------------------------------------------------------------
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
        return asdict(self)


def _best(study) -> tuple[float | None, dict[str, Any] | None]:
    from optuna.trial import TrialState

    done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))]
    if not done:
        return None, None
    b = min(done, key=lambda t: (t.value, t.number))
    return float(b.value), dict(b.params)


def _enqueue_baselines(study, task: TuneTask) -> None:
    if study.user_attrs.get(_ATTR_ENQUEUED):
        return
    for _, params in baseline_equivalents(task).items():
        study.enqueue_trial(params, skip_if_exists=True)
    study.set_user_attr(_ATTR_ENQUEUED, True)


def _progress_bar(total: int, desc: str, enabled: bool, initial: int):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=desc, unit="trial", disable=not enabled, leave=True,
                dynamic_ncols=True)


def _run_workers(jobs: list[WorkerJob], study, n: int, bar, stop: Stop) -> None:
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


def _device_row(session, task: TuneTask, backend: TimingBackend | None, backend_name: str):
    if backend is not None:
        info, sw = backend.device_info(), backend.software()
    else:
        dev = resolve_device(task.gpu)
        info = {"name": dev.name, "num_sms": dev.num_sms, "hbm_bandwidth_gbps": float(dev.hbm_bandwidth_gbps),
                "read_bandwidth_gbps": None}
        sw = {"backend": backend_name}
    return store.get_or_create_device(session, name=info["name"], num_sms=info["num_sms"],
                                      hbm_bandwidth_gbps=info["hbm_bandwidth_gbps"], software=sw,
                                      read_bandwidth_gbps=info.get("read_bandwidth_gbps"))


def _calibration_for(url: str, gpu: str, backend: str) -> tuple[dict[str, Any] | None, float | None]:
    """Newest stored calibration constants and measured read bandwidth (GB/s) of ``gpu`` (sim only)."""
    if backend != "sim":
        return None, None
    with store.session_scope(url) as s:
        cal = store.latest_calibration(s, gpu=gpu)
        data = None if cal is None else {"constants": dict(cal.constants), "kernel_config": dict(cal.kernel_config)}
        return data, store.measured_read_bandwidth(s, gpu)


def _check_same_batches(task: TuneTask, bucket: Any) -> None:
    """Refuse a task whose batches differ from those its bucket was first tuned on.

    A bucket's study resumes on the bucket's stored training and held-out
    batches; a later task with other draws (another ``--seed``,
    ``--total-tokens``, ``--num-train``, ...) would silently tune on the old
    ones, so it is refused, naming the bucket's first source.
    """
    sb = bucket.sample_batches or {}
    if not (sb.get("train") and sb.get("heldout")):
        return
    stored = (tuple(tuple(int(v) for v in x) for x in sb["train"]),
              tuple(tuple(int(v) for v in x) for x in sb["heldout"]))
    if stored != (task.train, task.heldout):
        raise ValueError(
            f"bucket {task.key} keeps the batches of its first tune ({bucket.source or 'another task'}); this run "
            f"({task.source}) draws other ones: the bucket's study resumes only on its own batches, so use the "
            "first run's --seed, --total-tokens, --num-train, --num-heldout and trace options, or tune into "
            "another store (--database-url)")


def check_task_batches(task: TuneTask, database_url: str) -> None:
    """Raise ValueError when ``task``'s bucket exists in the store with other batches (see ``tune_task``)."""
    with store.session_scope(database_url) as s:
        b = store.get_bucket(s, task.key)
        if b is not None:
            _check_same_batches(task, b)


def tune_task(task: TuneTask, cfg: TuneConfig, *, stop: Stop | None = None,
              backend: TimingBackend | None = None) -> TuneResult:
    """Tune, verify and (if it passes) publish the ``tuned`` policy of one bucket.

    Re-running with the same arguments resumes the study: it ends with exactly
    ``cfg.n_trials`` finished trials in total. Returns a :class:`TuneResult`;
    ``status`` is ``interrupted`` after Ctrl-C (no verification then).
    """
    from . import verify as _verify

    url = store.resolve_url(cfg.database_url)
    spec = storage_spec(url, journal=cfg.journal, workers=cfg.workers, heartbeat_interval=cfg.heartbeat_interval,
                        grace_period=cfg.grace_period)
    stop = stop or Stop()
    calibration, bw = _calibration_for(url, task.gpu, cfg.backend)
    # the bucket keeps the batches it was first tuned on
    with store.session_scope(url, write=True) as s:
        b = store.get_or_create_bucket(
            s, key=task.key, gpu=task.gpu, num_kv_heads=task.num_kv_heads, head_dim=task.head_dim,
            dtype=task.dtype, page_size=task.page_size, signature=dict(task.signature), source=task.source,
            sample_batches={"train": [list(x) for x in task.train], "heldout": [list(x) for x in task.heldout]},
        )
        _check_same_batches(task, b)
        bucket_id = b.id
    name = study_name(task, cfg.backend)
    own_backend = backend
    if cfg.workers == 1 and own_backend is None:
        own_backend = make_backend(cfg.backend, gpu=task.gpu, num_qo_heads=task.num_qo_heads,
                                   num_kv_heads=task.num_kv_heads, head_dim=task.head_dim, dtype=task.dtype,
                                   page_size=task.page_size, max_tokens=task.max_tokens, max_batch=task.max_batch,
                                   calibration=calibration, read_bandwidth_gbps=bw)
    with store.session_scope(url, write=True) as s:
        dev_row = _device_row(s, task, own_backend, cfg.backend)
        run = store.start_run(s, bucket_id=bucket_id, study_name=name, backend=cfg.backend, n_trials=cfg.n_trials,
                              workers=cfg.workers, storage_kind=spec.kind, device_id=dev_row.id)
        run_id, device_id = run.id, dev_row.id
    storage = open_storage(spec)
    study = _load_study(spec, name, cfg.seed, cfg.n_trials, storage=storage)
    study.set_user_attr(_ATTR_TASK, {"key": task.key, "source": task.source, "num_qo_heads": task.num_qo_heads})
    _enqueue_baselines(study, task)
    _fail_stale(study)
    deadline = time.time() + cfg.timeout if cfg.timeout else None
    c = study_counts(study)
    bar = _progress_bar(cfg.n_trials, f"{task.source} [{cfg.backend}]", cfg.progress,
                        min(cfg.n_trials, c["COMPLETE"] + c["PRUNED"]))
    status, message = "finished", ""
    try:
        job = WorkerJob(task=task, storage=spec, study=name, n_trials=cfg.n_trials, backend=cfg.backend,
                        seed=cfg.seed, deadline=deadline, calibration=calibration, read_bandwidth_gbps=bw)
        if cfg.workers == 1:
            def tick() -> None:
                cc = study_counts(study)
                bar.n = min(cfg.n_trials, cc["COMPLETE"] + cc["PRUNED"])
                bar.refresh()

            run_worker(job, stop=stop, backend=own_backend, on_trial=tick)
        else:
            _run_workers([replace(job, index=i) for i in range(cfg.workers)], study, cfg.n_trials, bar, stop)
    except BaseException as exc:
        status = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
        message = f"{type(exc).__name__}: {exc}"[:2000]
        c = study_counts(study)
        best_value, best_params = _best(study)
        with store.session_scope(url, write=True) as s:
            store.finish_run(s, run_id, status=status, n_finished=c["COMPLETE"] + c["PRUNED"],
                             best_value=best_value, best_params=best_params, message=message)
        bar.close()
        raise
    c = study_counts(study)
    finished = c["COMPLETE"] + c["PRUNED"]
    bar.n = min(cfg.n_trials, finished)
    bar.refresh()
    bar.close()
    best_value, best_params = _best(study)
    if stop.is_set():
        status, message = "interrupted", "stopped by signal after the current trial"
    elif finished < cfg.n_trials:
        message = f"timeout after {finished} of {cfg.n_trials} finished trials"
    result = TuneResult(task.key, name, run_id, status, finished, best_value, best_params, message=message)
    existing = None
    if status == "finished" and best_params is not None and cfg.verify:
        with store.session_scope(url) as s:
            existing = next((p for p in store.list_policies(s, bucket_key=task.key)
                             if p.backend == cfg.backend and p.params == best_params and p.verification), None)
    if existing is not None:
        # a resumed, already finished study: its best was verified before
        result.policy_id = existing.id
        result.published = existing.status == "published"
        result.verification = dict(existing.verification)
        result.message = (result.message + "; " if result.message else "") + \
            f"already verified as policy {existing.id} ({existing.status})"
    elif status == "finished" and best_params is not None and cfg.verify:
        vb = own_backend if own_backend is not None else make_backend(
            cfg.backend, gpu=task.gpu, num_qo_heads=task.num_qo_heads, num_kv_heads=task.num_kv_heads,
            head_dim=task.head_dim, dtype=task.dtype, page_size=task.page_size, max_tokens=task.max_tokens,
            max_batch=task.max_batch, calibration=calibration, read_bandwidth_gbps=bw)
        outcome = _verify.verify_and_store(task, best_params, vb, database_url=url, bucket_id=bucket_id,
                                           run_id=run_id, device_id=device_id, train_objective_s=best_value,
                                           publish=cfg.publish)
        result.policy_id = outcome.policy_id
        result.published = outcome.published
        result.verification = outcome.summary
        if outcome.note:
            result.message = (result.message + "; " if result.message else "") + outcome.note
    elif best_params is None and status == "finished":
        result.message = "no feasible trial"
    with store.session_scope(url, write=True) as s:
        store.finish_run(s, run_id, status=status, n_finished=finished, best_value=best_value,
                         best_params=best_params, message=result.message)
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
