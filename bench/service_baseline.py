"""The plain FastAPI baselines of the plan-service benchmark (bench/service_bench.py).

What a straightforward service would do: FastAPI parses the ``POST /v1/plan``
body into a pydantic model with ``kv_lens: list[int]`` and returns it (no
planning at all). Run on the same server stack as ``kvsplit serve``:

    .venv/bin/uvicorn bench.service_baseline:app --loop uvloop --http httptools --port 8001 --no-access-log
"""

from __future__ import annotations

from fastapi import FastAPI
from pydantic import BaseModel

app = FastAPI(title="plain FastAPI baseline")


class PlanRequest(BaseModel):
    gpu: str
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    dtype: str
    page_size: int
    kv_lens: list[int]


@app.post("/v1/plan")
async def plan(req: PlanRequest) -> PlanRequest:
    return req


# The same baseline with a synchronous endpoint (FastAPI runs it in its thread
# pool), as many plain FastAPI services are written; uvicorn
# bench.service_baseline:app_sync ...
app_sync = FastAPI(title="plain FastAPI baseline (def endpoint)")


@app_sync.post("/v1/plan")
def plan_sync(req: PlanRequest) -> PlanRequest:
    return req


async def hello(scope, receive, send):
    """The server floor (not a baseline to beat): a raw ASGI app that reads the body and answers 11 bytes.

    What uvicorn + uvloop + httptools cost per request on this machine with no framework and no work:
    ``uvicorn bench.service_baseline:hello ...`` (``bench/service_bench.py --floor``).
    """
    if scope["type"] != "http":
        return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json"), (b"content-length", b"11")],
        }
    )
    await send({"type": "http.response.body", "body": b'{"ok":true}'})
