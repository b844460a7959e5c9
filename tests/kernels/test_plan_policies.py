"""Policies of kvsplit.kernels.plan: invariants (hypothesis), hand-computed plans, errors."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvsplit.kernels.device import DeviceSpec
from kvsplit.kernels.plan import (
    POLICIES,
    TUNED_PARAM_SPACE,
    Plan,
    _check_plan_invariants,
    default_config,
    fa3_static_num_splits,
    flashinfer_decode_occupancy,
    make_plan,
    policy_params,
)
from kvsplit.tuner.workloads import family_kv_lens

H200 = DeviceSpec.known("NVIDIA H200")

# every policy with a few parameter sets
POLICY_CASES = [
    ("no_split", {}),
    ("fixed", {"num_splits": 8}),
    ("fixed", {"num_splits": 3, "order": "heavy_first", "pack_tokens": 256}),
    ("balanced", {}),
    ("balanced", {"ctas_per_sm": 1}),
    ("flashinfer", {}),
    ("flashinfer", {"tensor_cores": False}),
    ("flashinfer", {"tensor_cores": False, "resident_ctas_per_sm": 2}),
    ("fa3", {}),
    ("fa3", {"order": "natural", "schedule": "grid"}),
    ("tuned", {}),
    ("tuned", {"ctas_per_sm": 0.5, "min_chunk_tokens": 512, "max_splits": 4, "block_n": 32, "num_warps": 2,
               "num_stages": 3, "order": "heavy_first", "schedule": "persistent", "programs_per_sm": 2,
               "pack_tokens": 1024}),
]


def check_invariants(plan: Plan) -> None:
    """DESIGN.md §3 invariants, checked independently of Plan's own checker."""
    L = plan.kv_lens
    B = L.shape[0]
    assert (plan.num_splits >= 1).all()
    assert plan.num_work_items == int(plan.num_splits.sum())
    for b in range(B):
        idx = np.flatnonzero(plan.work_request == b)
        assert idx.shape[0] == plan.num_splits[b]
        assert (np.diff(idx) == 1).all(), "items of a request are consecutive"
        s, e = plan.work_kv_start[idx], plan.work_kv_end[idx]
        if L[b] == 0:
            assert s.tolist() == [0] and e.tolist() == [0]
        else:
            assert s[0] == 0 and e[-1] == L[b]
            assert (e > s).all(), "no empty item"
            assert (s[1:] == e[:-1]).all(), "contiguous, in order"
    ci = plan.cta_indptr
    assert ci[0] == 0 and ci[-1] == plan.num_work_items and (np.diff(ci) >= 1).all()
    _check_plan_invariants(plan)  # the Plan's own check agrees


kv_lens_st = st.lists(
    st.one_of(st.integers(0, 64), st.integers(0, 5000), st.integers(0, 300_000)), min_size=1, max_size=40
)
device_st = st.sampled_from(
    [H200, dataclasses.replace(H200, num_sms=1), dataclasses.replace(H200, num_sms=3),
     dataclasses.replace(H200, num_sms=8), DeviceSpec.known("NVIDIA A100-SXM4-80GB")]
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kv=kv_lens_st,
    case=st.sampled_from(POLICY_CASES),
    hkv=st.sampled_from([1, 2, 4, 8, 32, 128]),
    page=st.sampled_from([1, 16, 64, 256]),
    dev=device_st,
)
def test_invariants_every_policy(kv, case, hkv, page, dev):
    policy, params = case
    plan = make_plan(kv, num_kv_heads=hkv, device=dev, policy=policy, params=params, page_size=page)
    check_invariants(plan)
    # determinism: the same input gives the same plan
    again = make_plan(list(kv), num_kv_heads=hkv, device=dev, policy=policy, params=dict(params), page_size=page)
    assert again == plan
    # exact JSON round trip
    d = plan.to_dict()
    back = Plan.from_dict(json.loads(json.dumps(d)))
    assert back == plan and back.to_dict() == d
    assert back.num_splits.tolist() == plan.num_splits.tolist()


def test_every_policy_is_covered():
    assert {p for p, _ in POLICY_CASES} == set(POLICIES)


def test_hq_is_not_an_argument():
    with pytest.raises(TypeError):
        make_plan([100], num_kv_heads=4, device=H200, num_qo_heads=32)  # type: ignore[call-arg]
    for policy in POLICIES:
        assert "num_qo_heads" not in policy_params(policy)


