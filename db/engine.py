"""Engines, sessions and migrations of the policy store (part of :mod:`kvsplit.db.store`).

One cached engine per URL; SQLite files get WAL, ``busy_timeout``, foreign keys
and real transactions; ``session_scope`` owns every transaction; Alembic
migrations with their own version table ``kvsplit_alembic_version``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from .settings import get_settings, normalize_database_url

VERSION_TABLE = "kvsplit_alembic_version"
_MIGRATIONS = Path(__file__).resolve().parent / "migrations"


class SchemaError(RuntimeError):
    """The database schema is missing, outdated or newer than this kvsplit."""


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


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc``, the DBAPI errors it wraps, and the exceptions it was raised from or during, in that order."""
    out: list[BaseException] = []
    todo = [exc]
    while todo and len(out) < 32:
        e = todo.pop(0)
        if e is None or any(e is x for x in out):
            continue
        out.append(e)
        todo += [getattr(e, "orig", None), e.__cause__, e.__context__]
    return out


def first_line(e: BaseException) -> str:
    text = str(e).strip()
    line = text.splitlines()[0].strip() if text else type(e).__name__
    if line.startswith("(") and ") " in line:  # SQLAlchemy's "(sqlite3.OperationalError) ..." prefix
        line = line.split(") ", 1)[1]
    return line


def _nearest_existing(path: str | None) -> Path | None:
    """The SQLite file ``path`` if it exists, else its nearest existing parent folder (None without a path)."""
    if not path:
        return None
    p = Path(path).expanduser().resolve()
    return next((q for q in (p, *p.parents) if q.exists()), None)


def _low_space(path: str | None) -> bool:
    q = _nearest_existing(path)
    if q is None:
        return False
    try:
        st = os.statvfs(q)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < 1 << 20


def _read_only(path: str | None) -> bool:
    q = _nearest_existing(path)
    if q is None:
        return False
    try:
        if os.statvfs(q).f_flag & os.ST_RDONLY:
            return True
    except OSError:
        return False
    return not os.access(q if q.is_dir() else q.parent, os.W_OK) or (q.is_file() and not os.access(q, os.W_OK))


def describe_error(exc: BaseException, url: str | None = None) -> str:
    """One line naming the real cause of a store failure: disk full, read-only, unreachable server, bad value.

    Looks through the exception chain (an error raised while rolling back, such
    as SQLite's ``no such savepoint`` after ``database or disk is full``, hides
    the first one) and at the SQLite file's file system (free space, read-only
    mount). ``url`` (password hidden) is named in the line. A cause it does not
    recognise gives ``cannot use the policy store at URL: <first line>``.
    """
    return (
        error_cause(exc, url)
        or f"cannot use the policy store at {safe_url(url) if url else 'the policy store'}: "
        f"{first_line(_chain(exc)[0])}"
    )


def error_cause(exc: BaseException, url: str | None = None) -> str | None:
    """The line of :func:`describe_error` for a recognised cause (disk full, read-only, missing folder,
    permissions, unreachable server, credentials, missing database, nesting too deep), else None."""
    where = safe_url(url) if url else "the policy store"
    path = None
    if url:
        with contextlib.suppress(Exception):
            if _is_sqlite(url):
                path = _sqlite_file(url)
    chain = _chain(exc)
    texts = [first_line(e) for e in chain]
    low = [t.lower() for t in texts]
    errnos = {getattr(e, "errno", None) for e in chain}
    if any(isinstance(e, RecursionError) for e in chain):
        return f"{where}: a value is nested too deeply to store or read ({texts[0]})"
    if (
        errno.ENOSPC in errnos
        or any("disk is full" in t or "no space left" in t for t in low)
        or (any("disk i/o error" in t for t in low) and _low_space(path))
    ):
        cause = next((texts[i] for i, t in enumerate(low) if "full" in t or "no space" in t or "i/o" in t), texts[0])
        return f"the disk is full: cannot write the store at {where} ({cause})"
    if (
        errno.EROFS in errnos
        or any("readonly" in t or "read-only" in t for t in low)
        or (path is not None and _read_only(path) and any("unable to open" in t for t in low))
    ):
        cause = next((texts[i] for i, t in enumerate(low) if "read" in t and "only" in t), texts[0])
        return f"the store at {where} is read-only: its file or folder cannot be written ({cause})"
    if errno.EACCES in errnos or errno.EPERM in errnos:
        return f"permission denied on the store at {where} ({texts[0]})"
    if path is not None and any("unable to open" in t for t in low):
        parent = Path(path).expanduser().resolve().parent
        if not parent.is_dir():
            return f"the folder {str(parent)!r} of the SQLite store {where} does not exist"
    for i, t in enumerate(low):
        if "password authentication failed" in t or "authentication failed" in t:
            return f"the database server of {where} refused the credentials ({texts[i]})"
        if "does not exist" in t and "database" in t:
            return f"{where}: {texts[i]}"
        if (
            "connection refused" in t
            or "could not translate host name" in t
            or "timeout expired" in t
            or "name or service not known" in t
            or "no route to host" in t
            or "connection failed" in t
            or "could not connect" in t
            or "network is unreachable" in t
        ):
            detail = next(
                (
                    texts[j]
                    for j, x in enumerate(low)
                    if "refused" in x
                    or "translate" in x
                    or "timeout" in x
                    or "not known" in x
                    or "route" in x
                    or "unreachable" in x
                ),
                texts[i],
            )
            return f"cannot reach the database server of {where}: {detail}"
    return None


