"""``kvsplit db upgrade | export | import FILE`` (each takes ``--database-url``).

- ``upgrade``: run the store's Alembic migrations (version table
  ``kvsplit_alembic_version``); safe to repeat.
- ``export``: published policies as versioned JSON (``--output FILE``, default
  stdout).
- ``import FILE``: validate every field of every entry, then store all of them
  or nothing. Besides the store's own field checks, each entry's params must
  make a valid plan for its bucket's shape (``kvsplit.kernels.plan.make_plan``,
  imported lazily: this command is the one place where the db area calls the
  planner, to reject policies a server could not use).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

__all__ = ["register", "plan_check_entry"]

# the import check shared with the service's import route (a CLI module may use the planner)
from ..kernels.policy_table import check_policy_entry as plan_check_entry  # noqa: E402

_URL_HELP = "SQLAlchemy URL of the policy store (default: KVSPLIT_DATABASE_URL or sqlite:///./kvsplit.db)"


def register(app: typer.Typer) -> None:
    """Add the ``db`` command group to ``app``."""
    db = typer.Typer(name="db", help="The policy store: migrations, export, import.", no_args_is_help=True)

    @db.command("upgrade")
    def upgrade_cmd(
        database_url: Optional[str] = typer.Option(None, "--database-url", help=_URL_HELP),
    ) -> None:
        """Create or migrate the store's tables to the newest revision."""
        from . import store

        try:
            url = store.resolve_url(database_url)
            before = store.current_revision(store.get_engine(url))
            rev = store.upgrade(url)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--database-url") from None
        safe = store.get_engine(url).url.render_as_string(hide_password=True)
        if before == rev:
            typer.echo(f"{safe}: already at revision {rev}")
        else:
            typer.echo(f"{safe}: upgraded {before or 'empty'} -> {rev}")

    @db.command("export")
    def export_cmd(
        database_url: Optional[str] = typer.Option(None, "--database-url", help=_URL_HELP),
        output: Optional[Path] = typer.Option(None, "--output", "-o", help="write here instead of stdout"),
    ) -> None:
        """Write every published policy as versioned JSON."""
        from . import store

        try:
            with store.session_scope(database_url) as s:
                doc = store.export_published(s)
        except store.SchemaError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(code=1) from None
        text = json.dumps(doc, indent=2, sort_keys=False) + "\n"
        if output is None:
            sys.stdout.write(text)
        else:
            output.write_text(text)
            typer.echo(f"exported {len(doc['policies'])} policies to {output}", err=True)

    @db.command("import")
    def import_cmd(
        file: Path = typer.Argument(..., help="JSON file written by `kvsplit db export`", exists=True,
                                    dir_okay=False, readable=True),
        database_url: Optional[str] = typer.Option(None, "--database-url", help=_URL_HELP),
    ) -> None:
        """Validate and import published policies (all or nothing)."""
        from . import store

        try:
            data = json.loads(file.read_text())
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            typer.echo(f"import rejected, nothing stored: {file} is not JSON ({exc})", err=True)
            raise typer.Exit(code=2) from None
        try:
            with store.session_scope(database_url, write=True) as s:
                ids = store.import_policies(s, data, validate_entry=plan_check_entry)
                published = sum(1 for i in ids if (p := store.get_policy(s, i)) is not None and p.status == "published")
                version = store.policies_version(s)
        except store.ImportValidationError as exc:
            typer.echo(str(exc), err=True)
            raise typer.Exit(code=2) from None
        except store.SchemaError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(code=1) from None
        typer.echo(f"imported {len(ids)} policies ({published} published); policies_version {version}")

    app.add_typer(db, name="db")
