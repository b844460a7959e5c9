"""``POST /v1/plan``: the plan of one decode batch under the published policies.

Kept lean for throughput (docs/perf.md, "Plan service"): the raw body is parsed
with orjson and validated with NumPy (:mod:`kvsplit.service.validation`), the
plan comes from the served :class:`~kvsplit.kernels.policy_table.PolicyTable`
snapshot and the answer is serialized with orjson straight from the NumPy
arrays. The request / response schemas are still declared for OpenAPI.
"""

from __future__ import annotations

import functools

import orjson
from fastapi import APIRouter, Request, Response

from .. import metrics
from ..schemas import PlanResponse, ValidationErrorOut, ErrorDetail
from ..validation import RequestValidationFailed, error, parse_plan_request, unsupported_media_type

router = APIRouter(tags=["plan"])

_OPT = orjson.OPT_SERIALIZE_NUMPY
_LOOKUPS: dict = {}  # policy source -> its bound kvsplit_plan_lookups_total child (labels() costs ~1 µs a call)


@functools.lru_cache(maxsize=1024)
def _config_dict(config) -> dict:
    """``KernelConfig.to_dict()`` memoized (frozen, hashable; dataclasses.asdict costs ~15 µs). Read-only use."""
    return config.to_dict()


def plan_answer(plan, bucket: dict, policy: dict) -> bytes:
    """Serialize ``Plan.to_dict()`` + bucket + policy (NumPy arrays written directly)."""
    d = {
        "kv_lens": plan.kv_lens,
        "num_splits": plan.num_splits,
        "work_request": plan.work_request,
        "work_kv_start": plan.work_kv_start,
        "work_kv_end": plan.work_kv_end,
        "cta_indptr": plan.cta_indptr,
        "config": _config_dict(plan.config),
        "params": plan.params,
        "made_for": {"num_kv_heads": plan.num_kv_heads, "head_dim": plan.head_dim, "page_size": plan.page_size,
                     "dtype": plan.dtype, "gpu": plan.gpu},
        "bucket": bucket,
        "policy": policy,
    }
    return orjson.dumps(d, option=_OPT)


def handle_plan(body: bytes, state, content_type: bytes | str | None = None) -> tuple[int, bytes]:
    """Validate, plan and serialize one ``POST /v1/plan`` body: ``(status, JSON bytes)``.

    ``content_type`` is the request's Content-Type header (None when absent):
    415 unless it is JSON (:func:`~kvsplit.service.validation.unsupported_media_type`).

    Shared by the route below and the ASGI fast path of
    :class:`kvsplit.service.middleware.GuardMiddleware` (which answers
    ``POST /v1/plan`` without FastAPI's routing and dependency machinery).
    """
    bad_type = unsupported_media_type(content_type)
    if bad_type is not None:
        return 415, bad_type
    try:
        req = parse_plan_request(body, max_kv_len=state.settings.max_kv_len)
    except RequestValidationFailed as exc:
        return 422, exc.body()
    served = state.holder.current
    if served is None:
        return 503, b'{"detail":"policy table not loaded yet"}'
    try:
        p, bucket, policy = served.table.plan(req.kv_lens, req.shape)
    except ValueError as exc:  # e.g. a device whose numbers make the policy's knobs infeasible
        return 422, orjson.dumps({"detail": [error("value_error", ("body",), f"Value error, {exc}")]})
    src = policy["source"]
    c = _LOOKUPS.get(src)
    if c is None:
        c = _LOOKUPS[src] = metrics.PLAN_LOOKUPS.labels(src)
    c.inc()
    return 200, plan_answer(p, bucket, policy)


@router.post(
    "/v1/plan",
    operation_id="plan",
    summary="Plan one decode batch",
    response_model=PlanResponse,
    responses={
        413: {"model": ErrorDetail, "description": "request body over the size limit (2 MiB)"},
        415: {"model": ErrorDetail, "description": "Content-Type is not application/json"},
        422: {"model": ValidationErrorOut, "description": "invalid request (field path and index in loc)"},
        503: {"model": ErrorDetail, "description": "policy table not loaded yet"},
    },
    openapi_extra={"requestBody": {"required": True, "content": {
        "application/json": {"schema": {"$ref": "#/components/schemas/PlanRequest"}}}}},
)
async def plan(request: Request) -> Response:
    """Plan a batch: Plan.to_dict() at the top level plus `bucket` and `policy` (DESIGN.md §3)."""
    status, out = handle_plan(await request.body(), request.app.state, request.headers.get("content-type"))
    return Response(out, status_code=status, media_type="application/json")
