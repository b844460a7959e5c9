"""scripts/build_shipped_policies.py's pick per bucket: the hysteresis against the table being replaced
(``--previous``, round 12) and the default's margin."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import build_shipped_policies as bsp  # noqa: E402

POOL = ("stream_k|c3|n128w4s2", "balanced|c3|n32w4s3|pf|h2", "stream_k|c1|n64w8s3|pf|h2|nx")


def _batches(times: dict[str, float]) -> list[dict[str, float]]:
    return [dict(times)]


def test_previous_pick_is_kept_within_the_margin():
    # the round-11 case: the new best is 0.4 % faster on the training batch than the previous table's plan
    t = {"stream_k|c3|n128w4s2": 1.10, "balanced|c3|n32w4s3|pf|h2": 1.004, "stream_k|c1|n64w8s3|pf|h2|nx": 1.0}
    assert bsp.choose(_batches(t), POOL) == "stream_k|c1|n64w8s3|pf|h2|nx"
    assert bsp.choose(_batches(t), POOL, previous="balanced|c3|n32w4s3|pf|h2") == "balanced|c3|n32w4s3|pf|h2"
    # a win larger than the margin replaces it
    t["balanced|c3|n32w4s3|pf|h2"] = 1.02
    assert bsp.choose(_batches(t), POOL, previous="balanced|c3|n32w4s3|pf|h2") == "stream_k|c1|n64w8s3|pf|h2|nx"
    # a previous pick the run did not time (or not in the pool) is ignored; the default's margin still applies
    t = {"stream_k|c3|n128w4s2": 1.005, "balanced|c3|n32w4s3|pf|h2": 1.0}
    assert bsp.choose(_batches(t), POOL[:2], previous="stream_k|c1|n64w8s3|pf|h2|nx") == "stream_k|c3|n128w4s2"


def test_previous_picks_maps_an_export_to_pool_names(tmp_path):
    def entry(key, name, params):
        return {"id": 1, "bucket": {"key": key}, "name": name, "params": params}

    doc = {"format": "kvsplit.policies", "policies": [
        entry("k1", "balanced", {"ctas_per_sm": 3.0, "block_n": 32, "num_warps": 4, "num_stages": 3,
                                 "prefetch": True, "heads_per_tile": 2, "whole_wave": 0.05, "whole_wave_heads": 2}),
        entry("k2", "stream_k", {"ctas_per_sm": 1.0, "block_n": 64, "num_warps": 8, "num_stages": 3,
                                 "prefetch": True, "heads_per_tile": 2, "next_item": True}),
        entry("k3", "stream_k", {"ctas_per_sm": 5.0, "block_n": 64, "num_warps": 4, "num_stages": 2})]}
    p = tmp_path / "prev.json"
    p.write_text(json.dumps(doc))
    assert bsp.previous_picks(p, POOL) == {"k1": "balanced|c3|n32w4s3|pf|h2", "k2": "stream_k|c1|n64w8s3|pf|h2|nx"}
    p.write_text(json.dumps({"cases": []}))
    with pytest.raises(ValueError, match="--previous"):
        bsp.previous_picks(p, POOL)
