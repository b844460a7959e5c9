"""Plan-service speed benchmark (not a test): wrk against ``kvsplit serve`` and the plain baselines.

Starts, on loopback, ``kvsplit serve`` (``--workers`` uvicorn workers, uvloop + httptools) on a
temporary SQLite store holding the shipped H200 policy table (kernels/data/h200_policies.json), and
the plain FastAPI baselines of ``bench/service_baseline.py`` (``async def`` and ``def`` endpoints:
a pydantic model of the plan request's fields, returned as is) with as many workers on the same
server stack; runs wrk with ``bench/plan_post.lua`` (B = 256 kv_lens per request, 400 distinct
bodies picked at random per request, 16 connections, 1 wrk thread) against each server in turn,
``--repeats`` times interleaved (the machine is noisy); records each server's RSS before and after
and its CPU time per request (user + system of the server's processes over the run, from /proc: less
sensitive than req/s to other load on the machine); then times a 65,536-entry request and
``PlanClient.plan`` per call. Prints markdown tables. ``--floor`` adds the raw ASGI hello-world of
``bench/service_baseline.py`` (no framework, no work: uvicorn's own cost per request).

    .venv/bin/python bench/service_bench.py [--duration 60] [--repeats 3] [--workers 1] [--connections 16] [--floor]
        [--traffic on|off|both] [--no-baselines]

``--traffic`` sets ``KVSPLIT_TRAFFIC`` of the kvsplit server (default ``on``, the service's default);
``both`` runs three kvsplit servers, traffic statistics on, off, and off again (the A/A control: how much two
identical servers differ on this machine), in the same interleaved repeats, and prints the median per-repeat
throughput ratio of on to off, the control's ratio, CPU per request and RSS after each repeat (the target: on
within 5 % of off, memory flat). ``--no-baselines`` leaves the plain FastAPI servers out.

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
SHAPE = {
    "gpu": "NVIDIA H200",
    "num_qo_heads": 32,
    "num_kv_heads": 4,
    "head_dim": 128,
    "dtype": "bfloat16",
    "page_size": 16,
}


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
    """The shipped H200 policy table (what ``make run`` serves)."""
    from kvsplit.db import store

    store.upgrade(url)
    with store.session_scope(url, write=True) as s:
        store.import_policies(s, json.loads((ROOT / "kernels" / "data" / "h200_policies.json").read_text()))


def rss_mb(pids: list[int]) -> float:
    """Resident memory of a server: its process and its children (uvicorn workers), MB."""
    total = 0
    seen = set(pids)
    for pid in list(pids):
        try:
            for child in open(f"/proc/{pid}/task/{pid}/children").read().split():
                seen.add(int(child))
        except OSError:
            pass
    for pid in seen:
        try:
            total += next(int(l.split()[1]) for l in open(f"/proc/{pid}/status") if l.startswith("VmRSS"))
        except (OSError, StopIteration):
            pass
    return total / 1024


def cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of a server: its process and its children (uvicorn workers)."""
    seen = set(pids)
    for pid in list(pids):
        try:
            seen.update(int(c) for c in open(f"/proc/{pid}/task/{pid}/children").read().split())
        except OSError:
            pass
    total = 0
    for pid in seen:
        try:
            f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            total += int(f[11]) + int(f[12])
        except (OSError, IndexError, ValueError):
            pass
    return total / os.sysconf("SC_CLK_TCK")


def _pinned(cpus: set[int] | None):
    """A ``preexec_fn`` that pins the child process to ``cpus`` (None: no pinning)."""
    if not cpus:
        return None
    return lambda: os.sched_setaffinity(0, cpus)


def wrk(url: str, duration: int, connections: int, batch: int, bodies: int = 400, cpus: set[int] | None = None) -> dict:
    env = dict(os.environ, KVSPLIT_BENCH_B=str(batch), KVSPLIT_BENCH_BODIES=str(bodies))
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{duration}s", "-s", str(ROOT / "bench/plan_post.lua"), url],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        preexec_fn=_pinned(cpus),
    ).stdout
    m = re.search(r"RESULT (.*)", out)
    return {k: float(v) for k, v in (kv.split("=") for kv in m.group(1).split())}


