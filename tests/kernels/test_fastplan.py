"""The compiled planner (kernels/fastplan.py) gives the NumPy reference's plans and bucket keys.

Random batches of several length families, every fast policy with a spread of
parameters, int32/int64 arrays and lists; plus errors (same messages) and the
one-conversion contract.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvsplit.kernels import fastplan
from kvsplit.kernels.buckets import bucket_key as bucket_key_ref
from kvsplit.kernels.device import DeviceSpec
from kvsplit.kernels.plan import make_plan
from kvsplit.kernels.policies import make_plan_reference

pytestmark = pytest.mark.skipif(not fastplan.HAVE_NUMBA, reason="numba is not installed")

H200 = DeviceSpec.known("NVIDIA H200")
CASES = [
    ("no_split", {}),
    ("fixed", {"num_splits": 3}),
    ("fixed", {"num_splits": 40, "order": "heavy_first"}),
    ("balanced", {}),
    ("balanced", {"ctas_per_sm": 1.5, "order": "heavy_first", "pack_tokens": 512}),
    ("balanced", {"ctas_per_sm": 8, "block_n": 128}),
    ("stream_k", {}),
    ("stream_k", {"ctas_per_sm": 4, "item_cost_blocks": 5, "min_piece_blocks": 8, "order": "heavy_first"}),
    ("stream_k", {"ctas_per_sm": 0.25, "min_piece_blocks": 3, "block_n": 16}),
    ("tuned", {}),
    ("tuned", {"ctas_per_sm": 2.5, "min_chunk_tokens": 1000, "max_splits": 7, "order": "heavy_first",
               "pack_tokens": 1024, "schedule": "persistent", "programs_per_sm": 2}),
    ("tuned", {"wave_aware": False, "ctas_per_sm": 3, "block_n": 32, "num_warps": 2}),
    ("tuned", {"partition": "stream_k", "ctas_per_sm": 1, "item_cost_blocks": 0, "min_piece_blocks": 2}),
    ("tuned", {"partition": "stream_k", "order": "heavy_first", "schedule": "persistent", "num_programs": 77}),
    ("stream_k", {"ctas_per_sm": 3, "block_n": 128, "whole_wave": 0.05}),
    ("balanced", {"whole_wave": 0.2, "order": "heavy_first"}),
    ("tuned", {"partition": "stream_k", "whole_wave": 0.05, "schedule": "persistent", "num_programs": 77}),
]


def _batches(seed: int):
    rng = np.random.default_rng(seed)
    yield rng.integers(1, 8192, 256)                      # uniform-ish
    yield rng.integers(0, 40, 33)                         # tiny, zeros
    yield np.array([0])                                    # B = 1, empty
    yield np.array([1])
    yield np.array([262144])                               # B = 1, long
    yield np.concatenate([[200000], rng.integers(1, 300, 500)])  # skewed
    yield rng.integers(1, 2000, 7) * 64                    # block-aligned
    yield np.full(132, 1024)                               # uniform, wave edge
    yield np.full(128, 2048)                               # whole wave of (64, 4, 2) at H_kv 4
    yield np.rint(5461 * rng.uniform(0.995, 1.005, 96)).astype(np.int64)  # near-even, (128, 4, 2) at H_kv 4
    yield rng.integers(0, 3, 1000)                         # many 0/1/2
    B = int(rng.integers(1, 600))
    yield (rng.pareto(1.2, B) * 500).astype(np.int64).clip(0, 2**20)


@pytest.mark.parametrize("policy,params", CASES)
@pytest.mark.parametrize("hkv", [1, 4, 8])
def test_same_plans_as_reference(policy, params, hkv):
    for seed in range(3):
        for L in _batches(seed * 31 + hkv):
            for arr in (L.astype(np.int64), L.astype(np.int32), L.tolist()):
                kw = dict(num_kv_heads=hkv, device=H200, policy=policy, params=params)
                ref = make_plan_reference(arr, **kw)
                fast = fastplan.make_plan(arr, **kw)
                assert fast is not None
                assert fast == ref, (policy, params, hkv, L.tolist()[:20])
                assert make_plan(arr, **kw) == ref
                for name in ("kv_lens", "num_splits", "work_request", "work_kv_start", "work_kv_end", "cta_indptr"):
                    a, b = getattr(fast, name), getattr(ref, name)
                    assert a.dtype == b.dtype and not a.flags.writeable, name


def test_plan_arrays_do_not_alias_the_input():
    L = np.array([100, 5000, 3], dtype=np.int64)
    p = make_plan(L, num_kv_heads=4, device=H200)
    L[0] = 7
    assert p.kv_lens[0] == 100 and L.flags.writeable


def test_other_devices_and_shapes():
    rng = np.random.default_rng(5)
    for dev in ("NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"):
        for hd, dt in ((64, "float16"), (256, "bfloat16"), (128, "float32")):
            for _ in range(3):
                L = rng.integers(0, 30000, int(rng.integers(1, 300)))
                kw = dict(num_kv_heads=2, device=dev, head_dim=hd, dtype=dt, page_size=8)
                for pol in ("balanced", "stream_k", "tuned"):
                    assert fastplan.make_plan(L, policy=pol, **kw) == make_plan_reference(L, policy=pol, **kw)


def test_same_bucket_keys_as_reference():
    rng = np.random.default_rng(7)
    batches = list(_batches(1)) + [np.zeros(5, np.int64), np.array([2**31 - 1, 1, 2, 3]),
                                   rng.integers(0, 2**31 - 1, 4096)]
    for L in batches:
        for arr in (L.astype(np.int64), L.tolist()):
            kw = dict(num_kv_heads=4, head_dim=128, dtype="bfloat16", device=H200, page_size=16)
            ref = bucket_key_ref(arr, **kw)
            got = fastplan.bucket_key(arr, **kw)
            assert got == ref and str(got) == str(ref) and hash(got) == hash(ref)


def test_same_bucket_keys_as_reference_on_rounding_ties():
    """Batches whose token weights split evenly over 3, 5, 6, 7 ... bins: equal remainders, so the
    leftover units of the 16 go by the reference's tie rule (the lower bin first)."""
    rng = np.random.default_rng(8)
    kw = dict(num_kv_heads=4, head_dim=128, dtype="bfloat16", device=H200, page_size=16)
    for _ in range(300):
        m = int(rng.integers(11, 31))  # 2^m tokens in every bin: 2^(m - e) requests of 2^e tokens
        exps = rng.choice(np.arange(m - 11, m + 1), int(rng.integers(2, 12)), replace=False)
        L = np.concatenate([np.full(1 << (m - int(e)), 1 << int(e), np.int64) for e in exps])
        rng.shuffle(L)
        ref = bucket_key_ref(L, **kw)
        assert fastplan.bucket_key(L, **kw) == ref and str(fastplan.bucket_key(L, **kw)) == str(ref)