def test_kv_len_zero_is_one_empty_item():
    for policy, params in POLICY_CASES:
        p = make_plan([0, 5000, 0], num_kv_heads=4, device=H200, policy=policy, params=params)
        check_invariants(p)
        for b in (0, 2):
            assert p.num_splits[b] == 1


# ---------------------------------------------------------------------------
# Hand-computed plans
# ---------------------------------------------------------------------------


def test_fa3_policies_md_example():
    # policies.md §2b: Hkv=8, S=132, lens=[65536]+15x[2048]: blocks_per_sm=51, splits [11]+[1]*15
    # n_b = 512 + 15*16 = 752; ceil(752 * 1.1 * 8 / 132) = ceil(50.13) = 51; cdiv(512, 51) = 11 <= static cap 15
    p = make_plan([65536] + [2048] * 15, num_kv_heads=8, device=H200, policy="fa3")
    assert p.num_splits.tolist() == [11] + [1] * 15
    assert p.num_work_items * 8 == 208
    assert p.config.schedule == "persistent" and p.config.num_programs == 132
    # heavy first: key cdiv(n_b, splits) = 47 for the long one, 16 for the others
    assert p.work_request.tolist() == [0] * 11 + list(range(1, 16))
    # knobs not given come from the default config
    d = default_config(128, "bfloat16")
    assert (p.config.block_n, p.config.num_warps, p.config.num_stages) == (d.block_n, d.num_warps, d.num_stages)


def test_fa3_static_cap_table():
    # policies.md §2a: S=132, Hkv 1/2/4/8/16/32 -> 109/57/29/15/8/4
    assert [fa3_static_num_splits(h, 4096, 132) for h in (1, 2, 4, 8, 16, 32)] == [109, 57, 29, 15, 8, 4]
    assert fa3_static_num_splits(4, 4, 132) == 1  # num_n_blocks <= 4
    assert fa3_static_num_splits(106, 4096, 132) == 1  # Hkv >= 0.8 S


def test_fa3_cap_and_heavy_first_order():
    # B=1, T=262144, Hkv=4: n=2048, blocks_per_sm=ceil(2048*1.1*4/132)=ceil(68.27)=69, cdiv(2048,69)=30 -> cap 29
    p = make_plan([262144], num_kv_heads=4, device=H200, policy="fa3")
    assert p.num_splits.tolist() == [29]
    # order by cdiv(n_b, splits) descending, stable
    p = make_plan([128, 1280, 640, 1280], num_kv_heads=4, device=H200, policy="fa3")
    # n_b = [1, 10, 5, 10]; blocks_per_sm = ceil(26*1.1*4/132) = 1; static cap with max n_b = 10:
    # eff(s) = 4s/132 for s <= 10, 0.85 * 40/132 -> s >= 8.5 -> 9; splits = min(n_b, 9)
    assert p.num_splits.tolist() == [1, 9, 5, 9]
    # keys cdiv(n_b, splits) = [1, 2, 1, 2]: requests 1, 3 first, then 0, 2 (stable)
    first = np.ones(p.num_work_items, dtype=bool)
    first[1:] = p.work_request[1:] != p.work_request[:-1]
    assert p.work_request[first].tolist() == [1, 3, 0, 2]


def test_fa3_no_split_above_992_requests():
    # 992 requests: n = 8192 + 991 = 9183, blocks_per_sm = ceil(9183 * 1.1 / 132) = 77, cdiv(8192, 77) = 107
    L = [1 << 20] + [128] * 991
    p = make_plan(L, num_kv_heads=1, device=H200, policy="fa3")
    assert p.num_splits.tolist() == [107] + [1] * 991
    p = make_plan(L + [128], num_kv_heads=1, device=H200, policy="fa3")  # 993: one split each
    assert (p.num_splits == 1).all()


def test_flashinfer_tensor_core_cliff_hand_computed():
    # T=262144 skewed80, Hkv=4, S=132, page 16: max_batch = 264 // 4 = 66 requests-worth of chunks
    L = family_kv_lens("skewed80", 64, 262144)  # long: 209715 tok = 13108 pages; 63 x 832 tok = 52 pages
    p = make_plan(L, num_kv_heads=4, device=H200, policy="flashinfer")
    # smallest c with cdiv(13108,c) + 63*cdiv(52,c) <= 66 -> c >= 52 and cdiv(13108,c) <= 3 -> c = 4370
    assert p.num_splits.tolist() == [3] + [1] * 63
    L = family_kv_lens("skewed80", 128, 262144)  # 128 requests > 66: the search ends at max pages, no split
    p = make_plan(L, num_kv_heads=4, device=H200, policy="flashinfer")
    assert (p.num_splits == 1).all()
    # small batch: B=1 -> chunk = cdiv(16384, 66) = 249 pages -> 66 chunks
    p = make_plan([262144], num_kv_heads=4, device=H200, policy="flashinfer")
    assert p.num_splits.tolist() == [66]
    # below the 128-token minimum chunk nothing splits
    p = make_plan([100, 20], num_kv_heads=4, device=H200, policy="flashinfer")
    assert p.num_splits.tolist() == [1, 1]


