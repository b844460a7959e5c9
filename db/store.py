"""The policy store API: engines, sessions, migrations, policies, runs, measurements.

Everything other code needs from the database goes through this module; it
depends on nothing else of kvsplit (plain data in, ORM rows or plain data out).

Engines and sessions
--------------------
``get_engine(url=None)``
    One cached engine per URL (default: ``KVSPLIT_DATABASE_URL``, see
    :mod:`kvsplit.db.settings`). SQLite files get WAL, ``busy_timeout`` and
    foreign keys; transactions are real (``BEGIN``, or ``BEGIN IMMEDIATE`` for
    write sessions) instead of pysqlite's implicit ones.
``session_scope(url=None, *, write=False, check=True)``
    Context manager yielding a :class:`~sqlalchemy.orm.Session` that commits on
    success and rolls back on error. ``write=True`` takes SQLite's write lock
    at the start (other writers wait up to the busy timeout). ``check=True``
    verifies the schema revision first (once per engine).
``upgrade(url=None)`` / ``check_schema(engine)`` / ``current_revision(engine)`` / ``head_revision()``
    Alembic migrations shipped in ``kvsplit/db/migrations`` with their own
    version table ``kvsplit_alembic_version``. ``check_schema`` raises
    :class:`SchemaError` telling to run ``kvsplit db upgrade`` when the
    database is empty or behind.

Policies (rows of :class:`~kvsplit.db.models.Policy`, bucket eagerly loaded)
--------------------------------------------------------------------------
``get_or_create_bucket(session, *, key, gpu, num_kv_heads, head_dim, dtype, page_size, signature=None, source="", sample_batches=None)``
``create_policy(session, *, bucket_id, params, backend, score=None, verification=None, tuning_run_id=None, device_id=None, name="tuned", note="")``
    A new ``draft`` with ``version`` = previous max + 1 for the bucket.
``publish(session, policy_id, *, force=False)``
    Makes it the bucket's one published policy and retires the previous one.
    Refuses (:class:`PublishRefused`, a ValueError) when the verification did
    not pass, when the bucket's published policy was measured on the GPU and
    this one only simulated, or when the published one scored better on the
    same backend (``score`` = geomean time / HBM floor on held-out batches,
    lower is better). ``force=True`` skips these checks.
``retire(session, policy_id)``
``get_published(session, bucket_key)`` / ``list_published(session, *, gpu=None, num_kv_heads=None, head_dim=None, dtype=None, page_size=None)`` / ``list_policies(...)``
``policies_version(session) -> int``
    Counter bumped by every publish, retire and import: servers poll it.
``export_published(session) -> dict`` / ``import_policies(session, data, *, validate_entry=None) -> list[int]``
    Versioned JSON (``format`` ``"kvsplit.policies"``, ``format_version`` 1)
    with each policy's bucket, params, verification and device fingerprint.
    Import validates every field of every entry first and raises
    :class:`ImportValidationError` (a ValueError naming the field) before
    writing anything; ``validate_entry`` is an optional extra check (the CLI
    passes one that builds a plan with the params).

Devices, calibrations, runs, measurements
-----------------------------------------
``get_or_create_device(session, *, name, num_sms, hbm_bandwidth_gbps, software=None, read_bandwidth_gbps=None)``,
``record_calibration(...)`` / ``latest_calibration(session, *, gpu, config_key=None)``,
``start_run(...)`` / ``finish_run(...)`` / ``list_runs(...)``,
``record_measurement(...)`` / ``list_measurements(...)``.

Examples
--------
>>> from kvsplit.db import store
>>> url = "sqlite:///./kvsplit.db"
>>> store.upgrade(url)                                      # doctest: +SKIP
>>> with store.session_scope(url) as s:                     # doctest: +SKIP
...     table = [(p.bucket_key, p.params) for p in store.list_published(s, gpu="NVIDIA H200")]
...     version = store.policies_version(s)
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import math
import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, func, or_, select, update
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, selectinload, sessionmaker

from .models import (
    BACKENDS,
    POLICY_STATUSES,
    ROLES,
    RUN_STATUSES,
    Bucket,
    Calibration,
    Device,
    Measurement,
    Policy,
    StoreState,
    TuningRun,
    utcnow,
)
from .settings import get_settings, normalize_database_url

__all__ = [
    "VERSION_TABLE",
    "EXPORT_FORMAT",
    "EXPORT_FORMAT_VERSION",
    "SchemaError",
    "PublishRefused",
    "ImportValidationError",
    "resolve_url",
    "safe_url",
    "check_exists",
    "get_engine",
    "dispose_engines",
    "session_scope",
    "upgrade",
    "check_schema",
    "current_revision",
    "head_revision",
    "software_fingerprint",
    "get_or_create_device",
    "get_device",
    "set_device_bandwidth",
    "measured_read_bandwidth",
    "record_calibration",
    "latest_calibration",
    "get_or_create_bucket",
    "get_bucket",
    "list_buckets",
    "create_policy",
    "publish",
    "retire",
    "get_policy",
    "get_published",
    "list_published",
    "list_policies",
    "policies_version",
    "policy_to_dict",
    "export_published",
    "import_policies",
    "validate_export",
    "start_run",
    "finish_run",
    "list_runs",
    "record_measurement",
    "list_measurements",
]

VERSION_TABLE = "kvsplit_alembic_version"
EXPORT_FORMAT = "kvsplit.policies"
EXPORT_FORMAT_VERSION = 1
_MIGRATIONS = Path(__file__).resolve().parent / "migrations"


class SchemaError(RuntimeError):
    """The database schema is missing, outdated or newer than this kvsplit."""


class PublishRefused(ValueError):
    """``publish`` refused to replace the bucket's published policy."""


