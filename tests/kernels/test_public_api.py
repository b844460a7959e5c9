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
    assert isinstance(table, PolicyTable) and len(table) == len(raw["policies"]) + len(h100["policies"]) == 263 + 859
    ids = [e.id for e in table.entries]  # 1..N in file order, the H200's first: what an empty store numbers them
    assert sorted(ids) == list(range(1, 263 + 859 + 1))
    assert {p["bucket"]["gpu"] for p in h100["policies"]} == {"NVIDIA H100 80GB HBM3"}
    want = PolicyTable.from_export(raw)
    L = np.random.default_rng(3).integers(1, 9000, 200)
    kw = dict(gpu="NVIDIA H200", num_qo_heads=32, num_kv_heads=4, head_dim=128, dtype="bfloat16")
    got, bucket, policy = table.plan(L, **kw)
    ref, rbucket, rpolicy = want.plan(L, **kw)
    assert got == ref and bucket == rbucket and policy["source"] == "tuned"
    # the same policy, named by its place in the file (the file's own ids are its store's)
    place = {p["id"]: i + 1 for i, p in enumerate(raw["policies"])}
    assert policy == {**rpolicy, "id": place[rpolicy["id"]]}
    # an H100 batch of the Qwen3-30B-A3B shape: the H100 table's own plan (the H200's would not serve it)
    kw["gpu"] = "h100"
    got, bucket, policy = table.plan(L, **kw)
    ref, rbucket, rpolicy = PolicyTable.from_export(h100).plan(L, **kw)
    assert got == ref and bucket == rbucket and policy["source"] == "tuned"
    assert policy == {**rpolicy, "id": 263 + 1 + [p["id"] for p in h100["policies"]].index(rpolicy["id"])}
    assert bucket["matched"].startswith("nvidia-h100-80gb-hbm3.kv4.")
    assert want.plan(L, **kw)[2]["source"] == "fallback"


def test_the_h100_table_serves_its_q_len_2_and_fp8_buckets():
    """An H100 verify step of 2 query tokens, and an fp8 KV cache, get the H100 table's own plan: each bucket's
    held-out batch of the campaign's verify step (service/data/h100_measurements.json) is served the policy the
    export publishes for that bucket key, not the fallback."""
    from kvsplit.kernels import load_shipped_table

    h100 = json.loads((ROOT / "kernels/data/h100_policies.json").read_text())
    meas = json.loads((ROOT / "service/data/h100_measurements.json").read_text())["measurements"]
    heldout = {m["bucket"]: m["kv_lens"] for m in meas if m["policy_name"] == "tuned" and m["role"] == "heldout"}
    table = load_shipped_table()
    for tag, kw in ((".q2.", {"q_len": 2}), (".kvfp8.", {"kv_dtype": "float8_e4m3fn"})):
        family = sorted((p for p in h100["policies"] if tag in p["bucket"]["key"]), key=lambda p: p["bucket"]["key"])
        assert len(family) == 122
        for p in family[::8]:  # 16 of each family's buckets, every batch size and token class among them
            key = p["bucket"]["key"]
            _, bucket, policy = table.plan(
                heldout[key], gpu="h100", num_qo_heads=32, num_kv_heads=4, head_dim=128, dtype="bfloat16", **kw
            )
            assert bucket["matched"] == key  # (the batch's own key may differ a little: drawn from its family)
            assert policy["source"] == "tuned" and policy["params"] == p["params"], key
        # the H200 table has no such family: an H200 batch of it gets the family's fallback
        _, bucket, policy = table.plan(
            heldout[key], gpu="h200", num_qo_heads=32, num_kv_heads=4, head_dim=128, dtype="bfloat16", **kw
        )
        assert policy["source"] == "fallback" and bucket["matched"] is None