@pytest.mark.parametrize("bad,field", [
    ([5, -1, 3], "kv_lens[1]"),
    (np.array([5, 2**31], dtype=np.int64), "kv_lens[1]"),
    ([1, True, 3], "kv_lens[1]"),
    ([1, 2.5], "kv_lens[1]"),
    ([], "kv_lens"),
    (np.zeros((2, 2), np.int64), "kv_lens"),
    (np.array([1.0]), "kv_lens"),
    (["3"], "kv_lens[0]"),
    ([2**70], "kv_lens[0]"),
])
def test_errors_match_reference(bad, field):
    with pytest.raises(ValueError) as ref:
        make_plan_reference(bad, num_kv_heads=4, device=H200)
    with pytest.raises(ValueError) as got:
        make_plan(bad, num_kv_heads=4, device=H200)
    assert str(got.value) == str(ref.value) and str(got.value).startswith(field)
    with pytest.raises(ValueError) as got:
        fastplan.bucket_key(bad, num_kv_heads=4, head_dim=128, dtype="bfloat16", device=H200)
    assert str(got.value).startswith(field)


@pytest.mark.parametrize("kwargs,field", [
    (dict(params={"ctas_per_sm": 0}), "params.ctas_per_sm"),
    (dict(params={"wave_aware": 1}, policy="tuned"), "params.wave_aware"),
    (dict(params={"bogus": 1}), "params"),
    (dict(num_kv_heads=True), "num_kv_heads"),
    (dict(head_dim=96), "head_dim"),
    (dict(policy="tuned", params={"partition": "stream_k", "max_splits": 4}), "params.max_splits"),
])
def test_param_errors_match_reference(kwargs, field):
    kw = dict(num_kv_heads=4, device=H200) | kwargs
    if kw.get("policy") == "tuned" and kw["params"].get("wave_aware") == 1:
        make_plan([5], **(kw | {"params": {"wave_aware": True}}))  # memoized True must not admit 1
    with pytest.raises(ValueError) as ref:
        make_plan_reference([5, 6], **kw)
    with pytest.raises(ValueError) as got:
        make_plan([5, 6], **kw)
    assert str(got.value) == str(ref.value) and str(got.value).startswith(field)


