"""``kvsplit serve`` and ``kvsplit plan`` (the service area's commands).

``kvsplit serve --database-url URL --host H --port P --workers N``
    Runs the plan service with uvicorn (uvloop + httptools). Settings come from
    ``KVSPLIT_*`` variables (kvsplit.service.settings); ``--database-url``
    overrides ``KVSPLIT_DATABASE_URL``. With ``--workers N > 1`` each worker is
    a process with its own table and reload poll, and Prometheus metrics use
    multiprocess mode (``PROMETHEUS_MULTIPROC_DIR`` set to a fresh directory
    unless already set).
``kvsplit plan --gpu ... --num-qo-heads ... --num-kv-heads ... --head-dim ... --dtype ... --page-size ... --kv-lens 4096,17,9000 --database-url ...``
    Prints the ``POST /v1/plan`` answer for that batch as JSON, planned with
    the store's published policies through the same validation and
    :class:`~kvsplit.kernels.policy_table.PolicyTable` as the service.
"""

from __future__ import annotations

import os
import sys
import tempfile
from typing import Optional

import typer

__all__ = ["register"]

_URL_HELP = "SQLAlchemy URL of the policy store (default: KVSPLIT_DATABASE_URL or sqlite:///./kvsplit.db)"


def _check_store(url: str) -> None:
    from ..db import store

    try:
        store.check_schema(store.get_engine(url))
    except (store.SchemaError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


def register(app: typer.Typer) -> None:
    """Add ``serve`` and ``plan`` to ``app``."""

    @app.command("serve")
    def serve(
        database_url: Optional[str] = typer.Option(None, "--database-url", help=_URL_HELP),
        host: str = typer.Option("127.0.0.1", "--host", help="interface to bind"),
        port: int = typer.Option(8000, "--port", min=0, max=65535, help="TCP port"),
        workers: int = typer.Option(1, "--workers", min=1, max=256, help="worker processes"),
        reload_interval: Optional[float] = typer.Option(
            None, "--reload-interval", min=0.0, help="seconds between policy-version polls (KVSPLIT_RELOAD_INTERVAL_S)"),
        log_level: str = typer.Option("info", "--log-level", help="uvicorn log level"),
        access_log: bool = typer.Option(False, "--access-log/--no-access-log", help="log every request"),
    ) -> None:
        """Run the plan service (HTTP API, dashboard at /, metrics at /metrics)."""
        import uvicorn

        from .settings import Settings

        if database_url is not None:
            os.environ["KVSPLIT_DATABASE_URL"] = database_url
        if reload_interval is not None:
            os.environ["KVSPLIT_RELOAD_INTERVAL_S"] = str(reload_interval)
        try:
            settings = Settings()
        except Exception as exc:  # pydantic ValidationError: a bad KVSPLIT_* value
            typer.echo(f"error: invalid settings: {exc}", err=True)
            raise typer.Exit(2) from None
        _check_store(settings.database_url)
        if workers > 1 and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="kvsplit-prometheus-")
        admin = "on" if settings.admin_token else "off (set KVSPLIT_ADMIN_TOKEN)"
        typer.echo(f"kvsplit serve: http://{host}:{port}/ ({workers} worker(s), store {settings.database_url}, "
                   f"admin routes {admin})", err=True)
        uvicorn.run("kvsplit.service.app:create_app_from_env", factory=True, host=host, port=port, workers=workers,
                    loop="uvloop", http="httptools", log_level=log_level, access_log=access_log,
                    timeout_graceful_shutdown=5)

    @app.command("plan")
    def plan_cmd(
        gpu: str = typer.Option(..., "--gpu", help="GPU name or alias, e.g. 'NVIDIA H200'"),
        num_qo_heads: int = typer.Option(..., "--num-qo-heads", help="H_q"),
        num_kv_heads: int = typer.Option(..., "--num-kv-heads", help="H_kv"),
        head_dim: int = typer.Option(..., "--head-dim", help="64, 128 or 256"),
        dtype: str = typer.Option(..., "--dtype", help="float16, bfloat16 or float32"),
        page_size: int = typer.Option(16, "--page-size", help="tokens per KV page"),
        kv_lens: str = typer.Option(..., "--kv-lens", help="comma-separated kv_len per request, e.g. 4096,17,9000"),
        database_url: Optional[str] = typer.Option(None, "--database-url", help=_URL_HELP),
        indent: bool = typer.Option(False, "--indent", help="pretty-print the JSON"),
    ) -> None:
        """Print the plan of one batch as JSON (the POST /v1/plan answer), using the store's policies."""
        import orjson

        from . import queries
        from .routers.plan import plan_answer
        from .settings import Settings
        from .state import ServedTable
        from .validation import RequestValidationFailed, parse_plan_request

        lens: list[int] = []
        for i, part in enumerate(kv_lens.split(",")):
            try:
                lens.append(int(part.strip()))
            except ValueError:
                raise typer.BadParameter(f"kv_lens[{i}]: expected an integer, got {part.strip()!r}",
                                         param_hint="--kv-lens") from None
        settings = Settings(**({"database_url": database_url} if database_url is not None else {}))
        body = orjson.dumps({"gpu": gpu, "num_qo_heads": num_qo_heads, "num_kv_heads": num_kv_heads,
                             "head_dim": head_dim, "dtype": dtype, "page_size": page_size, "kv_lens": lens})
        try:
            req = parse_plan_request(body, max_kv_len=settings.max_kv_len)
        except RequestValidationFailed as exc:
            for e in exc.errors:
                loc = ".".join(str(x) for x in e["loc"][1:])
                typer.echo(f"error: {loc}: {e['msg']}", err=True)
            raise typer.Exit(2) from None
        _check_store(settings.database_url)
        served = ServedTable.from_doc(queries.load_table_doc(settings.database_url))
        try:
            p, bucket, policy = served.table.plan(
                req.kv_lens, gpu=req.gpu, num_qo_heads=req.num_qo_heads, num_kv_heads=req.num_kv_heads,
                head_dim=req.head_dim, dtype=req.dtype, page_size=req.page_size, device=req.device)
        except ValueError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        out = plan_answer(p, bucket, policy)
        if indent:
            out = orjson.dumps(orjson.loads(out), option=orjson.OPT_INDENT_2)
        sys.stdout.write(out.decode() + "\n")
