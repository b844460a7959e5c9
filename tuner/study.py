"""The Optuna plumbing of the search: storages, heartbeats, stale and dead trials, study loading.

Every use of Optuna internals is in this module, checked against Optuna 5.0
(``optuna.storages._heartbeat`` for the journal heartbeat and the per-trial
heartbeat thread, ``Study._storage`` and ``Trial._trial_id`` for system
attributes and state changes outside ``tell``); the rest of the tuner uses
Optuna's public API. A failed (stale or dead) trial is retried through
Optuna's own ``RetryHeartbeatStaleTrialCallback`` (``RetryFailedTrialCallback``
before Optuna 4.9).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import time
import warnings
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..db import store
from .tasks import TuneTask

ATTR_PROC = "kvsplit:proc"
ATTR_HEARTBEAT = "kvsplit:heartbeat"
ATTR_SURPLUS = "kvsplit:surplus"
ATTR_ENQUEUED = "kvsplit:baselines_enqueued"
ATTR_TASK = "kvsplit:task"

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
        """The storage for messages: ``journal:<path>``, or the database URL with its password hidden."""
        if self.kind == "journal":
            return f"journal:{self.location}"
        from sqlalchemy.engine import make_url

        return make_url(self.location).render_as_string(hide_password=True)


def storage_spec(
    database_url: str,
    *,
    journal: str | os.PathLike | None = None,
    workers: int = 1,
    heartbeat_interval: int = 5,
    grace_period: int = 30,
) -> StorageSpec:
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


class StorageBusy(RuntimeError):
    """Another process holds the tuning lock of this SQLite study storage (:func:`exclusive_storage`)."""


_held: dict[str, list[int]] = {}  # lock file -> [fd, depth] of the locks this process holds


def _lock_path(spec: StorageSpec) -> Path | None:
    from sqlalchemy.engine import make_url

    if spec.kind != "rdb":
        return None
    u = make_url(spec.location)
    if (
        u.get_backend_name() != "sqlite"
        or not u.database
        or u.database == ":memory:"
        or u.database.startswith("file::memory:")
    ):
        return None
    db = Path(u.database).expanduser().resolve()
    return db.with_name(db.name + ".tune-lock")


def _holder(fd: int) -> str:
    """Who holds the lock file ``fd`` (what it wrote there), in words."""
    info: dict[str, Any] = {}
    for _ in range(20):  # the holder writes its identity just after taking the lock
        with contextlib.suppress(OSError, ValueError):
            info = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
        if info:
            break
        time.sleep(0.025)
    if not info:
        return "another process"
    since = time.strftime("%H:%M:%S UTC", time.gmtime(info.get("since", 0)))
    return f"PID {info.get('pid')} on {info.get('host')}, since {since}"


@contextlib.contextmanager
def exclusive_storage(spec: StorageSpec):
    """Hold the tuning lock of a SQLite study storage for the block; refuse at once if another process has it.

    One SQLite file cannot hold an Optuna study that several processes tune:
    Optuna's RDB storage claims a waiting trial with ``SELECT ... FOR UPDATE``,
    which SQLite ignores, so two processes can run the same trial
    (``UpdateFinishedTrialError``), and both may create Optuna's tables at
    once (``table studies already exists``). So the first ``kvsplit tune`` on a
    SQLite store takes an exclusive ``flock`` on ``<store file>.tune-lock``
    (beside the store; it holds the owner's PID and host) until it ends, and
    another one stops before touching the store. The kernel drops the lock
    when the process dies, ``kill -9`` included. Re-entrant within a process.
    PostgreSQL and journal storages need no lock: their tuners cooperate.

    Raises
    ------
    StorageBusy
        Another process holds the lock; the message names it (PID, host, since).
    OSError
        The lock file cannot be created (read-only or missing folder).
    """
    import fcntl

    path = _lock_path(spec)
    if path is None:
        yield
        return
    key = str(path)
    if key in _held:
        _held[key][1] += 1
        try:
            yield
        finally:
            _held[key][1] -= 1
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StorageBusy(
                f"another kvsplit tune ({_holder(fd)}) is tuning with the SQLite store {spec.describe()}; "
                "one SQLite file cannot share Optuna studies between processes: wait for it to end, or give "
                "every tuner the same PostgreSQL --database-url or --journal PATH"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({**store.process_identity(), "since": time.time()}).encode(), 0)
        _held[key] = [fd, 1]
        try:
            yield
        finally:
            del _held[key]
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


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
                self.set_trial_system_attr(trial_id, ATTR_HEARTBEAT, time.time())

        def _get_stale_trial_ids(self, study_id: int) -> list[int]:
            now = time.time()
            stale = []
            for t in self.get_all_trials(study_id, deepcopy=False, states=(TrialState.RUNNING,)):
                start = t.datetime_start.timestamp() if t.datetime_start is not None else now
                hb = t.system_attrs.get(ATTR_HEARTBEAT)
                last = float(hb) if isinstance(hb, (int, float)) else start
                if now - last > self._grace:
                    stale.append(t._trial_id)
            return stale

        def get_heartbeat_interval(self) -> int | None:
            return self._hb_interval

        def get_heartbeat_stale_trial_callback(self):
            return self._stale_cb

    return _HeartbeatJournalStorage


def HeartbeatJournalStorage(path: str, *, heartbeat_interval: int = 5, grace_period: int = 30, stale_callback=None):
    """A ``JournalStorage(JournalFileBackend(path))`` with heartbeats (see :func:`open_storage`)."""
    from optuna.storages.journal import JournalFileBackend

    cls = _journal_heartbeat_cls()
    return cls(
        JournalFileBackend(path),
        heartbeat_interval=heartbeat_interval,
        grace_period=grace_period,
        stale_callback=stale_callback,
    )


def _retry_callback(study, trial) -> None:
    """Re-enqueue a failed (stale or dead) trial with the same parameters, at most 3 times.

    Optuna's own retry callback, given the trial without kvsplit's system
    attributes (its dead owner and last heartbeat would mark the retry stale at
    once) and without user attributes (per-attempt notes).
    """
    import copy

    import optuna

    cls = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None) or optuna.storages.RetryFailedTrialCallback
    clean = copy.copy(trial)
    clean.system_attrs = {k: v for k, v in trial.system_attrs.items() if not k.startswith("kvsplit:")}
    clean.user_attrs = {}
    cls(max_retry=3)(study, clean)


def frozen_trial(study, trial):
    """The stored :class:`optuna.trial.FrozenTrial` of an asked ``trial`` (with its system attributes)."""
    return study._storage.get_trial(trial._trial_id)


def claim_trial(study, trial) -> None:
    """Record this process as the owner of ``trial`` (dead-worker detection below)."""
    study._storage.set_trial_system_attr(trial._trial_id, ATTR_PROC, {**_me(), "number": trial.number})


def trial_heartbeat(study, trial):
    """Context manager beating ``trial``'s heartbeat while it runs (Optuna's heartbeat thread)."""
    from optuna.storages._heartbeat import get_heartbeat_thread

    return get_heartbeat_thread(trial._trial_id, study._storage)


def open_storage(spec: StorageSpec):
    """The Optuna storage object for ``spec`` (heartbeats and stale-trial retry on)."""
    import optuna

    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    if spec.kind == "journal":
        return HeartbeatJournalStorage(
            spec.location,
            heartbeat_interval=spec.heartbeat_interval,
            grace_period=spec.grace_period,
            stale_callback=_retry_callback,
        )
    url = spec.location
    kwargs: dict[str, Any] = {}
    from sqlalchemy.engine import make_url

    if make_url(url).get_backend_name() == "sqlite":
        kwargs["connect_args"] = {"timeout": 60}
    else:
        kwargs["pool_pre_ping"] = True
    with store.schema_lock(url):  # tuners starting together on a fresh PostgreSQL: one creates Optuna's tables
        return optuna.storages.RDBStorage(
            url,
            engine_kwargs=kwargs,
            heartbeat_interval=spec.heartbeat_interval,
            grace_period=spec.grace_period,
            heartbeat_stale_trial_callback=_retry_callback,
        )


def study_name(task: TuneTask, backend: str) -> str:
    """``kvsplit-<backend>-<bucket key>``: one study per bucket and backend."""
    return f"kvsplit-{backend}-{task.key}"


def make_sampler(seed: int, n_trials: int):
    import optuna

    return optuna.samplers.TPESampler(
        seed=seed, multivariate=True, group=True, constant_liar=True, n_startup_trials=max(4, min(10, n_trials // 3))
    )


def load_study(spec: StorageSpec, name: str, seed: int, n_trials: int, storage=None):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = storage if storage is not None else open_storage(spec)
    for attempt in range(20):  # several workers creating the study at the same instant
        try:
            return optuna.create_study(
                storage=storage,
                study_name=name,
                direction="minimize",
                sampler=make_sampler(seed, n_trials),
                load_if_exists=True,
            )
        except Exception as exc:  # IntegrityError / DuplicatedStudyError races
            if attempt == 19:
                raise
            if (
                "exist" not in str(exc).lower()
                and "integrity" not in type(exc).__name__.lower()
                and "unique" not in str(exc).lower()
            ):
                raise
            time.sleep(0.05 + 0.1 * random.random())
    raise AssertionError("unreachable")


def study_counts(study) -> dict[str, int]:
    """Trials of a study by state name (``COMPLETE``, ``PRUNED``, ``RUNNING``, ``WAITING``, ``FAIL``)."""
    c = Counter(t.state.name for t in study.get_trials(deepcopy=False))
    return {s: c.get(s, 0) for s in ("COMPLETE", "PRUNED", "RUNNING", "WAITING", "FAIL")}


def study_best(study) -> tuple[float | None, dict[str, Any] | None]:
    from optuna.trial import TrialState

    done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))]
    if not done:
        return None, None
    b = min(done, key=lambda t: (t.value, t.number))
    return float(b.value), dict(b.params)


# Dead-worker detection (same host)
# ----------------------------------------------------------------------------


def _me() -> dict[str, Any]:
    return store.process_identity()


def _alive(owner: Mapping[str, Any]) -> bool:
    return store.process_alive(owner) is not False  # another host: only its heartbeat can tell


UNCLAIMED_AFTER_S = 30.0


def _unclaimed_dead(t, after_s: float) -> bool:
    """A RUNNING trial nobody claimed ``after_s`` seconds after it started: its worker died between
    ``study.ask()`` and :func:`claim_trial` (one storage round trip apart), before any heartbeat, so neither
    the owner check nor Optuna's heartbeat would ever fail it."""
    import datetime

    start = t.datetime_start
    if start is None:
        return False
    now = datetime.datetime.now(start.tzinfo) if start.tzinfo is not None else datetime.datetime.now()
    return (now - start).total_seconds() >= after_s


def fail_dead_trials(study, *, unclaimed_after_s: float = UNCLAIMED_AFTER_S) -> int:
    """Fail RUNNING trials whose worker process on this host is gone, then re-enqueue them.

    Optuna's heartbeat catches every stale trial after the grace period; this
    catches a killed local worker at once (a resumed run does not wait), and a
    trial left unclaimed for ``unclaimed_after_s`` seconds (its worker was
    killed between asking and claiming it, before its first heartbeat).
    Returns the number of trials failed.
    """
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState

    n = 0
    storage = study._storage
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        owner = t.system_attrs.get(ATTR_PROC)
        if owner is None and ATTR_HEARTBEAT not in t.system_attrs:
            if not _unclaimed_dead(t, unclaimed_after_s):
                continue
        elif not isinstance(owner, Mapping) or owner.get("number") != t.number or _alive(owner):
            continue
        try:
            if storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL):
                n += 1
                _retry_callback(study, storage.get_trial(t._trial_id))
        except UpdateFinishedTrialError:
            pass
    return n


def fail_stale(study) -> None:
    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        optuna.storages.fail_stale_trials(study)
    fail_dead_trials(study)