def _rss_list(repeats: list[dict]) -> str:
    return ", ".join(f"{r['rss_mb']:.1f}" for r in repeats)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--bodies", type=int, default=400)
    ap.add_argument("--floor", action="store_true", help="also run the raw ASGI hello-world (the server floor)")
    ap.add_argument(
        "--traffic", choices=("on", "off", "both"), default="on", help="KVSPLIT_TRAFFIC of the kvsplit server(s)"
    )
    ap.add_argument("--no-baselines", action="store_true", help="run no plain FastAPI server")
    ap.add_argument(
        "--no-pin",
        action="store_true",
        help="do not pin the servers to the last core and wrk to the others (pinned by default on >= 2 cores: "
        "the two processes then never share a core, which takes most of the noise out of req/s)",
    )
    args = ap.parse_args()
    ncpu = len(os.sched_getaffinity(0))
    pin = not args.no_pin and ncpu >= 2
    server_cpus = {sorted(os.sched_getaffinity(0))[-1]} if pin else None
    wrk_cpus = set(sorted(os.sched_getaffinity(0))[:-1]) if pin else None
    if shutil.which("wrk") is None:
        sys.exit("wrk not found: apt-get install -y wrk")
    tmp = tempfile.mkdtemp(prefix="kvsplit-bench-")
    db = f"sqlite:///{tmp}/bench.db"
    fill_store(db)
    procs = []
    servers = {}
    pids = {}
    try:
        w = str(args.workers)
        # both: a second server with statistics off is the A/A control (how much two identical servers differ)
        modes = ("on", "off", "off, control") if args.traffic == "both" else (args.traffic,)
        for mode in modes:
            port = free_port()
            env = dict(os.environ, KVSPLIT_DATABASE_URL=db, KVSPLIT_TRAFFIC="1" if mode == "on" else "0")
            procs.append(
                subprocess.Popen(
                    [
                        PY,
                        "-m",
                        "kvsplit.service.cli",
                        "serve",
                        "--port",
                        str(port),
                        "--workers",
                        w,
                        "--log-level",
                        "warning",
                    ],
                    env=env,
                    cwd=tmp,
                    preexec_fn=_pinned(server_cpus),
                )
            )
            name = "kvsplit serve" if len(modes) == 1 else f"kvsplit serve, traffic {mode}"
            servers[name] = f"http://127.0.0.1:{port}"
            pids[name] = procs[-1].pid
        main_name = next(iter(servers))
        targets = [] if args.no_baselines else [("plain FastAPI, async def", "app"), ("plain FastAPI, def", "app_sync")]
        if args.floor:
            targets.append(("raw ASGI hello (floor)", "hello"))
        for name, target in targets:
            p = free_port()
            procs.append(
                subprocess.Popen(
                    [
                        PY,
                        "-m",
                        "uvicorn",
                        f"bench.service_baseline:{target}",
                        "--port",
                        str(p),
                        "--workers",
                        w,
                        "--loop",
                        "uvloop",
                        "--http",
                        "httptools",
                        "--no-access-log",
                        "--log-level",
                        "warning",
                    ],
                    cwd=ROOT,
                    preexec_fn=_pinned(server_cpus),
                )
            )
            servers[name] = f"http://127.0.0.1:{p}"
            pids[name] = procs[-1].pid
        for name, u in servers.items():
            path = "/healthz" if name.startswith("kvsplit serve") else "/openapi.json"
            wait_up(u + ("/" if name == "raw ASGI hello (floor)" else path))
        for u in servers.values():
            wrk(u, 3, args.connections, args.batch, args.bodies, wrk_cpus)  # warm-up
        rss0 = {name: rss_mb([pids[name]]) for name in servers}
        repeats: dict[str, list] = {name: [] for name in servers}
        order = list(servers.items())
        for i in range(args.repeats):  # interleaved: every server once per repeat, the order rotated every repeat
            for name, u in order[i % len(order) :] + order[: i % len(order)]:
                c0 = cpu_s([pids[name]])
                r = wrk(u, args.duration, args.connections, args.batch, args.bodies, wrk_cpus)
                r["cpu_us"] = (cpu_s([pids[name]]) - c0) / max(r["requests"], 1) * 1e6
                r["rss_mb"] = rss_mb([pids[name]])
                repeats[name].append(r)
                print(
                    f"repeat {i + 1} {name}: {r['rps']:,.0f} req/s p99 {r['p99_ms']:.2f} ms "
                    f"non-2xx {int(r['non2xx'])} socket errors {int(r['sockerr'])} "
                    f"server CPU {r['cpu_us']:.0f} us/request, RSS {r['rss_mb']:.1f} MB (load {os.getloadavg()[0]:.1f})",
                    flush=True,
                )
        rss1 = {name: rss_mb([pids[name]]) for name in servers}
        results = {
            name: min(rs, key=lambda r: abs(r["rps"] - statistics.median(x["rps"] for x in rs)))
            for name, rs in repeats.items()
        }  # the median repeat
        # a 65,536-entry request, end to end over HTTP
        rng = np.random.default_rng(3)
        big = dict(SHAPE, kv_lens=np.floor(2 ** (rng.random(65536) * 14)).astype(int).tolist())
        body = json.dumps(big).encode()
        lat = []
        for _ in range(12):
            req = urllib.request.Request(
                servers[main_name] + "/v1/plan", data=body, headers={"Content-Type": "application/json"}
            )
            t0 = time.perf_counter()
            with urllib.request.urlopen(req, timeout=30) as r:
                r.read()
            lat.append(time.perf_counter() - t0)
        lat = lat[2:]
        # PlanClient.plan per call
        from kvsplit.service.client import PlanClient

        client = PlanClient(servers[main_name])
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
    print(
        f"\n{os.cpu_count()} cores ({cpu}), Python {platform.python_version()}, wrk -t1 -c{args.connections} "
        f"-d{args.duration}s, B = {args.batch} kv_lens per request, {args.bodies} bodies at random, "
        f"{args.workers} server worker(s), {args.repeats} interleaved repeats (median repeat shown; order rotated "
        f"every repeat), {'servers pinned to CPU ' + str(min(server_cpus)) + ', wrk to the others' if pin else 'no pinning'}, "
        f"load average at the end {os.getloadavg()[0]:.1f}\n"
    )
    print(
        "| server | req/s (median repeat) | all repeats | p50 ms | p90 ms | p99 ms | non-2xx + socket errors | "
        "RSS MB before -> after | server CPU us/request (median) |"
    )
    print("|---|---:|---|---:|---:|---:|---:|---|---:|")
    for name, r in results.items():
        allr = ", ".join(f"{x['rps']:,.0f}" for x in repeats[name])
        errs = sum(int(x["non2xx"] + x["sockerr"]) for x in repeats[name])
        print(
            f"| {name} | {r['rps']:,.0f} | {allr} | {r['p50_ms']:.2f} | {r['p90_ms']:.2f} | {r['p99_ms']:.2f} | "
            f"{errs} | {rss0[name]:.0f} -> {rss1[name]:.0f} | "
            f"{statistics.median(x['cpu_us'] for x in repeats[name]):.0f} |"
        )
    if args.traffic == "both":
        on, off, ctl = (f"kvsplit serve, traffic {m}" for m in ("on", "off", "off, control"))
        pairs = [a["rps"] / b["rps"] for a, b in zip(repeats[on], repeats[off])]
        both_off = [a["rps"] / ((b["rps"] + c["rps"]) / 2) for a, b, c in zip(repeats[on], repeats[off], repeats[ctl])]
        aa = [c["rps"] / b["rps"] for b, c in zip(repeats[off], repeats[ctl])]
        cpu = {n: statistics.median(x["cpu_us"] for x in repeats[n]) for n in (on, off, ctl)}
        print(
            f"\ntraffic statistics on / off: median of the per-repeat ratios {statistics.median(pairs):.3f}x req/s "
            f"(per repeat {', '.join(f'{x:.3f}' for x in pairs)}); on / mean of the two off servers "
            f"{statistics.median(both_off):.3f}x; A/A control (off, control / off) {statistics.median(aa):.3f}x "
            f"(per repeat {', '.join(f'{x:.3f}' for x in aa)}); server CPU per request on {cpu[on]:.0f}, off "
            f"{cpu[off]:.0f} and {cpu[ctl]:.0f} us; RSS MB on {rss0[on]:.1f} -> {_rss_list(repeats[on])}, off "
            f"{rss0[off]:.1f} -> {_rss_list(repeats[off])} (after each repeat)"
        )
    k = results[main_name]["rps"]
    kc = statistics.median(x["cpu_us"] for x in repeats[main_name])
    for name in list(results)[1:]:
        oc = statistics.median(x["cpu_us"] for x in repeats[name])
        print(
            f"\n{main_name} / {name}: {k / results[name]['rps']:.2f}x req/s, {oc / kc:.2f}x less server CPU per request"
        )
    print(
        f"\n65,536-entry POST /v1/plan, end to end (urllib client): median {statistics.median(lat) * 1e3:.1f} ms, "
        f"max {max(lat) * 1e3:.1f} ms over {len(lat)}"
    )
    print(f"PlanClient.plan, B = {args.batch}: {client_us:.0f} us per call")


if __name__ == "__main__":
    main()