def test_flashinfer_cuda_core_occupancy_and_cliff():
    # G=8, D=128, bf16: vec=8, bdx=16, threads=128, smem=2*2*1*8*1*128*2 + 1024 = 9216 B
    # limits: threads 2048/128=16, smem 233472//10240=22, regs 65536//(128*64)=8 -> 8
    assert flashinfer_decode_occupancy(128, "bfloat16", 8, H200) == 8
    # G=1: tile_per_bdx=4, bdz=8: smem = 2*2*4*1*8*128*2 + 4*128*8 = 36864 -> 233472//37888 = 6
    assert flashinfer_decode_occupancy(128, "bfloat16", 1, H200) == 6
    L256 = family_kv_lens("skewed80", 256, 262144)
    p = make_plan(L256, num_kv_heads=4, device=H200, policy="flashinfer", params={"tensor_cores": False})
    # capacity 1056 > 1024 CTAs: split; sum chunks <= 264: 255*1 + cdiv(13108, c) <= 264 -> 9 chunks
    assert p.num_splits[0] == 9 and (p.num_splits[1:] == 1).all()
    L512 = family_kv_lens("skewed80", 512, 262144)
    p = make_plan(L512, num_kv_heads=4, device=H200, policy="flashinfer", params={"tensor_cores": False})
    assert (p.num_splits == 1).all()  # 2048 >= 1056: split-KV off


def test_balanced_and_tuned_hand_computed():
    # balanced: total = 4*262144, fair = cdiv(1048576, 528) = 1986 -> chunk 2048 (block_n 64) -> 128 splits
    p = make_plan([262144], num_kv_heads=4, device=H200, policy="balanced")
    assert p.num_splits.tolist() == [128]
    # tuned with defaults == balanced
    for L in ([262144], family_kv_lens("skewed60", 37, 100_000).tolist(), [0, 1, 2, 3000]):
        a = make_plan(L, num_kv_heads=4, device=H200, policy="balanced")
        b = make_plan(L, num_kv_heads=4, device=H200, policy="tuned")
        assert a.num_splits.tolist() == b.num_splits.tolist()
        assert a.work_kv_start.tolist() == b.work_kv_start.tolist()
    # tuned: chunk = roundup(max(4096, fair), 64); fair = cdiv(4*10000, 2*132) = 152 -> 4096 -> cdiv(10000,4096)=3
    p = make_plan([10000, 100], num_kv_heads=4, device=H200, policy="tuned",
                  params={"ctas_per_sm": 2, "min_chunk_tokens": 4096})
    assert p.num_splits.tolist() == [3, 1]
    p = make_plan([10000, 100], num_kv_heads=4, device=H200, policy="tuned",
                  params={"min_chunk_tokens": 16, "max_splits": 2})
    assert p.num_splits.tolist() == [2, 1]
    p = make_plan([100], num_kv_heads=4, device=H200, policy="tuned",
                  params={"schedule": "persistent", "programs_per_sm": 3})
    assert p.config.num_programs == 396


def test_fixed_and_no_split():
    p = make_plan([10, 3, 0, 1000], num_kv_heads=2, device=H200, policy="fixed", params={"num_splits": 4})
    assert p.num_splits.tolist() == [4, 3, 1, 4]  # clamped to kv_len, >= 1
    assert p.work_kv_start[:4].tolist() == [0, 2, 5, 7] and p.work_kv_end[:4].tolist() == [2, 5, 7, 10]
    p = make_plan([10, 3], num_kv_heads=2, device=H200, policy="no_split")
    assert p.num_splits.tolist() == [1, 1]


def test_tuned_param_space_is_data_and_accepted():
    for name, spec in TUNED_PARAM_SPACE.items():
        assert name in policy_params("tuned")
        assert spec["kind"] in ("float", "int", "categorical")
        assert "doc" in spec and "default" in spec
    # every bound of the numeric ranges is accepted by make_plan
    for name in ("ctas_per_sm", "min_chunk_tokens", "max_splits"):
        for v in (TUNED_PARAM_SPACE[name]["low"], TUNED_PARAM_SPACE[name]["high"]):
            make_plan([5000, 10], num_kv_heads=4, device=H200, policy="tuned", params={name: v})
    for v in TUNED_PARAM_SPACE["pack_tokens"]["choices"]:
        make_plan([5000, 10], num_kv_heads=4, device=H200, policy="tuned", params={"pack_tokens": v})


