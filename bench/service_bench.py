"""Plan-service speed benchmark (not a test): wrk against ``kvsplit serve`` and the plain baselines.

Starts, on loopback, ``kvsplit serve`` (1 worker, uvloop + httptools) on a
temporary SQLite store with published policies for the benchmark's shape, and
the plain FastAPI baselines of ``bench/service_baseline.py`` (``async def`` and
``def`` endpoints) on the same server stack; runs wrk with
``bench/plan_post.lua`` (B = 256 kv_lens per request, 64 distinct bodies, 16
connections, 1 wrk thread) against each in turn; then times a 65,536-entry
request and ``PlanClient.plan`` per call. Prints a markdown table.

    .venv/bin/python bench/service_bench.py [--duration 10] [--connections 16] [--batch 256]

Needs Debian's ``wrk`` (``apt-get install -y wrk``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
SHAPE = {"gpu": "NVIDIA H200", "num_qo_heads": 32, "num_kv_heads": 4, "head_dim": 128, "dtype": "bfloat16",
         "page_size": 16}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_up(url: str, timeout: float = 30.0) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return
        except Exception:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


def fill_store(url: str) -> None:
    """Publish tuned-looking policies for B in {16..1024} x a few length mixes of the bench shape."""
    from kvsplit.db import store
    from kvsplit.kernels.buckets import bucket_key

    store.upgrade(url)
    rng = np.random.default_rng(7)
    with store.session_scope(url, write=True) as s:
        for B in (16, 32, 64, 128, 256, 512, 1024):
            for top in (10, 13, 15, 17):
                lens = np.floor(2 ** (rng.random(B) * top)).astype(np.int64)
                k = bucket_key(lens, device=SHAPE["gpu"], num_kv_heads=4, head_dim=128, dtype="bfloat16",
                               page_size=16)
                b = store.get_or_create_bucket(s, key=str(k), gpu=SHAPE["gpu"], num_kv_heads=4, head_dim=128,
                                               dtype="bfloat16", page_size=16, source=f"bench log-uniform 2^{top}")
                if store.get_published(s, str(k)) is None:
                    p = store.create_policy(s, bucket_id=b.id, backend="gpu", score=1.2,
                                            params={"ctas_per_sm": float(rng.choice([2.0, 3.0, 4.0, 6.0]))},
                                            name="balanced")
                    store.publish(s, p.id)


def wrk(url: str, duration: int, connections: int, batch: int) -> dict:
    env = dict(os.environ, KVSPLIT_BENCH_B=str(batch))
    out = subprocess.run(["wrk", "-t1", f"-c{connections}", f"-d{duration}s", "-s", str(ROOT / "bench/plan_post.lua"),
                          url], capture_output=True, text=True, env=env, check=True).stdout
    m = re.search(r"RESULT (.*)", out)
    return {k: float(v) for k, v in (kv.split("=") for kv in m.group(1).split())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=int, default=10)
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--batch", type=int, default=256)
    args = ap.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("wrk not found: apt-get install -y wrk")
    tmp = tempfile.mkdtemp(prefix="kvsplit-bench-")
    db = f"sqlite:///{tmp}/bench.db"
    fill_store(db)
    procs = []
    servers = {}
    try:
        port = free_port()
        env = dict(os.environ, KVSPLIT_DATABASE_URL=db)
        procs.append(subprocess.Popen([PY, "-m", "kvsplit.service.cli", "serve", "--port", str(port), "--workers",
                                       "1", "--log-level", "warning"], env=env, cwd=tmp))
        servers["kvsplit serve"] = f"http://127.0.0.1:{port}"
        for name, target in (("plain FastAPI, async def", "app"), ("plain FastAPI, def", "app_sync")):
            p = free_port()
            procs.append(subprocess.Popen([PY, "-m", "uvicorn", f"bench.service_baseline:{target}", "--port", str(p),
                                           "--loop", "uvloop", "--http", "httptools", "--no-access-log",
                                           "--log-level", "warning"], cwd=ROOT))
            servers[name] = f"http://127.0.0.1:{p}"
        for name, u in servers.items():
            wait_up(u + ("/healthz" if name == "kvsplit serve" else "/openapi.json"))
        results = {}
        for name, u in servers.items():
            wrk(u, 2, args.connections, args.batch)  # warm-up
            results[name] = wrk(u, args.duration, args.connections, args.batch)
        # a 65,536-entry request, end to end over HTTP
        rng = np.random.default_rng(3)
        big = dict(SHAPE, kv_lens=np.floor(2 ** (rng.random(65536) * 14)).astype(int).tolist())
        body = json.dumps(big).encode()
        lat = []
        for _ in range(12):
            req = urllib.request.Request(servers["kvsplit serve"] + "/v1/plan", data=body,
                                         headers={"Content-Type": "application/json"})
            t0 = time.perf_counter()
            with urllib.request.urlopen(req, timeout=30) as r:
                r.read()
            lat.append(time.perf_counter() - t0)
        lat = lat[2:]
        # PlanClient.plan per call
        from kvsplit.service.client import PlanClient

        client = PlanClient(servers["kvsplit serve"])
        batches = [np.floor(2 ** (rng.random(args.batch) * 15)).astype(np.int64) for _ in range(64)]
        for b in batches:
            client.plan(b, **SHAPE)
        n = 2000
        t0 = time.perf_counter()
        for i in range(n):
            client.plan(batches[i % 64], **SHAPE)
        client_us = (time.perf_counter() - t0) / n * 1e6
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except Exception:
        pass
    print(f"\n{os.cpu_count()} cores ({cpu}), Python {platform.python_version()}, wrk -t1 -c{args.connections} "
          f"-d{args.duration}s, B = {args.batch} kv_lens per request, 1 server worker\n")
    print("| server | req/s | p50 ms | p90 ms | p99 ms | non-2xx |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, r in results.items():
        print(f"| {name} | {r['rps']:,.0f} | {r['p50_ms']:.2f} | {r['p90_ms']:.2f} | {r['p99_ms']:.2f} | "
              f"{int(r['non2xx'])} |")
    k = results["kvsplit serve"]["rps"]
    for name in list(results)[1:]:
        print(f"\nkvsplit serve / {name}: {k / results[name]['rps']:.2f}x")
    print(f"\n65,536-entry POST /v1/plan, end to end (urllib client): median {statistics.median(lat) * 1e3:.1f} ms, "
          f"max {max(lat) * 1e3:.1f} ms over {len(lat)}")
    print(f"PlanClient.plan, B = {args.batch}: {client_us:.0f} us per call")


if __name__ == "__main__":
    main()
