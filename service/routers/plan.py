"""``POST /v1/plan``: the plan of one decode batch under the published policies.

Kept lean for throughput (docs/decisions/compiled-planner.md; figures in docs/results.md, "Planner and service speed"). The common request
(a header seen before, lengths as plain JSON integers) takes the compiled answer path
(:func:`_fast_answer`): the kv_lens list is read by the compiled scan of
:mod:`kvsplit.service.fastparse` and the header is recognized by its bytes
(:func:`kvsplit.service.validation.scan_request`), one compiled call computes
the bucket key, the nearest published policy and the plan
(:meth:`~kvsplit.kernels.policy_table.PolicyTable.plan_buffers`), and the
answer's integer arrays are written by :mod:`kvsplit.service.fastjson` between
per-policy constant text: about 30 µs in-process for B = 256 on a 2-core VM,
against about 49 µs for the full path below. Everything else takes the full
path: the raw body parsed with orjson and validated with NumPy
(:mod:`kvsplit.service.validation`), :meth:`PolicyTable.plan` and the answer
serialized with orjson straight from the NumPy arrays (:func:`plan_answer`),
which gives every error message. Both count the answered batch in the traffic
statistics (:class:`kvsplit.service.traffic.TrafficRecorder`, ``state.holder.traffic``;
None when ``KVSPLIT_TRAFFIC=0``): a dict update under a lock, no database access. Both write the same bytes
(tests/service/test_plan_answer.py). The request / response schemas are still
declared for OpenAPI.
"""

from __future__ import annotations

import functools
import types

import orjson
from fastapi import APIRouter, Request, Response

from ...kernels.workplan import made_for
from .. import fastjson, fastparse, metrics, validation
from ..schemas import ErrorDetail, PlanResponse, ValidationErrorOut
from ..traffic import SOURCE_INDEX as _SOURCE
from ..validation import RequestValidationFailed, error, parse_plan_request, scan_request, unsupported_media_type

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
        "made_for": made_for(plan),
        "bucket": bucket,
        "policy": policy,
    }
    return orjson.dumps(d, option=_OPT)


_JSON = b"application/json"
_KV_OPEN = b'{"kv_lens":'
_FRAGS: dict[tuple[int, int], tuple] = {}
"""(id(spec), id(entry or table)) -> (spec, entry or table, lookup counter, the constant parts of the answer's
tail): JSON text of a published policy and of its parsed parameters, which are fixed for the table's life (the
bucket key and distance of each batch are written per request). Bounded; never a batch's plan or lookup."""
_FRAGS_MAX = 4096


def _fragments(sp, entry, table) -> tuple:
    """The constant parts of the answer after the arrays for a parsed policy and its table entry (None: the
    table's fallback), the text :func:`plan_answer` writes around the bucket's key and distance."""
    owner = table if entry is None else entry
    hit = _FRAGS.get((id(sp), id(owner)))
    if hit is not None and hit[0] is sp and hit[1] is owner:
        return hit
    f = sp.fields
    head = orjson.dumps(
        {
            "config": _config_dict(f["config"]),
            "params": sp.params,
            "made_for": made_for(types.SimpleNamespace(**f)),
        }
    )
    if entry is None:
        source = "fallback"
        name, params = table.fallback_for(f["kv_dtype"], f["q_len"])
        policy = {"id": None, "version": None, "name": name, "params": params, "source": "fallback"}
        matched = b',"matched":null,"distance":null'
    else:
        source = entry.source
        policy = entry.info()
        matched = b',"matched":' + orjson.dumps(entry.bucket) + b',"distance":'
    counter = _LOOKUPS.get(source)
    if counter is None:
        counter = _LOOKUPS[source] = metrics.PLAN_LOOKUPS.labels(source)
    hit = (
        sp,
        owner,
        metrics.adder(counter),
        head[1:-1] + b',"bucket":{"key":"',
        b'"' + matched,
        b'},"policy":' + orjson.dumps(policy) + b"}",
    )
    if len(_FRAGS) >= _FRAGS_MAX:
        _FRAGS.clear()
    _FRAGS[(id(sp), id(owner))] = hit
    return hit


