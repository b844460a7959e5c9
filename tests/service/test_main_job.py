"""``kvsplit run`` (the main job of ``make run``) as a real process: import, demo tuning, serve, Ctrl-C."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

KVSPLIT = [sys.executable, "-m", "kvsplit.service.cli"]
ROOT = Path(__file__).resolve().parents[2]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_until_serving(cwd: Path, port: int, timeout: float = 120.0):
    env = {
        **os.environ,
        "KVSPLIT_DATABASE_URL": f"sqlite:///{cwd}/kvsplit.db",
        "KVSPLIT_PORT": str(port),
        "PYTHONUNBUFFERED": "1",
    }
    p = subprocess.Popen(
        [*KVSPLIT, "run"], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
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


def _get(url: str) -> tuple[int, str, bytes]:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.status, r.headers.get("Content-Type", ""), r.read()


def test_main_job_serves_shipped_tuned_plans_and_stops_cleanly(tmp_path):
    port = _port()
    p, lines = _run_until_serving(tmp_path, port)
    out = "".join(lines)
    base = f"http://127.0.0.1:{port}"
    try:
        # kernels/data/h200_policies.json: one GPU-tuned bucket per bucket key of the H200 sweep's 280
        # training batches, 263 of them (139 + 38 for 32/4/128, 56 + 4 for 32/8/128, 25 + 1 for 8/1/128,
        # stream_k + balanced), each with 2 training measurements (its published plan and balanced): 526; and
        # kernels/data/h100_policies.json: the 859 buckets of the H100's seven campaigns (123 per model shape at
        # q_len 1, for Qwen3-30B-A3B 122 at q_len 2, 123 at q_len 4, 123 at q_len 8 and 122 with an fp8 KV
        # cache), and their verify steps' 4417 held-out timings (the published plan and 4 baselines per bucket, 5
        # for an fp8 bucket: 5 * 737 + 6 * 122)
        assert "imported 1122 shipped policies (GPU-tuned: 263 NVIDIA H200, 859 NVIDIA H100 80GB HBM3)" in out
        assert "(526 training on the NVIDIA H200, 4417 held-out on the NVIDIA H100 80GB HBM3)" in out
        assert "stored the NVIDIA H100 80GB HBM3 simulator calibration" in out
        assert "tuning 3 demo buckets on the calibrated simulator" in out
        assert f"dashboard:  http://127.0.0.1:{port}/" in out
        curl = next(line for line in lines if line.startswith("curl "))
        body = curl.split("-d '", 1)[1].rsplit("'", 1)[0]
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/plan", data=body.encode(), headers={"Content-Type": "application/json"}
        )
        answer = json.loads(urllib.request.urlopen(req, timeout=10).read())
        assert answer["policy"]["source"] == "tuned" and answer["bucket"]["distance"] == 0.0
        assert len(answer["num_splits"]) == len(json.loads(body)["kv_lens"]) == 64
        html = urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10).read().decode()
        assert "<svg" in html and "<table" in html
        # every URL the job prints answers 200 (dashboard, policies, metrics, API docs)
        printed = re.findall(r"(?:dashboard|policies|metrics|API docs):\s+(http://\S+)", out)
        assert sorted(printed) == sorted([f"{base}/", f"{base}/v1/policies", f"{base}/metrics", f"{base}/v1/docs"])
        for url in printed:
            status, ctype, content = _get(url)
            assert status == 200 and content, url
        # the printed curl, run as printed, ends its output with a newline
        if shutil.which("curl"):
            res = subprocess.run(curl, shell=True, capture_output=True, text=True, timeout=30)
            assert res.returncode == 0 and res.stdout.endswith("}\n") and json.loads(res.stdout) == answer
        runs_first = json.loads(_get(f"{base}/v1/runs")[2])
        assert runs_first["count"] == 3  # one per demo bucket
        # the demo's simulator results are drafts: the service serves the GPU-measured policies only
        served = json.loads(_get(f"{base}/v1/policies")[2])["data"]
        assert len(served) == 1122 and {p["source"] for p in served} == {"tuned"}, {p["source"] for p in served}
        demo_lines = [line for line in lines if line.startswith("  nvidia-h200.")]
        assert len(demo_lines) == 3 and all("-> published" not in x for x in demo_lines), demo_lines
    finally:
        code, rest = _stop(p)
    assert code == 0 and "[kvsplit run] stopped" in rest
    # a second run reuses what the first stored, and records no new tuning run
    p, lines = _run_until_serving(tmp_path, port)
    try:
        out2 = "".join(lines)
        runs_second = json.loads(_get(f"{base}/v1/runs")[2])
    finally:
        code, _ = _stop(p)
    assert code == 0
    assert "shipped policies already in the store (1122 buckets: 263 NVIDIA H200, 859 NVIDIA H100 80GB HBM3)" in out2
    assert "all 3 demo buckets were tuned and verified before: nothing to tune" in out2
    assert runs_second == runs_first


def test_a_store_from_before_the_h100_table_gets_it_once_and_keeps_its_measurements(tmp_path, monkeypatch, capsys):
    from kvsplit.db import store
    from kvsplit.kernels import policy_table
    from kvsplit.service import main_job

    url = f"sqlite:///{tmp_path / 'old.db'}"
    store.upgrade(url)
    # what was shipped before: the H200 table, its measurements and calibration
    monkeypatch.setattr(policy_table, "SHIPPED_TABLES", policy_table.SHIPPED_TABLES[:1])
    monkeypatch.setattr(main_job, "SHIPPED_DATA", main_job.SHIPPED_DATA[:1])
    main_job._import_shipped(url)
    out = capsys.readouterr().out
    assert "imported 263 shipped policies (GPU-tuned: 263 NVIDIA H200) and their GPU measurements (526 training" in out
    monkeypatch.undo()
    main_job._import_shipped(url)
    out = capsys.readouterr().out
    assert "imported 859 shipped policies (GPU-tuned: 859 NVIDIA H100 80GB HBM3)" in out
    assert "(4417 held-out on the NVIDIA H100 80GB HBM3)" in out and "stored the NVIDIA H200" not in out
    assert "stored the NVIDIA H100 80GB HBM3 simulator calibration (held-out error median 2.6%" in out
    with store.session_scope(url) as s:
        assert len(store.list_measurements(s)) == 526 + 4417  # the H200's not recorded twice
        published = store.list_published(s)
        assert len(published) == 1122 and len({p.bucket_id for p in published}) == 1122
        # each H100 bucket's held-out timing of its plan is its published policy's own
        tuned = [m for m in store.list_measurements(s, policy_name="tuned") if m.role == "heldout"]
        assert len(tuned) == 859 and {m.policy_id for m in tuned} == {
            p.id for p in published if p.backend == "gpu" and p.bucket.gpu.startswith("NVIDIA H100")
        }
    main_job._import_shipped(url)
    out = capsys.readouterr().out
    assert "shipped policies already in the store (1122 buckets" in out and "calibration" not in out


def test_the_h100_families_get_their_own_calibration(tmp_path, capsys):
    """Each family of the shipped H100 table other than bf16 q_len 1 (q_len 2, 4, 8; an fp8 cache) has the
    calibration its campaign fitted, imported once by the first start; the simulator then models the family with
    it, and a family without one (fp8 at q_len 4) still says that it borrows another fit."""
    from kvsplit.db import store
    from kvsplit.kernels.buckets import BucketKey
    from kvsplit.service import main_job
    from kvsplit.tuner.calibrate import stored_calibration

    h100 = json.loads((ROOT / "kernels/data/h100_policies.json").read_text())
    families = {
        (BucketKey.parse(p["bucket"]["key"]).kv_dtype, BucketKey.parse(p["bucket"]["key"]).q_len)
        for p in h100["policies"]
    }
    shipped = json.loads((ROOT / "service/data/h100_calibrations.json").read_text())["calibrations"]
    fits = {(e["kv_dtype"], e["q_len"]): e for e in shipped}
    assert {(kv or "bfloat16", q) for kv, q in families} - {("bfloat16", 1)} == set(fits)
    url = f"sqlite:///{tmp_path / 'k.db'}"
    store.upgrade(url)
    main_job._import_shipped(url)
    out = capsys.readouterr().out
    assert "stored 4 more NVIDIA H100 80GB HBM3 simulator calibrations" in out
    assert "KV bfloat16 q_len 8 (3.4%)" in out
    with store.session_scope(url) as s:
        for (kv, q), e in fits.items():
            cal, note = stored_calibration(s, "NVIDIA H100 80GB HBM3", dtype="bfloat16", kv_dtype=kv, q_len=q)
            assert note == "" and cal.constants == e["constants"] and cal.error == e["error"], (kv, q)
        _, note = stored_calibration(s, "NVIDIA H100 80GB HBM3", dtype="bfloat16", kv_dtype="float8_e4m3fn", q_len=4)
        assert note.startswith("no calibration of NVIDIA H100 80GB HBM3 for KV float8_e4m3fn, q_len 4")
        n = len(store.list_calibrations(s))
    main_job._import_shipped(url)
    with store.session_scope(url) as s:
        assert len(store.list_calibrations(s)) == n == 2 + 4  # nothing imported twice


def test_the_demo_tunes_this_machines_gpu(monkeypatch):
    """On a GPU machine the demo's buckets are that GPU's (the GPU backend refuses to time another GPU's bucket);
    a GPU the project does not describe, or no CUDA, tunes the H200's buckets on the simulator. CI has no GPU:
    torch's device query is replaced by the names the driver reports."""
    torch = __import__("pytest").importorskip("torch")
    from kvsplit.service import main_job

    for reported, backend, gpu in (
        ("NVIDIA H100 80GB HBM3", "gpu", "NVIDIA H100 80GB HBM3"),
        ("NVIDIA H200", "gpu", "NVIDIA H200"),
        ("NVIDIA GeForce GT 710", "sim", "NVIDIA H200"),
    ):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, r=reported: r)
        assert main_job._backend_name() == backend and main_job._demo_gpu(backend) == gpu, reported
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main_job._backend_name() == "sim" and main_job._demo_gpu("sim") == "NVIDIA H200"
