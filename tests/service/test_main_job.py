"""``kvsplit run`` (the main job of ``make run``) as a real process: import, demo tuning, serve, Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

KVSPLIT = [sys.executable, "-m", "kvsplit.service.cli"]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_until_serving(cwd: Path, port: int, timeout: float = 120.0):
    env = {**os.environ, "KVSPLIT_DATABASE_URL": f"sqlite:///{cwd}/kvsplit.db", "KVSPLIT_PORT": str(port),
           "PYTHONUNBUFFERED": "1"}
    p = subprocess.Popen([*KVSPLIT, "run"], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True)
    lines = []
    deadline = time.time() + timeout
    while time.time() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        lines.append(line)
        if "serving until Ctrl-C" in line:
            return p, lines
    p.kill()
    raise AssertionError("kvsplit run did not start serving:\n" + "".join(lines))


def _stop(p) -> tuple[int, str]:
    p.send_signal(signal.SIGINT)
    rest, _ = p.communicate(timeout=30)
    return p.returncode, rest


def test_main_job_serves_shipped_tuned_plans_and_stops_cleanly(tmp_path):
    port = _port()
    p, lines = _run_until_serving(tmp_path, port)
    out = "".join(lines)
    try:
        assert "imported 23 shipped H200 policies" in out
        assert "tuning 3 demo buckets on the calibrated simulator" in out
        assert f"dashboard:  http://127.0.0.1:{port}/" in out
        curl = next(line for line in lines if line.startswith("curl "))
        body = curl.split("-d '", 1)[1].rsplit("'", 1)[0]
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/plan", data=body.encode(),
                                     headers={"Content-Type": "application/json"})
        answer = json.loads(urllib.request.urlopen(req, timeout=10).read())
        assert answer["policy"]["source"] == "tuned" and answer["bucket"]["distance"] == 0.0
        assert len(answer["num_splits"]) == len(json.loads(body)["kv_lens"]) == 64
        html = urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10).read().decode()
        assert "<svg" in html and "<table" in html
    finally:
        code, rest = _stop(p)
    assert code == 0 and "[kvsplit run] stopped" in rest
    # a second run reuses what the first stored
    p, lines = _run_until_serving(tmp_path, port)
    code, _ = _stop(p)
    assert code == 0
    assert "shipped policies already in the store (23 H200 buckets)" in "".join(lines)
