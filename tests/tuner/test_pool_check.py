"""``bench/pool_check.py`` times a shipped table's published plans and a draft's baselines against the fitted pool on
each bucket's held-out batch. Here on the simulator backend over the first 25 buckets of the H100's q_len-8 campaign,
with the shipped H100 table less its policy of the 25th bucket (24 published, then a draft): every figure it writes
is checked against the simulator's own times of plans built here, independently, from that export and the candidate
names."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

from kvsplit.kernels.plan import make_plan
from kvsplit.kernels.policy_table import SHIPPED_TABLES
from kvsplit.tuner.backends import make_backend
from kvsplit.tuner.campaign import CampaignConfig, campaign_tasks
from kvsplit.tuner.pool import SERVED_POOL, fitted_pool, parse_candidate

ROOT = Path(__file__).resolve().parents[2]
N = 25


def test_pool_check_figures_match_the_simulators_times_of_the_same_plans(tmp_path):
    cfg = CampaignConfig(database_url="sqlite://", gpu="h100", num_qo_heads=32, num_kv_heads=4, q_len=8, backend="sim")
    tasks = campaign_tasks(cfg)[:N]
    export = json.loads((ROOT / "kernels" / SHIPPED_TABLES[1]).read_text())  # the H100's
    assert export["policies"][0]["bucket"]["gpu"] == "NVIDIA H100 80GB HBM3"
    export["policies"] = [p for p in export["policies"] if p["bucket"]["key"] != tasks[-1].key]
    (tmp_path / "table.json").write_text(json.dumps(export))
    r = subprocess.run(
        [sys.executable, "bench/pool_check.py", "--gpu", "h100", "--model-shape", "qwen3-30b-a3b", "--q-len", "8"]
        + ["--table", str(tmp_path / "table.json"), "--backend", "sim", "--limit", str(N), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads((tmp_path / "pool_check.json").read_text())
    rows = doc["rows"]
    table = {p["bucket"]["key"]: p for p in export["policies"]}
    assert [row["bucket"] for row in rows] == [t.key for t in tasks]
    assert [row["published"] for row in rows] == [t.key in table for t in tasks]
    assert sum(not row["published"] for row in rows) == 1  # bucket 25, whose policy the table above lacks
    pool = fitted_pool(SERVED_POOL, 32, 4, 8)
    added = [n for n in pool if n not in SERVED_POOL]
    assert len(added) == 12  # the two-head candidates, one head at q_len 8 x GQA group 8
    sim = make_backend(
        "sim",
        shape=tasks[0].shape,
        max_tokens=max(sum(t.heldout[0]) for t in tasks) + 8192,
        max_batch=max(len(t.heldout[0]) for t in tasks) + 8,
    )
    pub_best, pub_added = [], []
    for task, row in zip(tasks, rows):
        lens = list(task.heldout[0])
        cand = {}
        for name in pool:
            policy, params = parse_candidate(name)
            cand[name] = sim.time_plan(make_plan(lens, policy=policy, params=params, **task.plan_kwargs))
        assert math.isclose(row["best_s"], min(cand.values()), rel_tol=1e-9)
        assert math.isclose(row["best_added_s"], min(cand[n] for n in added), rel_tol=1e-9)
        if row["published"]:
            e = table[task.key]
            t = sim.time_plan(make_plan(lens, policy=e["name"], params=e["params"], **task.plan_kwargs))
            assert math.isclose(row["published_s"], t, rel_tol=1e-9)
            pub_best.append(t / min(cand.values()))
            pub_added.append(t / min(cand[n] for n in added))
        else:
            fi = sim.time_plan(make_plan(lens, policy="flashinfer", params={}, **task.plan_kwargs))
            bal = sim.time_plan(make_plan(lens, policy="balanced", params={}, **task.plan_kwargs))
            assert math.isclose(row["flashinfer_s"], fi, rel_tol=1e-9)
            assert row["best_baseline_s"] <= min(fi, bal) * (1 + 1e-9)
            assert math.isclose(
                doc["summary"]["drafts"]["flashinfer_over_best_added"]["geomean"],
                fi / min(cand[n] for n in added),
                rel_tol=1e-9,
            )
    s = doc["summary"]["published"]
    gm = math.exp(sum(map(math.log, pub_best)) / len(pub_best))
    assert s["published_over_best"]["n"] == 24 and math.isclose(s["published_over_best"]["geomean"], gm, rel_tol=1e-9)
    assert math.isclose(s["published_over_best_added"]["max"], max(pub_added), rel_tol=1e-9)
    # the best of the whole pool is never slower than the best of its additions
    assert all(b <= a * (1 + 1e-12) for b, a in zip(pub_best, pub_added))


def test_pool_check_refuses_a_table_that_is_not_an_export(tmp_path):
    bad = tmp_path / "t.json"
    bad.write_text(json.dumps({"format": "something else"}))
    r = subprocess.run(
        [sys.executable, "bench/pool_check.py", "--gpu", "h100", "--model-shape", "qwen3-30b-a3b"]
        + ["--table", str(bad), "--backend", "sim"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert r.returncode == 2 and "--table" in r.stderr and "Traceback" not in r.stderr
