"""``GET /healthz`` and ``GET /metrics``."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from .. import metrics
from ..schemas import Health

router = APIRouter(tags=["health"])


@router.get(
    "/healthz", operation_id="healthz", summary="Liveness and the served table's version", response_model=Health
)
def healthz(request: Request) -> dict:
    holder = request.app.state.holder
    cur = holder.current
    return {
        "status": "ok" if cur is not None and holder.last_error is None else "degraded",
        "policies_version": None if cur is None else cur.version,
        "policies_loaded": 0 if cur is None else len(cur.table),
        "last_reload_error": holder.last_error,
    }


@router.get(
    "/metrics",
    operation_id="metrics",
    summary="Prometheus metrics (kvsplit_*)",
    response_class=Response,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
)
def prometheus_metrics() -> Response:
    return Response(metrics.render(), media_type=metrics.CONTENT_TYPE_LATEST)
