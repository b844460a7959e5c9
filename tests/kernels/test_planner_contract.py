"""The contract every planner meets: the plans of the NumPy oracle (tests/kernels/oracle.py).

Planners (parametrized, as Optuna's storage tests run every storage): ``jit``, the loop-form rules compiled by
numba (kernels/fastplan.py); ``python``, the same loops run as plain Python (``fastplan.python()``); ``device``,
the Triton device planner (kernels/device_plan.py) on the interpreter, for the rules it runs. Random batches of
several length families, every policy with a spread of parameters, int32/int64 arrays and lists; plus errors
(same messages) and the one-conversion contract.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

from kvsplit.kernels import fastplan
from kvsplit.kernels.buckets import bucket_key
from kvsplit.kernels.device import DeviceSpec
from kvsplit.kernels.plan import make_plan

from .oracle import bucket_key as bucket_key_ref
from .oracle import make_plan as oracle_plan

PLANNERS = ["jit", "python", "device"]

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
    (
        "tuned",
        {
            "ctas_per_sm": 2.5,
            "min_chunk_tokens": 1000,
            "max_splits": 7,
            "order": "heavy_first",
            "pack_tokens": 1024,
            "schedule": "persistent",
            "programs_per_sm": 2,
        },
    ),
    ("tuned", {"wave_aware": False, "ctas_per_sm": 3, "block_n": 32, "num_warps": 2}),
    ("tuned", {"partition": "stream_k", "ctas_per_sm": 1, "item_cost_blocks": 0, "min_piece_blocks": 2}),
    ("tuned", {"partition": "stream_k", "order": "heavy_first", "schedule": "persistent", "num_programs": 77}),
    ("stream_k", {"ctas_per_sm": 3, "block_n": 128, "whole_wave": 0.05}),
    ("balanced", {"whole_wave": 0.2, "order": "heavy_first"}),
    ("tuned", {"partition": "stream_k", "whole_wave": 0.05, "schedule": "persistent", "num_programs": 77}),
    ("flashinfer", {}),
    ("flashinfer", {"tensor_cores": False, "order": "heavy_first", "pack_tokens": 256}),
    ("flashinfer", {"tensor_cores": False, "resident_ctas_per_sm": 2}),
    ("fa3", {}),
    ("fa3", {"num_splits_static": 4, "order": "natural"}),
]


def _batches(seed: int):
    rng = np.random.default_rng(seed)
    yield rng.integers(1, 8192, 256)  # uniform-ish
    yield rng.integers(0, 40, 33)  # tiny, zeros
    yield np.array([0])  # B = 1, empty
    yield np.array([1])
    yield np.array([262144])  # B = 1, long
    yield np.concatenate([[200000], rng.integers(1, 300, 500)])  # skewed
    yield rng.integers(1, 2000, 7) * 64  # block-aligned
    yield np.full(132, 1024)  # uniform, wave edge
    yield np.full(128, 2048)  # whole wave of (64, 4, 2) at H_kv 4
    yield np.rint(5461 * rng.uniform(0.995, 1.005, 96)).astype(np.int64)  # near-even, (128, 4, 2) at H_kv 4
    yield rng.integers(0, 3, 1000)  # many 0/1/2
    B = int(rng.integers(1, 600))
    yield (rng.pareto(1.2, B) * 500).astype(np.int64).clip(0, 2**20)


def _device_plan(L, num_kv_heads, device, policy, params, **shape):
    """The device planner's buffers for ``L`` as a dict of the Plan's arrays (and its merge layout)."""
    torch = pytest.importorskip("torch")
    from kvsplit.kernels.device_plan import alloc_device_plan, check_device_rule, device_plan
    from kvsplit.kernels.rulespec import resolve

    spec = resolve(policy, params, num_kv_heads=num_kv_heads, device=device, **shape)
    try:
        check_device_rule(spec)
    except NotImplementedError:
        return None
    L = np.asarray(L, dtype=np.int64)
    B = L.shape[0]
    dev = "cuda" if torch.cuda.is_available() else "cpu"  # the interpreter without a GPU
    bufs = alloc_device_plan(max(B, 1), 8 * B + 4096, dev)
    device_plan(
        torch.tensor(L, dtype=torch.int32, device=dev), spec, bufs, torch.ones(1, dtype=torch.int32, device=dev)
    )
    W, C, T, M = bufs.counts.tolist()
    return {
        "work_request": bufs.work_request[:W].tolist(),
        "work_kv_start": bufs.work_kv_start[:W].tolist(),
        "work_kv_end": bufs.work_kv_end[:W].tolist(),
        "cta_indptr": bufs.cta_indptr[: C + 1].tolist(),
        "work_slot": bufs.work_slot[:W].tolist(),
        "merge_request": bufs.merge_request[:M].tolist(),
        "merge_slot_start": bufs.merge_slot_start[:M].tolist(),
        "merge_num": bufs.merge_num[:M].tolist(),
        "num_tiles": T,
    }


def _device_view(p):
    ws, mr, ms, mn = p.merge_layout()
    return {
        "work_request": p.work_request.tolist(),
        "work_kv_start": p.work_kv_start.tolist(),
        "work_kv_end": p.work_kv_end.tolist(),
        "cta_indptr": p.cta_indptr.tolist(),
        "work_slot": ws.tolist(),
        "merge_request": mr.tolist(),
        "merge_slot_start": ms.tolist(),
        "merge_num": mn.tolist(),
        "num_tiles": p.num_work_tiles,
    }


def check_planner(planner, L, forms=True, **kw):
    """``planner``'s plan of ``L`` equals the oracle's (for the host planners, for each input form)."""
    ref = oracle_plan(L, **kw)
    if planner == "device":
        got = _device_plan(L, **kw)
        if got is not None:
            assert got == _device_view(ref), (kw, np.asarray(L).tolist()[:20])
        return
    if planner == "jit" and not fastplan.HAVE_NUMBA:
        pytest.skip("numba is not installed")
    arrs = (np.asarray(L).astype(np.int64), np.asarray(L).astype(np.int32), np.asarray(L).tolist()) if forms else (L,)
    with fastplan.python() if planner == "python" else contextlib.nullcontext():
        for arr in arrs:
            got = make_plan(arr, **kw)
            assert got == ref, (planner, kw, np.asarray(L).tolist()[:20])
            for name in ("kv_lens", "num_splits", "work_request", "work_kv_start", "work_kv_end", "cta_indptr"):
                a, b = getattr(got, name), getattr(ref, name)
                assert a.dtype == b.dtype and not a.flags.writeable, name


@pytest.mark.parametrize("planner", PLANNERS)
@pytest.mark.parametrize("policy,params", CASES)
@pytest.mark.parametrize("hkv", [1, 4, 8])
def test_same_plans_as_oracle(planner, policy, params, hkv):
    for seed in range(1 if planner == "device" else 3):
        for L in _batches(seed * 31 + hkv):
            check_planner(planner, L, num_kv_heads=hkv, device=H200, policy=policy, params=params)


def test_plan_arrays_do_not_alias_the_input():
    L = np.array([100, 5000, 3], dtype=np.int64)
    p = make_plan(L, num_kv_heads=4, device=H200)
    L[0] = 7
    assert p.kv_lens[0] == 100 and L.flags.writeable


@pytest.mark.parametrize("planner", PLANNERS)
def test_other_devices_and_shapes(planner):
    rng = np.random.default_rng(5)
    for dev in ("NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"):
        for hd, dt in ((64, "float16"), (256, "bfloat16"), (128, "float32")):
            for _ in range(3):
                L = rng.integers(0, 30000, int(rng.integers(1, 300)))
                kw = dict(num_kv_heads=2, device=dev, head_dim=hd, dtype=dt, page_size=8)
                for pol, params in (
                    ("balanced", {}),
                    ("stream_k", {}),
                    ("tuned", {"wave_aware": False}),
                    ("flashinfer", {}),
                    ("fa3", {}),
                ):
                    check_planner(planner, L, forms=False, policy=pol, params=params, **kw)


@pytest.mark.parametrize("planner", ["jit", "python"])
def test_same_bucket_keys_as_oracle(planner):
    rng = np.random.default_rng(7)
    batches = list(_batches(1)) + [
        np.zeros(5, np.int64),
        np.array([2**31 - 1, 1, 2, 3]),
        rng.integers(0, 2**31 - 1, 4096),
    ]
    with fastplan.python() if planner == "python" else contextlib.nullcontext():
        for L in batches:
            for arr in (L.astype(np.int64), L.tolist()):
                kw = dict(num_kv_heads=4, head_dim=128, dtype="bfloat16", device=H200, page_size=16)
                ref = bucket_key_ref(arr, **kw)
                got = bucket_key(arr, **kw)
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
        assert bucket_key(L, **kw) == ref and str(bucket_key(L, **kw)) == str(ref)


@pytest.mark.parametrize(
    "bad,field",
    [
        ([5, -1, 3], "kv_lens[1]"),
        (np.array([5, 2**31], dtype=np.int64), "kv_lens[1]"),
        ([1, True, 3], "kv_lens[1]"),
        ([1, 2.5], "kv_lens[1]"),
        ([], "kv_lens"),
        (np.zeros((2, 2), np.int64), "kv_lens"),
        (np.array([1.0]), "kv_lens"),
        (["3"], "kv_lens[0]"),
        ([2**70], "kv_lens[0]"),
    ],
)
def test_errors_match_reference(bad, field):
    with pytest.raises(ValueError) as ref:
        oracle_plan(bad, num_kv_heads=4, device=H200)
    with pytest.raises(ValueError) as got:
        make_plan(bad, num_kv_heads=4, device=H200)
    assert str(got.value) == str(ref.value) and str(got.value).startswith(field)
    with pytest.raises(ValueError) as got:
        bucket_key(bad, num_kv_heads=4, head_dim=128, dtype="bfloat16", device=H200)
    assert str(got.value).startswith(field)


@pytest.mark.parametrize(
    "kwargs,field",
    [
        (dict(params={"ctas_per_sm": 0}), "params.ctas_per_sm"),
        (dict(params={"wave_aware": 1}, policy="tuned"), "params.wave_aware"),
        (dict(params={"bogus": 1}), "params"),
        (dict(num_kv_heads=True), "num_kv_heads"),
        (dict(head_dim=96), "head_dim"),
        (dict(policy="tuned", params={"partition": "stream_k", "max_splits": 4}), "params.max_splits"),
    ],
)
def test_param_errors_match_reference(kwargs, field):
    kw = dict(num_kv_heads=4, device=H200) | kwargs
    if kw.get("policy") == "tuned" and kw["params"].get("wave_aware") == 1:
        make_plan([5], **(kw | {"params": {"wave_aware": True}}))  # memoized True must not admit 1
    with pytest.raises(ValueError) as ref:
        oracle_plan([5, 6], **kw)
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
        oracle_plan(L, **kw)
    with pytest.raises(ValueError) as got:
        make_plan(L, **kw)
    assert str(got.value) == str(ref.value)


@pytest.mark.parametrize(
    "policy,params",
    [
        ("balanced", {"heads_per_tile": 2, "block_n": 64}),
        ("stream_k", {"heads_per_tile": 2, "ctas_per_sm": 6, "block_n": 32, "num_stages": 3, "prefetch": True}),
        ("tuned", {"heads_per_tile": 4, "ctas_per_sm": 2.5, "block_n": 32, "max_splits": 9}),
        ("tuned", {"heads_per_tile": 2, "partition": "stream_k", "ctas_per_sm": 3, "block_n": 64}),
        ("stream_k", {"heads_per_tile": 2, "ctas_per_sm": 3, "block_n": 64, "whole_wave": 0.05}),
    ],
)
@pytest.mark.parametrize("hkv", [4, 8])
@pytest.mark.parametrize("planner", PLANNERS)
def test_same_plans_as_oracle_with_heads_per_tile(planner, policy, params, hkv):
    """heads_per_tile changes how many tiles a work item makes (H_kv / heads_per_tile): every planner counts
    them as the oracle does."""
    for seed in range(1 if planner == "device" else 2):
        for L in _batches(seed * 17 + hkv):
            check_planner(planner, L, forms=False, num_kv_heads=hkv, device=H200, policy=policy, params=params)


@pytest.mark.parametrize("planner", ["jit", "python"])
def test_same_distances_as_oracle(planner):
    """``buckets.distance`` (the loop-form scan the policy table runs) equals the oracle's formula, bit for bit."""
    from kvsplit.kernels.buckets import distance

    from .oracle import distance as oracle_distance

    keys = [
        bucket_key_ref(L, num_kv_heads=4, head_dim=128, dtype="bfloat16", device=H200)
        for seed in range(2)
        for L in _batches(seed)
    ]
    with fastplan.python() if planner == "python" else contextlib.nullcontext():
        for a in keys:
            for b in keys:
                assert distance(a, b) == oracle_distance(a, b), (str(a), str(b))
