"""Devices, calibrations, tuning runs and measurements (part of :mod:`kvsplit.db.store`)."""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import socket
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, selectinload

from .checks import field_int, field_json_obj, field_num, field_str, software_fingerprint
from .models import (
    BACKENDS,
    ROLES,
    RUN_STATUSES,
    Bucket,
    Calibration,
    Device,
    Measurement,
    TuningRun,
    utcnow,
)

# ----------------------------------------------------------------------------
# Devices and calibrations
# ----------------------------------------------------------------------------


def get_or_create_device(
    session: Session,
    *,
    name: str,
    num_sms: int,
    hbm_bandwidth_gbps: float,
    software: Mapping[str, Any] | None = None,
    read_bandwidth_gbps: float | None = None,
) -> Device:
    """The device row for (``name``, fingerprint of ``software``), created if missing.

    ``read_bandwidth_gbps`` (measured, GB/s), when given, updates the row.
    """
    name = field_str("device.name", name, max_len=128)
    num_sms = field_int("device.num_sms", num_sms, 1)
    hbm = field_num("device.hbm_bandwidth_gbps", hbm_bandwidth_gbps, positive=True)
    rbw = field_num("device.read_bandwidth_gbps", read_bandwidth_gbps, positive=True, allow_none=True)
    sw = field_json_obj("device.software", software or {})
    fp = software_fingerprint(sw)
    dev = session.scalars(select(Device).where(Device.name == name, Device.fingerprint == fp)).first()
    if dev is None:
        dev = Device(
            name=name, num_sms=num_sms, hbm_bandwidth_gbps=hbm, software=sw, fingerprint=fp, read_bandwidth_gbps=rbw
        )
        try:
            with session.begin_nested():
                session.add(dev)
        except IntegrityError:  # another process created it meanwhile
            dev = session.scalars(select(Device).where(Device.name == name, Device.fingerprint == fp)).one()
    elif rbw is not None:
        dev.read_bandwidth_gbps = rbw
    session.flush()
    return dev


def device_to_dict(dev: Device) -> dict[str, Any]:
    """Plain-data form of a device row (the export files' ``device`` object): name, SM count, bandwidths
    (GB/s), software versions and their fingerprint."""
    return {
        "name": dev.name,
        "num_sms": dev.num_sms,
        "hbm_bandwidth_gbps": dev.hbm_bandwidth_gbps,
        "read_bandwidth_gbps": dev.read_bandwidth_gbps,
        "software": dict(dev.software or {}),
        "fingerprint": dev.fingerprint,
    }


def get_device(session: Session, name: str) -> Device | None:
    """The newest device row of GPU ``name`` (any software), or None."""
    return session.scalars(select(Device).where(Device.name == name).order_by(Device.id.desc())).first()


def measured_read_bandwidth(session: Session, gpu: str) -> float | None:
    """The newest measured read bandwidth (GB/s) stored for GPU ``gpu``, or None."""
    return session.scalar(
        select(Device.read_bandwidth_gbps)
        .where(Device.name == gpu, Device.read_bandwidth_gbps.is_not(None))
        .order_by(Device.id.desc())
        .limit(1)
    )


def set_device_bandwidth(session: Session, device_id: int, read_bandwidth_gbps: float) -> Device:
    """Store a measured read bandwidth (GB/s) on a device row."""
    dev = session.get(Device, device_id)
    if dev is None:
        raise KeyError(f"device id {device_id} not found")
    dev.read_bandwidth_gbps = field_num("read_bandwidth_gbps", read_bandwidth_gbps, positive=True)
    session.flush()
    return dev


def record_calibration(
    session: Session,
    *,
    device_id: int,
    constants: Mapping[str, Any],
    kv_dtype: str,
    q_len: int = 1,
    error: Mapping[str, Any] | None = None,
    kernel_config: Mapping[str, Any] | None = None,
    num_samples: int = 0,
) -> Calibration:
    """Store fitted simulator constants for a device, kernel config, KV cache dtype and q_len.

    ``kv_dtype`` is the dtype of the K/V elements the sample was timed with (the model's dtype for a 16-bit
    cache, ``"float8_e4m3fn"`` for an FP8 one; the tuner resolves it, :func:`kvsplit.kernels.limits.check_kv_dtype`),
    ``q_len`` the query tokens per request (>= 1). ``config_key`` is the canonical JSON of ``kernel_config``
    (``"{}"`` for a calibration valid for every config); ``version`` increases per
    (device, config_key, kv_dtype, q_len).

    Raises
    ------
    KeyError
        No device ``device_id``.
    ValueError
        A field of the wrong type or range, named.
    """
    if session.get(Device, device_id) is None:
        raise KeyError(f"device id {device_id} not found")
    kd = field_str("kv_dtype", kv_dtype, max_len=32)
    ql = field_int("q_len", q_len, 1)
    kc = field_json_obj("kernel_config", kernel_config or {})
    key = json.dumps(kc, sort_keys=True, separators=(",", ":"))
    last = session.scalar(
        select(func.max(Calibration.version)).where(
            Calibration.device_id == device_id,
            Calibration.config_key == key,
            Calibration.kv_dtype == kd,
            Calibration.q_len == ql,
        )
    )
    cal = Calibration(
        device_id=device_id,
        config_key=key,
        kv_dtype=kd,
        q_len=ql,
        kernel_config=kc,
        constants=field_json_obj("constants", constants),
        error=field_json_obj("error", error or {}),
        num_samples=field_int("num_samples", num_samples, 0),
        version=(last or 0) + 1,
    )
    session.add(cal)
    session.flush()
    return cal


