"""kvsplit.kernels.buckets: keys, string form, distance, nearest."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsplit.kernels.buckets import (
    DISTANCE_LIMIT,
    HIST_UNITS,
    BucketKey,
    bucket_key,
    distance,
    nearest,
)
from kvsplit.tuner.workloads import FAMILIES, family_kv_lens

KW = dict(num_kv_heads=4, head_dim=128, dtype="bfloat16", device="NVIDIA H200")


def key(L, **over):
    kw = dict(KW)
    kw.update(over)
    return bucket_key(L, **kw)


def test_hand_computed_key():
    # skewed40, B=8, T=262144: heavy 104857 tokens (2*log2 = 33.36 -> bin 33, weight 0.4 -> 6.4 units),
    # 7 x ~22469 tokens (2*log2 = 28.9 -> bin 28, 9.6 units); largest remainder: 6 + 10 = 16.
    # B class round(log2 8) = 3, T class round(log2 262144) = 18.
    k = key(family_kv_lens("skewed40", 8, 262144))
    assert str(k) == "nvidia-h200.kv4.d128.bf16.p16.b3.t18.w28x10-33x6"
    assert k.hist == ((28, 10), (33, 6)) and k.batch_class == 3 and k.tokens_class == 18
    # bin edges are exact: 2^k and 2^(k+1/2)
    assert key([1024]).hist == ((20, 16),) and key([1023]).hist == ((19, 16),)
    assert key([1448]).hist == ((20, 16),) and key([1449]).hist == ((21, 16),)  # sqrt(2)*1024 = 1448.15
    # empty requests weigh nothing; all-empty batch
    assert key([0, 0, 1024]).hist == ((20, 16),)
    e = key([0, 0])
    assert e.hist == () and e.tokens_class == -1 and BucketKey.parse(str(e)) == e


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=50),
    st.sampled_from([1, 4, 128]),
    st.sampled_from(["float16", "bfloat16", "float32"]),
    st.sampled_from([1, 16, 256]),
)
def test_round_trip_and_hash(L, hkv, dtype, page):
    k = key(L, num_kv_heads=hkv, dtype=dtype, page_size=page)
    s = str(k)
    assert BucketKey.parse(s) == k and hash(BucketKey.parse(s)) == hash(k)
    assert len(s) < 200 and all(c.isalnum() or c in ".-x" for c in s)
    if k.hist:
        assert sum(u for _, u in k.hist) == HIST_UNITS
    assert key(list(L), num_kv_heads=hkv, dtype=dtype, page_size=page) == k  # deterministic
    assert distance(k, k) == 0.0


def test_families_differ_and_nearest_is_own_family():
    for T in (262144, 1048576, 100_000):
        for B in (8, 16, 64, 256, 512, 4096):
            keys = {f: key(family_kv_lens(f, B, T)) for f in FAMILIES}
            assert len(set(keys.values())) == 5, (T, B)
            for f, k in keys.items():
                assert nearest(k, keys.values()) == (k, 0.0)
                others = [distance(k, keys[g]) for g in FAMILIES if g != f]
                assert min(others) >= 0.8


def test_nearby_sizes_are_neighbours():
    rng = np.random.default_rng(1)
    for f in FAMILIES:
        for T in (262144, 1048576):
            base_keys = {B: key(family_kv_lens(f, B, T)) for B in (8, 16, 32, 64, 128, 256, 512)}
            for B in base_keys:
                for _ in range(4):
                    B2 = int(round(B * rng.uniform(0.9, 1.1)))
                    L2 = (family_kv_lens(f, B2, T) * rng.uniform(0.9, 1.1, B2)).astype(np.int64)
                    k2 = key(L2)
                    assert distance(base_keys[B], k2) <= DISTANCE_LIMIT, (f, T, B, B2)
                    # the drawn batch's nearest reference key of its family is that of a nearby B
                    best = nearest(k2, [base_keys[b] for b in base_keys])
                    assert best is not None


def test_distance_hand_computed_and_families():
    a = key(family_kv_lens("skewed40", 8, 262144))  # w28x10-33x6
    b = key(family_kv_lens("skewed60", 8, 262144))  # w27x6-34x10
    # CDF diff: bin 27: 6, bins 28..32: 4 each (5 bins), bin 33: 10 -> 36 units / 16 * 0.5 = 1.125
    assert str(b).endswith("w27x6-34x10")
    assert distance(a, b) == pytest.approx(1.125)
    assert distance(a, b) == distance(b, a) == distance(str(a), str(b))
    # class steps: same histogram, B class 3 vs 4 -> 0.5
    assert distance(key([1024] * 8), key([1024] * 16)) == pytest.approx(0.5 + 0.5)  # B and T class both step
    # different family: infinite
    assert math.isinf(distance(a, key(family_kv_lens("skewed40", 8, 262144), num_kv_heads=8)))
    assert math.isinf(distance(a, key(family_kv_lens("skewed40", 8, 262144), device="NVIDIA H100 80GB HBM3")))
    assert math.isinf(distance(a, key([0])))


def test_nearest_ties_and_limits():
    k = key([1024] * 8)
    c1 = key([1024] * 16)  # distance 1.0
    c2 = key([2048] * 4)  # hist 22 vs 20: 1.0; B class 2: 0.5 ; T same -> 1.5
    assert nearest(k, [c2]) is None
    assert nearest(k, []) is None
    got = nearest(k, [c1, str(c1)])
    assert got is not None and got[1] == pytest.approx(1.0)
    # deterministic tie-break by string form, whatever the order
    t1, t2 = key([1024] * 4), key([1024] * 16)
    assert distance(k, t1) == distance(k, t2)
    first = min(str(t1), str(t2))
    assert str(nearest(k, [t1, t2])[0]) == first and str(nearest(k, [t2, t1])[0]) == first


@pytest.mark.parametrize(
    "s",
    [
        "",
        "nvidia-h200",
        "nvidia-h200.kv4.d128.bf16.p16.b3.t18.w28x10-33x5",
        "nvidia-h200.kv4.d128.bf16.p16.b3.t18.w33x6-28x10",
        "nvidia-h200.kv04.d128.bf16.p16.b3.t18.w28x16",
        "NVIDIA.kv4.d128.bf16.p16.b3.t18.w28x16",
        "nvidia-h200.kv4.d128.i8.p16.b3.t18.w28x16",
    ],
)
def test_parse_rejects(s):
    with pytest.raises(ValueError):
        BucketKey.parse(s)


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match="num_kv_heads"):
        key([1], num_kv_heads=0)
    with pytest.raises(ValueError, match="head_dim"):
        key([1], head_dim=100)
    with pytest.raises(ValueError, match="dtype"):
        key([1], dtype="fp8")
    with pytest.raises(ValueError, match="kv_lens"):
        key([-3])
    with pytest.raises(ValueError, match="device"):
        key([1], device="Foo GPU")


def test_planner_modules_do_not_import_torch():
    import subprocess
    import sys

    code = (
        "import sys; import kvsplit.kernels.plan, kvsplit.kernels.buckets, kvsplit.kernels.device; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
