"""The dashboard pages: ``GET /`` (summary), ``GET /shapes/{slug}`` (one shape), ``GET|POST /plan`` (plan viewer).

Server-rendered HTML with inline SVG (:mod:`kvsplit.service.dashboard`); works offline. A bad query parameter or
plan-viewer input answers 400 with an HTML page naming the argument; an unknown shape 404.
"""

from __future__ import annotations

from urllib.parse import parse_qs

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse
from starlette.concurrency import run_in_threadpool

from ..dashboard import render
from ..dashboard.pages import QueryError, shape_context, summary_context, table_query
from ..deps import SettingsDep

router = APIRouter(tags=["dashboard"])


def _table(request: Request):
    served = getattr(request.app.state.holder, "current", None)
    return None if served is None else served.table


def _message(status: int, heading: str, message: str, back: str = "/", version: int | str = "") -> HTMLResponse:
    return HTMLResponse(render("message.html", heading=heading, message=message, back=back, version=version), status)


@router.get("/", operation_id="dashboard", response_class=HTMLResponse, include_in_schema=False)
def dashboard(request: Request, settings: SettingsDep) -> HTMLResponse:
    return HTMLResponse(render("summary.html", **summary_context(settings.database_url, _table(request))))


@router.get("/shapes/{slug}", operation_id="dashboard_shape", response_class=HTMLResponse, include_in_schema=False)
def dashboard_shape(slug: str, request: Request, settings: SettingsDep) -> HTMLResponse:
    params = {k: v for k, v in request.query_params.items()}
    try:
        tq = table_query(params)
        ctx = shape_context(settings.database_url, slug, tq, _table(request))
    except QueryError as exc:
        return _message(400, "Invalid query parameter", str(exc), back=f"/shapes/{slug}")
    if ctx is None:
        return _message(404, "Unknown shape", f"slug: no bucket has the shape {slug[:120]!r}")
    return HTMLResponse(render("shape.html", **ctx))


def _shapes(url: str) -> list[dict]:
    from ..dashboard.render import shape_name
    from ..queries import dashboard_data

    shapes = [dict(s, model=shape_name(s["num_kv_heads"], s["head_dim"])) for s in dashboard_data(url)["shapes"]]
    if not shapes:  # an empty store: the main model's shape on the H200
        shapes = [
            dict(
                gpu="NVIDIA H200",
                num_kv_heads=4,
                head_dim=128,
                dtype="bfloat16",
                page_size=16,
                kv_dtype="bfloat16",
                q_len=1,
                slug="nvidia-h200.kv4.d128.bf16.p16",
                model=shape_name(4, 128),
            )
        ]
    return shapes


def _viewer(request: Request, settings, fields: dict[str, str]) -> HTMLResponse:
    from ..dashboard.viewer import (
        MAX_REQUESTS,
        MAX_TEXT,
        ViewerError,
        parse_kv_lens,
        trace_batch,
        trace_choices,
        viewer_context,
    )

    url = settings.database_url
    shapes = _shapes(url)
    ctx = {
        "shapes": shapes,
        "traces": trace_choices(),
        "max_requests": MAX_REQUESTS,
        "max_text": MAX_TEXT,
        "max_kv_len": settings.max_kv_len,
        "kv_text": "",
        "trace_value": "",
        "error": None,
        "result": None,
        "version": getattr(getattr(request.app.state.holder, "current", None), "version", ""),
        "shape_slug": shapes[0]["slug"],
    }
    status = 200
    try:
        unknown = sorted(set(fields) - {"shape", "kv_lens", "trace"})
        if unknown:
            raise ViewerError(f"{unknown[0][:40]}: unknown field; known: kv_lens, shape, trace")
        slug = fields.get("shape") or shapes[0]["slug"]
        sh = next((s for s in shapes if s["slug"] == slug), None)
        if sh is None:
            raise ViewerError(f"shape: {slug[:120]!r} is none of the store's shapes")
        ctx["shape_slug"] = slug
        lens = None
        if fields.get("trace"):
            ctx["trace_value"] = fields["trace"]
            name, _, b = fields["trace"].partition(":")
            if not b.isdigit():
                raise ViewerError(f"trace: expected NAME:B, got {fields['trace'][:40]!r}")
            # a verify step's kv_len counts its q_len tokens: a trace's shorter requests are raised to q_len, as the
            # tuner's and bench's batches are
            lens = [max(n, sh["q_len"]) for n in trace_batch(name, int(b))]
            ctx["kv_text"] = ", ".join(map(str, lens))
        elif "kv_lens" in fields:
            ctx["kv_text"] = fields["kv_lens"][:MAX_TEXT]
            lens = parse_kv_lens(fields["kv_lens"], max_kv_len=settings.max_kv_len)
        if lens is not None:
            ctx["result"] = viewer_context(url, _table(request), sh, lens)
    except ValueError as exc:  # ViewerError, or the planner refusing the shape (e.g. a GPU it does not know)
        ctx["error"] = str(exc)
        ctx["result"] = None
        status = 400
    return HTMLResponse(render("plan.html", **ctx), status)


@router.get("/plan", operation_id="dashboard_plan_viewer", response_class=HTMLResponse, include_in_schema=False)
def plan_viewer(request: Request, settings: SettingsDep) -> HTMLResponse:
    return _viewer(request, settings, dict(request.query_params.items()))


@router.post("/plan", operation_id="dashboard_plan_viewer_post", response_class=HTMLResponse, include_in_schema=False)
async def plan_viewer_post(request: Request, settings: SettingsDep) -> HTMLResponse:
    body = await request.body()
    try:
        parsed = parse_qs(body.decode("utf-8"), keep_blank_values=True, max_num_fields=10)
    except (UnicodeDecodeError, ValueError):
        return _message(400, "Invalid form", "body: expected an url-encoded form with kv_lens and shape", back="/plan")
    fields = {k: v[0] for k, v in parsed.items()}
    return await run_in_threadpool(_viewer, request, settings, fields)
