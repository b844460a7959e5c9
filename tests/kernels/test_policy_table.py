"""kernels/policy_table.py: the vectorized lookup equals kvsplit.kernels.buckets.nearest / distance."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import kvsplit.kernels
from kvsplit.kernels.buckets import DISTANCE_LIMIT, bucket_key, distance, nearest
from kvsplit.kernels.plan import make_plan
from kvsplit.kernels.policy_table import PolicyTable


def _key(lens):
    return bucket_key(np.asarray(lens), num_kv_heads=4, head_dim=128, dtype="bfloat16", device="NVIDIA H200")


def _table(keys, backends):
    pols = [
        {
            "id": i + 1,
            "version": 1,
            "bucket": str(k),
            "gpu": "NVIDIA H200",
            "num_kv_heads": 4,
            "head_dim": 128,
            "dtype": "bfloat16",
            "page_size": 16,
            "name": "balanced",
            "params": {"ctas_per_sm": 1.0 + i % 7},
            "backend": b,
        }
        for i, (k, b) in enumerate(zip(keys, backends))
    ]
    return PolicyTable.from_json(PolicyTable.document(pols, version=3))


def _batch(rng):
    n = int(rng.integers(1, 400))
    lens = np.floor(2 ** (rng.random(n) * rng.uniform(1, 20))).astype(np.int64)
    if rng.random() < 0.1:
        lens[:] = 0
    return lens


def test_lookup_matches_buckets_nearest():
    rng = np.random.default_rng(5)
    keys = list({str(_key(_batch(rng))): None for _ in range(120)})
    table = _table(keys, ["gpu"] * len(keys))
    for _ in range(400):
        k = _key(_batch(rng))
        entry, d = table.lookup(k)
        ref = nearest(k, keys, limit=table.distance_limit)  # the served limit (SERVE_DISTANCE_LIMIT)
        if ref is None:
            assert entry is None
        else:
            assert entry.bucket == ref[0] and d == ref[1] == distance(k, entry.key)


def test_gpu_tuned_preferred_over_closer_simulated_and_plan():
    base = [4096] * 60 + [64] * 4
    k_exact, k_near = _key(base), _key([6000] * 60 + [64] * 4)
    assert 0 < distance(k_exact, k_near) <= DISTANCE_LIMIT
    table = _table([k_exact, k_near], ["sim", "gpu"])
    plan, bucket, policy = table.plan(
        base, gpu="h200", num_qo_heads=32, num_kv_heads=4, head_dim=128, dtype="bfloat16", page_size=16
    )
    assert policy["source"] == "tuned" and policy["id"] == 2 and bucket["matched"] == str(k_near)
    assert plan == make_plan(base, num_kv_heads=4, device="NVIDIA H200", policy="balanced", params={"ctas_per_sm": 2.0})
    with pytest.raises(ValueError, match="num_qo_heads"):
        table.plan(base, gpu="h200", num_qo_heads=30, num_kv_heads=4, head_dim=128, dtype="bfloat16", page_size=16)
    # page_size defaults to 16, as make_plan's and the CLI's
    p16, _, _ = table.plan(base, gpu="h200", num_qo_heads=32, num_kv_heads=4, head_dim=128, dtype="bfloat16")
    assert p16 == plan and p16.page_size == 16
    p32, _, _ = table.plan(
        base, gpu="h200", num_qo_heads=32, num_kv_heads=4, head_dim=128, dtype="bfloat16", page_size=32
    )
    assert p32.page_size == 32


def test_from_json_rejects_bad_documents():
    good = PolicyTable.document([], version=0)
    assert good["format"] == "kvsplit.policy_table/2" and good["count"] == 0 and good["data"] == []
    PolicyTable.from_json(good)
    with pytest.raises(ValueError, match="format"):
        PolicyTable.from_json({**good, "format": "x"})
    entry = {
        "id": 1,
        "version": 1,
        "bucket": "nope",
        "gpu": "NVIDIA H200",
        "num_kv_heads": 4,
        "head_dim": 128,
        "dtype": "bfloat16",
        "page_size": 16,
        "name": "balanced",
        "params": {},
        "backend": "gpu",
    }
    bad = {**good, "count": 1, "data": [entry]}
    with pytest.raises(ValueError, match=r"data\[0\]\.bucket"):
        PolicyTable.from_json(bad)
    bad["data"][0]["bucket"] = str(_key([5, 6]))
    bad["data"][0]["num_kv_heads"] = 8
    with pytest.raises(ValueError, match=r"data\[0\]"):
        PolicyTable.from_json(bad)
    bad["data"][0]["num_kv_heads"] = 4
    assert len(PolicyTable.from_json(bad)) == 1
    with pytest.raises(ValueError, match=r"count: 2 but data has 1"):
        PolicyTable.from_json({**bad, "count": 2})
    # an older server's document (format /1, list under "policies") still reads
    old = {k: v for k, v in bad.items() if k not in ("count", "data")}
    old.update(format="kvsplit.policy_table/1", policies=bad["data"])
    assert [e.id for e in PolicyTable.from_json(old).entries] == [1]
    with pytest.raises(ValueError, match=r"policy table\.policies: missing"):
        PolicyTable.from_json({**bad, "format": "kvsplit.policy_table/1"})


def test_check_policy_entry_takes_the_export_form_and_the_table_entry_alike():
    from kvsplit.kernels.policy_table import check_policy_entry

    key = str(bucket_key([4096, 17, 9000], num_kv_heads=4, head_dim=128, dtype="bfloat16", device="NVIDIA H200"))
    fields = {"gpu": "NVIDIA H200", "num_kv_heads": 4, "head_dim": 128, "dtype": "bfloat16", "page_size": 16}
    flat = {"name": "balanced", "params": {"ctas_per_sm": 3.0}, "bucket": key, **fields}
    export = {"name": "balanced", "params": {"ctas_per_sm": 3.0}, "bucket": {"key": key, **fields}}
    check_policy_entry(flat)
    check_policy_entry(export)
    for bad in ({**flat, "num_kv_heads": 8}, {**export, "bucket": {**export["bucket"], "num_kv_heads": 8}}):
        with pytest.raises(ValueError, match="bucket.key: its num_kv_heads 4 differs from the entry's 8"):
            check_policy_entry(bad)
    with pytest.raises(ValueError, match="params do not make a plan: params: unknown parameters"):
        check_policy_entry({**flat, "params": {"bogus": 1}})


def test_read_export_reads_a_shipped_table_and_names_the_argument_on_bad_files(tmp_path):
    from kvsplit.db.store import EXPORT_FORMAT as STORE_FORMAT
    from kvsplit.kernels.policy_table import EXPORT_FORMAT, SHIPPED_TABLES, read_export

    assert EXPORT_FORMAT == STORE_FORMAT == "kvsplit.policies"  # the store's side writes what this reads
    path = Path(kvsplit.kernels.__file__).parent / SHIPPED_TABLES[1]
    doc = read_export(path, arg="--table")
    assert doc == json.loads(path.read_text()) and len(doc["policies"]) == 859
    bad = {
        "missing.json": None,
        "not_json.json": "{policies: [",
        "binary.json": b"\xff\xfe\x00",
        "a_list.json": "[]",
        "other_format.json": json.dumps({"format": "kvsplit.measurements", "policies": []}),
        "no_list.json": json.dumps({"format": "kvsplit.policies", "policies": {"1": {}}}),
    }
    for name, text in bad.items():
        p = tmp_path / name
        if isinstance(text, bytes):
            p.write_bytes(text)
        elif text is not None:
            p.write_text(text)
        with pytest.raises(ValueError) as err:
            read_export(p, arg="--previous")
        msg = str(err.value)
        assert msg.startswith("--previous: ") and name in msg, msg
        if name in ("missing.json", "not_json.json", "binary.json"):
            assert "cannot read" in msg, msg
        else:
            assert "is not a kvsplit.policies export" in msg, msg
