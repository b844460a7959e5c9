"""PlanClient against a live ``kvsplit serve`` subprocess: identical plans, ETag refresh, core-only install,
no dropped requests during reloads, multi-worker metrics."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from kvsplit.service.client import PlanClient, PlanServiceError, plan_from_response
from kvsplit.tuner.workloads import FAMILIES, family_kv_lens
from tests.service_support import GPU, SHAPE, TOTAL, LiveServer, fill_store

TOKEN = "tok-123"


def post(url: str, path: str, payload: dict, token: str | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(
        url + path,
        data=json.dumps(payload).encode(),
        method="POST",
        headers={"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("client")
    info = fill_store(f"sqlite:///{d}/store.db")
    with LiveServer(info.url, admin_token=TOKEN, reload_interval=0.2, cwd=str(d)) as srv:
        yield info, srv


def random_batches(n: int, seed: int = 0):
    """Random batches around the tuned families (near / exact / far), odd lengths, zeros, other shapes."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        kind = i % 4
        if kind == 0:
            fam = FAMILIES[rng.integers(len(FAMILIES))]
            B = int(rng.choice([3, 16, 64, 256, 300]))
            lens = (
                family_kv_lens(fam, B, TOTAL) if not (fam == "2x40" and B < 3) else family_kv_lens("uniform", B, TOTAL)
            )
            lens = (lens * rng.uniform(0.85, 1.15, lens.shape)).astype(np.int64)
        elif kind == 1:
            lens = np.floor(2 ** (rng.random(int(rng.integers(1, 600))) * 17)).astype(np.int64)
        elif kind == 2:
            lens = rng.integers(0, 5000, int(rng.integers(1, 2000)))
        else:
            lens = np.array([int(rng.integers(0, 1 << 24))] + [0] * int(rng.integers(0, 5)))
        shape = dict(SHAPE)
        if i % 7 == 3:
            shape.update(num_kv_heads=8, num_qo_heads=32)
        if i % 11 == 5:
            shape.update(head_dim=64, dtype="float16", page_size=int(rng.choice([1, 16, 64])))
        out.append((lens.tolist(), shape))
    return out


def test_client_plans_equal_http_answers(server):
    info, srv = server
    client = PlanClient(srv.url)
    sources = set()
    for lens, shape in random_batches(160):
        status, ans = post(srv.url, "/v1/plan", dict(shape, kv_lens=lens))
        assert status == 200, ans
        plan, bucket, policy = client.plan_with_info(lens, **shape)
        assert plan == plan_from_response(ans)
        assert plan.to_dict() == {**{k: v for k, v in ans.items() if k != "bucket"}, "policy": ans["policy"]["name"]}
        assert bucket == ans["bucket"] and policy == ans["policy"]
        sources.add(policy["source"])
    assert sources == {"tuned", "fallback"}
    # the simulated-only bucket
    lens = [1] * 4000
    assert client.plan_with_info(lens, **SHAPE)[2]["source"] == "simulated"
    assert client.plan(lens, **SHAPE) == plan_from_response(post(srv.url, "/v1/plan", dict(SHAPE, kv_lens=lens))[1])
    # page_size defaults to 16 in-process (as PolicyTable.plan and make_plan); the HTTP body names it
    assert SHAPE["page_size"] == 16
    no_ps = {k: v for k, v in SHAPE.items() if k != "page_size"}
    assert client.plan(lens, **no_ps) == client.plan(lens, **SHAPE)


