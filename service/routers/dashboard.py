"""``GET /``: the dashboard (server-rendered HTML, inline SVG charts, works offline)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

from .. import queries
from ..dashboard import render_dashboard
from ..deps import SettingsDep

router = APIRouter(tags=["dashboard"])


@router.get("/", operation_id="dashboard", response_class=HTMLResponse, include_in_schema=False)
def dashboard(settings: SettingsDep) -> HTMLResponse:
    return HTMLResponse(render_dashboard(queries.dashboard_data(settings.database_url)))
