"""``kvsplit bench --trace``: the served plan vs the baselines on trace batches (sim backend)."""

from __future__ import annotations

import collections

from typer.testing import CliRunner

from kvsplit.db import store
from kvsplit.service.cli import app
from kvsplit.tuner.bench import run_trace_bench


def test_trace_bench_on_an_empty_store_serves_the_fallback(tmp_path):
    url = f"sqlite:///{tmp_path}/k.db"
    store.upgrade(url)
    rows = run_trace_bench("arxiv", database_url=url, batch_sizes=(16,), batches=2)
    by = collections.defaultdict(dict)
    for r in rows:
        by[r["batch"]][r["policy"]] = r
    assert sorted(by) == [0, 1]
    for batch in by.values():
        # FlashInfer's *rules* on kvsplit's kernel; FlashInfer's own kernel (flashinfer_kernel) is GPU-only
        assert set(batch) == {"published", "balanced", "fa3", "fi_rule_tc", "fi_rule_notc", "no_split"}
        pub = batch["published"]
        assert pub["source"] == "fallback"
        # the fallback is `balanced`: the same plan, so the same predicted time
        assert pub["time_us"] == batch["balanced"]["time_us"]
        for r in batch.values():
            assert r["ratio"] >= 1.0 and abs(r["time_us"] / r["floor_us"] - r["ratio"]) < 1e-9
            assert 0 < r["B"] <= r["tokens"]


def test_trace_bench_cli(tmp_path):
    url = f"sqlite:///{tmp_path}/k.db"
    store.upgrade(url)
    res = CliRunner().invoke(
        app,
        [
            "bench",
            "--trace",
            "sharegpt",
            "--batch-sizes",
            "16",
            "--batches",
            "1",
            "--database-url",
            url,
            "--out",
            str(tmp_path),
        ],
    )
    assert res.exit_code == 0, res.output
    assert "vs balanced" in res.output and (tmp_path / "trace_sharegpt.csv").exists()
    # every column is explained, and the missing GPU-only baseline says so instead of showing a figure
    assert "fi_rule_tc         FlashInfer's split rule, tensor-core path" in res.output
    assert "flashinfer_kernel: not measured" in res.output and "vs flashinfer_kernel" not in res.output
    bad = CliRunner().invoke(app, ["bench", "--trace", "nope", "--database-url", url])
    assert bad.exit_code == 2 and "unknown trace 'nope'" in bad.output


def test_bench_labels_old_names_and_gpu_only_baseline(tmp_path):
    res = CliRunner().invoke(app, ["bench", "--backend", "sim", "--policies", "flashinfer_tc,balanced"])
    assert res.exit_code == 0, res.output
    # an earlier release's label is still accepted, printed under the new one
    assert "fi_rule_tc: time / HBM floor" in res.output
    assert "balanced           kvsplit's wave-aware even-chunk rule" in res.output
    bad = CliRunner().invoke(app, ["bench", "--backend", "sim", "--policies", "flashinfer_kernel"])
    assert bad.exit_code != 0 and "flashinfer_kernel is FlashInfer's kernel, timed on a GPU only" in bad.output