class ImportValidationError(ValueError):
    """An import file is malformed; nothing was stored."""


# ----------------------------------------------------------------------------
# Engines and sessions
# ----------------------------------------------------------------------------

_engines: dict[str, Engine] = {}
_checked: set[str] = set()
_lock = threading.Lock()


def resolve_url(url: str | None = None) -> str:
    """``url`` or, when None, ``KVSPLIT_DATABASE_URL`` (default ``sqlite:///./kvsplit.db``).

    A plain file path (no ``://``) means that SQLite file.
    """
    if url is None:
        url = get_settings().database_url
    if not isinstance(url, str) or not url.strip():
        raise ValueError(f"database_url: expected a SQLAlchemy URL string, got {url!r}")
    url = normalize_database_url(url)
    try:
        make_url(url)
    except Exception as exc:  # sqlalchemy.exc.ArgumentError
        raise ValueError(f"database_url: not a SQLAlchemy URL: {url!r} ({exc})") from None
    return url


def _is_sqlite(url: str) -> bool:
    return make_url(url).get_backend_name() == "sqlite"


def _sqlite_file(url: str) -> str | None:
    u = make_url(url)
    db = u.database
    if not db or db == ":memory:" or db.startswith("file::memory:"):
        return None
    return db


def safe_url(url: str) -> str:
    """``url`` with its password hidden (for messages)."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - not a URL: shown as given
        return url


def check_exists(url: str | None = None) -> None:
    """Raise :class:`SchemaError` when ``url`` names a SQLite file that does not exist.

    Read-only commands call it first: opening a missing SQLite file would
    create an empty one.
    """
    url = resolve_url(url)
    if _is_sqlite(url):
        path = _sqlite_file(url)
        if path is not None and not Path(path).expanduser().exists():
            raise SchemaError(f"no kvsplit store at {safe_url(url)} (the file {path} does not exist): "
                              f"run `kvsplit db upgrade --database-url {safe_url(url)}` to create it")


def get_engine(url: str | None = None) -> Engine:
    """The cached engine for ``url`` (default from settings).

    SQLite: WAL journal, ``busy_timeout`` (``KVSPLIT_DB_BUSY_TIMEOUT_MS``),
    ``foreign_keys=ON``, and explicit transactions (``BEGIN``; ``BEGIN
    IMMEDIATE`` on connections with the ``kvsplit_write`` execution option).
    Other backends: ``pool_pre_ping``.

    Raises
    ------
    ValueError
        ``url`` is not a SQLAlchemy URL.
    """
    url = resolve_url(url)
    with _lock:
        eng = _engines.get(url)
        if eng is not None:
            return eng
        if _is_sqlite(url):
            path = _sqlite_file(url)
            if path is not None:
                parent = Path(path).expanduser().resolve().parent
                if not parent.is_dir():
                    raise ValueError(f"database_url: folder {str(parent)!r} of the SQLite file does not exist")
            timeout_ms = get_settings().db_busy_timeout_ms
            eng = create_engine(url, connect_args={"timeout": timeout_ms / 1000.0, "check_same_thread": False})
            _setup_sqlite(eng, wal=path is not None, timeout_ms=timeout_ms)
        else:
            eng = create_engine(url, pool_pre_ping=True)
        _engines[url] = eng
        return eng


def _setup_sqlite(eng: Engine, *, wal: bool, timeout_ms: int) -> None:
    @event.listens_for(eng, "connect")
    def _on_connect(dbapi_conn, _record):  # pragma: no cover - exercised via every sqlite test
        # take transaction control away from pysqlite (it would BEGIN lazily,
        # only before DML); SQLAlchemy's "begin" event below emits BEGIN.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout = {int(timeout_ms)}")
        if wal:
            cur.execute("PRAGMA journal_mode = WAL")
            cur.execute("PRAGMA synchronous = NORMAL")
        cur.execute("PRAGMA foreign_keys = ON")
        cur.close()

    @event.listens_for(eng, "begin")
    def _on_begin(conn):
        mode = "IMMEDIATE" if conn.get_execution_options().get("kvsplit_write") else "DEFERRED"
        conn.exec_driver_sql(f"BEGIN {mode}")


def dispose_engines() -> None:
    """Dispose every cached engine (tests; before forking worker processes)."""
    with _lock:
        for eng in _engines.values():
            eng.dispose()
        _engines.clear()
        _checked.clear()


@contextlib.contextmanager
def session_scope(url: str | None = None, *, write: bool = False, check: bool = True) -> Iterator[Session]:
    """A session that commits on success and rolls back on any error.

    Parameters
    ----------
    url : str, optional
        SQLAlchemy URL; default from settings.
    write : bool
        Take the database's write lock when the transaction begins (SQLite
        ``BEGIN IMMEDIATE``); use it for sessions that write.
    check : bool
        Verify the schema revision first (once per engine); raises
        :class:`SchemaError` with the upgrade command when it is behind.

    Notes
    -----
    Rows stay readable after the block (``expire_on_commit=False``).
    """
    url = resolve_url(url)
    eng = get_engine(url)
    if check and url not in _checked:
        check_schema(eng)
        _checked.add(url)
    opts = {"kvsplit_write": True} if write else {}
    factory = sessionmaker(bind=eng, expire_on_commit=False)
    session = factory()
    if opts:
        session.connection(execution_options=opts)
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


# ----------------------------------------------------------------------------
# Migrations
# ----------------------------------------------------------------------------


def _alembic_config(url: str):
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(_MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def head_revision() -> str:
    """The newest migration revision this kvsplit ships."""
    from alembic.script import ScriptDirectory

    heads = ScriptDirectory(str(_MIGRATIONS)).get_heads()
    if len(heads) != 1:
        raise RuntimeError(f"kvsplit migrations: expected one head, found {heads}")
    return heads[0]


def current_revision(engine: Engine) -> str | None:
    """The revision stamped in ``kvsplit_alembic_version`` (None for an empty database)."""
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
        return ctx.get_current_revision()


def _safe_url(engine: Engine) -> str:
    return engine.url.render_as_string(hide_password=True)


def check_schema(engine: Engine) -> None:
    """Raise :class:`SchemaError` unless the database is at :func:`head_revision`.

    The message names the database and the command that fixes it
    (``kvsplit db upgrade --database-url URL``).
    """
    from alembic.script import ScriptDirectory

    cur = current_revision(engine)
    head = head_revision()
    if cur == head:
        return
    url = _safe_url(engine)
    fix = f"run `kvsplit db upgrade --database-url {url}`"
    if cur is None:
        raise SchemaError(f"the kvsplit database at {url} has no kvsplit schema (empty or not migrated): {fix}")
    known = {s.revision for s in ScriptDirectory(str(_MIGRATIONS)).walk_revisions()}
    if cur not in known:
        raise SchemaError(
            f"the kvsplit database at {url} is at revision {cur}, which this kvsplit does not know "
            f"(made by a newer version?); its newest revision is {head}. Upgrade kvsplit."
        )
    raise SchemaError(f"the kvsplit database at {url} is at revision {cur}, older than {head}: {fix}")


def upgrade(url: str | None = None, revision: str = "head") -> str:
    """Run the migrations up to ``revision``; returns the revision now stamped.

    Safe to run on an up-to-date database (does nothing) and on an empty one
    (creates every table and the ``store_state`` row).
    """
    from alembic import command

    url = resolve_url(url)
    eng = get_engine(url)
    cfg = _alembic_config(url)
    with eng.connect() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)
        conn.commit()
    _checked.discard(url)
    rev = current_revision(eng)
    assert rev is not None
    return rev


# ----------------------------------------------------------------------------
# Validation helpers
# ----------------------------------------------------------------------------

_HEAD_DIMS = (64, 128, 256)
_DTYPES = ("float16", "bfloat16", "float32")


def _int(name: str, v: Any, lo: int | None = None, hi: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        try:
            import numpy as np  # plain-data helper; numpy integers are fine

            if isinstance(v, np.integer):
                v = int(v)
            else:
                raise TypeError
        except (ImportError, TypeError):
            raise ValueError(f"{name}: expected an integer, got {v!r}") from None
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise ValueError(f"{name}: expected an integer in [{lo}, {hi if hi is not None else 'inf'}], got {v}")
    return int(v)


def _num(name: str, v: Any, *, positive: bool = False, allow_none: bool = False) -> float | None:
    if v is None and allow_none:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(float(v)):
        try:
            import numpy as np

            if isinstance(v, np.floating | np.integer) and math.isfinite(float(v)):
                v = float(v)
            else:
                raise TypeError
        except (ImportError, TypeError):
            raise ValueError(f"{name}: expected a finite number, got {v!r}") from None
    if positive and not float(v) > 0:
        raise ValueError(f"{name}: expected a number > 0, got {v!r}")
    return float(v)


def _str(name: str, v: Any, *, max_len: int = 512, choices: Sequence[str] | None = None) -> str:
    if not isinstance(v, str) or not v.strip():
        raise ValueError(f"{name}: expected a non-empty string, got {v!r}")
    if len(v) > max_len:
        raise ValueError(f"{name}: longer than {max_len} characters")
    if choices is not None and v not in choices:
        raise ValueError(f"{name}: expected one of {tuple(choices)}, got {v!r}")
    return v


def _json_obj(name: str, v: Any, *, scalars_only: bool = False) -> dict[str, Any]:
    if not isinstance(v, Mapping):
        raise ValueError(f"{name}: expected a JSON object, got {type(v).__name__}")
    out: dict[str, Any] = {}
    for k, x in v.items():
        if not isinstance(k, str) or not k:
            raise ValueError(f"{name}: keys must be non-empty strings, got {k!r}")
        if scalars_only and not (x is None or isinstance(x, (bool, int, float, str))):
            raise ValueError(f"{name}.{k}: expected a number, string, boolean or null, got {type(x).__name__}")
        if isinstance(x, float) and not math.isfinite(x):
            raise ValueError(f"{name}.{k}: expected a finite number, got {x!r}")
        out[k] = x
    try:
        json.dumps(out, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name}: not JSON-serialisable ({exc})") from None
    return out


def software_fingerprint(software: Mapping[str, Any] | None) -> str:
    """16-hex-digit sha256 of the canonical JSON of a software-versions dict."""
    blob = json.dumps(dict(software or {}), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _iso(t: _dt.datetime | None) -> str | None:
    if t is None:
        return None
    if t.tzinfo is None:  # SQLite drops the zone; values are stored as UTC
        t = t.replace(tzinfo=_dt.timezone.utc)
    return t.isoformat()


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
    name = _str("device.name", name, max_len=128)
    num_sms = _int("device.num_sms", num_sms, 1)
    hbm = _num("device.hbm_bandwidth_gbps", hbm_bandwidth_gbps, positive=True)
    rbw = _num("device.read_bandwidth_gbps", read_bandwidth_gbps, positive=True, allow_none=True)
    sw = _json_obj("device.software", software or {})
    fp = software_fingerprint(sw)
    dev = session.scalars(select(Device).where(Device.name == name, Device.fingerprint == fp)).first()
    if dev is None:
        dev = Device(name=name, num_sms=num_sms, hbm_bandwidth_gbps=hbm, software=sw, fingerprint=fp,
                     read_bandwidth_gbps=rbw)
        try:
            with session.begin_nested():
                session.add(dev)
        except IntegrityError:  # another process created it meanwhile
            dev = session.scalars(select(Device).where(Device.name == name, Device.fingerprint == fp)).one()
    elif rbw is not None:
        dev.read_bandwidth_gbps = rbw
    session.flush()
    return dev


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
    dev.read_bandwidth_gbps = _num("read_bandwidth_gbps", read_bandwidth_gbps, positive=True)
    session.flush()
    return dev


def record_calibration(
    session: Session,
    *,
    device_id: int,
    constants: Mapping[str, Any],
    error: Mapping[str, Any] | None = None,
    kernel_config: Mapping[str, Any] | None = None,
    num_samples: int = 0,
) -> Calibration:
    """Store fitted simulator constants for a device (and kernel config).

    ``config_key`` is the canonical JSON of ``kernel_config`` (``"{}"`` for a
    calibration valid for every config); ``version`` increases per
    (device, config_key).
    """
    if session.get(Device, device_id) is None:
        raise KeyError(f"device id {device_id} not found")
    kc = _json_obj("kernel_config", kernel_config or {})
    key = json.dumps(kc, sort_keys=True, separators=(",", ":"))
    last = session.scalar(
        select(func.max(Calibration.version)).where(Calibration.device_id == device_id, Calibration.config_key == key)
    )
    cal = Calibration(
        device_id=device_id,
        config_key=key,
        kernel_config=kc,
        constants=_json_obj("constants", constants),
        error=_json_obj("error", error or {}),
        num_samples=_int("num_samples", num_samples, 0),
        version=(last or 0) + 1,
    )
    session.add(cal)
    session.flush()
    return cal


def latest_calibration(session: Session, *, gpu: str, config_key: str | None = None) -> Calibration | None:
    """The newest calibration of any device row named ``gpu`` (optionally for one config key)."""
    q = select(Calibration).join(Device).where(Device.name == gpu)
    if config_key is not None:
        q = q.where(Calibration.config_key == config_key)
    return session.scalars(q.order_by(Calibration.created_at.desc(), Calibration.id.desc())).first()


# ----------------------------------------------------------------------------
# Buckets and policies
# ----------------------------------------------------------------------------


def _check_bucket_fields(prefix: str, gpu: Any, num_kv_heads: Any, head_dim: Any, dtype: Any, page_size: Any):
    gpu = _str(f"{prefix}.gpu", gpu, max_len=128)
    num_kv_heads = _int(f"{prefix}.num_kv_heads", num_kv_heads, 1, 1024)
    head_dim = _int(f"{prefix}.head_dim", head_dim)
    if head_dim not in _HEAD_DIMS:
        raise ValueError(f"{prefix}.head_dim: expected one of {_HEAD_DIMS}, got {head_dim}")
    dtype = _str(f"{prefix}.dtype", dtype, choices=_DTYPES)
    page_size = _int(f"{prefix}.page_size", page_size, 1, 256)
    return gpu, num_kv_heads, head_dim, dtype, page_size


def get_or_create_bucket(
    session: Session,
    *,
    key: str,
    gpu: str,
    num_kv_heads: int,
    head_dim: int,
    dtype: str,
    page_size: int,
    signature: Mapping[str, Any] | None = None,
    source: str = "",
    sample_batches: Mapping[str, Any] | None = None,
) -> Bucket:
    """The bucket row of ``key``, created if missing.

    An existing row must have the same shape fields (else ValueError); its
    sample batches are kept (a bucket is tuned and verified on one fixed set)
    unless it has none yet.
    """
    key = _str("bucket.key", key)
    gpu, num_kv_heads, head_dim, dtype, page_size = _check_bucket_fields(
        "bucket", gpu, num_kv_heads, head_dim, dtype, page_size
    )
    sig = _json_obj("bucket.signature", signature or {})
    batches = _json_obj("bucket.sample_batches", sample_batches or {})
    b = session.scalars(select(Bucket).where(Bucket.key == key)).first()
    if b is None:
        b = Bucket(key=key, gpu=gpu, num_kv_heads=num_kv_heads, head_dim=head_dim, dtype=dtype,
                   page_size=page_size, signature=sig, source=str(source)[:256], sample_batches=batches)
        try:
            with session.begin_nested():
                session.add(b)
        except IntegrityError:
            b = session.scalars(select(Bucket).where(Bucket.key == key)).one()
    fields = (b.gpu, b.num_kv_heads, b.head_dim, b.dtype, b.page_size)
    if fields != (gpu, num_kv_heads, head_dim, dtype, page_size):
        raise ValueError(
            f"bucket.key: {key!r} is stored for (gpu, num_kv_heads, head_dim, dtype, page_size) = {fields}, "
            f"not {(gpu, num_kv_heads, head_dim, dtype, page_size)}"
        )
    if batches and not b.sample_batches:
        b.sample_batches = batches
    session.flush()
    return b


def get_bucket(session: Session, key: str) -> Bucket | None:
    """The bucket row of ``key`` or None."""
    return session.scalars(select(Bucket).where(Bucket.key == key)).first()


def list_buckets(session: Session, *, gpu: str | None = None) -> list[Bucket]:
    """All bucket rows (optionally of one GPU), by id."""
    q = select(Bucket)
    if gpu is not None:
        q = q.where(Bucket.gpu == gpu)
    return list(session.scalars(q.order_by(Bucket.id)))


def create_policy(
    session: Session,
    *,
    bucket_id: int,
    params: Mapping[str, Any],
    backend: str,
    score: float | None = None,
    verification: Mapping[str, Any] | None = None,
    tuning_run_id: int | None = None,
    device_id: int | None = None,
    name: str = "tuned",
    note: str = "",
) -> Policy:
    """A new ``draft`` policy of the bucket; ``version`` = previous max + 1.

    Parameters
    ----------
    params : dict
        ``make_plan`` params of policy ``name`` (flat JSON scalars).
    backend : str
        ``"gpu"`` (measured) or ``"sim"`` (simulated).
    score : float, optional
        Geomean time / HBM floor of this policy on the bucket's held-out
        batches (lower is better); ``publish`` compares it.
    verification : dict, optional
        Summary of the verification (geomean time / floor per policy, ...).
    """
    bucket = session.get(Bucket, bucket_id)
    if bucket is None:
        raise KeyError(f"bucket id {bucket_id} not found")
    backend = _str("backend", backend, choices=BACKENDS)
    p = _json_obj("params", params, scalars_only=True)
    ver = _json_obj("verification", verification or {})
    sc = _num("score", score, positive=True, allow_none=True)
    # serialize version numbering with publish/retire/import: two tuning hosts finishing the same bucket
    # at once on PostgreSQL would otherwise both take max + 1 and one would fail on the unique version
    _lock_store(session)
    last = session.scalar(select(func.max(Policy.version)).where(Policy.bucket_id == bucket_id))
    pol = Policy(
        bucket_id=bucket_id, bucket_key=bucket.key, name=_str("name", name, max_len=64), params=p,
        version=(last or 0) + 1, status="draft", backend=backend, tuning_run_id=tuning_run_id,
        device_id=device_id, verification=ver, score=sc, note=str(note)[:2048],
    )
    session.add(pol)
    session.flush()
    return pol


def _lock_store(session: Session) -> StoreState:
    """Take the store's write lock (a no-op UPDATE of the state row) and return the row."""
    session.execute(update(StoreState).where(StoreState.id == 1).values(id=StoreState.id))
    st = session.get(StoreState, 1, populate_existing=True)
    if st is None:  # a database migrated without the seed row
        st = StoreState(id=1, policies_version=0)
        session.add(st)
        session.flush()
    return st