def latest_calibration(
    session: Session, *, gpu: str, kv_dtype: str, q_len: int = 1, config_key: str | None = None
) -> Calibration | None:
    """The newest calibration of any device row named ``gpu`` timed with K/V of ``kv_dtype`` at ``q_len``
    (optionally for one config key), or None: a fit of another KV dtype or q_len is never returned
    (:func:`kvsplit.tuner.calibrate.stored_calibration` chooses what a task uses when there is none)."""
    kd = field_str("kv_dtype", kv_dtype, max_len=32)
    ql = field_int("q_len", q_len, 1)
    q = select(Calibration).join(Device).where(Device.name == gpu, Calibration.kv_dtype == kd, Calibration.q_len == ql)
    if config_key is not None:
        q = q.where(Calibration.config_key == config_key)
    return session.scalars(q.order_by(Calibration.created_at.desc(), Calibration.id.desc())).first()


def list_calibrations(session: Session, *, gpu: str | None = None) -> list[Calibration]:
    """Every stored calibration (of GPU ``gpu`` when given), oldest first, with its device row loaded."""
    q = select(Calibration).join(Device).options(selectinload(Calibration.device))
    if gpu is not None:
        q = q.where(Device.name == gpu)
    return list(session.scalars(q.order_by(Calibration.id)))


# ----------------------------------------------------------------------------
# Tuning runs and measurements
# ----------------------------------------------------------------------------


# Owner processes of runs (and of Optuna trials, kvsplit.tuner.study): host, PID and the
# process start time, so that a PID reused by another process is not taken for the owner.


