"""Policy routes: the table (``GET /v1/policies``, ETag), one policy, and the admin routes."""

from __future__ import annotations

import asyncio
import logging
from typing import Annotated

import orjson
from fastapi import APIRouter, HTTPException, Path, Query, Request, Response
from fastapi.concurrency import run_in_threadpool

from ...db import store
from ...db.checks import check_json_tree
from ...db.transfer import parse_export
from ...kernels.policy_table import check_policy_entry
from .. import queries
from ..deps import AdminDep, FamilyFilter, FamilyFilterDep, HolderDep, ServedDep, SettingsDep
from ..schemas import ErrorDetail, ImportResult, PolicyDetail, PolicyStatusOut, PolicyTableDoc, ValidationErrorOut
from ..validation import unsupported_media_type

router = APIRouter(tags=["policies"])
log = logging.getLogger("kvsplit.service")

PolicyId = Annotated[int, Path(ge=1, le=2**63 - 1, description="policy id")]
_ADMIN_RESPONSES = {
    401: {"model": ErrorDetail, "description": "missing or wrong bearer token"},
    403: {"model": ErrorDetail, "description": "admin routes disabled (no KVSPLIT_ADMIN_TOKEN)"},
}


def _etag_matches(header: str | None, etag: str) -> bool:
    if not header:
        return False
    for tag in header.split(","):
        tag = tag.strip()
        if tag == "*" or tag == etag or (tag.startswith("W/") and tag[2:] == etag):
            return True
    return False


# HEAD: the headers of GET (ETag, Content-Length) without the body
@router.head("/v1/policies", operation_id="head_policies", include_in_schema=False)
@router.get(
    "/v1/policies",
    operation_id="list_policies",
    summary="The published-policy table",
    response_model=PolicyTableDoc,
    responses={304: {"description": "not modified (If-None-Match matched the ETag)"}},
)
def list_policies(request: Request, served: ServedDep, family: FamilyFilterDep) -> Response:
    """Everything a client needs to plan in-process with identical results (kvsplit.kernels.policy_table).

    Poll with If-None-Match: the answer is 304 while the table is unchanged.
    """
    return _table_response(request, served, family, head=request.method == "HEAD")


def _table_response(request: Request, served, family: FamilyFilter, head: bool = False) -> Response:
    body, etag = served.filtered(tuple(family))
    headers = {"ETag": etag, "Cache-Control": "no-cache"}
    if _etag_matches(request.headers.get("if-none-match"), etag):
        return Response(status_code=304, headers=headers)
    if head:
        return Response(None, media_type="application/json", headers={**headers, "Content-Length": str(len(body))})
    return Response(body, media_type="application/json", headers=headers)


@router.get(
    "/v1/policies/{policy_id:int}",
    operation_id="get_policy",
    summary="One policy (any status) with its bucket and verification",
    response_model=PolicyDetail,
    responses={404: {"model": ErrorDetail, "description": "no such policy"}},
)
def get_policy(policy_id: PolicyId, settings: SettingsDep) -> Response:
    d = queries.policy_detail(settings.database_url, policy_id)
    if d is None:
        raise HTTPException(404, f"policy {policy_id} not found")
    try:
        return Response(orjson.dumps(d), media_type="application/json")
    except orjson.JSONEncodeError:  # a row written before the store checked its JSON fields
        return Response(orjson.dumps(_servable(d, policy_id)), media_type="application/json")


def _servable(d: dict, policy_id: int) -> dict:
    """``d`` with each JSON field that orjson cannot write (:func:`kvsplit.db.checks.check_json_tree` says
    why: nested deeper than its limit, an integer past 64 bits) replaced by ``{"unservable": reason}``."""
    out = dict(d)
    for k, v in d.items():
        if isinstance(v, (dict, list)):
            try:
                check_json_tree(k, v)
            except ValueError as exc:
                log.warning("policy %d: stored %s cannot be served: %s", policy_id, k, exc)
                out[k] = {"unservable": f"{str(exc)[:300]} (stored before the store checked JSON fields)"}
    return out


async def _after_write(holder) -> int:
    served = await asyncio.to_thread(holder.reload)
    return served.version


