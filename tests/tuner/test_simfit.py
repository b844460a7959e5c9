"""Sweep-file helpers of kvsplit.tuner.simfit and the simulator's prefetch config keys."""

from __future__ import annotations

import json

import pytest

from kvsplit.kernels.limits import KernelConfig
from kvsplit.kernels.plan import make_plan
from kvsplit.tuner.simfit import candidate_policy, merged_case_records, sweep_samples
from kvsplit.tuner.simulate import Calibration, config_key


def test_candidate_policy_names():
    assert candidate_policy("balanced|c4|n64w4s2") == (
        "balanced",
        {"ctas_per_sm": 4.0, "block_n": 64, "num_warps": 4, "num_stages": 2},
    )
    assert candidate_policy("stream_k|c0.5|n128w4s3|o2m4|pf") == (
        "stream_k",
        {
            "ctas_per_sm": 0.5,
            "block_n": 128,
            "num_warps": 4,
            "num_stages": 3,
            "item_cost_blocks": 2,
            "min_piece_blocks": 4,
            "prefetch": True,
        },
    )
    assert candidate_policy("stream_k|c3|n128w4s3|pf")[1]["prefetch"] is True
    for name in ("served", "balanced", "fa3", "stream_k|c3|n128w4s3|p", "stream_k|c3|n128w4s3|pf|o2m4"):
        assert candidate_policy(name) is None, name


def _write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_merged_case_records_later_file_replaces_a_timing(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    _write(
        a,
        [
            {"kind": "versions"},
            {"kind": "bandwidth", "bytes_per_s": 4.5e12},
            {"kind": "case", "case": 0, "floor_s": 1e-4, "times": {"balanced": 2e-4, "fa3": 3e-4}},
            {"kind": "case", "case": -1, "floor_s": 1e-4, "times": {"balanced": 9e-4}},  # warm-up: dropped
            {"kind": "case", "case": 1, "floor_s": 2e-4, "times": {"balanced": 4e-4}},
        ],
    )
    _write(
        b,
        [
            {"kind": "bandwidth", "bytes_per_s": 4.6e12},
            {"kind": "case", "case": 0, "floor_s": 1e-4, "times": {"balanced": 1.5e-4, "stream_k|c3|n128w4s2": 1e-4}},
            {"kind": "case", "case": 2, "floor_s": 1e-4, "times": {"fa3": 5e-4}},
        ],
    )
    recs, bw = merged_case_records([a, b])
    assert bw == 4.5e12  # the first file's
    assert [r["case"] for r in recs] == [0, 1, 2]
    assert recs[0]["times"] == {"balanced": 1.5e-4, "fa3": 3e-4, "stream_k|c3|n128w4s2": 1e-4}
    assert recs[1]["times"] == {"balanced": 4e-4} and recs[2]["times"] == {"fa3": 5e-4}
    # the inputs are not modified and one path works as before
    one, _ = merged_case_records(a)
    assert one[0]["times"] == {"balanced": 2e-4, "fa3": 3e-4}


def test_sweep_samples_rebuild_prefetch_plans(tmp_path):
    cases = tmp_path / "cases.json"
    cases.write_text(
        json.dumps(
            {
                "cases": [
                    {
                        "id": 0,
                        "set": "train",
                        "family": "uniform",
                        "B": 2,
                        "T": 8192,
                        "num_qo_heads": 32,
                        "num_kv_heads": 4,
                        "kv_lens": [4096, 4096],
                    }
                ]
            }
        )
    )
    sweep = tmp_path / "s.jsonl"
    _write(
        sweep,
        [
            {
                "kind": "case",
                "case": 0,
                "set": "train",
                "family": "uniform",
                "B": 2,
                "T": 8192,
                "floor_s": 1e-5,
                "times": {"stream_k|c3|n64w4s3|pf": 2e-5, "balanced": 3e-5, "flashinfer_kernel": 1e-5},
            }
        ],
    )
    ss, _ = sweep_samples(sweep, cases)
    assert sorted(s.name for s in ss) == ["balanced", "stream_k|c3|n64w4s3|pf"]
    pf = next(s for s in ss if s.name.endswith("|pf"))
    assert pf.plan.config.prefetch and config_key(pf.plan.config) == "n64w4s3p"


def test_look_ahead_entry_overlays_the_config_without_it():
    """A look-ahead key's own entry (a lone-CTA rate, as fitted for the look-ahead configs) overlays the constants of its
    config without the look-ahead instead of replacing them: before, ``n64w8s3ph2x`` with only ``lone_bw`` ran
    on the global ``cta_bw`` / ``item_fixed_s`` and not ``n64w8s3ph2``'s."""
    base = Calibration(hbm_bw=4e12, sm_bw=1e12, cta_bw=0.8e12, item_fixed_s=1e-6)
    cal = Calibration(
        **{
            **base.to_dict(),
            "per_config": {
                "n64w8s3ph2": {"cta_bw": 0.5e12, "item_fixed_s": 3e-6},
                "n64w8s3ph2x": {"lone_bw": 0.03e12},
                "n32w4s3": {"cta_bw": 0.2e12},
            },
        }
    )
    x = cal.for_config(KernelConfig(64, 8, 3, prefetch=True, heads_per_tile=2, next_item=True))
    assert (x.cta_bw, x.item_fixed_s, x.lone_bw) == (0.5e12, 3e-6, 0.03e12)
    plain = cal.for_config("n64w8s3ph2")
    assert (plain.cta_bw, plain.lone_bw) == (0.5e12, base.lone_bw)
    # a look-ahead key without an entry: the chain of its config without it (h2 dropped, then p dropped)
    assert cal.for_config("n32w4s3ph2x").cta_bw == 0.2e12
    assert cal.for_config("n16w4s3ph2x").cta_bw == 0.8e12 and cal.for_config("n16w4s3ph2x").per_config == {}


def test_prefetch_config_key_falls_back_to_its_tile():
    base = Calibration(hbm_bw=4e12, sm_bw=1e12, cta_bw=0.8e12)
    cal = Calibration(
        **{**base.to_dict(), "per_config": {"n128w4s3": {"cta_bw": 0.5e12}, "n64w4s3p": {"cta_bw": 0.6e12}}}
    )
    assert config_key(KernelConfig(128, 4, 3, prefetch=True)) == "n128w4s3p"
    assert config_key(KernelConfig(128, 4, 3)) == "n128w4s3"
    assert cal.for_config("n128w4s3p").cta_bw == 0.5e12  # no entry of its own: the tile's
    assert cal.for_config("n64w4s3p").cta_bw == 0.6e12 and cal.for_config("n64w4s3").cta_bw == 0.8e12
    with pytest.raises(ValueError, match="n128w4s3p"):
        Calibration(**{**base.to_dict(), "per_config": {"n128w4s3q": {}}})
    p = make_plan(
        [4096] * 2,
        num_kv_heads=4,
        device="NVIDIA H200",
        policy="stream_k",
        params={"block_n": 128, "num_stages": 3, "prefetch": True},
    )
    assert config_key(p.config) == "n128w4s3p"
