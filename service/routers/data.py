"""Read-only store routes: buckets, tuning runs, measurements."""

from __future__ import annotations

from typing import Annotated, Literal, Optional

from fastapi import APIRouter, Query

from .. import queries
from ..deps import FamilyFilterDep, SettingsDep
from ..schemas import BucketList, MeasurementList, RunList

router = APIRouter(tags=["store"])


@router.get(
    "/v1/buckets",
    operation_id="list_buckets",
    summary="Tuned buckets and their published policy",
    response_model=BucketList,
)
def list_buckets(settings: SettingsDep, family: FamilyFilterDep) -> dict:
    data = queries.list_buckets(settings.database_url, **family._asdict())
    return {"count": len(data), "data": data}


@router.get("/v1/runs", operation_id="list_runs", summary="Tuning runs, newest first", response_model=RunList)
def list_runs(
    settings: SettingsDep,
    bucket: Annotated[Optional[str], Query(max_length=512)] = None,
    status: Annotated[Optional[Literal["running", "finished", "interrupted", "failed"]], Query()] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> dict:
    data = queries.list_runs(settings.database_url, bucket=bucket, status=status, limit=limit)
    return {"count": len(data), "data": data}


@router.get(
    "/v1/measurements",
    operation_id="list_measurements",
    summary="Stored measurements, oldest first",
    response_model=MeasurementList,
)
def list_measurements(
    settings: SettingsDep,
    bucket: Annotated[Optional[str], Query(max_length=512)] = None,
    policy_name: Annotated[Optional[str], Query(max_length=64)] = None,
    stage: Annotated[Optional[str], Query(max_length=32)] = None,
    limit: Annotated[int, Query(ge=1, le=10000)] = 1000,
) -> dict:
    data = queries.list_measurements(
        settings.database_url, bucket=bucket, policy_name=policy_name, stage=stage, limit=limit
    )
    return {"count": len(data), "data": data}