def _bump(st: StoreState) -> None:
    st.policies_version = (st.policies_version or 0) + 1
    st.updated_at = utcnow()


def _published_of(session: Session, bucket_id: int) -> Policy | None:
    return session.scalars(
        select(Policy).where(Policy.bucket_id == bucket_id, Policy.status == "published").order_by(Policy.id)
    ).first()


def _refusal(new: Policy, cur: Policy | None) -> str | None:
    """Why ``new`` must not replace ``cur`` (None when it may)."""
    ver = new.verification or {}
    if ver.get("passed") is False:
        return (f"policy {new.id} failed verification (tuned geomean {ver.get('tuned_geomean_ratio')} vs best "
                f"baseline {ver.get('best_baseline')} {ver.get('best_baseline_geomean_ratio')})")
    if cur is None or cur.id == new.id:
        return None
    if cur.backend == "gpu" and new.backend == "sim":
        return f"bucket {cur.bucket_key!r} has a GPU-measured policy ({cur.id}); a simulated one never replaces it"
    if cur.backend == new.backend and cur.score is not None and new.score is not None and new.score > cur.score:
        return (f"bucket {cur.bucket_key!r}: published policy {cur.id} scores {cur.score:.4f} (time / HBM floor), "
                f"better than {new.score:.4f} of policy {new.id}")
    return None


