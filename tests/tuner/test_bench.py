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


def test_sim_bench_uses_the_stores_calibration(tmp_path):
    """``kvsplit bench --backend sim`` simulates with the store's calibration of the shape's GPU (as ``kvsplit
    tune`` does): its figures equal those of the same constants given as ``--calibration FILE``, differ from the
    GPU's defaults, and the output names the calibration; a missing store is read as none and not created."""
    import json

    from kvsplit.kernels.device import resolve_device
    from kvsplit.tuner.simulate import Calibration

    gpu = resolve_device("h200").name
    constants = Calibration.default(gpu).to_dict()
    constants["tile_fixed_s"] = 5 * constants["tile_fixed_s"] + 2e-6  # far from the defaults' figures
    url = f"sqlite:///{tmp_path}/k.db"
    store.upgrade(url)
    with store.session_scope(url, write=True) as s:
        d = store.get_or_create_device(s, name=gpu, num_sms=132, hbm_bandwidth_gbps=4800, software={})
        cal_id = store.record_calibration(s, device_id=d.id, constants=constants, kv_dtype="bfloat16").id
    (tmp_path / "c.json").write_text(json.dumps(constants))

    def bench(*extra):
        res = CliRunner().invoke(app, ["bench", "--backend", "sim", "--policies", "balanced", "--gpu", "h200", *extra])
        assert res.exit_code == 0, res.output
        return res.output

    def table(out):  # the figures, without the lines that name the calibration and the store
        return [ln for ln in out.splitlines() if not ln.startswith(("calibration:", "backend=", "note:"))]

    stored = bench("--database-url", url)
    assert f"calibration: stored calibration {cal_id} of {gpu} (KV bfloat16, q_len 1)" in stored
    assert f"backend=sim gpu={gpu} " in stored and f"store={url}" in stored  # the full name, not the alias
    given = bench("--calibration", str(tmp_path / "c.json"), "--database-url", url)
    assert "calibration: the --calibration document" in given
    assert table(stored) == table(given)
    missing = tmp_path / "none.db"
    defaults = bench("--database-url", f"sqlite:///{missing}")
    assert f"calibration: no store read, the simulator's defaults from the DeviceSpec of {gpu}" in defaults
    assert "kvsplit calibrate --gpu" in defaults and not missing.exists()
    assert f"note: no kvsplit store at sqlite:///{missing}: no stored calibration to read" in defaults
    assert table(defaults) != table(stored)
