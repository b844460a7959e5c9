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

__all__ = ["store_errors", "store_failure", "load_settings", "settings_error", "hold_tuning_lock"]


def store_failure(exc: BaseException, url: str | None) -> NoReturn:
    """Exit with one line for a failure of the store at ``url``."""
    from ...db import store

    if isinstance(exc, store.SchemaError):
        fail(str(exc), code=1)
    if isinstance(exc, ValueError) and not _is_db_error(exc):
        fail(f"--database-url: {exc}")
    fail(store.describe_error(exc, url), code=1)


def _is_db_error(exc: BaseException) -> bool:
    import sqlalchemy.exc

    return isinstance(exc, sqlalchemy.exc.SQLAlchemyError)


@contextlib.contextmanager
def store_errors(url: str | None) -> Iterator[None]:
    """Run the block; any exception but ``typer.Exit`` (and Ctrl-C) ends the command with one line."""
    try:
        yield
    except (typer.Exit, typer.Abort, KeyboardInterrupt, SystemExit):
        raise
    except Exception as exc:  # noqa: BLE001 - one line, never a traceback
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
