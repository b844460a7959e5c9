"""Pure-ASGI middleware of the plan service: body-size limit and request metrics.

One layer (not Starlette's ``BaseHTTPMiddleware``, which costs a task and a
stream per request) that

* refuses request bodies over ``max_body_bytes`` with 413 **before** anything
  parses them: first by ``Content-Length``, then by counting the streamed bytes
  (chunked uploads), and
* counts every request and its latency by route template (``/v1/policies/{policy_id}``,
  not the raw path) and method, with bounded label values: every unmatched path
  is ``"unmatched"`` and every method outside :data:`METHODS` is ``"other"``
  (:func:`method_label`), so no client can add metric series. A request that
  ends in an unhandled exception is counted with status ``"500"``.

``POST /v1/plan`` (the hot path) is answered by :class:`PlanFastPath` instead,
which the app's ``__call__`` runs before anything of FastAPI or Starlette
(:func:`kvsplit.service.app.create_app`): the same body limit and metrics, then
the body goes straight to :func:`kvsplit.service.routers.plan.handle_plan`. That
skips FastAPI's per-request native-telemetry check (~15 µs: it looks up the
OpenTelemetry providers and environment on every request), Starlette's error
middleware, routing, dependency solving and the Response object. The FastAPI
route of ``/v1/plan`` calls the same function and documents the schemas in
OpenAPI; it answers only when the fast path is not installed. A ``POST /v1/plan`` that reaches
:class:`GuardMiddleware` (an app mounted under another path) is handed to the same
:class:`PlanFastPath`. Consequence: FastAPI's
native OpenTelemetry (if configured) sees no ``POST /v1/plan`` requests; the
Prometheus metrics count them.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import orjson

from . import metrics
from .routers.plan import handle_plan

__all__ = ["GuardMiddleware", "PlanFastPath", "PLAN_ROUTE", "METHODS", "method_label", "INTERNAL_ERROR"]

log = logging.getLogger("kvsplit.service")

METHODS = frozenset(("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"))
"""The HTTP methods (RFC 9110) counted under their own name in the request metrics."""
INTERNAL_ERROR = b'{"detail":"internal server error (logged by the service)"}'
"""The body of a 500 answer (the traceback goes to the service's log, never to the client)."""


def method_label(method: str) -> str:
    """The ``method`` label of a request: the method itself when in :data:`METHODS`, else ``"other"``."""
    return method if method in METHODS else "other"


_BODY_METHODS = frozenset(("POST", "PUT", "PATCH", "DELETE"))
PLAN_ROUTE = "/v1/plan"
_START = "http.response.start"
_BODY = "http.response.body"
_CT_JSON = (b"content-type", b"application/json")


async def _send_json(send: Any, status: int, payload: dict, headers: list | None = None) -> None:
    """An error answer that closes the connection (its body may be unread)."""
    body = orjson.dumps(payload)
    hdrs = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ] + (headers or [])
    await send({"type": "http.response.start", "status": status, "headers": hdrs})
    await send({"type": "http.response.body", "body": body})


async def _read_request(scope: dict, receive: Any, send: Any, limit: int) -> tuple[int, bytes, bytes | None]:
    """Read a request body of at most ``limit`` bytes: ``(0, body, Content-Type)``.

    Otherwise answers and returns the status with an empty body: 400 for a
    Content-Length that is not an integer, 413 when the declared or the counted
    (chunked) length is over ``limit``, checked before anything is parsed and
    after each chunk; 499 (nothing sent) when the client left first.
    """
    declared = None
    content_type = None
    for k, v in scope["headers"]:
        if k == b"content-length" and declared is None:
            try:
                declared = int(v)
            except ValueError:
                await _send_json(send, 400, {"detail": "invalid Content-Length header"})
                return 400, b"", None
        elif k == b"content-type" and content_type is None:
            content_type = v
    if declared is not None and declared > limit:
        await _send_json(send, 413, _too_large(declared, limit))
        return 413, b"", None
    msg = await receive()
    if msg["type"] == "http.disconnect":
        return 499, b"", None  # the client went away before sending its body
    body = msg.get("body", b"")
    total = len(body)
    chunks = [body]
    while msg.get("more_body", False) and total <= limit:  # chunked or split: collect, counting against the limit
        msg = await receive()
        if msg["type"] == "http.disconnect":
            return 499, b"", None
        chunk = msg.get("body", b"")
        total += len(chunk)
        chunks.append(chunk)
    if total > limit:
        await _send_json(send, 413, _too_large(None, limit))
        return 413, b"", None
    return 0, (body if len(chunks) == 1 else b"".join(chunks)), content_type


