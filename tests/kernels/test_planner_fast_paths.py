"""The fast paths of the host planner (docs/decisions/compiled-planner.md) give what the checked / NumPy paths give.

- ``PolicyTable.plan`` on the compiled core (one conversion, one compiled
  key-and-lookup pass, one compiled plan pass, a cached per-shape context)
  returns the same plan, bucket and policy answer as the NumPy reference
  (``fastplan.python()``), for int32, int64 and list input;
- ``BucketKey.from_trusted`` makes the key the checked constructor makes;
- the compiled ``round(log2 x)`` equals the Python one;
- bad input still raises a ValueError naming the argument, on every path.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kvsplit.kernels import fastplan
from kvsplit.kernels.buckets import BucketKey, bucket_key, key_prefix
from kvsplit.kernels.device import DeviceSpec
from kvsplit.kernels.plan import make_plan
from kvsplit.kernels.policy_table import PolicyTable
from kvsplit.kernels.shape import Shape

from .oracle import log2_class
from .oracle import make_plan as oracle_plan

pytestmark = pytest.mark.skipif(not fastplan.HAVE_NUMBA, reason="numba is not installed")

ROOT = Path(__file__).resolve().parents[2]
SHAPE = dict(gpu="NVIDIA H200", num_qo_heads=32, num_kv_heads=4, head_dim=128, dtype="bfloat16", page_size=16)


def _shipped() -> PolicyTable:
    return PolicyTable.from_export(json.loads((ROOT / "kernels/data/h200_policies.json").read_text()))


def _mixed() -> PolicyTable:
    """Tuned and simulated entries, an empty-histogram bucket, peer and tuned policies, a tight limit."""

    def key(lens):
        return str(bucket_key(np.asarray(lens), num_kv_heads=4, head_dim=128, dtype="bfloat16", device="NVIDIA H200"))

    rng = np.random.default_rng(3)
    specs = [
        ([0, 0, 0], "balanced", {}, "gpu"),
        ([4096] * 60 + [64] * 4, "stream_k", {"ctas_per_sm": 3}, "gpu"),
        ([100] * 300, "flashinfer", {}, "gpu"),
        ([2**20, 5], "tuned", {"partition": "stream_k"}, "sim"),
        ([7000] * 16, "fa3", {}, "sim"),
        ([300] * 1000, "tuned", {"pack_tokens": 512}, "gpu"),
        (
            [20000] * 24 + [30] * 50,
            "stream_k",
            {"ctas_per_sm": 6, "block_n": 32, "num_stages": 3, "prefetch": True, "heads_per_tile": 2},
            "gpu",
        ),
        ([9000] * 40, "balanced", {"ctas_per_sm": 3, "block_n": 64, "heads_per_tile": 2}, "gpu"),
    ]
    specs += [
        (
            rng.integers(1, 2 ** int(rng.integers(4, 18)), int(rng.integers(1, 900))),
            "balanced",
            {"ctas_per_sm": float(1 + i % 5)},
            "gpu" if i % 3 else "sim",
        )
        for i in range(40)
    ]
    pols = [
        {
            "id": i + 1,
            "version": 1,
            "bucket": key(L),
            "gpu": "NVIDIA H200",
            "num_kv_heads": 4,
            "head_dim": 128,
            "dtype": "bfloat16",
            "page_size": 16,
            "name": name,
            "params": params,
            "backend": b,
        }
        for i, (L, name, params, b) in enumerate(specs)
    ]
    table = PolicyTable.from_json(PolicyTable.document(pols, version=2, distance_limit=1.25))
    # the entries' own batches, and jittered ones: every source and policy kind is served
    table.test_batches = [np.asarray(L) for L, *_ in specs[:14]]
    table.test_batches += [(np.asarray(L) * rng.uniform(0.8, 1.2, len(L))).astype(np.int64) for L, *_ in specs[:14]]
    return table


def _batches(seed: int):
    rng = np.random.default_rng(seed)
    for _ in range(25):
        B = int(rng.choice([1, 3, 64, 256, 1000, 4096]))
        hi = 2 ** int(rng.integers(1, 21))
        yield rng.integers(0 if rng.random() < 0.3 else 1, hi, B)
    yield np.zeros(7, np.int64)
    yield np.array([2**31 - 1] * 3 + [1])
    yield np.full(256, 4096)


@pytest.mark.parametrize("table_fn", [_shipped, _mixed])
def test_table_plan_matches_reference(table_fn):
    table = table_fn()
    shape = Shape.of(device="NVIDIA H200", num_qo_heads=32, num_kv_heads=4)
    sources, heads = set(), set()
    for L in [*_batches(11), *getattr(table, "test_batches", [])]:
        with fastplan.python():
            ref = table.plan(L.astype(np.int64), **SHAPE)
        sources.add((ref[2]["source"], ref[2]["name"]))
        heads.add(ref[0].config.heads_per_tile)
        key = bucket_key(L, num_kv_heads=4, head_dim=128, dtype="bfloat16", device="NVIDIA H200")
        assert ref[1]["key"] == str(key)
        for arr in (L.astype(np.int32), L.astype(np.int64), L.tolist(), tuple(L.tolist())):
            for got in (table.plan(arr, **SHAPE), table.plan(arr, shape)):
                assert got[0] == ref[0] and got[1] == ref[1] and got[2] == ref[2]
                assert type(got[1]["distance"]) is type(ref[1]["distance"])
    assert {"tuned", "fallback"} <= {src for src, _ in sources}
    if table_fn is _mixed:
        assert {"simulated"} <= {src for src, _ in sources}
        assert {"flashinfer", "fa3", "tuned", "balanced"} <= {name for _, name in sources}
        assert heads == {1, 2}  # entries of two KV heads per work tile are served through the compiled pass too


def test_table_plan_other_families_and_devices():
    table = _mixed()
    rng = np.random.default_rng(4)
    dev = DeviceSpec(
        name="NVIDIA H200",
        num_sms=100,
        hbm_bandwidth_gbps=4000,
        l2_bytes=50 * 2**20,
        smem_per_sm_bytes=228 * 1024,
        smem_per_block_bytes=227 * 1024,
    )
    for kw in (
        dict(SHAPE, num_kv_heads=8, num_qo_heads=64),  # no candidates: fallback
        dict(SHAPE, gpu="h200", dtype="bf16"),  # aliases
        dict(SHAPE, device=dev),
    ):  # a caller's own device numbers
        for _ in range(5):
            L = rng.integers(1, 9000, int(rng.integers(1, 600)))
            with fastplan.python():
                ref = table.plan(L, **kw)
            for _ in range(2):  # the second call uses the cached shape
                got = table.plan(L.tolist(), **kw)
                assert got[0] == ref[0] and got[1] == ref[1] and got[2] == ref[2]


def test_table_plan_device_mapping_is_read_each_call():
    table = _shipped()
    L = np.random.default_rng(1).integers(1, 9000, 300)
    dev = {"name": "NVIDIA H200", "num_sms": 132, "hbm_bandwidth_gbps": 4800}
    kw = dict(SHAPE, gpu=None, device=dev)
    plans = []
    for sms in (132, 40):
        dev["num_sms"] = sms
        with fastplan.python():
            ref = table.plan(L, **kw)
        got = table.plan(L, **kw)
        assert got[0] == ref[0] and got[1] == ref[1] and got[2] == ref[2]
        plans.append(got[0])
    assert plans[0] != plans[1]


def test_table_plan_errors():
    table = _shipped()
    for bad, field in (
        ([5, -1, 3], "kv_lens[1]"),
        ([1, True, 3], "kv_lens[1]"),
        ([1, np.True_], "kv_lens[1]"),
        ([1, 2.5], "kv_lens[1]"),
        ([], "kv_lens"),
        (np.array([5, 2**31], np.int64), "kv_lens[1]"),
        (np.array([1.0]), "kv_lens"),
        (["3"], "kv_lens[0]"),
        ([2**70], "kv_lens[0]"),
    ):
        with fastplan.python(), pytest.raises(ValueError) as ref:
            table.plan(bad, **SHAPE)
        with pytest.raises(ValueError) as got:
            table.plan(bad, **SHAPE)
        assert str(got.value) == str(ref.value) and str(got.value).startswith(field)
    table.plan([5, 6], **SHAPE)  # a cached shape ...
    for kw, field in (
        (dict(num_kv_heads=True), "num_kv_heads"),
        (dict(num_kv_heads=4.0), "num_kv_heads"),
        (dict(num_qo_heads=30), "num_qo_heads"),
        (dict(head_dim=96), "head_dim"),
        (dict(dtype="int8"), "dtype"),
        (dict(page_size=0), "page_size"),
    ):
        with pytest.raises(ValueError, match=field):  # ... never admits another type or value
            table.plan([5, 6], **(SHAPE | kw))


def test_make_plan_rejects_numpy_bool_in_list():
    with pytest.raises(ValueError) as ref:
        oracle_plan([5, np.False_], num_kv_heads=4, device="NVIDIA H200")
    with pytest.raises(ValueError) as got:
        make_plan([5, np.False_], num_kv_heads=4, device="NVIDIA H200")
    assert str(got.value) == str(ref.value) and str(got.value).startswith("kv_lens[1]")
    # integers of any kind at 0/1 are fine
    p = make_plan([np.int32(1), 0, 7], num_kv_heads=4, device="NVIDIA H200")
    assert p == oracle_plan([1, 0, 7], num_kv_heads=4, device="NVIDIA H200")


def test_list_and_int32_give_identical_plans_and_keys():
    rng = np.random.default_rng(9)
    for B in (1, 256, 4096):
        L = rng.integers(0, 8193, B).astype(np.int32)
        for pol in ("balanced", "stream_k", "tuned"):
            a = make_plan(L, num_kv_heads=4, device="NVIDIA H200", policy=pol)
            b = make_plan(L.tolist(), num_kv_heads=4, device="NVIDIA H200", policy=pol)
            assert a == b
        kw = dict(num_kv_heads=4, head_dim=128, dtype="bfloat16", device="NVIDIA H200")
        assert bucket_key(L, **kw) == bucket_key(L.tolist(), **kw)


def test_trusted_bucket_key_equals_checked():
    rng = np.random.default_rng(2)
    for _ in range(50):
        L = rng.integers(0, 2 ** int(rng.integers(1, 31)), int(rng.integers(1, 3000)))
        ref = bucket_key(L, num_kv_heads=2, head_dim=64, dtype="float16", device="NVIDIA A100-SXM4-80GB", page_size=8)
        fields = dict(
            gpu=ref.gpu,
            num_kv_heads=ref.num_kv_heads,
            head_dim=ref.head_dim,
            dtype=ref.dtype,
            page_size=ref.page_size,
            batch_class=ref.batch_class,
            tokens_class=ref.tokens_class,
            hist=ref.hist,
        )
        t = BucketKey.from_trusted(**fields)
        assert t == ref == BucketKey(**fields) and hash(t) == hash(ref) and str(t) == str(ref)
        assert t.family == ref.family and BucketKey.parse(str(t)) == t
        assert str(t).startswith(key_prefix(ref.gpu, ref.num_kv_heads, ref.head_dim, ref.dtype, ref.page_size) + ".b")


def test_compiled_log2_class_matches_python():
    xs = {1, 2, 3, 5, 6, 7, 2**47 + 12345, 65536 * (2**31 - 1)}
    for k in range(1, 52):
        t = fastplan.HALF_UP[k]
        xs |= {2**k - 1, 2**k, 2**k + 1, int(t) - 1, int(t), int(t) + 1}
    for x in sorted(xs):
        assert fastplan.log2_class(x) == log2_class(x), x


def test_compiled_division_helpers():
    rng = np.random.default_rng(8)
    for d in (1, 3, 7, 16, 32, 100, 128, 257, 4096, 2**20 + 1, 2**31 - 1):
        xs = [0, 1, d - 1, d, d + 1, 2**31 - 1, 2**47 + 3, 2**50 - 1] + rng.integers(0, 2**50, 40).tolist()
        for x in xs:
            assert fastplan.div(x, d, 1.0 / d) == x // d, (x, d)
            sh = fastplan.log2_exact(d)
            assert sh == (d.bit_length() - 1 if d & (d - 1) == 0 else -1)
            if x < 2**40:
                assert fastplan.blocks(x, d, sh, 1.0 / d) == -(-x // d), (x, d)
