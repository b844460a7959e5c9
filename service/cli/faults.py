"""One-line errors for the store, the settings and the tuning lock (every ``kvsplit`` command uses these).

- :func:`store_errors`: a block that touches the store; any failure becomes one
  ``error:`` line naming the real cause (disk full, read-only, unreachable
  server, missing folder, bad URL, schema to upgrade) through
  :func:`kvsplit.db.store.describe_error`, exit code 1 (2 for a bad URL).
- :func:`load_settings`: the settings class built from ``KVSPLIT_*`` variables,
  ``./.env`` and the command's flags; a bad value is one line naming the
  variable (``KVSPLIT_PORT``) or flag (``--database-url``) and the value, exit 2.
- :func:`hold_tuning_lock`: the exclusive tuning lock of a SQLite study storage
  (:func:`kvsplit.tuner.study.exclusive_storage`), held until the command ends;
  another tuner holding it is named (PID, host) in one line, exit 1.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import typer

from .options import fail

__all__ = ["store_errors", "store_failure", "is_store_failure", "load_settings", "settings_error", "hold_tuning_lock"]


def is_store_failure(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception in its chain) is a failure of the database or the file system."""
    import sqlalchemy.exc

    from ...db import store
    from ...tuner.study import StorageBusy

    seen: list[BaseException] = []
    e: BaseException | None = exc
    todo = [exc]
    while todo and len(seen) < 32:
        e = todo.pop()
        if e is None or any(e is x for x in seen):
            continue
        seen.append(e)
        if isinstance(e, (sqlalchemy.exc.SQLAlchemyError, OSError, store.SchemaError, StorageBusy)):
            return True
        if type(e).__module__.split(".")[0] in ("sqlite3", "psycopg", "psycopg2"):
            return True
        todo += [e.__cause__, e.__context__]
    return False


def store_failure(exc: BaseException, url: str | None) -> NoReturn:
    """Exit with one line for a failure of the store at ``url``: the cause as
    :func:`kvsplit.db.store.describe_error` names it (exit 1), or a bad URL (exit 2)."""
    from pydantic import ValidationError

    from ...db import store
    from ...tuner.study import StorageBusy

    if isinstance(exc, ValidationError):  # a bad KVSPLIT_* value read on the way (get_settings)
        fail(settings_error(exc))
    if isinstance(exc, (store.SchemaError, StorageBusy)):
        fail(str(exc), code=1)
    if isinstance(exc, ValueError) and not is_store_failure(exc):
        text = str(exc)
        if text.startswith("database_url: "):  # resolve_url / get_engine: a bad URL or a missing folder
            fail("--" + text.replace("_", "-", 1))
        fail(text, code=1)
    fail(store.describe_error(exc, url), code=1)


@contextlib.contextmanager
def store_errors(url: str | None) -> Iterator[None]:
    """Run the block; a store failure (database, file system, bad URL, schema, tuning lock) ends the
    command with one line (:func:`store_failure`). Other exceptions propagate: they are bugs to see."""
    try:
        yield
    except (ValueError, RecursionError) as exc:
        store_failure(exc, url)
    except Exception as exc:
        if not is_store_failure(exc):
            raise
        store_failure(exc, url)


def settings_error(exc: Any, flags: dict[str, str] | None = None) -> str:
    """One line for a pydantic ``ValidationError`` of the settings: the variable (or flag), the value, the rule.

    ``flags`` maps a field given on the command line to its flag name.
    """
    parts = []
    for e in exc.errors():
        field = str(e["loc"][0]) if e.get("loc") else "settings"
        name = (flags or {}).get(field) or f"KVSPLIT_{field.upper()}"
        msg = str(e.get("msg", "invalid")).removeprefix("Value error, ")
        parts.append(f"{name}={e.get('input')!r}: {msg}")
    return "invalid setting " + "; ".join(parts)


def load_settings(cls: type | None = None, *, flags: dict[str, tuple[str, Any]] | None = None) -> Any:
    """``cls(**overrides)`` (default: the service's settings); a bad value exits with :func:`settings_error`.

    ``flags``: ``{field: (flag name, value)}`` for command-line values that
    override the environment (None values are left to the environment).
    """
    from pydantic import ValidationError

    if cls is None:
        from ..settings import Settings as cls  # noqa: N813
    given = {k: v for k, (_, v) in (flags or {}).items() if v is not None}
    try:
        return cls(**given)
    except ValidationError as exc:
        fail(settings_error(exc, {k: f for k, (f, v) in (flags or {}).items() if v is not None}))


def hold_tuning_lock(ctx: typer.Context, spec: Any) -> None:
    """Take the tuning lock of ``spec`` (a SQLite study storage) until the command of ``ctx`` ends.

    Another process holding it ends the command with one line naming it.
    """
    from ...db import store
    from ...tuner.study import StorageBusy, exclusive_storage

    try:
        ctx.with_resource(exclusive_storage(spec))
    except StorageBusy as exc:
        fail(str(exc), code=1)
    except FileNotFoundError as exc:
        fail(f"--database-url: folder {str(Path(exc.filename or '.').parent)!r} of the SQLite file does not exist")
    except OSError as exc:
        fail(store.describe_error(exc, spec.location), code=1)
