"""The plan service (FastAPI): ``create_app(settings)`` wires routers, lifespan and middleware.

Routes (operation ids in brackets; OpenAPI at ``/v1/openapi.json``, docs at ``/v1/docs``):

* ``POST /v1/plan`` [plan] — the plan of a batch (docs/concepts/design.md §3).
* ``GET /v1/policies`` [list_policies] — the policy table, ETag / If-None-Match.
* ``GET /v1/policies/{policy_id}`` [get_policy]
* ``POST /v1/policies/import`` [import_policies], ``POST /v1/policies/{id}/publish`` [publish_policy],
  ``POST /v1/policies/{id}/retire`` [retire_policy] — admin, ``Authorization: Bearer <KVSPLIT_ADMIN_TOKEN>``.
* ``GET /v1/buckets`` [list_buckets], ``GET /v1/runs`` [list_runs], ``GET /v1/measurements`` [list_measurements]
* ``GET /v1/traffic`` [get_traffic] — what the service served per bucket key (:mod:`kvsplit.service.traffic`).
* ``GET /healthz`` [healthz], ``GET /metrics`` [metrics], ``GET /`` (dashboard), ``GET /favicon.ico``.

The API docs (Swagger UI) load their JavaScript and CSS from this server
(``/v1/docs/static/``, the files the ``fastapi-offline`` package ships), so they
work without internet access; ReDoc is not served.

Errors are JSON (``{"detail": ...}``): 4xx for every bad request (a plan body
nested deeper than 8 levels is a 422 ``json_too_deep`` before any field is
checked, :mod:`kvsplit.service.validation`); a store failure is 507 when its
disk is full, else 503 (:func:`store_failure`); any other unhandled exception
is a 500 with no detail (the traceback goes to the log). Each is counted under
its status in ``kvsplit_http_requests_total``.

Start-up (lifespan) loads the published policies from the store (failing
loudly when the schema is outdated: run ``kvsplit db upgrade``), warns when the
store has none (every batch would get the fallback) and starts the version
poll; see :mod:`kvsplit.service.state`. With ``KVSPLIT_TRAFFIC`` on (the
default) it also starts the periodic flush of the traffic statistics, and
shutdown flushes them once more (:mod:`kvsplit.service.traffic`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.resources
import logging
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import FileResponse, Response
from fastapi_offline import FastAPIOffline
from pydantic.json_schema import models_json_schema
from sqlalchemy.exc import DBAPIError

from . import fastjson, fastparse, queries
from .middleware import INTERNAL_ERROR, PLAN_ROUTE, GuardMiddleware, PlanFastPath
from .routers import dashboard, data, health, plan, policies
from .routers import traffic as traffic_router
from .schemas import DeviceIn, make_plan_request_model
from .settings import Settings
from .state import TableHolder
from .traffic import TrafficRecorder

__all__ = ["create_app", "DOCS_STATIC_URL"]

log = logging.getLogger("kvsplit.service")

DOCS_STATIC_URL = "/v1/docs/static"
"""Where the Swagger UI assets are served (from the installed ``fastapi-offline`` package)."""
_FAVICON = importlib.resources.files("fastapi_offline") / "static" / "favicon.png"


def _custom_openapi(app: FastAPI, max_kv_len: int) -> Any:
    def openapi() -> dict:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        req_model = make_plan_request_model(max_kv_len)
        _, defs = models_json_schema(
            [(req_model, "validation"), (DeviceIn, "validation")], ref_template="#/components/schemas/{model}"
        )
        comps = schema.setdefault("components", {}).setdefault("schemas", {})
        comps.update(defs.get("$defs", {}))
        app.openapi_schema = schema
        return schema

    return openapi


_DISK_FULL = ("database or disk is full", "no space left on device", "could not extend file")
"""How SQLite (SQLITE_FULL), the OS (ENOSPC) and PostgreSQL (SQLSTATE 53100) say that the store's disk is full."""


def store_failure(exc: BaseException) -> tuple[int, str]:
    """The answer to a request whose store access raised ``exc``: ``(status, message)``.

    507 when the store's disk is full (anywhere in the exception's chain: SQLite reports SQLITE_FULL and then
    fails to roll back its savepoint, ``no such savepoint``, which hides the first error), else 503. The
    database's own message goes to the log only (it may name hosts and users). Nothing a failed write began
    is kept (the transaction is rolled back).
    """
    seen = []
    e: BaseException | None = exc
    while e is not None and len(seen) < 16:
        seen.append(e)
        orig = getattr(e, "orig", None)
        if isinstance(orig, BaseException):
            seen.append(orig)
        e = e.__cause__ or e.__context__
    for x in seen:
        text = str(x).lower()
        if any(m in text for m in _DISK_FULL) or getattr(x, "sqlstate", None) == "53100":
            return 507, "policy store: database or disk is full; nothing was stored"
    return 503, "policy store unavailable (the service's log has the database's error)"


