"""Traffic statistics of the plan service and the tuning loop they drive.

Real ``kvsplit serve`` processes on temporary SQLite stores (and PostgreSQL where
``KVSPLIT_TEST_POSTGRES_URL`` is set), real ``kvsplit tune`` subprocesses. Every expected
count, range and histogram is recomputed in the test from the batches it sent.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter

import numpy as np
import pytest
from sqlalchemy import func, select

from kvsplit.db import store
from kvsplit.db.models import Traffic, TrafficBin
from kvsplit.kernels.buckets import DISTANCE_LIMIT, bucket_key
from kvsplit.service import main_job
from kvsplit.service.traffic import SOURCE_INDEX, TrafficRecorder, current_hour, traffic_summary

from ..service_support import LiveServer

KVSPLIT = [sys.executable, "-m", "kvsplit.service.cli"]
# Llama-3.1-8B's attention shape with 32-token pages: the shipped H200 policies (page_size 16) do not cover it
SHAPE = {"gpu": "NVIDIA H200", "num_qo_heads": 32, "num_kv_heads": 8, "head_dim": 128, "dtype": "bfloat16"}
UNCOVERED = dict(SHAPE, page_size=32)


class Poster:
    """One keep-alive HTTP/1.1 connection (opened again when the server closed an idle one)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

    def _call(self, method: str, path: str, body: bytes | None) -> tuple[int, dict]:
        for attempt in range(2):
            try:
                hdr = {"Content-Type": "application/json"} if body is not None else {}
                self.conn.request(method, path, body=body, headers=hdr)
                r = self.conn.getresponse()
                return r.status, json.loads(r.read())
            except (ConnectionError, http.client.HTTPException):
                self.conn.close()
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def post(self, path: str, doc: dict) -> tuple[int, dict]:
        return self._call("POST", path, json.dumps(doc).encode())

    def get(self, path: str) -> tuple[int, dict]:
        return self._call("GET", path, None)

    def close(self) -> None:
        self.conn.close()


def key_of(lens, shape) -> str:
    return str(
        bucket_key(
            np.asarray(lens),
            num_kv_heads=shape["num_kv_heads"],
            head_dim=shape["head_dim"],
            dtype=shape["dtype"],
            device=shape["gpu"],
            page_size=shape["page_size"],
        )
    )


def uniform_batches(B: int, center: float, n: int, seed: int) -> list[list[int]]:
    """``n`` batches of ``B`` lengths within +-3 % of ``center`` (one half-octave bin, one bucket key)."""
    rng = np.random.default_rng(seed)
    return [[int(x) for x in np.rint(center * rng.uniform(0.97, 1.03, B))] for _ in range(n)]


def expected(batches: list[list[int]]) -> dict:
    """What the statistics of these batches must say (independent of the service's code)."""
    Bs = [len(b) for b in batches]
    Ts = [sum(b) for b in batches]
    return {
        "requests": len(batches),
        "b_min": min(Bs),
        "b_max": max(Bs),
        "tokens_min": min(Ts),
        "tokens_max": max(Ts),
        "batch_hist": sorted(Counter(B.bit_length() for B in Bs).items()),
        "tokens_hist": sorted(Counter(T.bit_length() for T in Ts).items()),
    }


def hist_pairs(h: list[dict]) -> list[tuple[int, int]]:
    for x in h:  # each bin is [2^(k-1), 2^k - 1]
        k = x["hi"].bit_length()
        assert x["hi"] == (1 << k) - 1 and x["lo"] == (0 if k == 0 else 1 << (k - 1)), x
    return [(x["hi"].bit_length(), x["requests"]) for x in h]


def tune_cli(*args: str, timeout: float = 400) -> subprocess.CompletedProcess:
    return subprocess.run([*KVSPLIT, "tune", *args], capture_output=True, text=True, timeout=timeout)