class GuardMiddleware:
    """Body-size limit + Prometheus request metrics (module doc).

    Parameters
    ----------
    app : ASGI app
    max_body_bytes : int
        Largest accepted request body, bytes (``KVSPLIT_MAX_BODY_BYTES``, 2 MiB).
    """

    def __init__(self, app: Any, max_body_bytes: int, plan_state: Any = None) -> None:
        self.app = app
        self.max_body = int(max_body_bytes)
        # POST /v1/plan reaching the guard (an app mounted under another path) takes the same fast path
        self._plan = PlanFastPath(plan_state, max_body_bytes) if plan_state is not None else None

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method = scope["method"]
        if self._plan is not None and method == "POST" and scope["path"] == PLAN_ROUTE:
            await self._plan(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = [500]

        async def send_wrapped(msg: dict) -> None:
            if msg["type"] == "http.response.start":
                status[0] = msg["status"]
            await send(msg)

        try:
            if method not in _BODY_METHODS:
                await self.app(scope, receive, send_wrapped)
                return
            code, body, _ = await _read_request(scope, receive, send, self.max_body)
            if code:
                status[0] = code
                return
            replayed = False

            async def replay() -> dict:
                nonlocal replayed
                if not replayed:
                    replayed = True
                    return {"type": "http.request", "body": body, "more_body": False}
                return await receive()

            await self.app(scope, replay, send_wrapped)
        finally:
            route = scope.get("route")
            label = getattr(route, "path", None) or "unmatched"
            m = method_label(method)
            metrics.REQUESTS.labels(label, m, str(status[0])).inc()
            metrics.LATENCY.labels(label, m).observe(time.perf_counter() - t0)


def _too_large(n: int | None, limit: int) -> dict:
    got = f"{n} bytes" if n is not None else "more"
    return {"detail": f"request body too large: {got}, limit {limit} bytes (KVSPLIT_MAX_BODY_BYTES)"}


class PlanFastPath:
    """``POST /v1/plan`` as a bare ASGI callable (module doc): body limit, plan, metrics.

    Same answers as the route behind :class:`GuardMiddleware`: 400 for a bad
    ``Content-Length``, 413 over ``max_body_bytes`` (declared or counted), then
    :func:`~kvsplit.service.routers.plan.handle_plan`'s status and body. A
    success keeps the connection open (no ``Connection`` header); the 400/413
    answers close it, as the guard's do. An exception of ``handle_plan`` (a bug:
    every bad body is a 4xx) is logged with its traceback and answered 500 with
    :data:`INTERNAL_ERROR`, counted as 500.
    """

    __slots__ = ("state", "max_body", "_requests", "_observe")

    def __init__(self, state: Any, max_body_bytes: int) -> None:
        self.state = state
        self.max_body = int(max_body_bytes)
        # the children bound once, updated through metrics.adder / observer (the client's own values)
        self._requests = {
            s: metrics.adder(metrics.REQUESTS.labels(PLAN_ROUTE, "POST", str(s))) for s in (200, 422, 503)
        }
        self._observe = metrics.observer(metrics.LATENCY.labels(PLAN_ROUTE, "POST"))

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        t0 = time.perf_counter()
        status = 500
        try:
            code, body, content_type = await _read_request(scope, receive, send, self.max_body)
            if code:
                status = code
                return
            try:
                status, out = handle_plan(body, self.state, content_type)
            except Exception:
                log.exception("POST %s: unhandled error (answered 500)", PLAN_ROUTE)
                status, out = 500, INTERNAL_ERROR
            await send({"type": _START, "status": status, "headers": [_CT_JSON, (b"content-length", b"%d" % len(out))]})
            await send({"type": _BODY, "body": out})
        finally:
            c = self._requests.get(status)
            if c is not None:
                c()
            else:
                metrics.REQUESTS.labels(PLAN_ROUTE, "POST", str(status)).inc()
            self._observe(time.perf_counter() - t0)