def publish(session: Session, policy_id: int, *, force: bool = False) -> Policy:
    """Make ``policy_id`` the published policy of its bucket (retiring the old one).

    Runs under the store's write lock, so two publishers of one bucket
    serialise; the partial unique index backs it up.

    Raises
    ------
    KeyError
        Unknown ``policy_id``.
    PublishRefused
        See the module docstring; nothing is changed.
    """
    st = _lock_store(session)
    pol = session.get(Policy, policy_id, populate_existing=True)
    if pol is None:
        raise KeyError(f"policy id {policy_id} not found")
    cur = _published_of(session, pol.bucket_id)
    if cur is not None and cur.id == pol.id:
        return pol
    if not force:
        why = _refusal(pol, cur)
        if why is not None:
            raise PublishRefused(why)
    _set_published(session, pol, cur)
    _bump(st)
    session.flush()
    return pol


def _set_published(session: Session, pol: Policy, cur: Policy | None) -> None:
    now = utcnow()
    if cur is not None and cur.id != pol.id:
        cur.status = "retired"
        cur.retired_at = now
        session.flush()  # before the new one, or the partial unique index fires
    pol.status = "published"
    pol.published_at = now
    pol.retired_at = None
    session.flush()


def retire(session: Session, policy_id: int) -> Policy:
    """Retire a policy (the bucket then falls back to the default policy)."""
    st = _lock_store(session)
    pol = session.get(Policy, policy_id, populate_existing=True)
    if pol is None:
        raise KeyError(f"policy id {policy_id} not found")
    if pol.status != "retired":
        pol.status = "retired"
        pol.retired_at = utcnow()
        _bump(st)
        session.flush()
    return pol