async def _store_error_answer(request: Request, exc: Exception) -> Response:
    status, msg = store_failure(exc)
    first = (str(getattr(exc, "orig", None) or exc).strip().splitlines() or [type(exc).__name__])[0]
    log.error("%s %s: %s: %s", request.method, request.url.path, msg, first[:500])
    return Response(orjson.dumps({"detail": msg}), status_code=status, media_type="application/json")


async def _internal_error_answer(request: Request, exc: Exception) -> Response:
    """Any other unhandled exception: a JSON 500 (Starlette's error middleware logs the traceback)."""
    return Response(INTERNAL_ERROR, status_code=500, media_type="application/json")


class _PlanServiceApp(FastAPI):
    """The service's FastAPI app: ``POST /v1/plan`` is answered before FastAPI's own ``__call__``.

    ``create_app`` gets its app from ``FastAPIOffline`` (a function returning a
    FastAPI instance) and sets its class to this subclass, which only adds the
    hot-path dispatch to :class:`~kvsplit.service.middleware.PlanFastPath`
    (``plan_fast_path``; None: everything goes through FastAPI).
    """

    plan_fast_path: PlanFastPath | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        fast = self.plan_fast_path
        if fast is not None and scope["type"] == "http" and scope["path"] == PLAN_ROUTE and scope["method"] == "POST":
            await fast(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the service app.

    Parameters
    ----------
    settings : Settings, optional
        Defaults to ``Settings()`` (``KVSPLIT_*`` environment variables).
    """
    settings = settings or Settings()
    url = settings.database_url
    holder = TableHolder(functools.partial(queries.load_table_doc, url), functools.partial(queries.read_version, url))
    traffic = TrafficRecorder(url, retention_hours=settings.traffic_retention_hours) if settings.traffic else None

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        served = await asyncio.to_thread(holder.reload)
        await asyncio.to_thread(fastparse.warmup)  # compile or load the kv_lens scan before the first request
        await asyncio.to_thread(fastjson.warmup)  # and the answer's writer
        if len(served.table) == 0:
            log.warning(
                "the store %s has no published policies: every batch gets the %r fallback plan "
                "(fill it with `kvsplit run --no-tune`, `kvsplit db import` or `kvsplit tune`)",
                url,
                served.table.fallback_name,
            )
        tasks = []
        if settings.reload_interval_s > 0:
            tasks.append(asyncio.create_task(holder.poll(settings.reload_interval_s)))
        if traffic is not None:
            tasks.append(asyncio.create_task(traffic.run(settings.traffic_flush_interval_s)))
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            if traffic is not None:  # this process's last counts
                try:
                    await asyncio.to_thread(traffic.flush)
                except Exception as exc:  # noqa: BLE001 - a store error at shutdown: say what is lost
                    log.error(
                        "traffic statistics: the last flush failed, %d requests not stored: %s", traffic.pending(), exc
                    )

    # FastAPI with Swagger UI's assets served from the installed package instead of a CDN
    app = FastAPIOffline(
        title="kvsplit plan service",
        version="1",
        description="Split-KV plans for GQA decode attention from per-bucket tuned policies.",
        openapi_url="/v1/openapi.json",
        docs_url="/v1/docs",
        redoc_url=None,
        static_url=DOCS_STATIC_URL,
        favicon_url="/favicon.ico",
        lifespan=lifespan,
    )

    @app.get("/favicon.ico", include_in_schema=False)
    def favicon() -> FileResponse:
        return FileResponse(str(_FAVICON), media_type="image/png")

    app.add_exception_handler(DBAPIError, _store_error_answer)
    app.add_exception_handler(Exception, _internal_error_answer)
    app.state.settings = settings
    app.state.holder = holder
    app.state.traffic = traffic
    holder.traffic = traffic  # the plan path reads it there (a plain attribute)
    for r in (plan.router, policies.router, data.router, health.router, dashboard.router, traffic_router.router):
        app.include_router(r)
    app.add_middleware(GuardMiddleware, max_body_bytes=settings.max_body_bytes, plan_state=app.state)
    app.__class__ = _PlanServiceApp  # FastAPIOffline builds a plain FastAPI; only __call__ differs
    app.plan_fast_path = PlanFastPath(app.state, settings.max_body_bytes)
    app.openapi = _custom_openapi(app, settings.max_kv_len)  # type: ignore[method-assign]
    return app


def create_app_from_env() -> FastAPI:
    """Factory for ``uvicorn --factory`` (settings from the environment)."""
    return create_app(Settings())