def test_int_and_float_params_give_their_own_params():
    a = make_plan([5, 9000], num_kv_heads=4, device=H200, params={"ctas_per_sm": 4})
    b = make_plan([5, 9000], num_kv_heads=4, device=H200, params={"ctas_per_sm": 4.0})
    assert type(a.params["ctas_per_sm"]) is int and type(b.params["ctas_per_sm"]) is float


def test_work_item_limit_matches_reference(monkeypatch):
    kw = dict(num_kv_heads=1, device=H200, policy="fixed", params={"num_splits": 65536})
    L = np.full(300, 2**20)
    with pytest.raises(ValueError) as ref:
        make_plan_reference(L, **kw)
    with pytest.raises(ValueError) as got:
        make_plan(L, **kw)
    assert str(got.value) == str(ref.value)


def test_reference_switch_and_peer_policies():
    L = [4096, 17, 9000]
    with fastplan.reference():
        assert fastplan.make_plan(L, num_kv_heads=4, device=H200) is None
        p = make_plan(L, num_kv_heads=4, device=H200)
    assert p == make_plan(L, num_kv_heads=4, device=H200)
    assert fastplan.make_plan(L, num_kv_heads=4, device=H200, policy="fa3") is None
    assert make_plan(L, num_kv_heads=4, device=H200, policy="fa3") == make_plan_reference(
        L, num_kv_heads=4, device=H200, policy="fa3")


@pytest.mark.parametrize("policy,params", [
    ("balanced", {"heads_per_tile": 2, "block_n": 64}),
    ("stream_k", {"heads_per_tile": 2, "ctas_per_sm": 6, "block_n": 32, "num_stages": 3, "prefetch": True}),
    ("tuned", {"heads_per_tile": 4, "ctas_per_sm": 2.5, "block_n": 32, "max_splits": 9}),
    ("tuned", {"heads_per_tile": 2, "partition": "stream_k", "ctas_per_sm": 3, "block_n": 64}),
    ("stream_k", {"heads_per_tile": 2, "ctas_per_sm": 3, "block_n": 64, "whole_wave": 0.05}),
])
@pytest.mark.parametrize("hkv", [4, 8])
def test_same_plans_as_reference_with_heads_per_tile(policy, params, hkv):
    """heads_per_tile changes how many tiles a work item makes (H_kv / heads_per_tile): the compiled planner
    counts them as the reference does."""
    for seed in range(2):
        for L in _batches(seed * 17 + hkv):
            kw = dict(num_kv_heads=hkv, device=H200, policy=policy, params=params)
            ref = make_plan_reference(L, **kw)
            assert fastplan.make_plan(L, **kw) == ref, (policy, params, hkv, L.tolist()[:20])