def get_policy(session: Session, policy_id: int) -> Policy | None:
    """A policy row by id (bucket loaded), or None."""
    return session.scalars(select(Policy).options(selectinload(Policy.bucket)).where(Policy.id == policy_id)).first()


def get_published(session: Session, bucket_key: str) -> Policy | None:
    """The published policy of ``bucket_key`` or None."""
    return session.scalars(
        select(Policy).options(selectinload(Policy.bucket))
        .where(Policy.bucket_key == bucket_key, Policy.status == "published")
    ).first()


def list_published(
    session: Session,
    *,
    gpu: str | None = None,
    num_kv_heads: int | None = None,
    head_dim: int | None = None,
    dtype: str | None = None,
    page_size: int | None = None,
) -> list[Policy]:
    """Published policies, optionally filtered by the bucket's shape fields.

    ``gpu`` matches the stored GPU name (``"NVIDIA H200"``) or the slug that
    starts bucket keys (``"nvidia-h200"``). Each row's ``bucket`` is loaded
    (usable after the session closes). Order:
    GPU-measured before simulated, then by bucket key.
    """
    q = select(Policy).join(Bucket).options(selectinload(Policy.bucket)).where(Policy.status == "published")
    if gpu is not None:
        # the GPU name as stored ("NVIDIA H200") or the bucket-key slug ("nvidia-h200")
        slug = re.sub(r"[^a-z0-9]+", "-", str(gpu).lower()).strip("-")
        q = q.where(or_(Bucket.gpu == gpu, Bucket.key.startswith(slug + ".", autoescape=True)))
    for col, v in ((Bucket.num_kv_heads, num_kv_heads), (Bucket.head_dim, head_dim),
                   (Bucket.dtype, dtype), (Bucket.page_size, page_size)):
        if v is not None:
            q = q.where(col == v)
    return list(session.scalars(q.order_by(Policy.backend, Policy.bucket_key)))