# ----------------------------------------------------------------------------
# (a) traffic of an uncovered shape -> GET /v1/traffic -> tune --from-traffic -> served tuned/simulated
# ----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_uncovered_traffic_is_recorded_tuned_from_traffic_and_then_served_near(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'k.db'}"
    store.upgrade(url)
    main_job._import_shipped(url)  # the shipped H200 policies (page_size 16) and the H200 calibration
    monkeypatch.setenv("KVSPLIT_TRAFFIC_FLUSH_INTERVAL_S", "0.2")
    # two buckets of the uncovered shape: B = 24 and B = 48, about 234,000 tokens, lengths in one bin each
    sets = {
        24: uniform_batches(24, 2**13.25, 30, seed=1),
        48: uniform_batches(48, 2**12.25, 30, seed=2),
    }
    keys = {B: {key_of(b, UNCOVERED) for b in bs} for B, bs in sets.items()}
    assert all(len(k) == 1 for k in keys.values()), keys
    keys = {B: k.pop() for B, k in keys.items()}
    # a third, covered shape's traffic: answered by a shipped policy, never picked by --from-traffic
    covered = uniform_batches(64, 4096, 5, seed=3)
    with LiveServer(url, reload_interval=0.3) as srv:
        c = Poster(srv.port)
        for B, bs in sets.items():
            for b in bs:
                st, ans = c.post("/v1/plan", dict(UNCOVERED, kv_lens=b))
                assert st == 200 and ans["bucket"]["key"] == keys[B]
                assert ans["policy"]["source"] == "fallback", ans["policy"]
        for b in covered:
            st, ans = c.post("/v1/plan", dict(SHAPE, page_size=16, kv_lens=b))
            assert st == 200 and ans["policy"]["source"] == "tuned"
        st, doc = c.get("/v1/traffic?hours=1")
        assert st == 200 and doc["recording"] and doc["requests"] == 65, doc
        rows = {r["key"]: r for r in doc["data"]}
        for B, bs in sets.items():
            r = rows[keys[B]]
            want = expected(bs)
            assert r["family"] == "nvidia-h200.kv8.d128.bf16.p32"
            got = {k: r[k] for k in ("requests", "b_min", "b_max", "tokens_min", "tokens_max")}
            assert got == {k: want[k] for k in got}, (got, want)
            assert hist_pairs(r["batch_hist"]) == want["batch_hist"]
            assert hist_pairs(r["tokens_hist"]) == want["tokens_hist"]
            assert r["by_source"] == {"tuned": 0, "simulated": 0, "fallback": 30}
            assert r["max_distance"] is None and r["mean_distance"] is None and r["far"] == 0
        cov = [r for r in doc["data"] if r["family"].endswith(".p16")]
        assert sum(r["requests"] for r in cov) == 5 and all(r["by_source"]["fallback"] == 0 for r in cov)
        assert all(r["max_distance"] is not None and r["max_distance"] <= 2.5 for r in cov)

        # tune the two keys the fallback served, from the recorded statistics, and publish
        r = tune_cli(
            "--from-traffic",
            "2",
            "--backend",
            "sim",
            "--trials",
            "10",
            "--num-train",
            "2",
            "--num-heldout",
            "2",
            "--num-qo-heads",
            "32",
            "--num-kv-heads",
            "8",
            "--database-url",
            url,
        )
        assert r.returncode == 0, r.stdout + r.stderr
        assert "tuning 2 bucket(s)" in r.stderr, r.stderr
        for B in sets:
            line = next(x for x in r.stdout.splitlines() if x.startswith(keys[B] + ":"))
            assert "published (policy" in line and "not published" not in line, r.stdout
        with store.session_scope(url) as s:
            for B in sets:
                b = store.get_bucket(s, keys[B])
                assert b.source.startswith("traffic:30/30 requests"), b.source
                for role in ("train", "heldout"):  # drawn from the statistics, with the recorded key
                    for lens in b.sample_batches[role]:
                        assert key_of(lens, UNCOVERED) == keys[B]
                assert store.get_published(s, keys[B]).backend == "sim"
        # the server reloads the table (policies_version poll) and answers the same traffic near
        st, pol = c.get("/v1/policies")
        limit = pol["distance_limit"]
        deadline = time.monotonic() + 30
        while True:
            st, ans = c.post("/v1/plan", dict(UNCOVERED, kv_lens=sets[24][0]))
            if ans["policy"]["source"] != "fallback" or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        for B, bs in sets.items():
            for b in bs:
                st, ans = c.post("/v1/plan", dict(UNCOVERED, kv_lens=b))
                assert st == 200 and ans["policy"]["source"] in ("tuned", "simulated"), ans["policy"]
                assert ans["bucket"]["matched"] == keys[B]
                assert ans["bucket"]["distance"] == 0.0 < min(limit, DISTANCE_LIMIT)
        st, doc = c.get("/v1/traffic?hours=1")
        rows = {r["key"]: r for r in doc["data"]}
        assert rows[keys[24]]["by_source"] == {"tuned": 0, "simulated": 31, "fallback": 30}
        assert rows[keys[48]]["by_source"] == {"tuned": 0, "simulated": 30, "fallback": 30}
        assert rows[keys[48]]["max_distance"] == 0.0 and rows[keys[48]]["mean_distance"] == 0.0
        c.close()
    # nothing left to pick: a second --from-traffic finds no fallback or far traffic in a 0-request window
    # of another GPU, and says so in one line
    r = tune_cli("--from-traffic", "1", "--gpu", "NVIDIA H100 80GB HBM3", "--database-url", url, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--from-traffic: no NVIDIA H100" in r.stderr, r.stderr


# ----------------------------------------------------------------------------
# (b) several server processes add into one store without losing a count
# ----------------------------------------------------------------------------


def _hammer(port: int, bodies: list[dict], n: int, out: list) -> None:
    c = Poster(port)
    try:
        for i in range(n):
            st, _ = c.post("/v1/plan", bodies[i % len(bodies)])
            out.append(st)
    finally:
        c.close()


def _counts_after_flush(port: int, want: int, timeout: float = 30.0) -> dict:
    c = Poster(port)
    deadline = time.monotonic() + timeout
    try:
        while True:
            st, doc = c.get("/v1/traffic?hours=2")
            assert st == 200
            if doc["requests"] >= want or time.monotonic() > deadline:
                return doc
            time.sleep(0.1)
    finally:
        c.close()


def _bodies() -> tuple[list[dict], list[str]]:
    """Four batches of four different keys (two of them on the fast path's plain form, all JSON)."""
    bodies = [dict(SHAPE, page_size=16, kv_lens=b[0]) for b in (uniform_batches(B, 3000, 1, B) for B in (8, 16, 32))]
    bodies.append(dict(UNCOVERED, kv_lens=[70_000, 17, 9, 4000]))
    return bodies, [key_of(b["kv_lens"], dict(b)) for b in bodies]


def _check_two_servers(url: str, monkeypatch, workers: int) -> None:
    store.upgrade(url)
    main_job._import_shipped(url)
    monkeypatch.setenv("KVSPLIT_TRAFFIC_FLUSH_INTERVAL_S", "0.05")  # many concurrent upserts of the same rows
    bodies, keys = _bodies()
    servers = [LiveServer(url, workers=workers, reload_interval=0) for _ in range(2 if workers == 1 else 1)]
    with servers[0] as a:
        with servers[-1] if len(servers) == 2 else _null(a) as b:
            res: list = [[], []]
            ports = (a.port, b.port) if b is not a else (a.port, a.port)
            threads = [threading.Thread(target=_hammer, args=(p, bodies, 500, res[i])) for i, p in enumerate(ports)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
            assert res[0] == [200] * 500 and res[1] == [200] * 500
            doc = _counts_after_flush(a.port, 1000)
            time.sleep(0.5)  # later flushes add nothing more
            doc = _counts_after_flush(a.port, 1000)
            assert doc["requests"] == 1000, doc
            per_key = {r["key"]: r["requests"] for r in doc["data"]}
            assert per_key == {k: 250 for k in keys}, per_key
    with store.session_scope(url) as s:  # after both shut down: still exactly 1000, each bin too
        assert s.scalar(select(func.sum(Traffic.requests))) == 1000
        for kind in ("batch", "tokens"):
            assert s.scalar(select(func.sum(TrafficBin.n)).where(TrafficBin.kind == kind)) == 1000


class _null:
    def __init__(self, v):
        self.v = v

    def __enter__(self):
        return self.v

    def __exit__(self, *exc):
        return None


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_server_processes_on_one_sqlite_store_count_exactly(tmp_path, monkeypatch):
    _check_two_servers(f"sqlite:///{tmp_path / 'k.db'}", monkeypatch, workers=1)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_uvicorn_workers_count_exactly(tmp_path, monkeypatch):
    _check_two_servers(f"sqlite:///{tmp_path / 'k.db'}", monkeypatch, workers=2)


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.timeout(300)
def test_two_server_processes_on_one_postgres_store_count_exactly(pg_url, monkeypatch):
    _check_two_servers(pg_url, monkeypatch, workers=1)


# ----------------------------------------------------------------------------
# (c) retention and the off switch
# ----------------------------------------------------------------------------


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _stored_hours(url: str) -> list[int]:
    with store.session_scope(url) as s:
        return sorted(s.scalars(select(Traffic.hour)).all())


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_retention_prunes_hours_older_than_the_limit_and_windows_sum_hours(tmp_path, backend, request):
    url = f"sqlite:///{tmp_path / 'k.db'}" if backend == "sqlite" else request.getfixturevalue("pg_url")
    store.upgrade(url)
    h0 = 490_000  # 2025-11-24
    clock = Clock(h0 * 3600 + 5)
    rec = TrafficRecorder(url, retention_hours=3, clock=clock)
    key = b"nvidia-h200.kv4.d128.bf16.p16.b4.t14.w26x16"
    for hour, n in ((0, 2), (1, 3), (2, 4)):
        clock.t = (h0 + hour) * 3600 + 100
        for i in range(n):
            rec.record(key, 16, 16_000 + i, SOURCE_INDEX["tuned"], 0.25 * i)
        rec.record(b"nvidia-h200.kv4.d128.bf16.p16.b0.t-1.w", 1, 0, SOURCE_INDEX["fallback"], None)
        assert rec.flush() == n + 1
    assert _stored_hours(url) == [h0, h0, h0 + 1, h0 + 1, h0 + 2, h0 + 2]
    now = (h0 + 2) * 3600 + 100
    with store.session_scope(url) as s:
        rows = {r.key: r for r in traffic_summary(s, hours=2, now=now)}
        r = rows[key.decode()]
        assert r.requests == 7 and r.by_source == {"tuned": 7, "simulated": 0, "fallback": 0}
        assert (r.tokens_min, r.tokens_max, r.max_distance) == (16_000, 16_003, 0.75)
        assert r.mean_distance == pytest.approx((0.25 * (0 + 1 + 2) + 0.25 * (0 + 1 + 2 + 3)) / 7)
        assert r.first_hour.endswith("T01:00:00Z") or r.first_hour != r.last_hour
        empty = rows["nvidia-h200.kv4.d128.bf16.p16.b0.t-1.w"]
        assert empty.requests == 2 and empty.tokens_max == 0 and [(b.lo, b.hi) for b in empty.tokens_hist] == [(0, 0)]
        assert empty.max_distance is None and empty.mean_distance is None
        assert traffic_summary(s, hours=3, now=now)[0].requests == 9
    clock.t = (h0 + 3) * 3600  # hour h0 is now 3 hours back: out of a 3-hour retention
    assert rec.flush() == 0
    assert _stored_hours(url) == [h0 + 1, h0 + 1, h0 + 2, h0 + 2]
    clock.t = (h0 + 5) * 3600 + 1
    rec.record(key, 16, 1, SOURCE_INDEX["simulated"], 1.5)  # beyond DISTANCE_LIMIT: far
    rec.flush()
    assert _stored_hours(url) == [h0 + 5]
    with store.session_scope(url) as s:
        (r,) = traffic_summary(s, hours=1, now=clock.t)
        assert (r.requests, r.far, r.by_source["simulated"]) == (1, 1, 1)
        with pytest.raises(ValueError, match="hours: expected an integer >= 1"):
            traffic_summary(s, hours=0)


def test_a_failed_flush_keeps_the_counts_for_the_next(tmp_path):
    url = f"sqlite:///{tmp_path / 'k.db'}"
    store.upgrade(url)
    rec = TrafficRecorder(url, retention_hours=24)
    rec.record(b"nvidia-h200.kv4.d128.bf16.p16.b4.t14.w26x16", 16, 16_000, SOURCE_INDEX["fallback"], None)
    eng = store.get_engine(url)
    with eng.begin() as conn:  # the store loses the table for a moment: the flush fails
        conn.exec_driver_sql("ALTER TABLE traffic RENAME TO traffic_away")
    with pytest.raises(Exception, match="traffic"):
        rec.flush()
    assert rec.pending() == 1
    rec.record(b"nvidia-h200.kv4.d128.bf16.p16.b4.t14.w26x16", 20, 15_000, SOURCE_INDEX["fallback"], None)
    with eng.begin() as conn:
        conn.exec_driver_sql("ALTER TABLE traffic_away RENAME TO traffic")
    assert rec.flush() == 2 and rec.pending() == 0
    with store.session_scope(url) as s:
        (r,) = traffic_summary(s, hours=1)
        assert (r.requests, r.b_min, r.b_max, r.tokens_min, r.tokens_max) == (2, 16, 20, 15_000, 16_000)


def test_the_in_memory_cells_are_bounded(tmp_path):
    url = f"sqlite:///{tmp_path / 'k.db'}"
    store.upgrade(url)
    rec = TrafficRecorder(url, retention_hours=24, max_cells=3)
    keys = [f"nvidia-h200.kv4.d128.bf16.p16.b{b}.t14.w26x16".encode() for b in range(5)]
    for k in keys:
        rec.record(k, 1, 10, SOURCE_INDEX["fallback"], None)
    rec.record(keys[0], 1, 10, SOURCE_INDEX["fallback"], None)  # a known cell still counts
    assert rec.pending() == 4
    assert rec.flush() == 4
    with store.session_scope(url) as s:
        assert sorted(r.requests for r in traffic_summary(s, hours=1)) == [1, 1, 2]


def test_folds_racing_records_lose_nothing_and_keep_each_request_hour(tmp_path):
    # record() appends without a lock; fold() (the flush task's worker thread) moves the log into cells while
    # four threads record: every request lands exactly once, in the hour its own clock reading gave
    url = f"sqlite:///{tmp_path / 'k.db'}"
    store.upgrade(url)
    now = [3600.0 * 500 + 10]
    rec = TrafficRecorder(url, retention_hours=10_000, clock=lambda: now[0], max_log=5_000)
    key = b"nvidia-h200.kv4.d128.bf16.p16.b4.t14.w26x16"
    stop = threading.Event()

    def folding():
        while not stop.is_set():
            rec.fold()

    def recording(i):
        for j in range(20_000):
            rec.record(key, 1 + (j % 64), 1_000 + j, SOURCE_INDEX["tuned"], 0.5)

    f = threading.Thread(target=folding)
    f.start()
    threads = [threading.Thread(target=recording, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    f.join()
    assert rec.pending() == 80_000
    rec.record(key, 3, 7, SOURCE_INDEX["fallback"], None)  # recorded in hour 500, folded in hour 501
    now[0] += 3600
    assert rec.flush() == 80_001
    with store.session_scope(url) as s:
        rows = {
            (t.hour, t.requests, t.n_tuned, t.n_fallback, t.batch_min, t.batch_max) for t in s.scalars(select(Traffic))
        }
    assert rows == {(500, 80_001, 80_000, 1, 1, 64)}


def test_a_sliced_fold_folds_everything_while_requests_keep_coming(tmp_path):
    url = f"sqlite:///{tmp_path / 'k.db'}"
    store.upgrade(url)
    rec = TrafficRecorder(url, retention_hours=24)
    key = b"nvidia-h200.kv4.d128.bf16.p16.b4.t14.w26x16"
    for i in range(1000):
        rec.record(key, 16, 16_000 + i, SOURCE_INDEX["tuned"], 0.1)
    t = threading.Thread(target=rec.fold, args=(100,))  # as the flush task folds: a worker thread, 10 slices
    t.start()
    for _ in range(500):
        rec.record(key, 32, 1, SOURCE_INDEX["fallback"], None)
    t.join()
    folded = sum(c[0] for c in rec._cells.values())
    assert folded >= 1000 and folded + len(rec._log) == 1500
    rec.fold(7)
    (cell,) = rec._cells.values()
    assert not rec._log and (cell[0], cell[1], cell[3], cell[5], cell[6], cell[7]) == (1500, 1000, 500, 16, 32, 1)


def test_a_full_log_is_folded_on_the_request_path(tmp_path):
    url = f"sqlite:///{tmp_path / 'k.db'}"
    store.upgrade(url)
    rec = TrafficRecorder(url, retention_hours=24, max_log=10)
    for i in range(25):
        rec.record(b"nvidia-h200.kv4.d128.bf16.p16.b4.t14.w26x16", 16, 16_000 + i, SOURCE_INDEX["tuned"], 0.1)
    assert len(rec._log) == 5 and sum(c[0] for c in rec._cells.values()) == 20  # two folds by record() itself
    assert rec.pending() == 25 and not rec._log


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_off_switch_records_nothing(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'k.db'}"
    store.upgrade(url)
    monkeypatch.setenv("KVSPLIT_TRAFFIC", "0")
    monkeypatch.setenv("KVSPLIT_TRAFFIC_FLUSH_INTERVAL_S", "0.05")
    with LiveServer(url, reload_interval=0) as srv:
        c = Poster(srv.port)
        for _ in range(20):
            st, ans = c.post("/v1/plan", dict(SHAPE, page_size=16, kv_lens=[4096, 17, 0]))
            assert st == 200 and ans["policy"]["source"] == "fallback"
        time.sleep(0.3)
        st, doc = c.get("/v1/traffic")
        assert st == 200 and doc["recording"] is False and doc["requests"] == 0 and doc["data"] == []
        c.close()
    with store.session_scope(url) as s:
        assert s.scalar(select(func.count()).select_from(Traffic)) == 0
        assert s.scalar(select(func.count()).select_from(TrafficBin)) == 0


def test_bad_traffic_settings_stop_serve_in_one_line_naming_the_variable(tmp_path):
    url = f"sqlite:///{tmp_path / 'k.db'}"
    store.upgrade(url)
    for var, value in (
        ("KVSPLIT_TRAFFIC_RETENTION_HOURS", "0"),
        ("KVSPLIT_TRAFFIC_FLUSH_INTERVAL_S", "-1"),
        ("KVSPLIT_TRAFFIC", "maybe"),
    ):
        env = {**os.environ, var: value}
        r = subprocess.run(
            [*KVSPLIT, "serve", "--database-url", url, "--port", "0"],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert r.returncode == 2 and var in r.stderr and r.stderr.count("\n") == 1, (var, r.stderr)


def test_current_hour_is_utc_epoch_hours():
    assert current_hour(0) == 0 and current_hour(3599.9) == 0 and current_hour(3600) == 1