@router.post(
    "/v1/policies/import",
    operation_id="import_policies",
    summary="Import an export file (kvsplit db export); all or nothing",
    response_model=ImportResult,
    dependencies=[AdminDep],
    responses={
        **_ADMIN_RESPONSES,
        413: {"model": ErrorDetail, "description": "body over the size limit"},
        415: {"model": ErrorDetail, "description": "Content-Type is not application/json"},
        422: {
            "model": ValidationErrorOut,
            "description": "invalid file (not JSON, a field nested too "
            "deeply or too large, a bad value); nothing stored",
        },
        503: {"model": ErrorDetail, "description": "the policy store failed; nothing stored"},
        507: {"model": ErrorDetail, "description": "the store's disk is full; nothing stored"},
    },
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {
                    "schema": {
                        "type": "object",
                        "description": "the JSON of `kvsplit db export` (format kvsplit.policies, version 1)",
                        "required": ["format", "format_version", "policies"],
                        "properties": {
                            "format": {"type": "string", "enum": ["kvsplit.policies"]},
                            "format_version": {"type": "integer", "enum": [1]},
                            "exported_at": {"type": ["string", "null"], "format": "date-time"},
                            "policies_version": {"type": "integer"},
                            "policies": {"type": "array", "items": {"type": "object"}},
                        },
                    }
                }
            },
        }
    },
)
async def import_policies(request: Request, settings: SettingsDep, holder: HolderDep) -> Response:
    bad_type = unsupported_media_type(request.headers.get("content-type"))
    if bad_type is not None:
        return Response(bad_type, status_code=415, media_type="application/json")
    body = await request.body()

    def work() -> list[int]:
        data = parse_export(body, source="the body")  # the file check of `kvsplit db import` too
        with store.session_scope(settings.database_url, write=True) as s:
            return store.import_policies(s, data, validate_entry=check_policy_entry)

    try:
        ids = await run_in_threadpool(work)
    except store.ImportValidationError as exc:
        return Response(
            orjson.dumps({"detail": [{"type": "value_error", "loc": ["body"], "msg": str(exc), "input": None}]}),
            status_code=422,
            media_type="application/json",
        )
    version = await _after_write(holder)
    return Response(
        orjson.dumps({"imported": len(ids), "policy_ids": ids, "policies_version": version}),
        media_type="application/json",
    )


def _status_change(settings, policy_id: int, action: str, force: bool) -> PolicyStatusOut:
    with store.session_scope(settings.database_url, write=True) as s:
        try:
            p = store.publish(s, policy_id, force=force) if action == "publish" else store.retire(s, policy_id)
        except KeyError:
            raise HTTPException(404, f"policy {policy_id} not found") from None
        except store.PublishRefused as exc:
            raise HTTPException(409, f"publish refused: {exc}") from None
        status = p.status
    return PolicyStatusOut(id=policy_id, status=status, policies_version=0)


@router.post(
    "/v1/policies/{policy_id:int}/publish",
    operation_id="publish_policy",
    summary="Publish a policy (retires the bucket's previous one)",
    response_model=PolicyStatusOut,
    dependencies=[AdminDep],
    responses={
        **_ADMIN_RESPONSES,
        404: {"model": ErrorDetail, "description": "no such policy"},
        409: {
            "model": ErrorDetail,
            "description": "refused: failed verification, or would replace a "
            "GPU-measured or better policy (use force=true)",
        },
    },
)
async def publish_policy(
    policy_id: PolicyId,
    settings: SettingsDep,
    holder: HolderDep,
    force: Annotated[bool, Query(description="skip the publish rules")] = False,
) -> PolicyStatusOut:
    out = await run_in_threadpool(_status_change, settings, policy_id, "publish", force)
    out.policies_version = await _after_write(holder)
    return out


@router.post(
    "/v1/policies/{policy_id:int}/retire",
    operation_id="retire_policy",
    summary="Retire a policy (its bucket falls back to the default policy)",
    response_model=PolicyStatusOut,
    dependencies=[AdminDep],
    responses={**_ADMIN_RESPONSES, 404: {"model": ErrorDetail, "description": "no such policy"}},
)
async def retire_policy(policy_id: PolicyId, settings: SettingsDep, holder: HolderDep) -> PolicyStatusOut:
    out = await run_in_threadpool(_status_change, settings, policy_id, "retire", False)
    out.policies_version = await _after_write(holder)
    return out
