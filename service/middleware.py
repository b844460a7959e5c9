"""Pure-ASGI middleware of the plan service: body-size limit and request metrics.

One layer (not Starlette's ``BaseHTTPMiddleware``, which costs a task and a
stream per request) that

* refuses request bodies over ``max_body_bytes`` with 413 **before** anything
  parses them: first by ``Content-Length``, then by counting the streamed bytes
  (chunked uploads), and
* counts every request and its latency by route template (``/v1/policies/{policy_id}``,
  not the raw path, so label cardinality stays bounded; unmatched paths are
  ``"unmatched"``).

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

import time
from typing import Any

import orjson

from . import metrics
from .routers.plan import handle_plan

__all__ = ["GuardMiddleware", "PlanFastPath", "PLAN_ROUTE"]

_BODY_METHODS = frozenset(("POST", "PUT", "PATCH", "DELETE"))
PLAN_ROUTE = "/v1/plan"
_START = "http.response.start"
_BODY = "http.response.body"
_CT_JSON = (b"content-type", b"application/json")


async def _send_json(send: Any, status: int, payload: dict, headers: list | None = None) -> None:
    """An error answer that closes the connection (its body may be unread)."""
    body = orjson.dumps(payload)
    hdrs = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"connection", b"close")] + (headers or [])
    await send({"type": "http.response.start", "status": status, "headers": hdrs})
    await send({"type": "http.response.body", "body": body})


def _scan_headers(headers: Any) -> tuple[int | None, bytes | None]:
    """``(Content-Length, Content-Type)`` of an ASGI header list (first of each, None when absent).

    Raises
    ------
    ValueError
        On a Content-Length that is not an integer.
    """
    declared = None
    content_type = None
    for k, v in headers:
        if k == b"content-length" and declared is None:
            declared = int(v)
        elif k == b"content-type" and content_type is None:
            content_type = v
    return declared, content_type


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

    def _too_large(self, n: int | None) -> dict:
        return _too_large(n, self.max_body)

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
            try:
                declared, _ = _scan_headers(scope["headers"])
            except ValueError:
                status[0] = 400
                await _send_json(send, 400, {"detail": "invalid Content-Length header"})
                return
            if declared is not None and declared > self.max_body:
                status[0] = 413
                await _send_json(send, 413, self._too_large(declared))
                return
            chunks = []
            total = 0
            more = True
            while more:
                msg = await receive()
                if msg["type"] == "http.disconnect":
                    status[0] = 499  # client went away before sending its body
                    return
                chunk = msg.get("body", b"")
                total += len(chunk)
                if total > self.max_body:
                    status[0] = 413
                    await _send_json(send, 413, self._too_large(None))
                    return
                if chunk:
                    chunks.append(chunk)
                more = msg.get("more_body", False)
            body = b"".join(chunks)
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
            metrics.REQUESTS.labels(label, method, str(status[0])).inc()
            metrics.LATENCY.labels(label, method).observe(time.perf_counter() - t0)


def _too_large(n: int | None, limit: int) -> dict:
    got = f"{n} bytes" if n is not None else "more"
    return {"detail": f"request body too large: {got}, limit {limit} bytes (KVSPLIT_MAX_BODY_BYTES)"}


class PlanFastPath:
    """``POST /v1/plan`` as a bare ASGI callable (module doc): body limit, plan, metrics.

    Same answers as the route behind :class:`GuardMiddleware`: 400 for a bad
    ``Content-Length``, 413 over ``max_body_bytes`` (declared or counted), then
    :func:`~kvsplit.service.routers.plan.handle_plan`'s status and body. A
    success keeps the connection open (no ``Connection`` header); the 400/413
    answers close it, as the guard's do. An exception propagates to the server
    (uvicorn answers 500 and logs it) and is counted as 500.
    """

    __slots__ = ("state", "max_body", "_requests", "_latency")

    def __init__(self, state: Any, max_body_bytes: int) -> None:
        self.state = state
        self.max_body = int(max_body_bytes)
        self._requests = {s: metrics.REQUESTS.labels(PLAN_ROUTE, "POST", str(s)) for s in (200, 422, 503)}
        self._latency = metrics.LATENCY.labels(PLAN_ROUTE, "POST")

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        t0 = time.perf_counter()
        status = 500
        try:
            try:
                declared, content_type = _scan_headers(scope["headers"])
            except ValueError:
                status = 400
                await _send_json(send, 400, {"detail": "invalid Content-Length header"})
                return
            limit = self.max_body
            if declared is not None and declared > limit:
                status = 413
                await _send_json(send, 413, _too_large(declared, limit))
                return
            msg = await receive()
            if msg["type"] == "http.disconnect":
                status = 499  # client went away before sending its body
                return
            body = msg.get("body", b"")
            if msg.get("more_body", False):  # chunked or split: collect, counting against the limit
                chunks = [body]
                total = len(body)
                more = True
                while more:
                    msg = await receive()
                    if msg["type"] == "http.disconnect":
                        status = 499
                        return
                    chunk = msg.get("body", b"")
                    total += len(chunk)
                    if total > limit:
                        status = 413
                        await _send_json(send, 413, _too_large(None, limit))
                        return
                    chunks.append(chunk)
                    more = msg.get("more_body", False)
                body = b"".join(chunks)
            elif len(body) > limit:
                status = 413
                await _send_json(send, 413, _too_large(None, limit))
                return
            status, out = handle_plan(body, self.state, content_type)
            await send({"type": _START, "status": status, "headers": [_CT_JSON, (b"content-length", b"%d" % len(out))]})
            await send({"type": _BODY, "body": out})
        finally:
            c = self._requests.get(status)
            (c if c is not None else metrics.REQUESTS.labels(PLAN_ROUTE, "POST", str(status))).inc()
            self._latency.observe(time.perf_counter() - t0)