def _proc_start(pid: int) -> str:
    """Start time of process ``pid`` in clock ticks since boot (``/proc/PID/stat`` field 22), '' if unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def _pid_namespace() -> str:
    """The PID namespace of this process (``/proc/self/ns/pid`` inode), '' if unknown: containers that share
    a host name but not their PIDs differ here."""
    try:
        return os.readlink("/proc/self/ns/pid").removeprefix("pid:[").removesuffix("]")
    except OSError:
        return ""


def process_identity() -> dict[str, Any]:
    """This process as ``{"host": hostname, "pid": PID, "start": start time in clock ticks, "pidns": PID
    namespace}``."""
    pid = os.getpid()
    return {"host": socket.gethostname(), "pid": pid, "start": _proc_start(pid), "pidns": _pid_namespace()}


def process_alive(owner: Mapping[str, Any]) -> bool | None:
    """Whether the process ``owner`` (a :func:`process_identity`) still runs.

    True or False for a process of this host and PID namespace (a PID now
    held by a process started at another time counts as gone); None for
    another host or PID namespace, where only a heartbeat can tell.
    """
    if owner.get("host") != socket.gethostname():
        return None
    ns = owner.get("pidns")
    if ns and ns != _pid_namespace():
        return None
    try:
        pid = int(owner.get("pid", -1))
    except (TypeError, ValueError):
        return None
    if pid <= 0:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    start = owner.get("start")
    return not start or _proc_start(pid) == start


DEFAULT_STALE_AFTER_S = 600
"""Heartbeat silence (s) after which a running row without its own ``stale_after_s`` is abandoned."""


def start_run(
    session: Session,
    *,
    bucket_id: int,
    study_name: str,
    backend: str,
    n_trials: int,
    workers: int = 1,
    storage_kind: str = "rdb",
    device_id: int | None = None,
    stale_after_s: int = DEFAULT_STALE_AFTER_S,
) -> TuningRun:
    """Record the start of a tuning run (status ``running``) owned by this process.

    Runs abandoned by dead processes are marked failed first (:func:`reap_runs`).
    The row records this process (:func:`process_identity`) and a heartbeat
    (:func:`run_heartbeat` keeps it fresh); ``stale_after_s`` (seconds) is the
    heartbeat silence after which another host takes the run for abandoned.
    """
    reap_runs(session)
    me = process_identity()
    run = TuningRun(
        bucket_id=bucket_id,
        study_name=field_str("study_name", study_name),
        backend=field_str("backend", backend, choices=BACKENDS),
        n_trials=field_int("n_trials", n_trials, 1),
        workers=field_int("workers", workers, 1),
        storage_kind=field_str("storage_kind", storage_kind, max_len=32),
        device_id=device_id,
        status="running",
        host=me["host"][:255],
        pid=me["pid"],
        proc_start=f"{me['start']}@{me['pidns']}"[:32],
        heartbeat_at=utcnow(),
        stale_after_s=field_int("stale_after_s", stale_after_s, 1),
    )
    session.add(run)
    session.flush()
    return run


def _aware(t: _dt.datetime | None) -> _dt.datetime | None:
    # SQLite hands back naive datetimes; every time the store writes is UTC
    if t is None or t.tzinfo is not None:
        return t
    return t.replace(tzinfo=_dt.UTC)


def run_abandoned(run: TuningRun, now: _dt.datetime | None = None) -> str | None:
    """Why the ``running`` row ``run`` is abandoned, or None while its process may still run it.

    Abandoned: its owner process on this host is gone (PID and start time), or
    its newest heartbeat (its start, for rows without one) is older than its
    ``stale_after_s`` (default :data:`DEFAULT_STALE_AFTER_S`).
    """
    if run.status != "running":
        return None
    if run.host and run.pid:
        start, _, ns = (run.proc_start or "").partition("@")  # "<start ticks>@<PID namespace>"
        alive = process_alive({"host": run.host, "pid": run.pid, "start": start, "pidns": ns})
        if alive is False:
            return (
                f"abandoned: its process (PID {run.pid} on {run.host}) is gone, killed or crashed "
                f"before it recorded the end of the run"
            )
        if alive:
            return None
    now = now or utcnow()
    last = _aware(run.heartbeat_at) or _aware(run.started_at)
    limit = run.stale_after_s or DEFAULT_STALE_AFTER_S
    if last is not None and (now - last).total_seconds() > limit:
        who = f"PID {run.pid} on {run.host}" if run.host else "an unrecorded process"
        return (
            f"abandoned: no heartbeat from its process ({who}) since {last.isoformat(timespec='seconds')}, "
            f"more than {limit} s"
        )
    return None


def reap_runs(session: Session) -> list[TuningRun]:
    """Mark every abandoned ``running`` row (:func:`run_abandoned`) ``failed``, with the reason as its message.

    Returns the rows marked. Call it in a write session.
    """
    now = utcnow()
    marked = []
    for run in session.scalars(select(TuningRun).where(TuningRun.status == "running")):
        why = run_abandoned(run, now)
        if why is None:
            continue
        run.status = "failed"
        run.message = (why + (f"; {run.message}" if run.message else ""))[:2048]
        run.finished_at = now
        marked.append(run)
    if marked:
        session.flush()
    return marked


def beat_run(session: Session, run_id: int) -> bool:
    """Refresh the heartbeat of run ``run_id``; False when the row is gone or no longer ``running``."""
    run = session.get(TuningRun, run_id)
    if run is None or run.status != "running":
        return False
    run.heartbeat_at = utcnow()
    session.flush()
    return True


@contextlib.contextmanager
def run_heartbeat(url: str, run_id: int, interval_s: float) -> Iterator[None]:
    """Beat run ``run_id``'s heartbeat every ``interval_s`` seconds in a daemon thread while the block runs.

    An exception leaving the block marks the row ``failed`` with the
    exception's first line, when it is still ``running`` (a failure to write
    that, e.g. on a full disk, is left to :func:`reap_runs`).
    """
    from .engine import session_scope

    done = threading.Event()

    def beat() -> None:
        while not done.wait(interval_s):
            try:
                with session_scope(url, write=True) as s:
                    if not beat_run(s, run_id):
                        return
            except Exception:  # noqa: BLE001 - a busy or full store: the next beat tries again
                continue

    t = threading.Thread(target=beat, name=f"kvsplit-run-{run_id}-heartbeat", daemon=True)
    t.start()
    try:
        yield
    except BaseException as exc:
        done.set()
        t.join()
        from .engine import error_cause, first_line

        why = f"{type(exc).__name__}: {error_cause(exc, url) or first_line(exc)}"
        status = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
        with contextlib.suppress(Exception):
            with session_scope(url, write=True) as s:
                run = s.get(TuningRun, run_id)
                if run is not None and run.status == "running":
                    run.status, run.message, run.finished_at = status, why[:2048], utcnow()
        raise
    finally:
        done.set()
        t.join()


def finish_run(
    session: Session,
    run_id: int,
    *,
    status: str,
    n_finished: int,
    best_value: float | None = None,
    best_params: Mapping[str, Any] | None = None,
    message: str = "",
) -> TuningRun:
    """Record the end of a tuning run."""
    run = session.get(TuningRun, run_id)
    if run is None:
        raise KeyError(f"tuning run id {run_id} not found")
    run.status = field_str("status", status, choices=RUN_STATUSES)
    run.n_finished = field_int("n_finished", n_finished, 0)
    run.best_value = field_num("best_value", best_value, allow_none=True)
    run.best_params = None if best_params is None else field_json_obj("best_params", best_params)
    run.message = str(message)[:2048]
    run.finished_at = utcnow()
    session.flush()
    return run


def list_runs(
    session: Session, *, bucket_key: str | None = None, status: str | None = None, limit: int | None = 100
) -> list[TuningRun]:
    """Tuning runs, newest first (bucket loaded). Abandoned rows are marked by :func:`reap_runs`, not here."""
    q = select(TuningRun).options(selectinload(TuningRun.bucket))
    if bucket_key is not None:
        q = q.join(Bucket).where(Bucket.key == bucket_key)
    if status is not None:
        q = q.where(TuningRun.status == field_str("status", status, choices=RUN_STATUSES))
    q = q.order_by(TuningRun.id.desc())
    if limit is not None:
        q = q.limit(field_int("limit", limit, 1))
    return list(session.scalars(q))


def record_measurement(
    session: Session,
    *,
    bucket_id: int,
    policy_name: str,
    kv_lens: Sequence[int],
    time_s: float,
    backend: str,
    floor_s: float | None = None,
    params: Mapping[str, Any] | None = None,
    role: str = "heldout",
    batch_index: int = 0,
    stage: str = "verify",
    tuning_run_id: int | None = None,
    policy_id: int | None = None,
    device_id: int | None = None,
    software: Mapping[str, Any] | None = None,
) -> Measurement:
    """Store one timed (policy, batch).

    Parameters
    ----------
    kv_lens : sequence of int, ``[B]``
        The batch.
    time_s : float
        Kernel time, seconds (> 0).
    floor_s : float, optional
        HBM read floor of the batch, seconds; ``ratio = time_s / floor_s``.
    """
    lens = [field_int(f"kv_lens[{i}]", int(v) if not isinstance(v, bool) else v, 0) for i, v in enumerate(kv_lens)]
    if not lens:
        raise ValueError("kv_lens: expected at least one request")
    t = field_num("time_s", time_s, positive=True)
    fl = field_num("floor_s", floor_s, positive=True, allow_none=True)
    m = Measurement(
        bucket_id=bucket_id,
        tuning_run_id=tuning_run_id,
        policy_id=policy_id,
        device_id=device_id,
        stage=field_str("stage", stage, max_len=32),
        policy_name=field_str("policy_name", policy_name, max_len=64),
        params=field_json_obj("params", params or {}),
        role=field_str("role", role, choices=ROLES),
        batch_index=field_int("batch_index", batch_index, 0),
        kv_lens=lens,
        batch_size=len(lens),
        total_tokens=sum(lens),
        time_s=t,
        floor_s=fl,
        ratio=None if fl is None else t / fl,
        backend=field_str("backend", backend, choices=BACKENDS),
        software=field_json_obj("software", software or {}),
    )
    session.add(m)
    session.flush()
    return m


def list_measurements(
    session: Session,
    *,
    bucket_key: str | None = None,
    tuning_run_id: int | None = None,
    policy_id: int | None = None,
    policy_name: str | None = None,
    stage: str | None = None,
    limit: int | None = None,
) -> list[Measurement]:
    """Measurements, oldest first, optionally filtered."""
    q = select(Measurement)
    if bucket_key is not None:
        q = q.join(Bucket, Bucket.id == Measurement.bucket_id).where(Bucket.key == bucket_key)
    if tuning_run_id is not None:
        q = q.where(Measurement.tuning_run_id == tuning_run_id)
    if policy_id is not None:
        q = q.where(Measurement.policy_id == policy_id)
    if policy_name is not None:
        q = q.where(Measurement.policy_name == policy_name)
    if stage is not None:
        q = q.where(Measurement.stage == stage)
    q = q.order_by(Measurement.id)
    if limit is not None:
        q = q.limit(field_int("limit", limit, 1))
    return list(session.scalars(q))
