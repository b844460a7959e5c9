"""service/fastjson.py: the compiled writer of a plan's arrays writes orjson's bytes."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from kvsplit.kernels.fastplan import as_kv_lens, run_spec
from kvsplit.kernels.plan import make_plan
from kvsplit.kernels.rulespec import resolve
from kvsplit.service import fastjson

pytestmark = pytest.mark.skipif(not fastjson.ENABLED, reason="numba off: the service serializes with orjson")

NAMES = ("kv_lens", "num_splits", "work_request", "work_kv_start", "work_kv_end", "cta_indptr")
I64 = np.iinfo(np.int64)
I32 = np.iinfo(np.int32)


def _orjson_opening(arrays) -> bytes:
    """What orjson writes for the six members, up to and including the comma after the last array."""
    d = dict(zip(NAMES, arrays))
    return orjson.dumps(d, option=orjson.OPT_SERIALIZE_NUMPY)[:-1] + b","


class _P:  # duck-typed Plan: plan_arrays_json reads the six attributes
    def __init__(self, arrays):
        self.__dict__.update(zip(NAMES, arrays))


def _edge_values() -> list[int]:
    vals = [0, 1, 9, 10, 99, 100, I64.max, I64.min, I64.min + 1, I32.max, I32.min, I32.max + 1, 2**53, 2**53 + 1]
    for k in range(19):
        for d in (-1, 0, 1):
            vals += [10**k + d, -(10**k) + d]
    return [v for v in vals if I64.min <= v <= I64.max]


def test_edge_values_int64_and_int32():
    vals = np.array(_edge_values(), np.int64)
    small = vals[(vals >= I32.min) & (vals <= I32.max)].astype(np.int32)
    arrays = (vals, small, small[::-1].copy(), vals[::-1].copy(), np.zeros(0, np.int64), np.array([7], np.int32))
    assert bytes(fastjson.plan_arrays_json(_P(arrays))) == _orjson_opening(arrays)


@pytest.mark.parametrize("seed", range(4))
def test_random_arrays_every_magnitude(seed):
    rng = np.random.default_rng(seed)
    for _ in range(50):
        arrays = []
        read_only = rng.random() < 0.5  # a Plan's arrays are read-only (one compiled variant per mix of flags)
        for name in NAMES:
            n = int(rng.integers(0, 300))
            mag = rng.integers(0, 63, n)  # every digit count, both signs
            a = (rng.integers(0, 2**62, n) >> (62 - mag)) * rng.choice([-1, 1], n)
            dt = np.int32 if name in ("num_splits", "work_request", "cta_indptr") else np.int64
            a = np.clip(a, np.iinfo(dt).min, np.iinfo(dt).max).astype(dt)
            a.setflags(write=not read_only)
            arrays.append(a)
        assert bytes(fastjson.plan_arrays_json(_P(arrays))) == _orjson_opening(arrays)


def test_strided_arrays():
    a = np.arange(100, dtype=np.int64) * 12345
    arrays = (a[::3], a[1::7].astype(np.int32), a[:0], a[::-1], a[5:6], a[::2].astype(np.int32))
    assert bytes(fastjson.plan_arrays_json(_P(arrays))) == _orjson_opening([np.ascontiguousarray(x) for x in arrays])


@pytest.mark.parametrize(
    "policy,params",
    [
        ("balanced", {}),
        ("stream_k", {"ctas_per_sm": 3.0}),
        ("tuned", {"partition": "stream_k", "order": "heavy_first"}),
        ("tuned", {"pack_tokens": 512, "wave_aware": False}),
        ("fixed", {"num_splits": 3}),
        ("no_split", {}),
    ],
)
def test_planner_buffers_equal_the_plan(policy, params):
    """buffers_json on run_spec's two buffers == the Plan's arrays through orjson; with_kv=False leaves
    exactly ``{"kv_lens":[...]`` out."""
    rng = np.random.default_rng(3)
    sp = resolve(policy, params, num_kv_heads=4, device="NVIDIA H200")
    for _ in range(60):
        lens = np.floor(2 ** (rng.random(int(rng.integers(1, 400))) * rng.uniform(1, 24))).astype(np.int64)
        if rng.random() < 0.2:
            lens[rng.random(lens.shape[0]) < 0.5] = 0
        plan = make_plan(lens, num_kv_heads=4, device="NVIDIA H200", policy=policy, params=params)
        ref = _orjson_opening([getattr(plan, k) for k in NAMES])
        W, nc, b64, b32 = run_spec(as_kv_lens(lens), sp, True)
        assert bytes(fastjson.buffers_json(b64, b32, lens.shape[0], W, nc)) == ref
        assert bytes(fastjson.plan_arrays_json(plan)) == ref
        tail = bytes(fastjson.buffers_json(b64, b32, lens.shape[0], W, nc, False))
        assert b'{"kv_lens":' + orjson.dumps(lens.tolist()) + tail == ref