def _fast_answer(body: bytes, state) -> bytes | None:
    """The answer of a common request on the compiled path (parse, plan, write), or None: run the full path.

    The same bytes as :func:`plan_answer` of :meth:`PolicyTable.plan`'s result (tests compare them): the
    arrays are written by :mod:`kvsplit.service.fastjson` from the planner's buffers (the request's
    ``kv_lens`` list copied when it is plain), the rest from per-policy constant text around the bucket
    key and distance. Anything unusual (a request the scan or the header memo does not take, no table, a
    ValueError of the planner, a policy outside the compiled core) returns None, and the full path gives
    the answer or the error message.
    """
    found = scan_request(body, state.settings.max_kv_len)
    if found is None:
        return None
    kv, header, start, end, plain, total = found
    holder = state.holder
    served = holder.current
    if served is None:
        return None
    table = served.table
    try:
        raw = table.plan_buffers(kv, header[7])
    except ValueError:
        return None
    if raw is None:
        return None
    B, W, nc, b64, b32, sp, key, entry, distance = raw
    _, _, count, head, matched, policy = _fragments(sp, entry, table)
    count()
    traffic = getattr(holder, "traffic", None)  # a plain attribute (state's own lookup costs ~0.4 µs)
    if traffic is not None:
        traffic.record(key.tobytes(), B, total, _SOURCE[entry.source] if entry is not None else 3, distance)
    arrays = fastjson.buffers_json(b64, b32, B, W, nc, not plain)
    if entry is None:  # (the key's characters need no escaping: letters, digits, '.', '-')
        return b"".join(
            (_KV_OPEN, body[start:end], arrays, head, key, matched, policy)
            if plain
            else (arrays, head, key, matched, policy)
        )
    d = orjson.dumps(distance)
    return b"".join(
        (_KV_OPEN, body[start:end], arrays, head, key, matched, d, policy)
        if plain
        else (arrays, head, key, matched, d, policy)
    )


def handle_plan(body: bytes, state, content_type: bytes | str | None = None) -> tuple[int, bytes]:
    """Validate, plan and serialize one ``POST /v1/plan`` body: ``(status, JSON bytes)``.

    ``content_type`` is the request's Content-Type header (None when absent):
    415 unless it is JSON (:func:`~kvsplit.service.validation.unsupported_media_type`).

    Shared by the route below and the ASGI fast path of
    :class:`kvsplit.service.middleware.GuardMiddleware` (which answers
    ``POST /v1/plan`` without FastAPI's routing and dependency machinery).
    The common request takes the compiled path (:func:`_fast_answer`), the
    rest :func:`parse_plan_request`, :meth:`PolicyTable.plan` and :func:`plan_answer`.
    """
    if content_type is not None and content_type != _JSON:
        bad_type = unsupported_media_type(content_type)
        if bad_type is not None:
            return 415, bad_type
    if fastparse.ENABLED and fastjson.ENABLED and type(body) is bytes and validation.HEADER_CACHE:
        out = _fast_answer(body, state)
        if out is not None:
            return 200, out
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
    traffic = getattr(state.holder, "traffic", None)
    if traffic is not None:
        traffic.record(
            bucket["key"].encode(),
            int(p.kv_lens.shape[0]),
            int(p.kv_lens.sum()),
            _SOURCE[src],
            bucket["distance"],
        )
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
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/PlanRequest"}}},
        }
    },
)
async def plan(request: Request) -> Response:
    """Plan a batch: Plan.to_dict() at the top level plus `bucket` and `policy` (docs/concepts/design.md §3)."""
    status, out = handle_plan(await request.body(), request.app.state, request.headers.get("content-type"))
    return Response(out, status_code=status, media_type="application/json")
