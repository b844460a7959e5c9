"""`kvsplit tune` end to end with worker processes (sim backend): journal storage,
kill -9 and resume, eight workers at once, PostgreSQL across processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from kvsplit.db import store
from kvsplit.tuner import search
from kvsplit.tuner import study as study_mod
from tests.service_support import SHAPE_ARGS

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(240),
    pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used"),
]

KVSPLIT = [sys.executable, "-m", "kvsplit.service.cli"]


def _cli(*args, env=None, check=True, **kw):
    e = {**os.environ, **(env or {})}
    r = subprocess.run([*KVSPLIT, *args], capture_output=True, text=True, env=e, timeout=200, **kw)
    if check and r.returncode != 0:
        raise AssertionError(f"kvsplit {' '.join(args)} -> {r.returncode}\n{r.stdout}\n{r.stderr}")
    return r


def _journal_studies(path: Path):
    storage = search.open_storage(search.StorageSpec("journal", str(path)))
    return {
        s.study_name: optuna.load_study(study_name=s.study_name, storage=storage)
        for s in optuna.get_all_study_summaries(storage)
    }


def test_two_buckets_two_workers_journal_publish_export_import(tmp_path):
    db = f"sqlite:///{tmp_path / 'k.db'}"
    journal = tmp_path / "studies.journal"
    # simulated trials take milliseconds: slow them so the second worker has started before the first
    # could finish the study alone (both must write trials)
    slow = {"KVSPLIT_TUNE_TRIAL_DELAY_S": "0.3"}
    # trace buckets whose tuned gain on the (uncalibrated) simulator usually clears the 5 % margin a simulated
    # result needs (tuner/verify.py). Which trial is best on the training batches depends on the order the two
    # workers sample in, so the held-out gain varies between runs: arxiv B=128 gained 6.4-25 % in 18 runs on a
    # 2-core machine (1.0188, 1.1474 or 1.1999x the floor against the best baseline's 1.2765x) and mooncake B=128
    # 15-28 % in 12; one full CI run left arxiv unpublished. So the test holds the publish decision to the
    # verification (a bucket below the margin is kept as a draft, saying why) and the export and import to the
    # published buckets, of which there must be one.
    results = []
    for trace in ("arxiv", "mooncake"):
        r = _cli(
            "tune",
            *SHAPE_ARGS,
            "--trace",
            trace,
            "--batch-size",
            "128",
            "--num-train",
            "3",
            "--num-heldout",
            "3",
            "--trials",
            "10",
            "--workers",
            "2",
            "--journal",
            str(journal),
            "--database-url",
            db,
            "--no-progress",
            "--json",
            env=slow,
        )
        results += json.loads(r.stdout)
    assert len(results) == 2 and len({x["bucket_key"] for x in results}) == 2
    studies = _journal_studies(journal)
    for x in results:
        assert x["status"] == "finished" and x["n_finished"] == 10, x
        v = x["verification"]
        assert x["published"] == v["passed"], x
        if not x["published"]:
            assert v["gain"] < v["margin"] and "not published: " in x["message"], x  # kept as a draft, saying why
        c = search.study_counts(studies[x["study_name"]])
        assert c["COMPLETE"] + c["PRUNED"] == 10 and c["RUNNING"] == 0
        v = x["verification"]
        assert v["tuned_geomean_ratio"] <= v["best_baseline_geomean_ratio"]
        # the study values were written by both worker processes
        pids = {
            t.system_attrs[study_mod.ATTR_PROC]["pid"]
            for t in studies[x["study_name"]].get_trials()
            if study_mod.ATTR_PROC in t.system_attrs
        }
        assert len(pids) == 2
    export = tmp_path / "policies.json"
    _cli("db", "export", "--database-url", db, "--output", str(export))
    doc = json.loads(export.read_text())
    published = [x for x in results if x["published"]]
    assert published, results
    assert sorted(e["bucket"]["key"] for e in doc["policies"]) == sorted(x["bucket_key"] for x in published)
    fresh = f"sqlite:///{tmp_path / 'fresh.db'}"
    _cli("db", "upgrade", "--database-url", fresh)
    out = _cli("db", "import", str(export), "--database-url", fresh)
    n = len(published)
    assert f"imported {n} polic{'y' if n == 1 else 'ies'} ({n} published)" in out.stdout, out.stdout
    with store.session_scope(fresh) as s:
        got = {p.bucket_key: p.params for p in store.list_published(s)}
    assert got == {x["bucket_key"]: x["best_params"] for x in published}
    store.dispose_engines()


def test_sqlite_refused_for_parallel_workers(tmp_path):
    r = _cli(
        "tune",
        *SHAPE_ARGS,
        "--family",
        "uniform",
        "--batch-size",
        "8",
        "--trials",
        "3",
        "--workers",
        "2",
        "--database-url",
        f"sqlite:///{tmp_path / 'k.db'}",
        check=False,
    )
    assert r.returncode == 2 and "--journal PATH" in r.stderr


def test_kill_9_mid_study_then_resume(tmp_path):
    db = f"sqlite:///{tmp_path / 'k.db'}"
    journal = tmp_path / "studies.journal"
    args = [
        "tune",
        *SHAPE_ARGS,
        "--family",
        "skewed60",
        "--batch-size",
        "32",
        "--num-train",
        "2",
        "--num-heldout",
        "2",
        "--trials",
        "12",
        "--workers",
        "2",
        "--journal",
        str(journal),
        "--database-url",
        db,
        "--no-progress",
    ]
    p = subprocess.Popen(
        [*KVSPLIT, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "KVSPLIT_TUNE_TRIAL_DELAY_S": "0.5"},
        start_new_session=True,
    )
    deadline = time.time() + 120
    running_seen = False
    try:
        while time.time() < deadline:
            time.sleep(0.3)
            if not journal.exists():
                continue
            studies = _journal_studies(journal)
            if not studies:
                continue
            c = search.study_counts(next(iter(studies.values())))
            if c["COMPLETE"] + c["PRUNED"] >= 3 and c["RUNNING"] >= 1:
                running_seen = True
                break
        assert running_seen, "the study never had finished and running trials at once"
    finally:
        os.killpg(p.pid, signal.SIGKILL)  # the coordinator and its workers, mid-trial
        p.wait()
    (study,) = _journal_studies(journal).values()
    before = search.study_counts(study)
    assert before["RUNNING"] >= 1 and before["COMPLETE"] + before["PRUNED"] < 12
    r = _cli(*args)
    (study,) = _journal_studies(journal).values()
    after = search.study_counts(study)
    assert after["COMPLETE"] + after["PRUNED"] == 12
    assert after["RUNNING"] == 0 and after["WAITING"] == 0
    # the killed trials were failed and retried with the same parameters
    failed = [t for t in study.get_trials() if t.state.name == "FAIL" and not t.user_attrs.get(study_mod.ATTR_SURPLUS)]
    retried = [t for t in study.get_trials() if "failed_trial" in t.system_attrs]
    assert len(failed) >= 1 and {t.number for t in failed} <= {t.system_attrs["failed_trial"] for t in retried}
    assert "published" in r.stdout


def test_eight_workers_started_at_once(tmp_path):
    db = f"sqlite:///{tmp_path / 'k.db'}"
    journal = tmp_path / "studies.journal"
    r = _cli(
        "tune",
        *SHAPE_ARGS,
        "--family",
        "2x40",
        "--batch-size",
        "16",
        "--num-train",
        "2",
        "--num-heldout",
        "2",
        "--trials",
        "16",
        "--workers",
        "8",
        "--journal",
        str(journal),
        "--database-url",
        db,
        "--no-progress",
        "--json",
    )
    (res,) = json.loads(r.stdout)
    assert res["status"] == "finished" and res["n_finished"] == 16
    (study,) = _journal_studies(journal).values()
    c = search.study_counts(study)
    assert c["COMPLETE"] + c["PRUNED"] == 16 and c["RUNNING"] == 0
    # the four baseline equivalents were enqueued once
    enq = [t for t in study.get_trials() if "fixed_params" in t.system_attrs and t.state.name != "FAIL"]
    assert len({json.dumps(t.system_attrs["fixed_params"], sort_keys=True) for t in enq}) == len(enq)


@pytest.mark.postgres
def test_postgres_multi_worker_tuning(pg_url):
    # the store and the Optuna study both in PostgreSQL, two worker processes, no journal
    _cli("db", "upgrade", "--database-url", pg_url)
    # a trace bucket whose result clears the simulator's 5 % margin (tuner/verify.py) whatever order the two
    # workers sample in: with 20 trials the study enqueues the warm starts (tuner.space.WARM_START), and the
    # equivalent of balanced|c4|n64w4s2 wins at a 13.1 % held-out gain (12 of 12 local runs). With 10 trials
    # (baselines only) a sampled trial sometimes won on the 2 training batches at a 3.2 % held-out gain and was
    # rightly not published (1 of 6 local runs, and one CI run)
    args = [
        "tune",
        *SHAPE_ARGS,
        "--trace",
        "azure_code",
        "--batch-size",
        "64",
        "--num-train",
        "2",
        "--num-heldout",
        "2",
        "--workers",
        "2",
        "--database-url",
        pg_url,
        "--no-progress",
        "--json",
    ]
    r = _cli(*args, "--trials", "20", env={"KVSPLIT_TUNE_TRIAL_DELAY_S": "0.3"})  # so both workers get trials
    (res,) = json.loads(r.stdout)
    assert res["status"] == "finished" and res["n_finished"] == 20 and res["published"]
    storage = search.open_storage(search.storage_spec(pg_url, workers=2))
    study = optuna.load_study(study_name=res["study_name"], storage=storage)
    c = search.study_counts(study)
    assert c["COMPLETE"] + c["PRUNED"] == 20 and c["RUNNING"] == 0
    pids = {
        t.system_attrs[study_mod.ATTR_PROC]["pid"] for t in study.get_trials() if study_mod.ATTR_PROC in t.system_attrs
    }
    assert len(pids) == 2
    # resuming through the same URL stops at the requested count
    r = _cli(*args, "--trials", "22")
    assert json.loads(r.stdout)[0]["n_finished"] == 22
    with store.session_scope(pg_url) as s:
        assert [p.bucket_key for p in store.list_published(s)] == [res["bucket_key"]]
        assert len(store.list_measurements(s, tuning_run_id=res["run_id"])) == 5 * 2


@pytest.mark.parametrize("workers", [1, 2])
def test_ctrl_c_stops_after_the_current_trial(tmp_path, workers):
    db = f"sqlite:///{tmp_path / 'k.db'}"
    journal = tmp_path / "studies.journal"
    args = [
        "tune",
        *SHAPE_ARGS,
        "--family",
        "uniform",
        "--batch-size",
        "32",
        "--num-train",
        "2",
        "--num-heldout",
        "2",
        "--trials",
        "40",
        "--workers",
        str(workers),
        "--journal",
        str(journal),
        "--database-url",
        db,
        "--no-progress",
    ]
    p = subprocess.Popen(
        [*KVSPLIT, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "KVSPLIT_TUNE_TRIAL_DELAY_S": "0.4"},
        start_new_session=True,
    )
    deadline = time.time() + 120
    while time.time() < deadline:
        time.sleep(0.2)
        studies = _journal_studies(journal) if journal.exists() else {}
        if studies:
            c = search.study_counts(next(iter(studies.values())))
            if c["COMPLETE"] + c["PRUNED"] >= 2 and c["RUNNING"] >= 1:
                break
    os.killpg(p.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130, (out, err)
    assert "re-run the same command to resume" in err
    (study,) = _journal_studies(journal).values()
    c = search.study_counts(study)
    assert c["RUNNING"] == 0 and c["FAIL"] == 0  # running trials were finished, not abandoned
    assert 2 <= c["COMPLETE"] + c["PRUNED"] < 40
    with store.session_scope(db) as s:
        (run,) = store.list_runs(s)
        assert run.status == "interrupted"
        assert store.list_published(s) == []  # no verification after an interrupt
    store.dispose_engines()
