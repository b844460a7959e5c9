"""``kvsplit tune --campaign`` end to end, in real processes on the simulator backend: from a fresh store to a
table ``kvsplit plan`` serves; resume after ``kill -9`` at a random point gives the uninterrupted run's table;
``--max-minutes`` slices; two worker processes on one journal (or one PostgreSQL store) tune each bucket once with
exact trial counts."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from kvsplit.db import store

CLI = [sys.executable, "-m", "kvsplit.service.cli"]
# a small campaign: the five families at B = 4 and 64, T = 262,144, no trace; at most 5 trials per bucket
SMALL = [
    "tune",
    "--campaign",
    "--backend",
    "sim",
    "--model-shape",
    "qwen3-30b-a3b",
    "--budget-minutes",
    "0.3",
    "--batch-sizes",
    "4,64",
    "--totals",
    "262144",
    "--traces",
    "none",
    "--trials",
    "5",
    "--seed",
    "3",
]


def _env():
    env = dict(os.environ)
    env.pop("KVSPLIT_DATABASE_URL", None)
    return env


def _run(args, timeout=300, **env):
    return subprocess.run(CLI + args, capture_output=True, text=True, timeout=timeout, env={**_env(), **env})


def _table(url):
    with store.session_scope(url) as s:
        doc = store.export_published(s)
    return {
        p["bucket"]["key"]: (
            p["name"],
            json.dumps(p["params"], sort_keys=True),
            p["source"] if "source" in p else p.get("backend"),
        )
        for p in doc["policies"]
    }


def test_campaign_from_a_fresh_store_publishes_a_table_that_plan_serves(tmp_path):
    # a GPU listed in kernels/device.py and not present: the simulator's table, labelled simulated
    url = f"sqlite:///{tmp_path}/fresh.db"
    r = _run(SMALL + ["--gpu", "h100", "--database-url", url, "--json"])
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["status"] == "finished" and res["time_kind"] == "simulated"
    assert res["buckets"] >= 8 and 1 <= res["published"] <= res["buckets"]
    assert "DeviceSpec of NVIDIA H100" in res["calibration"]  # no calibration stored: labelled as the spec's figures
    # the budget: at most 10 % over (simulated GPU time)
    assert 0 < res["spent_s"] <= 1.1 * 0.3 * 60
    with store.session_scope(url) as s:
        pub = store.list_published(s)
        assert len(pub) == res["published"]
        bucket = pub[0].bucket
        held = bucket.sample_batches["heldout"][0]
        params = dict(pub[0].params)
        assert all(p.backend == "sim" for p in pub)
    # the plan of a held-out batch of a published bucket: served from the campaign's table
    p = _run(
        [
            "plan",
            "--gpu",
            "h100",
            "--num-qo-heads",
            "32",
            "--num-kv-heads",
            "4",
            "--head-dim",
            "128",
            "--dtype",
            "bf16",
            "--kv-lens",
            ",".join(map(str, held)),
            "--database-url",
            url,
            "--compact",
        ]
    )
    assert p.returncode == 0, p.stderr
    ans = json.loads(p.stdout)
    assert ans["policy"]["source"] == "simulated"
    assert ans["bucket"]["matched"] == bucket.key and ans["policy"]["params"] == params
    # a rerun of the finished campaign times nothing
    t0 = time.time()
    r2 = _run(SMALL + ["--gpu", "h100", "--database-url", url, "--json"])
    assert r2.returncode == 0, r2.stderr
    again = json.loads(r2.stdout)
    assert again["timings"] == 0 and "already finished" in again["lines"][0]
    assert again["spent_s"] == res["spent_s"] and time.time() - t0 < 30
    # the dashboard shows each published bucket's held-out evidence: the campaign verifies outside a tuning run, so
    # the policy's own timings (policy_id) and the baselines beside them; the gain over each baseline is the one
    # its verification recorded (the geomean of the time ratios over the same held-out batches)
    from kvsplit.service.queries import dashboard_data

    with store.session_scope(url) as s:
        verified = {p.bucket.key: dict(p.verification) for p in store.list_published(s)}
    rows = [b for sh in dashboard_data(url)["shapes"] for b in sh["buckets"] if b["key"] in verified]
    assert len(rows) == len(verified)
    for b in rows:
        assert b["evidence"] == "held-out" and b["n_heldout"] >= 1 and b["measured_on"] == ["sim"], b
        want = verified[b["key"]]["speedup_vs"]
        assert set(b["speedups"]) == set(want)
        for base, x in want.items():
            assert abs(b["speedups"][base] - x) <= 1e-9 * x, (b["key"], base)
    tuned_series = [n for sh in dashboard_data(url)["shapes"] for fam in sh["families"].values() for n, _ in fam]
    assert "tuned (simulated)" in tuned_series


def test_resume_after_kill_9_gives_the_uninterrupted_table(tmp_path):
    ref_url = f"sqlite:///{tmp_path}/ref.db"
    t0 = time.time()
    r = _run(SMALL + ["--database-url", ref_url])
    assert r.returncode == 0, r.stderr
    wall = time.time() - t0
    ref = _table(ref_url)
    assert ref
    seed = int(os.environ.get("KVSPLIT_TEST_KILL_SEED", random.randrange(1 << 30)))
    at = random.Random(seed).uniform(0.3 * wall, 0.9 * wall)  # start-up (imports) is the first ~20 %
    url = f"sqlite:///{tmp_path}/killed.db"
    for _ in range(3):  # a run faster than the reference (a less loaded machine) may end before the kill: earlier
        proc = subprocess.Popen(
            CLI + SMALL + ["--database-url", url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env()
        )
        time.sleep(at)
        if proc.poll() is None:
            break
        proc.wait()
        for f in tmp_path.glob("killed.db*"):  # the store and its tune lock
            f.unlink()
        at /= 2
    assert proc.poll() is None, "the campaign ended before the kill, three times"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    # resume in slices of about a second (exit 75 while work is left), then to the end
    import sqlite3

    try:  # the killed run had opened the campaign's state: its study holds the campaign's identity (a kill between
        # creating the study and storing that attribute leaves nothing to resume), and not yet 'finished' (a kill
        # after the last step, before the process ended, leaves nothing to resume either)
        with sqlite3.connect(f"{tmp_path}/killed.db") as db:
            q = (
                "select a.key from study_user_attributes a join studies s on a.study_id = s.study_id "
                "where s.study_name like 'kvsplit-campaign-%' and a.key in ('identity', 'finished')"
            )
            keys = {k for (k,) in db.execute(q).fetchall()}
        started = "identity" in keys and "finished" not in keys
    except sqlite3.OperationalError:  # killed before the store had its tables
        started = False
    codes, timed = [], 0
    for i in range(3):
        s = _run(SMALL + ["--database-url", url, "--max-minutes", "0.02", "--json"])
        codes.append(s.returncode)
        assert s.returncode in (0, 75), s.stderr
        if i == 0 and started:
            assert "resuming kvsplit-campaign-sim-" in s.stderr and "GPU budget spent" in s.stderr, s.stderr
        timed += json.loads(s.stdout)["timings"]
        if s.returncode == 0:
            break
    if codes[-1] == 75:
        s = _run(SMALL + ["--database-url", url, "--json"])
        assert s.returncode == 0, s.stderr
        timed += json.loads(s.stdout)["timings"]
    where = f"kill -9 after {at:.2f} s of {wall:.2f} s, {timed} plans timed after it (KVSPLIT_TEST_KILL_SEED={seed})"
    print(where)
    assert _table(url) == ref, where


def test_a_paused_campaign_says_what_is_published_so_far_and_how_to_go_on(tmp_path):
    s = _run(SMALL + ["--database-url", f"sqlite:///{tmp_path}/p.db", "--max-minutes", "0.001"])
    assert s.returncode == 75, s.stderr
    head = s.stdout.splitlines()[0]
    assert head.startswith("paused: ") and " published so far (the verify step, the campaign's last, " in head, head
    assert "paused after --max-minutes 0.001: run the same command again to continue" in s.stderr
    # a slice shorter than the campaign's start-up times nothing, and says why
    assert "this slice timed no plan: its " in s.stderr, s.stderr
    assert "past --max-minutes 0.001 (0.1 s); give a longer --max-minutes" in s.stderr, s.stderr
    s = _run(SMALL + ["--database-url", f"sqlite:///{tmp_path}/p.db", "--max-minutes", "0.1", "--json"])
    assert s.returncode in (0, 75), s.stderr
    assert json.loads(s.stdout)["timings"] > 0 and "this slice timed no plan" not in s.stderr, s.stderr


def test_two_workers_on_one_journal_tune_each_bucket_once_with_exact_trials(tmp_path):
    journal = tmp_path / "studies.journal"
    _two_workers(f"sqlite:///{tmp_path}/w2.db", journal)


@pytest.mark.postgres
def test_two_workers_on_one_postgresql_store(pg_url):
    # the store and every Optuna study in PostgreSQL, as several hosts would share them
    _two_workers(pg_url, None)


def _two_workers(url, journal):
    import optuna

    from kvsplit.tuner.study import open_storage, storage_spec

    args = [
        "tune",
        "--campaign",
        "--backend",
        "sim",
        "--model-shape",
        "llama-3.1-8b",
        "--budget-minutes",
        "0.3",
        "--batch-sizes",
        "64",
        "--totals",
        "262144",
        "--traces",
        "none",
        "--trials",
        "6",
        "--workers",
        "2",
        "--database-url",
        url,
        "--json",
    ] + (["--journal", str(journal)] if journal else [])
    # each measured trial sleeps 0.5 s (the workers' test hook), so the first worker cannot finish every trial
    # before the second has started: on a loaded 2-core machine the second's start (imports, numba) can take seconds
    r = _run(args, KVSPLIT_TUNE_TRIAL_DELAY_S="0.5")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["status"] == "finished"
    storage = open_storage(storage_spec(url, journal=str(journal) if journal else None, workers=2))
    state = optuna.load_study(study_name=res["name"], storage=storage).user_attrs
    alloc = state["alloc"]
    assert len(alloc) == res["buckets"] >= 4 and sorted(state["searched"]) == sorted(alloc)
    names = {s.study_name for s in optuna.get_all_study_summaries(storage)}
    pids = set()
    for key, n in alloc.items():
        study_names = [x for x in names if x.endswith(key)]
        assert study_names == [f"kvsplit-sim-{key}"]  # one study per bucket
        trials = optuna.load_study(study_name=study_names[0], storage=storage).get_trials(deepcopy=False)
        finished = [t for t in trials if t.state.name in ("COMPLETE", "PRUNED")]
        assert len(finished) == n  # exactly the allocated trials
        assert not [t for t in trials if t.state.name in ("RUNNING", "WAITING")]
        measured = [
            json.dumps(t.params, sort_keys=True)
            for t in finished
            if t.state.name == "COMPLETE" and "cached_from" not in t.user_attrs
        ]
        assert len(measured) == len(set(measured))  # no parameter set measured twice
        pids |= {t.system_attrs["kvsplit:proc"]["pid"] for t in finished if "kvsplit:proc" in t.system_attrs}
    assert len(pids) == 2  # both workers took trials
    with store.session_scope(url) as s:
        runs = store.list_runs(s, limit=None)
        per_bucket = {}
        for run in runs:
            per_bucket[run.bucket.key] = per_bucket.get(run.bucket.key, 0) + 1
        assert per_bucket == {k: 1 for k in alloc}  # each bucket tuned by one run
        assert {run.status for run in runs} == {"finished"}
        # the pool step, split over the two workers: every batch timed, none twice
        pool = store.list_measurements(s, stage="pool")
        seen = [(m.bucket_id, m.batch_index, m.policy_name) for m in pool]
        assert len(seen) == len(set(seen)) and len({m.bucket_id for m in pool}) == len(alloc)


def test_the_budget_bounds_the_search(tmp_path):
    # 5 buckets; the budget, not --trials, bounds the Optuna trials; the time spent stays within 10 % of it
    import optuna

    from kvsplit.tuner.campaign import CampaignConfig, run_campaign
    from kvsplit.tuner.study import open_storage, storage_spec

    url = f"sqlite:///{tmp_path}/budget.db"
    store.upgrade(url)
    cfg = CampaignConfig(
        database_url=url, budget_minutes=0.2, batch_sizes=(64,), totals=(262_144,), traces=(), max_trials=40, seed=1
    )
    res = run_campaign(cfg)
    assert res.status == "finished" and res.buckets == 5
    alloc = optuna.load_study(study_name=res.name, storage=open_storage(storage_spec(url))).user_attrs["alloc"]
    assert sum(alloc.values()) < 5 * 40 and max(alloc.values()) > 1
    assert 0.7 * 12.0 <= res.spent_s <= 1.1 * 12.0
    # the whole-wave step timed the near-even probe batches (jittered training batches are never even enough for
    # the rule): each with its nearest bucket's chosen params, timed exactly where a variant of the rule changes
    # its plan, and those ratios enter the decision
    from kvsplit.kernels.buckets import bucket_key, nearest
    from kvsplit.kernels.plan import make_plan
    from kvsplit.tuner.campaign import WHOLE_WAVE_PROBE_BATCH_SIZES, WHOLE_WAVE_PROBE_TOTALS, WHOLE_WAVE_VARIANTS

    attrs = optuna.load_study(study_name=res.name, storage=open_storage(storage_spec(url))).user_attrs
    rows, choice = attrs["whole_wave_rows"], attrs["choice"]
    shape = dict(num_kv_heads=4, head_dim=128, dtype="bfloat16", device="NVIDIA H200", page_size=16)
    acted = []
    for T in WHOLE_WAVE_PROBE_TOTALS:
        for B in WHOLE_WAVE_PROBE_BATCH_SIZES:
            (ratios,) = rows[f"probe:B{B}:T{T}"]
            lens = [T // B] * B
            near, _ = nearest(bucket_key(lens, **shape), sorted(choice), limit=float("inf"))
            params = choice[near]["params"]
            base = make_plan(lens, policy="tuned", params=params, num_qo_heads=32, **shape).work_key()
            for r, v in zip(ratios, WHOLE_WAVE_VARIANTS, strict=True):
                plan = make_plan(lens, policy="tuned", params={**params, **v}, num_qo_heads=32, **shape)
                changed = plan.work_key() != base
                assert (r != 1.0) == changed and r > 0, (B, T, v, r)
                acted += [r] if changed else []
    assert acted, "the rule changes the plan of some probe batch"
    assert res.whole_wave["batches"] >= 1


def test_a_campaign_on_a_sqlite_store_another_tuner_holds_stops_first_in_one_line(tmp_path):
    """The SQLite store is one tuner's for the whole campaign: a campaign started while another process holds the
    store's tuning lock stops before its pool step or any line about the campaign's state (it printed its pool
    progress, or "resuming ...", and only stopped at the search)."""
    from kvsplit.tuner.study import exclusive_storage, storage_spec

    url = f"sqlite:///{tmp_path}/c.db"
    with exclusive_storage(storage_spec(url)):  # this process holds the store, as a running tuner would
        r = _run(SMALL + ["--database-url", url], timeout=120)
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.returncode == 1 and "Traceback" not in r.stderr, (r.returncode, r.stderr)
    # what it prints: the store it created and the campaign it was asked for, then the refusal
    assert [x.split()[0] for x in lines] == ["created", "campaign", "error:"], lines
    assert lines[-1].startswith(f"error: another kvsplit tune (PID {os.getpid()} on "), lines[-1]
    assert "is tuning with the SQLite store" in lines[-1] and r.stdout == "", r.stdout
