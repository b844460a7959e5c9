"""``GET /v1/traffic``: what the plan service served, per bucket key, over a window of hours."""

from __future__ import annotations

import asyncio
import logging
from typing import Annotated

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, Field

from ...db import store
from ..deps import SettingsDep
from ..traffic import FAR_DISTANCE, TrafficRow, current_hour, iso_hour, traffic_summary

router = APIRouter(tags=["store"])
log = logging.getLogger("kvsplit.service")

MAX_HOURS = 87_600
"""Largest ``hours`` window (ten years; the store keeps ``KVSPLIT_TRAFFIC_RETENTION_HOURS``)."""


class TrafficList(BaseModel):
    """The answer of ``GET /v1/traffic``."""

    hours: int = Field(description="window: the current hour and the hours - 1 before it")
    since: str = Field(description="start of the window's first hour (ISO 8601, UTC)")
    recording: bool = Field(description="whether this server records traffic (KVSPLIT_TRAFFIC)")
    retention_hours: int = Field(description="hours the store keeps (KVSPLIT_TRAFFIC_RETENTION_HOURS)")
    far_distance: float = Field(description="a request matched beyond this distance counts as far")
    count: int
    requests: int = Field(description="requests of all keys in the window")
    data: list[TrafficRow]


@router.get(
    "/v1/traffic",
    operation_id="get_traffic",
    summary="Served traffic per bucket key (counts and histograms, no kv_lens)",
    response_model=TrafficList,
)
async def get_traffic(
    request: Request,
    settings: SettingsDep,
    hours: Annotated[int, Query(ge=1, le=MAX_HOURS, description="window in hours (default 24)")] = 24,
    limit: Annotated[int, Query(ge=1, le=10_000, description="most keys, most requests first")] = 1000,
) -> dict:
    """Per bucket key, the requests served in the last ``hours`` hours: count, B and total-token ranges and
    log2 histograms, requests per source (tuned / simulated / fallback), far requests, max and mean distance.
    This server process's pending counts are flushed first; other workers' reach the store within
    ``KVSPLIT_TRAFFIC_FLUSH_INTERVAL_S``."""
    rec = request.app.state.traffic
    if rec is not None:
        try:
            await asyncio.to_thread(rec.flush)
        except Exception as exc:  # noqa: BLE001 - kept for the next flush; the store read below says more
            log.warning("traffic statistics flush before GET /v1/traffic failed: %s", exc)

    def read() -> list[TrafficRow]:
        with store.session_scope(settings.database_url) as s:
            return traffic_summary(s, hours=hours)

    rows = await asyncio.to_thread(read)
    since = current_hour() - hours + 1
    return {
        "hours": hours,
        "since": iso_hour(since),
        "recording": rec is not None,
        "retention_hours": settings.traffic_retention_hours,
        "far_distance": FAR_DISTANCE,
        "count": min(len(rows), limit),
        "requests": sum(r.requests for r in rows),
        "data": rows[:limit],
    }