def list_policies(
    session: Session, *, bucket_key: str | None = None, status: str | None = None, limit: int | None = None
) -> list[Policy]:
    """Policies of any status, newest first."""
    q = select(Policy).options(selectinload(Policy.bucket))
    if bucket_key is not None:
        q = q.where(Policy.bucket_key == bucket_key)
    if status is not None:
        q = q.where(Policy.status == _str("status", status, choices=POLICY_STATUSES))
    q = q.order_by(Policy.id.desc())
    if limit is not None:
        q = q.limit(_int("limit", limit, 1))
    return list(session.scalars(q))


def policies_version(session: Session) -> int:
    """The counter bumped by every publish, retire and import (0 for a new store)."""
    v = session.scalar(select(StoreState.policies_version).where(StoreState.id == 1))
    return int(v or 0)


def policy_to_dict(p: Policy) -> dict[str, Any]:
    """Plain-data form of a policy row and its bucket (the export entry form)."""
    b = p.bucket
    dev = p.device
    return {
        "id": p.id,
        "bucket": {
            "key": b.key,
            "gpu": b.gpu,
            "num_kv_heads": b.num_kv_heads,
            "head_dim": b.head_dim,
            "dtype": b.dtype,
            "page_size": b.page_size,
            "signature": dict(b.signature or {}),
            "source": b.source,
        },
        "name": p.name,
        "params": dict(p.params or {}),
        "version": p.version,
        "status": p.status,
        "backend": p.backend,
        "score": p.score,
        "verification": dict(p.verification or {}),
        "tuning_run_id": p.tuning_run_id,
        "created_at": _iso(p.created_at),
        "published_at": _iso(p.published_at),
        "device": None if dev is None else {
            "name": dev.name,
            "num_sms": dev.num_sms,
            "hbm_bandwidth_gbps": dev.hbm_bandwidth_gbps,
            "read_bandwidth_gbps": dev.read_bandwidth_gbps,
            "software": dict(dev.software or {}),
            "fingerprint": dev.fingerprint,
        },
    }


_ENTRY_KEYS = {"bucket", "name", "params", "version", "backend", "score", "verification", "created_at",
               "published_at", "device"}
_ENTRY_OPTIONAL = {"id", "status", "tuning_run_id"}
_BUCKET_KEYS = {"key", "gpu", "num_kv_heads", "head_dim", "dtype", "page_size", "signature", "source"}
_DEVICE_KEYS = {"name", "num_sms", "hbm_bandwidth_gbps", "read_bandwidth_gbps", "software", "fingerprint"}


def export_published(session: Session) -> dict[str, Any]:
    """Every published policy as versioned JSON-able data.

    Returns
    -------
    dict
        ``{"format": "kvsplit.policies", "format_version": 1, "exported_at":
        ISO-8601, "policies_version": int, "policies": [entry, ...]}``; each
        entry as :func:`policy_to_dict` (bucket, name, params, version,
        backend, score, verification, times, device with its software
        fingerprint).
    """
    pols = session.scalars(
        select(Policy).options(selectinload(Policy.bucket), selectinload(Policy.device))
        .where(Policy.status == "published").order_by(Policy.bucket_key)
    ).all()
    return {
        "format": EXPORT_FORMAT,
        "format_version": EXPORT_FORMAT_VERSION,
        "exported_at": utcnow().isoformat(),
        "policies_version": policies_version(session),
        "policies": [policy_to_dict(p) for p in pols],
    }


def _parse_time(name: str, v: Any) -> str | None:
    if v is None:
        return None
    if not isinstance(v, str):
        raise ValueError(f"{name}: expected an ISO-8601 string or null, got {v!r}")
    try:
        _dt.datetime.fromisoformat(v)
    except ValueError:
        raise ValueError(f"{name}: not an ISO-8601 time: {v!r}") from None
    return v


