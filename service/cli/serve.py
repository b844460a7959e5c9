"""``kvsplit serve``, ``kvsplit plan`` and ``kvsplit run`` (the service's commands).

``kvsplit serve --database-url URL --host H --port P --workers N``
    Runs the plan service with uvicorn (uvloop + httptools). Settings come from
    ``KVSPLIT_*`` variables and ``./.env`` (:mod:`kvsplit.service.settings`);
    ``--database-url`` overrides ``KVSPLIT_DATABASE_URL``. The store must exist
    (``kvsplit db upgrade`` creates it) and the port must be free: both are
    checked before starting. With ``--workers N > 1`` each worker is a process
    with its own table and reload poll, and Prometheus metrics use
    multiprocess mode (``PROMETHEUS_MULTIPROC_DIR`` set to a fresh directory
    unless already set).
``kvsplit plan --gpu ... --num-qo-heads ... --num-kv-heads ... [--head-dim 128] [--dtype bfloat16] [--page-size 16] (--kv-lens 4096,17,9000 | --kv-lens-file PATH) --database-url ...``
    Prints the ``POST /v1/plan`` answer for that batch as JSON, planned with
    the store's published policies through the same validation and
    :class:`~kvsplit.kernels.policy_table.PolicyTable` as the service
    (indented on a terminal, one line otherwise or with ``--compact``). When
    the answer is the fallback policy, stderr says why.
``kvsplit run``
    The main job of ``make run`` (:mod:`kvsplit.service.main_job`).
"""

from __future__ import annotations

import errno
import json
import os
import socket
import sys
import tempfile
from pathlib import Path
from typing import Annotated, Optional

import typer

from .faults import load_settings, store_errors
from .options import (
    DatabaseUrl,
    Dtype,
    Gpu,
    HeadDim,
    KvDtype,
    NumKvHeads,
    NumQoHeads,
    PageSize,
    QLen,
    checked_shape,
    existing_store,
    fail,
    gpu_or_fail,
    store_url,
)

__all__ = ["serve_cmd", "plan_cmd", "run_cmd", "port_in_use", "parse_kv_lens_text"]

Host = Annotated[str, typer.Option("--host", metavar="HOST", help="interface to bind")]


def port_in_use(host: str, port: int) -> bool:
    """Whether ``host:port`` cannot be bound now (as uvicorn binds it: ``SO_REUSEADDR``)."""
    if port == 0:
        return False
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def serve_cmd(
    database_url: DatabaseUrl = None,
    host: Host = "127.0.0.1",
    port: Annotated[
        Optional[int],
        typer.Option("--port", metavar="PORT", min=0, max=65535, help="TCP port (default KVSPLIT_PORT, else 8000)"),
    ] = None,
    workers: Annotated[int, typer.Option("--workers", metavar="N", min=1, max=256, help="worker processes")] = 1,
    reload_interval: Annotated[
        Optional[float],
        typer.Option(
            "--reload-interval",
            metavar="SECONDS",
            min=0.0,
            help="seconds between policy-version polls (KVSPLIT_RELOAD_INTERVAL_S)",
        ),
    ] = None,
    log_level: Annotated[str, typer.Option("--log-level", metavar="LEVEL", help="uvicorn log level")] = "info",
    access_log: Annotated[
        bool, typer.Option("--access-log/--no-access-log", metavar="", help="log every request")
    ] = False,
) -> None:
    """Run the plan service (HTTP API, dashboard at /, metrics at /metrics)."""
    settings = load_settings(
        flags={
            "database_url": ("--database-url", database_url),
            "reload_interval_s": ("--reload-interval", reload_interval),
            "port": ("--port", port),
        }
    )
    port = settings.port
    if reload_interval is not None:  # the workers build their settings from the environment
        os.environ["KVSPLIT_RELOAD_INTERVAL_S"] = str(reload_interval)
    url = existing_store(settings.database_url)
    # the workers read KVSPLIT_DATABASE_URL: give them the URL as resolved here (a plain path made a SQLite URL)
    os.environ["KVSPLIT_DATABASE_URL"] = url
    if port_in_use(host, port):
        fail(f"--port: {host}:{port} is already in use (another kvsplit serve?); choose another --port")
    if workers > 1 and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="kvsplit-prometheus-")
    import uvicorn

    from ...db import store

    admin = "on" if settings.admin_token else "off (set KVSPLIT_ADMIN_TOKEN)"
    typer.echo(
        f"kvsplit serve: http://{host}:{port}/ ({workers} worker(s), store {store.safe_url(url)}, "
        f"admin routes {admin})",
        err=True,
    )
    uvicorn.run(
        "kvsplit.service.app:create_app_from_env",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        loop="uvloop",
        http="httptools",
        log_level=log_level,
        access_log=access_log,
        timeout_graceful_shutdown=5,
    )


