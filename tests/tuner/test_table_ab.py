"""A campaign's table, exported with ``kvsplit db export``, is a file in the shipped table's format that
``PolicyTable.from_export`` serves; ``bench/table_ab.py`` compares it with the shipped table batch by batch
(here on the simulator backend: its figures are checked against the simulator's own times of the plans each
table serves, computed independently)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np

from kvsplit.kernels.policy_table import PolicyTable
from kvsplit.tuner.backends import SimBackend
from kvsplit.tuner.workloads import evaluation_cases

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "kernels/data/h200_policies.json"
CLI = [sys.executable, "-m", "kvsplit.service.cli"]
SHAPE = dict(gpu="NVIDIA H200", num_qo_heads=32, num_kv_heads=4, head_dim=128, dtype="bfloat16", page_size=16)


def _run(args, timeout=300):
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def _ab(tables, cases, out):
    return _run(
        [sys.executable, "bench/table_ab.py", "--tables", *map(str, tables), "--cases", str(cases)]
        + ["--backend", "sim", "--out", str(out)]
    )


def test_a_campaign_export_has_the_shipped_format_and_table_ab_compares_it(tmp_path):
    url = f"sqlite:///{tmp_path}/c.db"
    r = _run(
        CLI
        + ["tune", "--campaign", "--backend", "sim", "--gpu", "h200", "--model-shape", "qwen3-30b-a3b"]
        + ["--budget-minutes", "0.3", "--batch-sizes", "4,64", "--totals", "262144", "--traces", "none"]
        + ["--trials", "4", "--seed", "3", "--database-url", url, "--json"]
    )
    assert r.returncode == 0, r.stderr
    exported = tmp_path / "campaign.json"
    e = _run(CLI + ["db", "export", "--database-url", url, "--output", str(exported)])
    assert e.returncode == 0, e.stderr
    doc, shipped = json.loads(exported.read_text()), json.loads(SHIPPED.read_text())
    assert set(doc) == set(shipped) and doc["format"] == shipped["format"] == "kvsplit.policies"
    assert doc["format_version"] == shipped["format_version"]
    assert set(doc["policies"][0]) == set(shipped["policies"][0])
    table = PolicyTable.from_export(doc, version=doc["policies_version"])
    assert len(table) == len(doc["policies"]) == json.loads(r.stdout)["published"] > 0
    # the table serves each published bucket's params on that bucket's own held-out batch
    from kvsplit.db import store

    with store.session_scope(url) as s:
        published = [
            (p.bucket.key, dict(p.params), p.bucket.sample_batches["heldout"][0]) for p in store.list_published(s)
        ]
    for key, params, held in published:
        plan, bucket, info = table.plan(np.asarray(held), **SHAPE)
        assert bucket["matched"] == key and plan.params == params and info["source"] == "simulated"

    # the A/B on six evaluation batches of the campaign's shape, and a seventh of a shape it has no bucket for
    cases = [c for c in evaluation_cases() if c["num_kv_heads"] == 4][:60:10]
    cases.append(next(c for c in evaluation_cases() if c["num_kv_heads"] == 8))
    case_file = tmp_path / "cases.json"
    case_file.write_text(json.dumps({"cases": cases}))
    ab = _ab([SHIPPED, exported], case_file, tmp_path / "ab")
    assert ab.returncode == 0, ab.stderr
    assert "left out: [(32, 8)]" in ab.stdout and "geomean B/A" in ab.stdout
    got = json.loads((tmp_path / "ab/table_ab.json").read_text())
    rows, summary = got["batches"], got["summary"]
    assert [r["case"] for r in rows] == [c["id"] for c in cases[:6]]
    sim = SimBackend("h200", num_kv_heads=4, head_dim=128, dtype="bfloat16")
    a_tab = PolicyTable.from_export(json.loads(SHIPPED.read_text()))
    for r, c in zip(rows, cases, strict=False):
        lens = np.asarray(c["kv_lens"])
        # independent: the simulator's time of the plan each table serves
        assert r["a_s"] == sim.time_plan(a_tab.plan(lens, **SHAPE)[0])
        assert r["b_s"] == sim.time_plan(table.plan(lens, **SHAPE)[0])
        assert r["oracle_s"] == min(r["times"].values()) <= min(r["a_s"], r["b_s"])
    ba = [r["b_s"] / r["a_s"] for r in rows]
    assert math.isclose(summary["geomean_b_over_a"], math.exp(np.mean(np.log(ba))), rel_tol=1e-12)
    assert summary["worst_b_over_a"] == max(ba) and summary["batches"] == 6
    assert summary["worst_b_over_oracle"] == max(r["b_s"] / r["oracle_s"] for r in rows)
    assert summary["batches_b_over_a_above_1.03"] == sum(x > 1.03 for x in ba)


def test_table_ab_of_a_table_against_itself_is_even_and_bad_input_is_named(tmp_path):
    cases = [c for c in evaluation_cases() if c["num_kv_heads"] == 4][:3]
    case_file = tmp_path / "cases.json"
    case_file.write_text(json.dumps({"cases": cases}))
    ab = _ab([SHIPPED, SHIPPED], case_file, tmp_path)
    assert ab.returncode == 0, ab.stderr
    s = json.loads((tmp_path / "table_ab.json").read_text())["summary"]
    assert s["geomean_b_over_a"] == 1.0 and s["worst_b_over_a"] == 1.0
    bad = _ab([tmp_path / "missing.json", SHIPPED], case_file, tmp_path)
    assert bad.returncode == 2 and "--tables" in bad.stderr and "missing.json" in bad.stderr
    bad = _ab([SHIPPED, SHIPPED], tmp_path / "nope.json", tmp_path)
    assert bad.returncode == 2 and "--cases" in bad.stderr