def validate_export(
    data: Any, *, validate_entry: Callable[[dict[str, Any]], None] | None = None
) -> list[dict[str, Any]]:
    """Check an export document field by field; return its normalised entries.

    Raises
    ------
    ImportValidationError
        On the first bad field, naming its path (``policies[3].bucket.head_dim``).
    """
    try:
        if not isinstance(data, Mapping):
            raise ValueError(f"file: expected a JSON object, got {type(data).__name__}")
        if data.get("format") != EXPORT_FORMAT:
            raise ValueError(f"format: expected {EXPORT_FORMAT!r}, got {data.get('format')!r}")
        fv = data.get("format_version")
        if fv != EXPORT_FORMAT_VERSION or isinstance(fv, bool):
            raise ValueError(f"format_version: this kvsplit reads version {EXPORT_FORMAT_VERSION}, got {fv!r}")
        unknown = set(data) - {"format", "format_version", "exported_at", "policies_version", "policies"}
        if unknown:
            raise ValueError(f"file: unknown fields {sorted(unknown)}")
        _parse_time("exported_at", data.get("exported_at"))
        entries = data.get("policies")
        if not isinstance(entries, list):
            raise ValueError("policies: expected a list")
        out: list[dict[str, Any]] = []
        keys_seen: set[str] = set()
        for i, e in enumerate(entries):
            pre = f"policies[{i}]"
            if not isinstance(e, Mapping):
                raise ValueError(f"{pre}: expected an object")
            missing = _ENTRY_KEYS - set(e)
            if missing:
                raise ValueError(f"{pre}: missing fields {sorted(missing)}")
            extra = set(e) - _ENTRY_KEYS - _ENTRY_OPTIONAL
            if extra:
                raise ValueError(f"{pre}: unknown fields {sorted(extra)}")
            b = e["bucket"]
            if not isinstance(b, Mapping):
                raise ValueError(f"{pre}.bucket: expected an object")
            if set(b) != _BUCKET_KEYS:
                raise ValueError(f"{pre}.bucket: expected fields {sorted(_BUCKET_KEYS)}, got {sorted(b)}")
            key = _str(f"{pre}.bucket.key", b["key"])
            if key in keys_seen:
                raise ValueError(f"{pre}.bucket.key: {key!r} appears twice in the file")
            keys_seen.add(key)
            gpu, hkv, hd, dt, ps = _check_bucket_fields(
                f"{pre}.bucket", b["gpu"], b["num_kv_heads"], b["head_dim"], b["dtype"], b["page_size"]
            )
            if not isinstance(b["source"], str):
                raise ValueError(f"{pre}.bucket.source: expected a string")
            bucket = {"key": key, "gpu": gpu, "num_kv_heads": hkv, "head_dim": hd, "dtype": dt, "page_size": ps,
                      "signature": _json_obj(f"{pre}.bucket.signature", b["signature"]), "source": b["source"]}
            if "status" in e and e["status"] != "published":
                raise ValueError(f"{pre}.status: only published policies can be imported, got {e['status']!r}")
            if "tuning_run_id" in e and e["tuning_run_id"] is not None:
                _int(f"{pre}.tuning_run_id", e["tuning_run_id"], 1)
            if "id" in e:
                _int(f"{pre}.id", e["id"], 1)
            dev = e["device"]
            device = None
            if dev is not None:
                if not isinstance(dev, Mapping) or set(dev) != _DEVICE_KEYS:
                    raise ValueError(f"{pre}.device: expected null or an object with fields {sorted(_DEVICE_KEYS)}")
                device = {
                    "name": _str(f"{pre}.device.name", dev["name"], max_len=128),
                    "num_sms": _int(f"{pre}.device.num_sms", dev["num_sms"], 1),
                    "hbm_bandwidth_gbps": _num(f"{pre}.device.hbm_bandwidth_gbps", dev["hbm_bandwidth_gbps"],
                                               positive=True),
                    "read_bandwidth_gbps": _num(f"{pre}.device.read_bandwidth_gbps", dev["read_bandwidth_gbps"],
                                                positive=True, allow_none=True),
                    "software": _json_obj(f"{pre}.device.software", dev["software"]),
                }
                fp = software_fingerprint(device["software"])
                if dev["fingerprint"] != fp:
                    raise ValueError(f"{pre}.device.fingerprint: {dev['fingerprint']!r} does not match its software "
                                     f"versions (expected {fp!r})")
                if device["name"] != gpu:
                    raise ValueError(f"{pre}.device.name: {device['name']!r} differs from bucket.gpu {gpu!r}")
            entry = {
                "bucket": bucket,
                "name": _str(f"{pre}.name", e["name"], max_len=64),
                "params": _json_obj(f"{pre}.params", e["params"], scalars_only=True),
                "version": _int(f"{pre}.version", e["version"], 1),
                "backend": _str(f"{pre}.backend", e["backend"], choices=BACKENDS),
                "score": _num(f"{pre}.score", e["score"], positive=True, allow_none=True),
                "verification": _json_obj(f"{pre}.verification", e["verification"]),
                "created_at": _parse_time(f"{pre}.created_at", e["created_at"]),
                "published_at": _parse_time(f"{pre}.published_at", e["published_at"]),
                "device": device,
            }
            if validate_entry is not None:
                try:
                    validate_entry(entry)
                except ValueError as exc:
                    raise ValueError(f"{pre}: {exc}") from None
            out.append(entry)
        return out
    except ImportValidationError:
        raise
    except ValueError as exc:
        raise ImportValidationError(f"import rejected, nothing stored: {exc}") from None