def parse_kv_lens_text(text: str, source: str) -> list[int]:
    """kv_lens from text: a JSON list, or integers separated by commas, whitespace or newlines.

    Raises ValueError naming ``source`` and the index of the first bad entry.
    """
    s = text.strip()
    if s.startswith("["):
        try:
            data = json.loads(s)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{source}: not a JSON list ({exc})") from None
        if not isinstance(data, list):
            raise ValueError(f"{source}: expected a JSON list of integers")
        for i, v in enumerate(data):
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError(f"{source}: kv_lens[{i}]: expected an integer, got {v!r}")
        return data
    parts = s.replace(",", " ").split()
    out: list[int] = []
    for i, part in enumerate(parts):
        try:
            out.append(int(part))
        except ValueError:
            raise ValueError(f"{source}: kv_lens[{i}]: expected an integer, got {part!r}") from None
    if not out:
        raise ValueError(f"{source}: no kv_len given")
    return out


def _read_kv_lens(kv_lens: str | None, kv_lens_file: str | None) -> list[int]:
    if (kv_lens is None) == (kv_lens_file is None):
        fail("give exactly one of --kv-lens and --kv-lens-file")
    try:
        if kv_lens is not None:
            return parse_kv_lens_text(kv_lens, "--kv-lens")
        if kv_lens_file == "-":
            return parse_kv_lens_text(sys.stdin.read(), "--kv-lens-file -")
        path = Path(kv_lens_file)
        try:
            text = path.read_text()
        except OSError as exc:
            raise ValueError(f"--kv-lens-file: cannot read {kv_lens_file}: {exc.strerror or exc}") from None
        return parse_kv_lens_text(text, f"--kv-lens-file {kv_lens_file}")
    except ValueError as exc:
        fail(str(exc))


def _fallback_reason(table, bucket: dict) -> str:
    """Why a batch got the fallback policy: no policy for its shape, or none within the distance limit."""
    from ...kernels.buckets import BucketKey, distance

    key = BucketKey.parse(bucket["key"])
    if key.tokens_class < 0:
        return "an all-empty batch (every kv_len 0) has no length signature to match a bucket; it reads no KV"
    same = [e for e in table.entries if e.shape == key.family]
    if not same:
        return (
            "no published policy for this shape (gpu, num_kv_heads, head_dim, dtype, page_size, kv_dtype, q_len) "
            f"in the store ({len(table.entries)} published for other shapes)"
        )
    d, e = min(((distance(key, e.key), e) for e in same), key=lambda x: x[0])
    return (
        f"no published policy within the distance limit {table.distance_limit:g} of bucket {bucket['key']} "
        f"(nearest: {e.bucket} at distance {d:.3f})"
    )


