"""Shared dependencies of the routers: settings, the served table, admin auth."""

from __future__ import annotations

import hmac
from typing import Annotated, Literal, NamedTuple, Optional

from fastapi import Depends, Header, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError

from ..kernels.limits import DTYPE_ALIASES, KV_DTYPE_SHORT
from ..kernels.plan import HEAD_DIMS
from . import queries
from .schemas import DTYPE_VALUES, KV_DTYPE_VALUES
from .settings import Settings
from .state import ServedTable, TableHolder

__all__ = [
    "get_settings",
    "get_holder",
    "get_served",
    "require_admin",
    "SettingsDep",
    "ServedDep",
    "HolderDep",
    "AdminDep",
    "check_head_dim",
    "GpuFilter",
    "NumKvHeadsFilter",
    "HeadDimFilter",
    "DtypeFilter",
    "PageSizeFilter",
    "KvDtypeFilter",
    "QLenFilter",
    "dtype_filter_name",
]


def get_settings(request: Request) -> Settings:
    """FastAPI dependency: the app's :class:`~kvsplit.service.settings.Settings` (set at startup)."""
    return request.app.state.settings


def get_holder(request: Request) -> TableHolder:
    """FastAPI dependency: the app's :class:`~kvsplit.service.state.TableHolder` (the served table and its reloads)."""
    return request.app.state.holder


def get_served(request: Request) -> ServedTable:
    """FastAPI dependency: the current :class:`~kvsplit.service.state.ServedTable` snapshot.

    Raises
    ------
    HTTPException
        503 before the app's startup has loaded the table.
    """
    served = request.app.state.holder.current
    if served is None:  # only before the lifespan finished loading
        raise HTTPException(503, "policy table not loaded yet")
    return served


def require_admin(request: Request, authorization: Annotated[Optional[str], Header()] = None) -> None:
    """Bearer-token check of the admin routes.

    403 when the server has no ``KVSPLIT_ADMIN_TOKEN`` (admin routes disabled),
    401 with ``WWW-Authenticate: Bearer`` on a missing or wrong token.
    """
    token = request.app.state.settings.admin_token
    if not token:
        raise HTTPException(403, "admin routes are disabled: start the server with KVSPLIT_ADMIN_TOKEN set")
    given = ""
    if authorization:
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() == "bearer":
            given = value.strip()
    if not given or not hmac.compare_digest(given.encode("utf-8", "surrogateescape"), token.encode("utf-8")):
        raise HTTPException(
            401,
            "admin route: missing or wrong bearer token (Authorization: Bearer <token>)",
            headers={"WWW-Authenticate": "Bearer"},
        )


def check_head_dim(head_dim: Optional[int]) -> None:
    """422 (FastAPI's shape) unless the ``head_dim`` query filter is None or 64/128/256."""
    if head_dim is not None and head_dim not in HEAD_DIMS:
        raise RequestValidationError(
            [
                {
                    "type": "literal_error",
                    "loc": ("query", "head_dim"),
                    "msg": "Input should be 64, 128 or 256",
                    "input": head_dim,
                }
            ]
        )


SettingsDep = Annotated[Settings, Depends(get_settings)]
HolderDep = Annotated[TableHolder, Depends(get_holder)]
ServedDep = Annotated[ServedTable, Depends(get_served)]
AdminDep = Depends(require_admin)

# the shape filters of the list routes (GET /v1/policies, GET /v1/buckets): query parameters, all optional, taken
# and normalized by one dependency (:func:`family_filter`)
GpuFilter = Annotated[Optional[str], Query(min_length=1, max_length=200)]
NumKvHeadsFilter = Annotated[Optional[int], Query(ge=1, le=1024)]
HeadDimFilter = Annotated[Optional[int], Query(json_schema_extra={"enum": list(HEAD_DIMS)})]
DtypeFilter = Annotated[
    Optional[Literal[DTYPE_VALUES]],  # type: ignore[valid-type]
    Query(description="q's dtype: torch's name or its alias, as POST /v1/plan takes it"),
]
PageSizeFilter = Annotated[Optional[int], Query(ge=1, le=256)]
KvDtypeFilter = Annotated[
    Optional[Literal[KV_DTYPE_VALUES]],  # type: ignore[valid-type]
    Query(description="the KV cache's dtype of the policies' family (fp8: float8_e4m3fn)"),
]
QLenFilter = Annotated[Optional[int], Query(ge=1, le=8, description="query tokens per request of the family")]


def dtype_filter_name(kv_dtype: str | None) -> str | None:
    """A ``DtypeFilter`` or ``KvDtypeFilter`` value as the name the entries record (``bf16`` -> ``bfloat16``,
    ``fp8`` -> ``float8_e4m3fn``)."""
    if kv_dtype is None:
        return None
    return {s: k for k, s in KV_DTYPE_SHORT.items()}.get(kv_dtype) or DTYPE_ALIASES.get(kv_dtype, kv_dtype)


class FamilyFilter(NamedTuple):
    """The shape filters of a list route, normalized as the entries record them (None: any): the GPU's table
    name (:func:`kvsplit.service.queries.canonical_gpu`), q's and the KV cache's dtype names
    (:func:`dtype_filter_name`). In this order it is :meth:`kvsplit.service.state.ServedTable.filtered`'s tuple."""

    gpu: str | None
    num_kv_heads: int | None
    head_dim: int | None
    dtype: str | None
    page_size: int | None
    kv_dtype: str | None
    q_len: int | None


def family_filter(
    gpu: GpuFilter = None,
    num_kv_heads: NumKvHeadsFilter = None,
    head_dim: HeadDimFilter = None,
    dtype: DtypeFilter = None,
    page_size: PageSizeFilter = None,
    kv_dtype: KvDtypeFilter = None,
    q_len: QLenFilter = None,
) -> FamilyFilter:
    """The list routes' shape query parameters as a :class:`FamilyFilter`; a ``head_dim`` other than 64/128/256 is
    a 422 (:func:`check_head_dim`)."""
    check_head_dim(head_dim)
    return FamilyFilter(
        None if gpu is None else queries.canonical_gpu(gpu),
        num_kv_heads,
        head_dim,
        dtype_filter_name(dtype),
        page_size,
        dtype_filter_name(kv_dtype),
        q_len,
    )


FamilyFilterDep = Annotated[FamilyFilter, Depends(family_filter)]