def check_exists(url: str | None = None) -> None:
    """Raise :class:`SchemaError` when ``url`` names a SQLite file that does not exist.

    Read-only commands call it first: opening a missing SQLite file would
    create an empty one.
    """
    url = resolve_url(url)
    if _is_sqlite(url):
        path = _sqlite_file(url)
        if path is not None and not Path(path).expanduser().exists():
            raise SchemaError(
                f"no kvsplit store at {safe_url(url)} (the file {path} does not exist): "
                f"run `kvsplit run --no-tune --database-url {safe_url(url)}` to create it with the "
                f"shipped policies and serve it, or `kvsplit db upgrade --database-url "
                f"{safe_url(url)}` for an empty one"
            )


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

_SCHEMA_LOCK_KEY = zlib.crc32(b"kvsplit schema lock")  # a PostgreSQL advisory lock key (bigint)


@contextlib.contextmanager
def schema_lock(url: str | None = None) -> Iterator[None]:
    """Hold the store's schema lock for the block: one process at a time creates or migrates tables.

    PostgreSQL: the session-level advisory lock ``pg_advisory_lock`` (a
    constant key) on a connection of its own; other processes wait for it.
    Other backends: nothing (:func:`upgrade` runs SQLite migrations in one
    ``BEGIN IMMEDIATE`` transaction, which serialises them already).
    Used around :func:`upgrade` and the creation of Optuna's tables
    (:func:`kvsplit.tuner.study.open_storage`), which race otherwise
    (``relation ... already exists``).
    """
    url = resolve_url(url)
    if make_url(url).get_backend_name() != "postgresql":
        yield
        return
    with get_engine(url).connect() as conn:
        conn.exec_driver_sql(f"SELECT pg_advisory_lock({_SCHEMA_LOCK_KEY})")
        conn.commit()
        try:
            yield
        finally:
            with contextlib.suppress(Exception):  # a lost connection releases the lock itself
                conn.exec_driver_sql(f"SELECT pg_advisory_unlock({_SCHEMA_LOCK_KEY})")
                conn.commit()


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
    (creates every table and the ``store_state`` row), and from several
    processes at once: one migrates, the others wait and find it done (SQLite:
    the migration runs in one ``BEGIN IMMEDIATE`` transaction; PostgreSQL:
    :func:`schema_lock`).
    """
    return upgrade_from(url, revision)[1]


def upgrade_from(url: str | None = None, revision: str = "head") -> tuple[str | None, str]:
    """:func:`upgrade`, returning (the revision found under the lock, None for an empty database; the
    revision now stamped): equal when another process had migrated first."""
    from alembic import command
    from alembic.runtime.migration import MigrationContext

    url = resolve_url(url)
    eng = get_engine(url)
    cfg = _alembic_config(url)
    with schema_lock(url), eng.connect().execution_options(kvsplit_write=True) as conn:
        before = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE}).get_current_revision()
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)
        conn.commit()
    _checked.discard(url)
    rev = current_revision(eng)
    assert rev is not None
    return before, rev
