"""In-process cost of one ``POST /v1/plan`` request (not a test): where the server's time goes, no sockets.

Builds the service on a temporary SQLite store with the shipped H200 policy table (as
``bench/service_bench.py``), makes 400 distinct B = 256 bodies (the distribution of
``bench/plan_post.lua``) and prints, per request, median of ``--reps`` passes over the 400 bodies:

* the stages of :func:`kvsplit.service.routers.plan.handle_plan` timed in sequence: the full path
  (Content-Type check, parse + validation, ``PolicyTable.plan``, the answer's serialization with orjson)
  and, where the tree has it, the compiled answer path that serves the common request (the kv_lens scan
  and header memo, ``PolicyTable.plan_buffers``, the compiled writer), and
* the whole ASGI call (scope in, both response messages out) of ``kvsplit serve``'s app, of the plain
  FastAPI ``async def`` echo of ``bench/service_baseline.py`` and of its raw ASGI hello-world.

    .venv/bin/python -m bench.service_inprocess [--reps 7]      # from the repository root
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time

import numpy as np
import orjson

from kvsplit.tuner.workloads import plan_request_mix


def make_bodies(n: int = 400, batch: int = 256, seed: int = 12345) -> list[bytes]:
    """``n`` POST /v1/plan bodies of the reference shape, kv_lens from :func:`plan_request_mix`."""
    return [
        (
            '{"gpu":"NVIDIA H200","num_qo_heads":32,"num_kv_heads":4,"head_dim":128,'
            '"dtype":"bfloat16","page_size":16,"kv_lens":[' + ",".join(map(str, lens.tolist())) + "]}"
        ).encode()
        for lens in plan_request_mix(n, batch, seed=seed)
    ]


def scope_of(body: bytes) -> dict:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/plan",
        "raw_path": b"/v1/plan",
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"127.0.0.1:8000"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }


async def call(app, body: bytes) -> int:
    sent = False

    async def receive() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return {"type": "http.disconnect"}

    status = [0]

    async def send(msg: dict) -> None:
        if msg["type"] == "http.response.start":
            status[0] = msg["status"]

    await app(scope_of(body), receive, send)
    return status[0]


async def asgi_us(app, bodies: list[bytes], reps: int) -> float:
    for b in bodies[:50]:
        assert await call(app, b) == 200
    res = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for b in bodies:
            await call(app, b)
        res.append((time.perf_counter() - t0) / len(bodies) * 1e6)
    return statistics.median(res)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    from bench.service_bench import fill_store

    tmp = tempfile.mkdtemp(prefix="kvsplit-inproc-")
    url = f"sqlite:///{tmp}/bench.db"
    fill_store(url)
    os.environ["KVSPLIT_DATABASE_URL"] = url
    os.environ["KVSPLIT_RELOAD_INTERVAL_S"] = "0"
    from kvsplit.service import metrics
    from kvsplit.service.app import create_app
    from kvsplit.service.routers.plan import plan_answer
    from kvsplit.service.validation import parse_plan_request, unsupported_media_type

    try:  # older trees (to time a before / after) lack these
        from kvsplit.service import fastparse
        from kvsplit.service.routers.plan import _LOOKUPS
    except ImportError:
        fastparse, _LOOKUPS = None, {}
    try:  # the compiled answer path
        from kvsplit.service import fastjson
        from kvsplit.service.routers.plan import _KV_OPEN, _fragments
        from kvsplit.service.validation import scan_request

        compiled = fastjson.ENABLED and fastparse.ENABLED
    except ImportError:
        compiled = False

    from bench import service_baseline

    bodies = make_bodies()
    app = create_app()

    def per_request(stages, acc, step) -> None:
        for _ in range(args.reps + 1):
            t = np.zeros(len(stages))
            for b in bodies:
                t += step(b)
            for s, v in zip(stages, t):
                acc[s].append(v / len(bodies) * 1e6)
            acc["handle_plan total"].append(t.sum() / len(bodies) * 1e6)

    def table(title, acc) -> None:
        print(f"| {title} | us per request |\n|---|---:|")
        for s, v in acc.items():
            print(f"| {s} | {statistics.median(v[1:]):.1f} |")
        print()

    async def run() -> None:
        async with app.router.lifespan_context(app):
            state = app.state
            limit = state.settings.max_kv_len
            ct = b"application/json"
            tab = state.holder.current.table

            def full(b):
                t0 = time.perf_counter()
                unsupported_media_type(ct)
                t1 = time.perf_counter()
                req = parse_plan_request(b, max_kv_len=limit)
                t2 = time.perf_counter()
                p, bucket, policy = tab.plan(req.kv_lens, req.shape)
                t3 = time.perf_counter()
                c = _LOOKUPS.get(policy["source"]) or metrics.PLAN_LOOKUPS.labels(policy["source"])
                c.inc()
                t4 = time.perf_counter()
                plan_answer(p, bucket, policy)
                t5 = time.perf_counter()
                return (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4)

            stages = ("Content-Type", "parse + validation", "PolicyTable.plan", "metrics", "serialization (orjson)")
            acc = {s: [] for s in stages + ("handle_plan total",)}
            per_request(stages, acc, full)
            print(
                f"compiled kv_lens scan: {'on' if fastparse and fastparse.ENABLED else 'off'}; compiled answer "
                f"path: {'on' if compiled else 'off'}; 400 bodies, B = 256; median of {args.reps} passes "
                f"(first pass dropped)\n"
            )
            table("full path, stage (in sequence)", acc)
            if compiled:

                def fast(b):
                    t0 = time.perf_counter()
                    ok = ct == b"application/json"
                    t1 = time.perf_counter()
                    kv, header, start, end, plain = scan_request(b, limit)
                    t2 = time.perf_counter()
                    B, W, nc, b64, b32, sp, key, entry, distance = tab.plan_buffers(kv, header[7])
                    t3 = time.perf_counter()
                    _, _, count, head, matched, policy = _fragments(sp, entry, tab)
                    count()
                    t4 = time.perf_counter()
                    arrays = fastjson.buffers_json(b64, b32, B, W, nc, not plain)
                    parts = (
                        (_KV_OPEN, b[start:end], arrays, head, key, matched) if plain else (arrays, head, key, matched)
                    )
                    b"".join(parts + ((policy,) if entry is None else (orjson.dumps(distance), policy)))
                    t5 = time.perf_counter()
                    assert ok
                    return (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4)

                stages = (
                    "Content-Type",
                    "scan + header (scan_request)",
                    "key + lookup + plan (plan_buffers)",
                    "metrics",
                    "answer writer (fastjson + fragments)",
                )
                acc = {s: [] for s in stages + ("handle_plan total",)}
                per_request(stages, acc, fast)
                table("compiled path, stage (in sequence)", acc)
            print("| whole ASGI call, in-process | us per request |\n|---|---:|")
            for name, a in (
                ("kvsplit serve app", app),
                ("plain FastAPI async def echo", service_baseline.app),
                ("raw ASGI hello", service_baseline.hello),
            ):
                print(f"| {name} | {await asgi_us(a, bodies, args.reps):.1f} |")
            print(f"\nload average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")

    asyncio.run(run())


if __name__ == "__main__":
    main()