def test_client_refresh_by_etag_and_errors(server):
    info, srv = server
    client = PlanClient(srv.url, filters={"gpu": GPU})
    v0 = client.version
    assert client.refresh() is False  # 304
    lens = family_kv_lens("uniform", 64, TOTAL).tolist()
    shape8 = dict(SHAPE, num_kv_heads=8)
    assert client.plan_with_info(lens, **shape8)[2]["source"] == "fallback"
    status, out = post(srv.url, f"/v1/policies/{info.draft_id}/publish", {}, token=TOKEN)
    assert status == 200 and out["policies_version"] == v0 + 1
    timed = PlanClient(srv.url, refresh_interval_s=0.05)  # its thread polls every 50 ms
    try:
        assert client.refresh() is True and client.version == v0 + 1
        assert client.plan_with_info(lens, **shape8)[2]["id"] == info.draft_id
        t_end = time.monotonic() + 10
        while timed.version != v0 + 1:
            assert time.monotonic() < t_end, "the refresh thread did not load the published table"
            time.sleep(0.01)
        assert timed.plan_with_info(lens, **shape8)[2]["id"] == info.draft_id
        status, out = post(srv.url, f"/v1/policies/{info.draft_id}/retire", {}, token=TOKEN)
        assert status == 200
        while timed.version != out["policies_version"]:  # the server reloads within 0.2 s, the thread polls every 50 ms
            assert time.monotonic() < t_end, "the refresh thread did not load the retired table"
            time.sleep(0.01)
        assert timed.plan_with_info(lens, **shape8)[2]["source"] == "fallback"
        assert not timed.stale and timed.last_error is None
    finally:
        timed.close()
        post(srv.url, f"/v1/policies/{info.draft_id}/retire", {}, token=TOKEN)
    with pytest.raises(ValueError, match="num_qo_heads"):
        client.plan([5], **dict(SHAPE, num_qo_heads=6))
    with pytest.raises(ValueError, match=r"kv_lens\[1\]"):
        client.plan([5, -1], **SHAPE)
    with pytest.raises(PlanServiceError, match=r"http://127\.0\.0\.1:9/v1/policies"):
        PlanClient("http://127.0.0.1:9/")
    with pytest.raises(ValueError, match="url"):
        PlanClient("ftp://x")


def test_client_needs_only_the_core_install(server):
    """Import and use PlanClient with fastapi, starlette, pydantic, sqlalchemy, torch, httpx blocked."""
    _, srv = server
    code = f"""
import sys
BLOCK = ("fastapi", "starlette", "pydantic", "pydantic_settings", "sqlalchemy", "alembic", "torch", "triton",
         "httpx", "orjson", "prometheus_client", "uvicorn", "optuna", "jinja2")
class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCK:
            raise ImportError("blocked in this test: " + name)
sys.meta_path.insert(0, Blocker())
from kvsplit.service.client import PlanClient
c = PlanClient({srv.url!r})
p = c.plan([4096, 17, 9000], gpu="NVIDIA H200", num_qo_heads=32, num_kv_heads=4, head_dim=128,
           dtype="bfloat16", page_size=16)
print(p.num_splits.tolist())
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    # balanced fallback, default tile (128, 4, 2): target 396 tiles, fair = cdiv(4 * 13113, 396) = 133 -> chunk 256
    assert out.stdout.strip() == "[16, 1, 36]"


def test_no_request_dropped_during_reloads(server):
    info, srv = server
    errors: list = []
    done = threading.Event()
    lens = family_kv_lens("uniform", 64, TOTAL).tolist()

    def hammer():
        while not done.is_set():
            status, ans = post(srv.url, "/v1/plan", dict(SHAPE, num_kv_heads=8, kv_lens=lens))
            if status != 200:
                errors.append((status, ans))

    threads = [threading.Thread(target=hammer) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        for _ in range(6):
            assert post(srv.url, f"/v1/policies/{info.draft_id}/publish", {}, token=TOKEN)[0] == 200
            assert post(srv.url, f"/v1/policies/{info.draft_id}/retire", {}, token=TOKEN)[0] == 200
    finally:
        done.set()
        for t in threads:
            t.join(30)
    assert errors == []


def test_multiworker_metrics_are_aggregated(tmp_path):
    info = fill_store(f"sqlite:///{tmp_path}/store.db")
    with LiveServer(info.url, workers=2, cwd=str(tmp_path)) as srv:
        for _ in range(20):
            assert post(srv.url, "/v1/plan", dict(SHAPE, kv_lens=[100, 2000]))[0] == 200
        text = urllib.request.urlopen(srv.url + "/metrics", timeout=10).read().decode()
    line = next(
        l
        for l in text.splitlines()
        if l.startswith("kvsplit_http_requests_total") and 'route="/v1/plan"' in l and 'status="200"' in l
    )
    assert float(line.rsplit(" ", 1)[1]) == 20.0  # summed over both workers' files
    assert "kvsplit_policies_loaded" in text
