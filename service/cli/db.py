"""``kvsplit db upgrade | export | import FILE`` (each takes ``--database-url``).

- ``upgrade``: run the store's Alembic migrations (version table
  ``kvsplit_alembic_version``); safe to repeat; creates the store.
- ``export``: published policies as versioned JSON (``--output FILE``, default
  stdout); with ``--calibrations``, the stored simulator calibrations (per GPU,
  KV dtype and q_len, :func:`kvsplit.db.store.export_calibrations`) instead.
  Read-only: a missing SQLite store is refused, not created.
- ``import FILE``: validate every field of every entry, then store all of them
  or nothing. Besides the store's own field checks, each entry's params must
  make a valid plan for its bucket's shape
  (:func:`kvsplit.kernels.policy_table.check_policy_entry`, the check of the
  service's import route); a calibrations file (its ``format``) is imported as
  calibrations, each entry checked by
  :func:`kvsplit.tuner.calibrate.check_calibration_entry`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from .faults import store_failure
from .options import DatabaseUrl, existing_store, fail, store_url

__all__ = ["db_app"]

db_app = typer.Typer(name="db", help="The policy store: migrations, export, import.", no_args_is_help=True)


def _store_error(exc: Exception, url: str) -> None:
    store_failure(exc, url)  # one line naming the cause: disk full, read-only, unreachable, ...


@db_app.command("upgrade")
def upgrade_cmd(database_url: DatabaseUrl = None) -> None:
    """Create or migrate the store's tables to the newest revision."""
    from ...db import store

    url = store_url(database_url)
    try:
        before, rev = store.upgrade_from(url)  # before: as found under the schema lock
    except Exception as exc:  # noqa: BLE001 - one line, never a traceback
        _store_error(exc, url)
    safe = store.safe_url(url)
    if before == rev:
        typer.echo(f"{safe}: already at revision {rev}")
    else:
        typer.echo(f"{safe}: upgraded {before or 'empty'} -> {rev}")


@db_app.command("export")
def export_cmd(
    database_url: DatabaseUrl = None,
    output: Annotated[
        Optional[Path], typer.Option("--output", "-o", metavar="FILE", help="write here instead of stdout")
    ] = None,
    calibrations: Annotated[
        bool,
        typer.Option(
            "--calibrations",
            metavar="",
            help="write the stored simulator calibrations (per GPU, KV dtype and q_len) instead of the policies",
        ),
    ] = False,
) -> None:
    """Write every published policy (or, with --calibrations, every stored calibration) as versioned JSON."""
    from ...db import store

    if output is not None and not output.parent.is_dir():
        fail(f"--output: folder {str(output.parent)!r} does not exist")
    url = existing_store(database_url)
    try:
        with store.session_scope(url) as s:
            doc = store.export_calibrations(s) if calibrations else store.export_published(s)
    except Exception as exc:  # noqa: BLE001
        _store_error(exc, url)
    what = "calibrations" if calibrations else "policies"
    text = json.dumps(doc, indent=2, sort_keys=False) + "\n"
    if output is None:
        sys.stdout.write(text)
        return
    try:
        output.write_text(text)
    except OSError as exc:
        fail(f"--output: cannot write {output}: {exc.strerror or exc}")
    typer.echo(f"exported {len(doc[what])} {what} to {output}", err=True)


@db_app.command("import")
def import_cmd(
    file: Annotated[
        Path,
        typer.Argument(metavar="FILE", help="JSON file written by `kvsplit db export`"),
    ],
    database_url: DatabaseUrl = None,
) -> None:
    """Validate and import published policies, or the calibrations of `kvsplit db export --calibrations` (all or nothing)."""  # noqa: E501
    from ...db import store
    from ...db.models import Calibration, Policy
    from ...db.transfer import parse_export
    from ...kernels.policy_table import check_policy_entry

    try:
        raw = file.read_bytes()
    except OSError as exc:  # missing, a folder, unreadable: one line naming the argument, as every other command
        fail(f"FILE: cannot read {str(file)!r}: {exc.strerror or exc}")
    try:
        data = parse_export(raw, source=str(file))
    except store.ImportValidationError as exc:
        fail(str(exc))
    fmt = data.get("format") if isinstance(data, dict) else None
    if isinstance(fmt, str) and fmt not in (store.EXPORT_FORMAT, store.CALIBRATIONS_FORMAT):
        fail(
            f"FILE: {str(file)!r} is a {fmt[:80]!r} document, not a `kvsplit db export` file: `kvsplit db import` "
            f"reads {store.EXPORT_FORMAT!r} (policies) and {store.CALIBRATIONS_FORMAT!r} "
            "(`kvsplit db export --calibrations`); nothing stored"
        )
    url = existing_store(database_url)
    if fmt == store.CALIBRATIONS_FORMAT:
        from ...tuner.calibrate import check_calibration_entry

        try:
            with store.session_scope(url, write=True) as s:
                before = _max_id(s, Calibration)
                ids = store.import_calibrations(s, data, validate_entry=check_calibration_entry)
        except store.ImportValidationError as exc:
            fail(str(exc))
        except Exception as exc:  # noqa: BLE001
            _store_error(exc, url)
        typer.echo(_imported(ids, before, "calibration", "calibrations"))
        return
    try:
        with store.session_scope(url, write=True) as s:
            before = _max_id(s, Policy)
            ids = store.import_policies(s, data, validate_entry=check_policy_entry)
            published = sum(1 for i in ids if (p := store.get_policy(s, i)) is not None and p.status == "published")
            version = store.policies_version(s)
    except store.ImportValidationError as exc:
        fail(str(exc))
    except Exception as exc:  # noqa: BLE001
        _store_error(exc, url)
    typer.echo(f"{_imported(ids, before, 'policy', 'policies')} ({published} published); policies_version {version}")


def _max_id(session, model) -> int:
    """The largest id of ``model``'s rows (0 for none): rows an import adds get larger ones."""
    from sqlalchemy import func, select

    return int(session.scalar(select(func.max(model.id))) or 0)


def _imported(ids: list[int], before: int, one: str, many: str) -> str:
    """``"imported 3 policies"``, ``"imported 1 calibration, 3 already stored"`` or ``"nothing new: the 4
    calibrations are already stored"``: the file's entries that became new rows (ids above ``before``) and those an
    identical stored row stood for."""
    new = sum(1 for i in ids if i > before)
    word = one if len(ids) == 1 else many
    if new == 0 and ids:
        return f"nothing new: the {len(ids)} {word} {'is' if len(ids) == 1 else 'are'} already stored"
    old = len(ids) - new
    return f"imported {new} {one if new == 1 else many}" + (f", {old} already stored" if old else "")