def import_policies(
    session: Session,
    data: Any,
    *,
    validate_entry: Callable[[dict[str, Any]], None] | None = None,
) -> list[int]:
    """Import an export document; all-or-nothing. Returns the policy ids, in file order.

    Every entry is validated before anything is written
    (:func:`validate_export`). Each entry becomes a published policy of its
    bucket (bucket and device rows created as needed); an entry identical to a
    policy already stored (same bucket, params, backend, score) reuses that
    row, so importing the same file twice changes nothing (a policy retired
    since stays retired). The publish rules
    apply: an entry that may not replace the bucket's published policy (a
    GPU-measured or better one) is stored as ``draft`` with the reason in
    ``note``. Any error rolls the whole import back (the session's
    transaction is rolled back to where it was).
    """
    entries = validate_export(data, validate_entry=validate_entry)
    ids: list[int] = []
    changed = False
    with session.begin_nested():
        st = _lock_store(session)
        for e in entries:
            b = e["bucket"]
            bucket = get_or_create_bucket(session, key=b["key"], gpu=b["gpu"], num_kv_heads=b["num_kv_heads"],
                                          head_dim=b["head_dim"], dtype=b["dtype"], page_size=b["page_size"],
                                          signature=b["signature"], source=b["source"])
            device_id = None
            if e["device"] is not None:
                d = e["device"]
                device_id = get_or_create_device(session, name=d["name"], num_sms=d["num_sms"],
                                                 hbm_bandwidth_gbps=d["hbm_bandwidth_gbps"],
                                                 software=d["software"],
                                                 read_bandwidth_gbps=d["read_bandwidth_gbps"]).id
            same = [p for p in session.scalars(select(Policy).where(Policy.bucket_id == bucket.id))
                    if p.params == e["params"] and p.backend == e["backend"] and p.score == e["score"]
                    and p.name == e["name"]]
            if same:
                pol = next((p for p in same if p.status == "published"), same[0])
            else:
                pol = create_policy(session, bucket_id=bucket.id, params=e["params"], backend=e["backend"],
                                    score=e["score"], verification=e["verification"], device_id=device_id,
                                    name=e["name"], note=f"imported (exported version {e['version']})")
                changed = True
            if pol.status == "retired":
                # an operator retired this very policy: re-importing the same file (make run does, on
                # every start) must not bring it back
                ids.append(pol.id)
                continue
            if pol.status != "published":
                cur = _published_of(session, bucket.id)
                why = _refusal(pol, cur)
                if why is None:
                    _set_published(session, pol, cur)
                    changed = True
                else:
                    pol.note = f"imported, not published: {why}"[:2048]
            ids.append(pol.id)
        if changed:
            _bump(st)
        session.flush()
    return ids


# ----------------------------------------------------------------------------
# Tuning runs and measurements
# ----------------------------------------------------------------------------


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
) -> TuningRun:
    """Record the start of a tuning run (status ``running``)."""
    run = TuningRun(
        bucket_id=bucket_id, study_name=_str("study_name", study_name), backend=_str("backend", backend,
                                                                                    choices=BACKENDS),
        n_trials=_int("n_trials", n_trials, 1), workers=_int("workers", workers, 1),
        storage_kind=_str("storage_kind", storage_kind, max_len=32), device_id=device_id, status="running",
    )
    session.add(run)
    session.flush()
    return run


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
    run.status = _str("status", status, choices=RUN_STATUSES)
    run.n_finished = _int("n_finished", n_finished, 0)
    run.best_value = _num("best_value", best_value, allow_none=True)
    run.best_params = None if best_params is None else _json_obj("best_params", best_params)
    run.message = str(message)[:2048]
    run.finished_at = utcnow()
    session.flush()
    return run


def list_runs(
    session: Session, *, bucket_key: str | None = None, status: str | None = None, limit: int | None = 100
) -> list[TuningRun]:
    """Tuning runs, newest first (bucket loaded)."""
    q = select(TuningRun).options(selectinload(TuningRun.bucket))
    if bucket_key is not None:
        q = q.join(Bucket).where(Bucket.key == bucket_key)
    if status is not None:
        q = q.where(TuningRun.status == _str("status", status, choices=RUN_STATUSES))
    q = q.order_by(TuningRun.id.desc())
    if limit is not None:
        q = q.limit(_int("limit", limit, 1))
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
    lens = [_int(f"kv_lens[{i}]", int(v) if not isinstance(v, bool) else v, 0) for i, v in enumerate(kv_lens)]
    if not lens:
        raise ValueError("kv_lens: expected at least one request")
    t = _num("time_s", time_s, positive=True)
    fl = _num("floor_s", floor_s, positive=True, allow_none=True)
    m = Measurement(
        bucket_id=bucket_id, tuning_run_id=tuning_run_id, policy_id=policy_id, device_id=device_id,
        stage=_str("stage", stage, max_len=32), policy_name=_str("policy_name", policy_name, max_len=64),
        params=_json_obj("params", params or {}), role=_str("role", role, choices=ROLES),
        batch_index=_int("batch_index", batch_index, 0), kv_lens=lens, batch_size=len(lens),
        total_tokens=sum(lens), time_s=t, floor_s=fl, ratio=None if fl is None else t / fl,
        backend=_str("backend", backend, choices=BACKENDS), software=_json_obj("software", software or {}),
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
        q = q.limit(_int("limit", limit, 1))
    return list(session.scalars(q))


