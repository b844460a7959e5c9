"""The engine's import line and the shipped table loaded in-process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]


def test_one_import_line_and_no_torch_for_the_planner():
    code = (
        "import sys\n"
        "from kvsplit.kernels import PolicyTable, load_shipped_table, make_plan, Plan\n"
        "assert 'torch' not in sys.modules and 'triton' not in sys.modules\n"
        "p = make_plan([5, 9000], num_kv_heads=4, device='NVIDIA H200')\n"
        "assert isinstance(p, Plan)\n"
        "from kvsplit.kernels import DecodeWrapper\n"
        "assert 'torch' in sys.modules and DecodeWrapper.__module__ == 'kvsplit.kernels.wrapper'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_no_private_name_exported():
    import kvsplit.kernels as K

    assert all(not n.startswith("_") for n in K.__all__)
    for n in K.__all__:
        assert getattr(K, n) is not None
    try:
        K._NOPE  # noqa: B018
    except AttributeError as exc:
        assert "_NOPE" in str(exc)
    else:  # pragma: no cover
        raise AssertionError("unknown names must raise AttributeError")


def test_load_shipped_table_is_the_packaged_export():
    from kvsplit.kernels import PolicyTable, load_shipped_table

    raw = json.loads((ROOT / "kernels/data/h200_policies.json").read_text())
    h100 = json.loads((ROOT / "kernels/data/h100_policies.json").read_text())
    table = load_shipped_table()
    assert isinstance(table, PolicyTable) and len(table) == len(raw["policies"]) + len(h100["policies"]) == 263 + 369
    ids = [e.id for e in table.entries]  # unique: the H100's numbered after the H200's, as one store would
    assert sorted(ids) == sorted(p["id"] for p in raw["policies"]) + list(range(264, 264 + 369))
    assert {p["bucket"]["gpu"] for p in h100["policies"]} == {"NVIDIA H100 80GB HBM3"}
    want = PolicyTable.from_export(raw)
    L = np.random.default_rng(3).integers(1, 9000, 200)
    kw = dict(gpu="NVIDIA H200", num_qo_heads=32, num_kv_heads=4, head_dim=128, dtype="bfloat16")
    got, bucket, policy = table.plan(L, **kw)
    ref, rbucket, rpolicy = want.plan(L, **kw)
    assert got == ref and bucket == rbucket and policy == rpolicy and policy["source"] == "tuned"
    # an H100 batch of the Qwen3-30B-A3B shape: the H100 table's own plan (the H200's would not serve it)
    kw["gpu"] = "h100"
    got, bucket, policy = table.plan(L, **kw)
    ref, rbucket, rpolicy = PolicyTable.from_export(h100).plan(L, **kw)
    assert got == ref and bucket == rbucket and policy["source"] == "tuned"
    assert {**policy, "id": policy["id"] - 263} == rpolicy
    assert bucket["matched"].startswith("nvidia-h100-80gb-hbm3.kv4.")
    assert want.plan(L, **kw)[2]["source"] == "fallback"
