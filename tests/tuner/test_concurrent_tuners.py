"""Several ``kvsplit tune`` processes on one store, and tuners killed with ``kill -9`` (sim backend, real processes).

- SQLite: three tuners started together on a fresh store, ten repeats (a minute on 2 cores). One
  tunes; the others stop at once with one line naming it (PID, host); no
  traceback, exact trial counts, no ``running`` row left.
- PostgreSQL: three tuners started together on a fresh schema, three repeats.
  All cooperate on the study: all exit 0, exactly ``--trials`` finished trials,
  every run row finished.
- ``kill -9``: the killed tuner's ``running`` row becomes ``failed``
  (``abandoned: ...``, naming its PID) in ``GET /v1/runs`` of a live server and
  at the next tune start, which then resumes the study to the exact count.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import optuna
import pytest

from kvsplit.db import store
from kvsplit.tuner import search
from tests.service_support import LiveServer

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(900),
    pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used"),
]

KVSPLIT = [sys.executable, "-m", "kvsplit.service.cli"]
TRIALS = 8
TUNE = [
    "tune",
    "--family",
    "uniform",
    "--batch-size",
    "8",
    "--total-tokens",
    "8192",
    "--trials",
    str(TRIALS),
    "--num-train",
    "2",
    "--num-heldout",
    "2",
    "--no-progress",
    "--json",
]
SQLITE_ROUNDS = int(os.environ.get("KVSPLIT_TEST_TUNER_ROUNDS", "10"))
BUSY = re.compile(
    r"^error: another kvsplit tune \(PID (\d+) on (\S+), since [0-9:]+ UTC\) is tuning with the "
    r"SQLite store "
)


def _env(**extra: str) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("KVSPLIT_")}
    e.update(extra)
    return e


def _start_together(n: int, url: str, env: dict[str, str]) -> list[tuple[subprocess.Popen, str, str]]:
    procs = [
        subprocess.Popen(
            [*KVSPLIT, *TUNE, "--database-url", url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        for _ in range(n)
    ]
    return [(p, *p.communicate(timeout=600)) for p in procs]


def _study_counts(url: str) -> dict[str, int]:
    storage = search.open_storage(search.StorageSpec("rdb", url))
    (summary,) = optuna.get_all_study_summaries(storage)
    return search.study_counts(optuna.load_study(study_name=summary.study_name, storage=storage))


def _runs(url: str) -> list:
    with store.session_scope(url) as s:
        return store.list_runs(s, limit=None)


def test_three_tuners_on_a_fresh_sqlite_store(tmp_path):
    for i in range(SQLITE_ROUNDS):
        url = f"sqlite:///{tmp_path / f'repeat{i}.db'}"
        done = _start_together(3, url, _env())
        ok = [p for p, _, _ in done if p.returncode == 0]
        assert ok, "no tuner finished:\n" + "\n".join(e for _, _, e in done)
        for p, out, err in done:
            assert "Traceback" not in err + out, err
            if p.returncode == 0:
                (res,) = json.loads(out)
                assert res["status"] == "finished" and res["n_finished"] == TRIALS
                continue
            lines = [x for x in err.splitlines() if x.strip()]
            assert p.returncode == 1 and len(lines) == 1, err
            m = BUSY.match(lines[0])
            assert m and int(m.group(1)) in {q.pid for q in ok}, lines[0]  # it names the tuner that ran
        c = _study_counts(url)
        assert c["COMPLETE"] + c["PRUNED"] == TRIALS and c["RUNNING"] == 0 and c["WAITING"] == 0, c
        runs = _runs(url)
        assert sorted(r.pid for r in runs) == sorted(p.pid for p in ok)  # a refused tuner wrote no row
        assert {r.status for r in runs} == {"finished"} and all(r.n_finished == TRIALS for r in runs)
        store.dispose_engines()


@contextlib.contextmanager
def _pg_schema(base: str):
    from sqlalchemy import create_engine, text

    schema = f"t_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base)
    with admin.begin() as c:
        c.execute(text(f"CREATE SCHEMA {schema}"))
    try:
        yield f"{base}{'&' if '?' in base else '?'}options=-csearch_path%3D{schema}"
    finally:
        store.dispose_engines()
        with admin.begin() as c:
            c.execute(text(f"DROP SCHEMA {schema} CASCADE"))
        admin.dispose()


@pytest.mark.postgres
def test_three_tuners_cooperate_on_a_fresh_postgresql_schema():
    base = os.environ.get("KVSPLIT_TEST_POSTGRES_URL")
    if not base:
        pytest.skip("KVSPLIT_TEST_POSTGRES_URL is not set (.ci/run starts PostgreSQL and sets it)")
    for _ in range(3):
        with _pg_schema(base) as url:
            # trials slowed so that the three overlap on the study
            done = _start_together(3, url, _env(KVSPLIT_TUNE_TRIAL_DELAY_S="0.3"))
            for p, out, err in done:
                assert p.returncode == 0 and "Traceback" not in err, err
                (res,) = json.loads(out)
                assert res["status"] == "finished" and res["n_finished"] == TRIALS
            c = _study_counts(url)
            assert c["COMPLETE"] + c["PRUNED"] == TRIALS and c["RUNNING"] == 0 and c["WAITING"] == 0, c
            runs = _runs(url)
            assert sorted(r.pid for r in runs) == sorted(p.pid for p, _, _ in done)
            assert {r.status for r in runs} == {"finished"} and all(r.n_finished == TRIALS for r in runs)


def _running_row(url: str, pid: int, timeout: float = 120.0) -> int:
    """Wait until the tuner ``pid`` has a running row and a finished trial; its run id."""
    deadline = time.time() + timeout
    db = url.removeprefix("sqlite:///")
    while time.time() < deadline:
        time.sleep(0.3)
        if not Path(db).exists():
            continue
        with contextlib.suppress(sqlite3.OperationalError), contextlib.closing(sqlite3.connect(db)) as c:
            row = c.execute("SELECT id FROM tuning_runs WHERE pid = ? AND status = 'running'", (pid,)).fetchone()
            done = c.execute("SELECT count(*) FROM trials WHERE state = 'COMPLETE'").fetchone()[0]
            if row and done >= 1:
                return row[0]
    raise AssertionError(f"tuner {pid} never had a running row and a finished trial")


def _kill_9_mid_study(url: str) -> tuple[int, int]:
    p = subprocess.Popen(
        [*KVSPLIT, *TUNE, "--database-url", url],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=_env(KVSPLIT_TUNE_TRIAL_DELAY_S="1"),
    )
    try:
        run_id = _running_row(url, p.pid)
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    return p.pid, run_id


def test_killed_tuner_row_is_failed_in_runs_route_and_at_next_start(tmp_path):
    url = f"sqlite:///{tmp_path / 'k.db'}"
    pid1, run1 = _kill_9_mid_study(url)
    with LiveServer(url) as srv:
        with urllib.request.urlopen(f"{srv.url}/v1/runs", timeout=30) as r:
            runs = {x["id"]: x for x in json.loads(r.read())["data"]}
        assert runs[run1]["status"] == "failed", runs[run1]
        assert runs[run1]["message"].startswith(f"abandoned: its process (PID {pid1} on ")
        with store.session_scope(url) as s:  # written to the store, not only shown
            (row,) = [r for r in store.list_runs(s) if r.id == run1]
            assert row.status == "failed" and row.finished_at is not None
        pid2, run2 = _kill_9_mid_study(url)  # the server still runs: only a tune start may mark it now
        with store.session_scope(url) as s:
            assert [r.status for r in store.list_runs(s) if r.id == run2] == ["running"]
        r = subprocess.run(
            [*KVSPLIT, *TUNE, "--database-url", url], capture_output=True, text=True, env=_env(), timeout=600
        )
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
        (res,) = json.loads(r.stdout)
        assert res["status"] == "finished" and res["n_finished"] == TRIALS  # resumed to the exact count
        with store.session_scope(url) as s:
            rows = {x.id: x for x in store.list_runs(s)}
        assert rows[run2].status == "failed" and f"PID {pid2} on " in rows[run2].message
        assert rows[res["run_id"]].status == "finished" and res["run_id"] > run2
        with urllib.request.urlopen(f"{srv.url}/v1/runs?status=running", timeout=30) as r:
            assert json.loads(r.read())["count"] == 0
    c = _study_counts(url)
    assert c["COMPLETE"] + c["PRUNED"] == TRIALS and c["RUNNING"] == 0
    store.dispose_engines()


def test_silent_run_of_another_host_is_abandoned_after_its_stale_limit(tmp_path):
    """PID checks hold on this host only; a row of another host is judged by its heartbeat."""
    import datetime as dt

    from kvsplit.db.models import TuningRun, utcnow

    url = f"sqlite:///{tmp_path / 'k.db'}"
    store.upgrade(url)
    with store.session_scope(url, write=True) as s:
        b = store.get_or_create_bucket(
            s, key="b", gpu="NVIDIA H200", num_kv_heads=4, head_dim=128, dtype="bfloat16", page_size=16
        )
        mine = store.start_run(s, bucket_id=b.id, study_name="st", backend="sim", n_trials=4, stale_after_s=30)
        other = store.start_run(s, bucket_id=b.id, study_name="st", backend="sim", n_trials=4, stale_after_s=30)
        other.host, other.pid = "another-host.example", 1
        # this host name, another PID namespace (a container sharing the host's name): PID 1 there is not ours
        boxed = store.start_run(s, bucket_id=b.id, study_name="st", backend="sim", n_trials=4, stale_after_s=30)
        boxed.pid, boxed.proc_start = 1, "42@1"
        ids = mine.id, other.id, boxed.id
    now = utcnow()
    with store.session_scope(url) as s:
        a, o, x = (s.get(TuningRun, i) for i in ids)
        assert store.run_abandoned(a, now + dt.timedelta(hours=1)) is None  # this process lives
        assert store.run_abandoned(x, now + dt.timedelta(seconds=20)) is None
        assert store.run_abandoned(x, now + dt.timedelta(seconds=31)).startswith("abandoned: no heartbeat")
        assert store.run_abandoned(o, now + dt.timedelta(seconds=20)) is None  # heartbeat 20 s old: alive
        why = store.run_abandoned(o, now + dt.timedelta(seconds=31))
        assert (
            why is not None
            and why.startswith("abandoned: no heartbeat from its process (PID 1 on another-host.example)")
            and "more than 30 s" in why
        )
    with store.session_scope(url, write=True) as s:
        store.beat_run(s, ids[1])
        store.beat_run(s, ids[2])
        assert store.reap_runs(s) == []  # fresh heartbeats, just now
    store.dispose_engines()