def plan_cmd(
    gpu: Gpu,
    num_qo_heads: NumQoHeads,
    num_kv_heads: NumKvHeads,
    head_dim: HeadDim = 128,
    dtype: Dtype = "bfloat16",
    page_size: PageSize = 16,
    kv_dtype: KvDtype = None,
    q_len: QLen = 1,
    kv_lens: Annotated[
        Optional[str],
        typer.Option("--kv-lens", metavar="LIST", help="kv_len per request, comma-separated, e.g. 4096,17,9000"),
    ] = None,
    kv_lens_file: Annotated[
        Optional[str],
        typer.Option(
            "--kv-lens-file",
            metavar="PATH",
            help="read kv_lens from this file ('-': stdin): a JSON list, or integers separated by commas, "
            "spaces or newlines (for batches too long for the command line)",
        ),
    ] = None,
    database_url: DatabaseUrl = None,
    compact: Annotated[
        bool, typer.Option("--compact", metavar="", help="one-line JSON (default when stdout is not a terminal)")
    ] = False,
    indent: Annotated[bool, typer.Option("--indent", metavar="", help="indented JSON (default on a terminal)")] = False,
) -> None:
    """Print the plan of one batch as JSON (the POST /v1/plan answer), using the store's policies."""
    import orjson

    from ...kernels.shape import canonical_dtype
    from ...tuner.published import load_table_doc
    from ..routers.plan import plan_answer
    from ..state import ServedTable
    from ..validation import RequestValidationFailed, parse_plan_request

    if compact and indent:
        fail("give at most one of --compact and --indent")
    lens = _read_kv_lens(kv_lens, kv_lens_file)
    gpu_or_fail(gpu)
    try:
        dtype = canonical_dtype(dtype)
    except ValueError as exc:
        fail(f"--{exc}")
    checked_shape(  # the kernels' rules and words, as kvsplit tune, bench and calibrate say them
        device=gpu,
        num_qo_heads=num_qo_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        dtype=dtype,
        page_size=page_size,
        kv_dtype=kv_dtype,
        q_len=q_len,
    )
    settings = load_settings(flags={"database_url": ("--database-url", database_url)})
    body = orjson.dumps(
        {
            "gpu": gpu,
            "num_qo_heads": num_qo_heads,
            "num_kv_heads": num_kv_heads,
            "head_dim": head_dim,
            "dtype": dtype,
            "page_size": page_size,
            "kv_lens": lens,
            **({"kv_dtype": kv_dtype} if kv_dtype is not None else {}),
            **({"q_len": q_len} if q_len != 1 else {}),
        }
    )
    try:
        req = parse_plan_request(body, max_kv_len=settings.max_kv_len)
    except RequestValidationFailed as exc:
        for e in exc.errors:
            loc = e["loc"][1:]
            name = f"--{str(loc[0]).replace('_', '-')}" if loc else "request"
            where = "".join(f"[{x}]" for x in loc[1:])
            msg = str(e["msg"]).removeprefix("Value error, ")  # pydantic's wording, kept over HTTP only
            typer.echo(f"error: {name}{where}: {msg}", err=True)
        raise typer.Exit(2) from None
    url = existing_store(settings.database_url)
    with store_errors(url):
        served = ServedTable.from_doc(load_table_doc(url))
    try:
        p, bucket, policy = served.table.plan(req.kv_lens, req.shape)
    except ValueError as exc:
        fail(str(exc))
    if policy["source"] == "fallback":
        from ...kernels.policy_table import FP8_FALLBACK

        fp8 = (policy["name"], policy["params"]) == FP8_FALLBACK
        which = " (the fallback of an fp8 decode family, kvsplit.kernels.policy_table.FP8_FALLBACK)" if fp8 else ""
        typer.echo(
            f"note: planned with the fallback policy {policy['name']!r}{which}: "
            f"{_fallback_reason(served.table, bucket)}",
            err=True,
        )
    out = plan_answer(p, bucket, policy)
    if indent or (not compact and sys.stdout.isatty()):
        out = orjson.dumps(orjson.loads(out), option=orjson.OPT_INDENT_2)
    sys.stdout.write(out.decode() + "\n")


def run_cmd(
    host: Host = "127.0.0.1",
    port: Annotated[
        Optional[int],
        typer.Option(
            "--port",
            metavar="PORT",
            min=0,
            max=65535,
            help="port (default KVSPLIT_PORT, else 8000; another free one if taken, said so)",
        ),
    ] = None,
    tune: Annotated[
        bool, typer.Option("--tune/--no-tune", metavar="", help="tune the demo buckets before serving")
    ] = True,
    database_url: DatabaseUrl = None,
) -> None:
    """The main job (make run): store, shipped policies, demo tuning, plan service until Ctrl-C."""
    from ..main_job import prepare, serve

    settings = load_settings(flags={"database_url": ("--database-url", database_url), "port": ("--port", port)})
    url = store_url(settings.database_url)  # a plain path means that SQLite file
    with store_errors(url):  # one line naming the cause: disk full, read-only, unreachable, another tuner, ...
        prepare(url, tune=tune)
    serve(settings, host=host, port=settings.port)
