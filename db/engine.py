"""Engines, sessions and migrations of the policy store (part of :mod:`kvsplit.db.store`).

One cached engine per URL; SQLite files get WAL, ``busy_timeout``, foreign keys
and real transactions; ``session_scope`` owns every transaction; Alembic
migrations with their own version table ``kvsplit_alembic_version``.
"""

from __future__ import annotations

import contextlib
import threading
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
                              f"run `kvsplit run --no-tune --database-url {safe_url(url)}` to create it with the "
                              f"shipped H200 policies and serve it, or `kvsplit db upgrade --database-url "
                              f"{safe_url(url)}` for an empty one")


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