# ---------------------------------------------------------------------------
# Few SMs, many KV heads: no split < 1, no empty chunk, no division by zero
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("sms", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("hkv", [1, 7, 64, 128])
def test_small_gpus_many_heads(sms, hkv):
    dev = dataclasses.replace(H200, num_sms=sms)
    for policy, params in POLICY_CASES:
        for L in ([0], [1], [0, 0, 0], [1, 2, 3], [2**31 - 1], [300_000, 5, 0, 17]):
            check_invariants(make_plan(L, num_kv_heads=hkv, device=dev, policy=policy, params=params))


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(kv_lens=[-1]), "kv_lens[0]"),
        (dict(kv_lens=[1.5]), "kv_lens[0]"),
        (dict(kv_lens=[2**31]), "kv_lens[0]"),
        (dict(kv_lens=np.array([1.0])), "kv_lens"),
        (dict(kv_lens=[1] * 65537), "kv_lens"),
        (dict(kv_lens=[]), "kv_lens"),
        (dict(num_kv_heads=0), "num_kv_heads"),
        (dict(head_dim=96), "head_dim"),
        (dict(dtype="int8"), "dtype"),
        (dict(page_size=0), "page_size"),
        (dict(policy="nope"), "policy"),
        (dict(device="NVIDIA Nonexistent"), "device"),
        (dict(policy="fixed"), "params.num_splits"),
        (dict(policy="fixed", params={"num_splits": 0}), "params.num_splits"),
        (dict(policy="balanced", params={"ctas_per_sm": 0}), "params.ctas_per_sm"),
        (dict(policy="balanced", params={"bogus": 1}), "params"),
        (dict(policy="flashinfer", params={"tensor_cores": "yes"}), "params.tensor_cores"),
        (dict(policy="flashinfer", params={"resident_ctas_per_sm": 4}), "params.resident_ctas_per_sm"),
        (dict(policy="flashinfer", params={"tensor_cores": False, "resident_ctas_per_sm": 0}),
         "params.resident_ctas_per_sm"),
        (dict(policy="flashinfer", params={"group_size": 0}), "params.group_size"),
        (dict(policy="fa3", params={"num_splits_static": 256}), "params.num_splits_static"),
        (dict(policy="tuned", params={"ctas_per_sm": float("nan")}), "params.ctas_per_sm"),
        (dict(policy="tuned", params={"ctas_per_sm": 100}), "params.ctas_per_sm"),
        (dict(policy="tuned", params={"min_chunk_tokens": 8}), "params.min_chunk_tokens"),
        (dict(policy="tuned", params={"max_splits": 0}), "params.max_splits"),
        (dict(policy="tuned", params={"programs_per_sm": 2}), "params.programs_per_sm"),
        (dict(policy="tuned", params={"block_n": 48}), "params.block_n"),
        (dict(policy="tuned", params={"num_warps": 3}), "params.num_warps"),
        (dict(policy="tuned", params={"order": "random"}), "params.order"),
        (dict(policy="tuned", params={"schedule": "wave"}), "params.schedule"),
        (dict(policy="tuned", params={"num_programs": 5}), "params.num_programs"),
        (dict(policy="tuned", params={"pack_tokens": -1}), "params.pack_tokens"),
    ],
)
def test_errors_name_the_field(kwargs, field):
    args = dict(kv_lens=[100, 200], num_kv_heads=4, device=H200)
    args.update(kwargs)
    kv = args.pop("kv_lens")
    with pytest.raises(ValueError) as exc:
        make_plan(kv, **args)
    assert field in str(exc.value)


def test_large_batch_plans_are_valid():
    # Functional check only (speed is printed by bench/bench_planner.py).
    L = np.random.default_rng(0).integers(1, 10_000, 4096)
    for policy, params in POLICY_CASES:
        p = make_plan(L, num_kv_heads=8, device=H200, policy=policy, params=params)
        assert p.batch_size == 4096
        check_invariants(p)


def test_work_item_limit():
    with pytest.raises(ValueError, match="work items, above the limit"):
        make_plan([1_000_000] * 65536, num_kv_heads=1, device=H200, policy="fixed", params={"num_splits": 65536})
