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
from typing import Any, Optional

import typer

__all__ = ["register", "plan_check_entry"]

_URL_HELP = "SQLAlchemy URL of the policy store (default: KVSPLIT_DATABASE_URL or sqlite:///./kvsplit.db)"


def plan_check_entry(entry: dict[str, Any]) -> None:
    """Raise ValueError unless ``entry``'s params make a plan for its bucket's shape.

    Also checks that the bucket key parses (``BucketKey.parse``) and agrees
    with the bucket fields.
    """
    from ..kernels.device import DeviceSpec
    from ..kernels.plan import POLICIES, make_plan

    b = entry["bucket"]
    if entry["name"] not in POLICIES:
        raise ValueError(f"name: unknown policy {entry['name']!r}; known: {sorted(POLICIES)}")
    try:
        device: Any = DeviceSpec.known(b["gpu"])
    except ValueError:
        d = entry.get("device")
        if d is None:
            raise ValueError(f"bucket.gpu: unknown GPU {b['gpu']!r} and no device numbers in the entry") from None
        device = DeviceSpec(name=d["name"], num_sms=d["num_sms"], hbm_bandwidth_gbps=d["hbm_bandwidth_gbps"],
                            l2_bytes=50 * 2**20, smem_per_sm_bytes=228 * 1024, smem_per_block_bytes=227 * 1024)
    for lens in ([4096, 17, 9000, 1], [131072] + [512] * 63):
        try:
            make_plan(lens, num_kv_heads=b["num_kv_heads"], device=device, policy=entry["name"],
                      params=entry["params"], head_dim=b["head_dim"], page_size=b["page_size"], dtype=b["dtype"])
        except ValueError as exc:
            raise ValueError(f"params do not make a plan: {exc}") from None
    from ..kernels.buckets import BucketKey, gpu_slug

    try:
        key = BucketKey.parse(b["key"])
    except ValueError as exc:
        raise ValueError(f"bucket.key: {exc}") from None
    expect = {"gpu": gpu_slug(b["gpu"]), **{f: b[f] for f in ("num_kv_heads", "head_dim", "dtype", "page_size")}}
    for f, v in expect.items():
        if getattr(key, f) != v:
            raise ValueError(f"bucket.key: its {f} {getattr(key, f)!r} differs from the entry's {v!r}")


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
