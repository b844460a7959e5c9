"""scripts/pairs_summary.py: two runs of the same pairs merged by geometric mean, the best of a group per case."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import pairs_summary as ps  # noqa: E402


def _run(path: Path, times: dict[int, dict[str, float]]) -> Path:
    with path.open("w") as f:
        f.write(json.dumps({"kind": "versions"}) + "\n")
        for cid, t in times.items():
            f.write(json.dumps({"kind": "case", "case": cid, "T": 1024, "family": "uniform", "B": cid, "floor_s": 1e-4,
                                "times": t}) + "\n")
    return path


def test_two_orders_merge_and_group_best(tmp_path):
    a = _run(tmp_path / "a.jsonl", {1: {"x": 2e-4, "y": 1.5e-4, "z": None}, 2: {"x": 1.2e-4, "y": 1.8e-4}})
    b = _run(tmp_path / "b.jsonl", {1: {"x": 8e-4, "y": 1.5e-4}, 2: {"x": 1.2e-4}})
    t, meta = ps.load([a, b])
    assert math.isclose(t[(1, "x")], 4e-4)  # sqrt(2e-4 * 8e-4)
    assert math.isclose(t[(2, "y")], 1.8e-4)  # timed in one run only
    assert (1, "z") not in t  # an untimed (None) record is left out
    assert meta[2] == (1024, "uniform", 2, 1e-4)
    assert ps.best_of(t, [1, 2], ["x", "y"]) == pytest.approx({1: 1.5e-4, 2: 1.2e-4})
    assert ps.best_of(t, [1, 2, 3], ["z"]) == {}
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "pairs_summary.py"), str(a), str(b),
                          "--groups", "X=x", "Y=y", "--vs", "X/Y"], capture_output=True, text=True, check=True).stdout
    # case 1: 4e-4 / 1.5e-4; case 2: 1.2e-4 / 1.8e-4 -> geomean sqrt(8/3 * 2/3) = 1.3333
    assert "X/Y: geomean 1.3333 min 0.667 max 2.667; faster on 1 of 2" in out
