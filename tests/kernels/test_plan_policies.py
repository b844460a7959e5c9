"""Policies of kvsplit.kernels.plan: invariants (hypothesis), hand-computed plans, errors."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvsplit.kernels.device import DeviceSpec
from kvsplit.kernels.plan import (
    POLICIES,
    TUNED_PARAM_SPACE,
    KernelConfig,
    Plan,
    check_plan_invariants,
    default_config,
    fa3_static_num_splits,
    flashinfer_decode_occupancy,
    make_plan,
    policy_params,
)
from kvsplit.tuner.workloads import family_kv_lens

H200 = DeviceSpec.known("NVIDIA H200")
# the first default tile (4 resident CTAs/SM on the H200): the hand-computed wave cases below pin it, so
# they do not move when the documented default config changes
R1_TILE = {"block_n": 64, "num_warps": 4, "num_stages": 2}

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
    (
        "tuned",
        {
            "ctas_per_sm": 0.5,
            "min_chunk_tokens": 512,
            "max_splits": 4,
            "block_n": 32,
            "num_warps": 2,
            "num_stages": 3,
            "order": "heavy_first",
            "schedule": "persistent",
            "programs_per_sm": 2,
            "pack_tokens": 1024,
        },
    ),
    ("stream_k", {}),
    ("stream_k", {"ctas_per_sm": 4, "item_cost_blocks": 0}),
    (
        "stream_k",
        {"ctas_per_sm": 1, "item_cost_blocks": 5, "min_piece_blocks": 8, "order": "heavy_first", "block_n": 16},
    ),
    ("stream_k", {"ctas_per_sm": 0.25, "min_piece_blocks": 2, "schedule": "persistent", "num_programs": 7}),
    ("tuned", {"partition": "stream_k"}),
    (
        "tuned",
        {
            "partition": "stream_k",
            "ctas_per_sm": 3,
            "item_cost_blocks": 2,
            "min_piece_blocks": 3,
            "order": "heavy_first",
            "block_n": 128,
        },
    ),
    ("tuned", {"wave_aware": False, "ctas_per_sm": 2}),
    ("stream_k", {"ctas_per_sm": 4, "item_cost_blocks": 3, "min_piece_blocks": 4, "order": "heavy_first"}),
    ("tuned", {"partition": "stream_k", "min_piece_blocks": 2}),
]


def check_invariants(plan: Plan) -> None:
    """docs/concepts/design.md §3 invariants, checked independently of Plan's own checker."""
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
    check_plan_invariants(plan)  # the Plan's own check agrees


kv_lens_st = st.lists(
    st.one_of(st.integers(0, 64), st.integers(0, 5000), st.integers(0, 300_000)), min_size=1, max_size=40
)
device_st = st.sampled_from(
    [
        H200,
        dataclasses.replace(H200, num_sms=1),
        dataclasses.replace(H200, num_sms=3),
        dataclasses.replace(H200, num_sms=8),
        DeviceSpec.known("NVIDIA A100-SXM4-80GB"),
    ]
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


def test_hq_only_sizes_the_rows_of_q_len_tiles():
    # H_q enters a plan only through a q_len > 1 tile's query rows (G * q_len): at q_len 1 it changes nothing
    L = [100, 5000, 70_000, 3]
    p = make_plan(L, num_kv_heads=4, device=H200)
    for hq in (4, 32, 64):
        assert make_plan(L, num_kv_heads=4, device=H200, num_qo_heads=hq) == p
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
    # balanced, default tile (128, 4 warps, 2 stages): 3 resident CTAs/SM (measured) -> 396 slots, so the target
    # floor(4 * 132) = 528 is cut to one wave of 396; fair = cdiv(4*262144, 396) = 2648 -> chunk 2688 (block_n 128)
    # -> ceil(262144 / 2688) = 98 splits, 392 tiles <= 396
    p = make_plan([262144], num_kv_heads=4, device=H200, policy="balanced")
    assert p.num_splits.tolist() == [98]
    # with the first default tile (64, 4, 2: 4 CTAs/SM, 528 slots): fair = cdiv(1048576, 528) = 1986 -> chunk 2048 -> 128
    p = make_plan(
        [262144],
        num_kv_heads=4,
        device=H200,
        policy="balanced",
        params={"block_n": 64, "num_warps": 4, "num_stages": 2},
    )
    assert p.num_splits.tolist() == [128]
    # tuned with defaults == balanced
    for L in ([262144], family_kv_lens("skewed60", 37, 100_000).tolist(), [0, 1, 2, 3000]):
        a = make_plan(L, num_kv_heads=4, device=H200, policy="balanced")
        b = make_plan(L, num_kv_heads=4, device=H200, policy="tuned")
        assert a.num_splits.tolist() == b.num_splits.tolist()
        assert a.work_kv_start.tolist() == b.work_kv_start.tolist()
    # tuned: chunk = roundup(max(4096, fair), 128); fair = cdiv(4*10000, 2*132) = 152 -> 4096 -> cdiv(10000,4096)=3
    p = make_plan(
        [10000, 100], num_kv_heads=4, device=H200, policy="tuned", params={"ctas_per_sm": 2, "min_chunk_tokens": 4096}
    )
    assert p.num_splits.tolist() == [3, 1]
    p = make_plan(
        [10000, 100], num_kv_heads=4, device=H200, policy="tuned", params={"min_chunk_tokens": 16, "max_splits": 2}
    )
    assert p.num_splits.tolist() == [2, 1]
    p = make_plan(
        [100], num_kv_heads=4, device=H200, policy="tuned", params={"schedule": "persistent", "programs_per_sm": 3}
    )
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
    # the stream_k partition's parameters: both bounds accepted, one step outside refused, naming the parameter
    # (the `stream_k` policy itself allows wider ranges; `tuned` keeps to its documented space)
    for name in ("item_cost_blocks", "min_piece_blocks"):
        lo, hi = TUNED_PARAM_SPACE[name]["low"], TUNED_PARAM_SPACE[name]["high"]
        for v in (lo, hi):
            make_plan(
                [5000, 10], num_kv_heads=4, device=H200, policy="tuned", params={"partition": "stream_k", name: v}
            )
        for v in (lo - 1, hi + 1):
            with pytest.raises(ValueError, match=rf"params\.{name}: expected an integer in \[{lo}, {hi}\], got {v}"):
                make_plan(
                    [5000, 10], num_kv_heads=4, device=H200, policy="tuned", params={"partition": "stream_k", name: v}
                )
        make_plan([5000, 10], num_kv_heads=4, device=H200, policy="stream_k", params={name: hi + 1})


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
        (
            dict(policy="flashinfer", params={"tensor_cores": False, "resident_ctas_per_sm": 0}),
            "params.resident_ctas_per_sm",
        ),
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


# ---------------------------------------------------------------------------
# stream_k and the wave-aware rules
# ---------------------------------------------------------------------------

TINY = DeviceSpec(
    name="Tiny GPU",
    num_sms=2,
    hbm_bandwidth_gbps=100.0,
    l2_bytes=1 << 20,
    smem_per_sm_bytes=228 * 1024,
    smem_per_block_bytes=227 * 1024,
)


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def stream_k_reference(L, hkv, num_sms, block_n, cps, o, mp, heavy_first):
    """Plain-loop re-statement of stream_k_work's docstring (independent of its prefix-sum code).

    Walk the requests in launch order along the cost axis (each costs o, then its
    n_b blocks); a share boundary k * share strictly inside a request's blocks is a
    cut, kept unless closer than mp blocks to either end of the request; a piece
    belongs to the CTA of its first block, except that a first piece whose
    near-start cut was dropped belongs to the CTA after that (last such) boundary.
    """
    L = [int(x) for x in L]
    B = len(L)
    order = sorted(range(B), key=lambda b: -L[b]) if heavy_first else list(range(B))
    C = max(1, int(math.floor(cps * num_sms)) // hkv)
    nb = [_ceil(x, block_n) for x in L]
    share = max(1, _ceil(sum(n + o for n in nb), C))
    items = []  # (request, start, end, cta)
    pos = 0
    for b in order:
        pos += o
        lo, hi = pos, pos + nb[b]
        pos = hi
        if nb[b] == 0:
            items.append((b, 0, 0, min(lo // share, C - 1)))
            continue
        k = lo // share + 1
        boundaries = []  # block offsets x, 0 < x < n_b, with lo + x a multiple of share
        while k * share < hi:
            boundaries.append(k * share - lo)
            k += 1
        kept = [x for x in boundaries if x >= mp and nb[b] - x >= mp]
        dropped_near_start = [x for x in boundaries if x < mp]
        edges = [0] + kept + [nb[b]]
        for j in range(len(edges) - 1):
            s, e = edges[j], edges[j + 1]
            first_block = lo + s
            if j == 0 and dropped_near_start:
                first_block = lo + max(dropped_near_start)
            items.append((b, min(s * block_n, L[b]), min(e * block_n, L[b]), first_block // share))
    cta_indptr = [0]
    for i in range(1, len(items)):
        if items[i][3] != items[i - 1][3]:
            cta_indptr.append(i)
    cta_indptr.append(len(items))
    num_splits = [sum(1 for it in items if it[0] == b) for b in range(B)]
    return dict(
        work_request=[it[0] for it in items],
        work_kv_start=[it[1] for it in items],
        work_kv_end=[it[2] for it in items],
        cta_indptr=cta_indptr,
        num_splits=num_splits,
        C=C,
        share=share,
        ctas=[it[3] for it in items],
    )


def _plan_arrays(p: Plan) -> dict:
    return dict(
        work_request=p.work_request.tolist(),
        work_kv_start=p.work_kv_start.tolist(),
        work_kv_end=p.work_kv_end.tolist(),
        cta_indptr=p.cta_indptr.tolist(),
        num_splits=p.num_splits.tolist(),
    )


def _tiny_sk(L, **params):
    return make_plan(
        L,
        num_kv_heads=1,
        device=TINY,
        policy="stream_k",
        params=dict(block_n=16, **params),
        head_dim=64,
        dtype="float16",
    )


def test_stream_k_hand_computed_three_ctas():
    # kv_lens [100, 30, 0, 50], block_n 16: n_b = [7, 2, 0, 4]; o = 1 -> cost [8, 3, 1, 5], total 17
    # C = floor(1.5 * 2) // 1 = 3, share = ceil(17 / 3) = 6; prefix P = [0, 8, 11, 12]
    # blocks: r0 [1, 8), r1 [9, 11), r2 [12, 12), r3 [13, 17)
    # multiples of 6 strictly inside: r0: 6 -> cut 6 - 1 = 5 blocks = 80 tokens; r1, r2, r3: none (12 is r2's
    # empty point, 18 > 17)
    # CTAs (first block // 6): r0a 1//6 = 0, r0b 6//6 = 1, r1 9//6 = 1, r2 12//6 = 2, r3 13//6 = 2
    # CTA costs: 5+1 = 6; (2+1) + (2+1) = 6; (0+1) + (4+1) = 6
    p = _tiny_sk([100, 30, 0, 50], ctas_per_sm=1.5)
    assert _plan_arrays(p) == dict(
        work_request=[0, 0, 1, 2, 3],
        work_kv_start=[0, 80, 0, 0, 0],
        work_kv_end=[80, 100, 30, 0, 50],
        cta_indptr=[0, 1, 3, 5],
        num_splits=[2, 1, 1, 1],
    )
    assert p.num_work_tiles == 3


def test_stream_k_hand_computed_item_cost_zero():
    # o = 0: cost [7, 2, 0, 4], total 13, C = 3, share = ceil(13 / 3) = 5; P = lo = [0, 7, 9, 9], hi = [7, 9, 9, 13]
    # r0 (0, 7): 5 -> cut 5 (80 tok); r1 (7, 9): none; r2 empty; r3 (9, 13): 10 -> cut 1 (16 tok)
    # CTAs: r0a 0, r0b 5//5 = 1, r1 7//5 = 1, r2 9//5 = 1, r3a 9//5 = 1, r3b 10//5 = 2 -> costs 5, 2+2+0+1 = 5, 3
    p = _tiny_sk([100, 30, 0, 50], ctas_per_sm=1.5, item_cost_blocks=0)
    assert _plan_arrays(p) == dict(
        work_request=[0, 0, 1, 2, 3, 3],
        work_kv_start=[0, 80, 0, 0, 0, 16],
        work_kv_end=[80, 100, 30, 0, 16, 50],
        cta_indptr=[0, 1, 5, 6],
        num_splits=[2, 1, 1, 2],
    )


def test_stream_k_hand_computed_four_ctas_and_min_piece_blocks():
    # C = floor(2 * 2) = 4, o = 1: cost [8, 3, 1, 5] = 17, share = ceil(17 / 4) = 5
    # lo = [1, 9, 12, 13], hi = [8, 11, 12, 17]
    # r0 (1, 8): 5 -> cut 4 (64 tok); r1 (9, 11): 10 -> cut 1 (16 tok); r3 (13, 17): 15 -> cut 2 (32 tok)
    # mp = 1: CTAs r0a 1//5 = 0, r0b 5//5 = 1, r1a 9//5 = 1, r1b 10//5 = 2, r2 12//5 = 2, r3a 13//5 = 2,
    # r3b 15//5 = 3; costs 5, (3+1)+(1+1) = 6, (1+1)+(0+1)+(2+1) = 6, 3: at most share + o = 6
    p = _tiny_sk([100, 30, 0, 50], ctas_per_sm=2)
    assert _plan_arrays(p) == dict(
        work_request=[0, 0, 1, 1, 2, 3, 3],
        work_kv_start=[0, 64, 0, 16, 0, 0, 32],
        work_kv_end=[64, 100, 16, 30, 0, 32, 50],
        cta_indptr=[0, 1, 3, 6, 7],
        num_splits=[2, 2, 1, 2],
    )
    # mp = 2: r1's cut 1 < 2 is dropped (r1 has 2 < 2 * 2 blocks: never split); its piece moves to the CTA after
    # that boundary: (9 + 1) // 5 = 2. r0's cut 4 (4 >= 2, 7 - 4 = 3 >= 2) and r3's cut 2 (2 >= 2, 4 - 2 >= 2) stay.
    # CTAs: r0a 0, r0b 1, r1 2, r2 2, r3a 2, r3b 3; costs 5, 4, (2+1)+(0+1)+(2+1) = 7 = share + o + 1, 3
    p = _tiny_sk([100, 30, 0, 50], ctas_per_sm=2, min_piece_blocks=2)
    assert _plan_arrays(p) == dict(
        work_request=[0, 0, 1, 2, 3, 3],
        work_kv_start=[0, 64, 0, 0, 0, 32],
        work_kv_end=[64, 100, 30, 0, 32, 50],
        cta_indptr=[0, 1, 2, 5, 6],
        num_splits=[2, 1, 1, 2],
    )
    # mp = 3 at C = 3 (share 6): r0's cut 5 leaves 7 - 5 = 2 < 3 blocks: dropped, r0 whole in CTA 0 (cost 8)
    p = _tiny_sk([100, 30, 0, 50], ctas_per_sm=1.5, min_piece_blocks=3)
    assert _plan_arrays(p) == dict(
        work_request=[0, 1, 2, 3],
        work_kv_start=[0, 0, 0, 0],
        work_kv_end=[100, 30, 0, 50],
        cta_indptr=[0, 1, 2, 4],
        num_splits=[1, 1, 1, 1],
    )


def test_stream_k_hand_computed_heavy_first():
    # launch order by kv_len descending (stable): [r0 100, r3 50, r1 30, r2 0]; cost [8, 5, 3, 1] = 17, C = 3,
    # share 6; lo = [1, 9, 14, 17], hi = [8, 13, 16, 17]
    # r0 (1, 8): 6 -> cut 5 (80 tok); r3 (9, 13): 12 -> cut 3 (48 tok); r1 (14, 16), r2: none
    # CTAs: r0a 0, r0b 1, r3a 9//6 = 1, r3b 12//6 = 2, r1 14//6 = 2, r2 17//6 = 2; costs 5, 7 = share + o, 6
    p = _tiny_sk([100, 30, 0, 50], ctas_per_sm=1.5, order="heavy_first")
    assert _plan_arrays(p) == dict(
        work_request=[0, 0, 3, 3, 1, 2],
        work_kv_start=[0, 80, 0, 48, 0, 0],
        work_kv_end=[80, 100, 48, 50, 30, 0],
        cta_indptr=[0, 1, 3, 6],
        num_splits=[2, 1, 1, 2],
    )
    # the tuned family's stream_k partition is the same rule
    q = make_plan(
        [100, 30, 0, 50],
        num_kv_heads=1,
        device=TINY,
        policy="tuned",
        params={"partition": "stream_k", "ctas_per_sm": 1.5, "order": "heavy_first", "block_n": 16},
        head_dim=64,
        dtype="float16",
    )
    assert _plan_arrays(q) == _plan_arrays(p)


def test_stream_k_many_heads_keep_one_cta_per_head():
    # H_kv = 4 on 2 SMs at ctas_per_sm 1: floor(2) // 4 = 0 -> C = 1, everything in one CTA per head (4 tiles)
    p = make_plan(
        [100, 30, 0, 50],
        num_kv_heads=4,
        device=TINY,
        policy="stream_k",
        params={"ctas_per_sm": 1, "block_n": 16},
        head_dim=64,
        dtype="float16",
    )
    assert p.num_splits.tolist() == [1, 1, 1, 1] and p.cta_indptr.tolist() == [0, 4] and p.num_work_tiles == 4


sk_case_st = st.fixed_dictionaries(
    {
        "kv": st.lists(
            st.one_of(st.integers(0, 40), st.integers(0, 3000), st.integers(0, 200_000)), min_size=1, max_size=30
        ),
        "hkv": st.sampled_from([1, 2, 3, 8, 32]),
        "sms": st.sampled_from([1, 2, 5, 132]),
        "block_n": st.sampled_from([16, 64, 256]),
        "cps": st.sampled_from([0.25, 0.5, 1, 1.5, 2, 3.7, 8]),
        "o": st.sampled_from([0, 1, 3, 17]),
        "mp": st.sampled_from([1, 1, 2, 3, 16]),
        "heavy": st.booleans(),
        "tuned": st.booleans(),
    }
)


def _sk_plan(c):
    params = {
        "ctas_per_sm": c["cps"],
        "item_cost_blocks": c["o"],
        "min_piece_blocks": c["mp"],
        "block_n": c["block_n"],
        "order": "heavy_first" if c["heavy"] else "natural",
    }
    if c["tuned"]:
        params["partition"] = "stream_k"
    dev = dataclasses.replace(H200, num_sms=c["sms"])
    return make_plan(
        c["kv"], num_kv_heads=c["hkv"], device=dev, policy="tuned" if c["tuned"] else "stream_k", params=params
    )


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(c=sk_case_st)
def test_stream_k_properties(c):
    plan = _sk_plan(c)
    L, bn, o, mp, hkv = plan.kv_lens, c["block_n"], c["o"], c["mp"], c["hkv"]
    check_invariants(plan)
    assert Plan.from_dict(plan.to_dict()) == plan  # the validating constructor accepts it
    # work tiles within floor(ctas_per_sm * SMs), rounded down to whole KV-head groups (at least one group)
    budget = int(math.floor(c["cps"] * c["sms"]))
    assert plan.num_work_tiles <= max(hkv, budget // hkv * hkv)
    s, e = plan.work_kv_start, plan.work_kv_end
    # every piece non-empty except a kv_len = 0 request's single [0, 0); every piece starts on a block boundary
    zero = L[plan.work_request] == 0
    assert (e[~zero] > s[~zero]).all() and (s[zero] == 0).all() and (e[zero] == 0).all()
    assert (s % bn == 0).all()
    # interior cuts also end on block boundaries (only a request's last piece ends at kv_len)
    last = np.append(plan.work_request[1:] != plan.work_request[:-1], True)
    assert (e[~last] % bn == 0).all()
    # requests of fewer than 2 * min_piece_blocks blocks are never split; no piece has < mp blocks unless whole
    nb = -(-L // bn)
    assert (plan.num_splits[nb < 2 * mp] == 1).all()
    blocks = -(-(e - s) // bn)
    split_item = plan.num_splits[plan.work_request] > 1
    first = np.append(True, plan.work_request[1:] != plan.work_request[:-1])
    # the end pieces of a split request keep >= mp blocks; interior pieces run between share boundaries
    # (a positive multiple of share blocks, which can be < mp when share < mp)
    assert (blocks[split_item & (first | last)] >= mp).all()
    interior = split_item & ~first & ~last
    C = max(1, budget // hkv)
    share = max(1, _ceil(int((nb + o).sum()), C))
    assert (blocks[interior] % share == 0).all() and (blocks[interior] >= share).all()
    # even shares: each CTA's cost within share + o (+ 2 (mp - 1) when cuts near request ends are dropped)
    ci = plan.cta_indptr
    cost = np.add.reduceat(blocks + o, ci[:-1])
    assert cost.sum() >= (nb + o).sum()
    if mp == 1:
        assert cost.max() <= share + o, (cost.tolist(), share)
    else:
        assert cost.max() <= share + o + 2 * (mp - 1), (cost.tolist(), share)
    # exact agreement with the plain-loop reference of the docstring's rule
    ref = stream_k_reference(c["kv"], hkv, c["sms"], bn, c["cps"], o, mp, c["heavy"])
    assert _plan_arrays(plan) == {k: ref[k] for k in _plan_arrays(plan)}


# --- balanced: wave-aware chunk --------------------------------------------

# Residency of the default head_dim-128 bf16 config (BLOCK_N 64, 4 warps, 2 stages) on the H200, from the
# measured (118 regs, 38912 B): regs per warp ceil(118 * 32 / 256) * 256 = 3840 -> 65536 // (3840 * 4) = 4;
# smem 38912 + 1024 -> 233472 // 39936 = 5; threads 2048 // 128 = 16 -> 4 CTAs per SM.
H200_DEFAULT_RESIDENCY = 4


def test_resident_slots_and_wave_target_hand_computed():
    from kvsplit.kernels.plan import default_config as dc
    from kvsplit.kernels.rulespec import PlanContext, resident_slots, wave_target

    ctx = PlanContext(H200, 4, 128, 16, "bfloat16")
    assert resident_slots(ctx, dc(128, "bfloat16")) == 396  # default tile (128, 4, 2): 3 CTAs/SM, measured
    cfg = KernelConfig(**R1_TILE)
    assert resident_slots(ctx, cfg) == 528
    assert wave_target(ctx, cfg, 4) == 528
    assert wave_target(ctx, cfg, 3) == 396  # below one wave: floor(3 * 132)
    assert wave_target(ctx, cfg, 6) == 528  # 792 slots wanted -> one whole wave (792 // 528 * 528)
    assert wave_target(ctx, cfg, 8.5) == 1056  # 1122 -> two whole waves
    assert wave_target(ctx, cfg, 0.25) == 33


def test_balanced_uniform_1m_fits_one_wave():
    # B = 8, T = 1,048,576 (131,072 each), H_kv = 4, H200: target 4 * 132 = 528 slots (residency 4)
    # chunk0 = roundup(ceil(4 * 1048576 / 528) = 7944, 64) = 8000 -> ceil(131072 / 8000) = 17 splits,
    # 4 * 8 * 17 = 544 tiles > 528 (a second wave of 16). H_kv * B = 32 <= 528 -> search: 8 * ceil(131072 / c)
    # <= 132 -> ceil <= 16 -> c >= 8192 = chunk_fit. 544 <= 2 * 528; est0 = (131072 / 17 + 64) * 2 = 15,548
    # tokens (16 overflow tiles behind first-wave tiles, each tile + one block of fixed cost) >= 8192 + 64 ->
    # chunk 8192: 16 splits each, 512 tiles.
    L = family_kv_lens("uniform", 8, 1_048_576)
    assert L.tolist() == [131072] * 8
    p = make_plan(L, num_kv_heads=4, device="NVIDIA H200", policy="balanced", params=R1_TILE)
    assert p.num_splits.tolist() == [16] * 8 and p.num_work_tiles == 512
    assert p.work_kv_start[:3].tolist() == [0, 8192, 16384]
    # the first campaign's rule (tuned, wave_aware=False) kept the 17-split plan
    q = make_plan(L, num_kv_heads=4, device="NVIDIA H200", policy="tuned", params={"wave_aware": False, **R1_TILE})
    assert q.num_splits.tolist() == [17] * 8 and q.num_work_tiles == 544


def test_balanced_skewed80_keeps_chunk0():
    # B = 128, T = 262,144: one request of 209,715 tokens, 127 of 412-413. H_kv = 4, target 528.
    # chunk0 = roundup(ceil(4 * 262144 / 528) = 1986, 64) = 2048: tiles0 = 4 * (ceil(209715 / 2048) = 103 + 127)
    # = 920 > 528; H_kv * B = 512 <= 528 -> chunk_fit: 127 + ceil(209715 / c) <= 132 -> c >= 41,943 -> 41,984.
    # 920 <= 1056; est0 (each tile + 64 of fixed cost): first wave = 412 long tiles (209715 / 103 + 64 =
    # 2100.1) + 116 short (477); 392 short overflow tiles follow the 116 short + 276 long slots that free first
    # -> 2100.1 + 477 = 2577.1 < chunk_fit's largest tile 209715 / 5 + 64 = 42,007 -> chunk0 stays: 103 splits
    # for the long request (not 5), 1 for the others.
    L = family_kv_lens("skewed80", 128, 262_144)
    assert int(L[0]) == 209_715 and set(L[1:].tolist()) == {412, 413}
    p = make_plan(L, num_kv_heads=4, device="NVIDIA H200", policy="balanced", params=R1_TILE)
    assert p.num_splits.tolist() == [103] + [1] * 127
    assert p.num_work_tiles == 920


def test_balanced_keeps_chunk0_when_growing_does_not_pay():
    # 4 KV heads x 132 requests of 1,000 tokens + one of 600,000 at ctas_per_sm 1 (target 132): H_kv * B = 532
    # > 132 -> chunk0 = roundup(ceil(4 * 732000 / 132) = 22182, 64) = 22208 without a search:
    # ceil(600000 / 22208) = 28 splits
    L = [600_000] + [1000] * 132
    p = make_plan(L, num_kv_heads=4, device="NVIDIA H200", policy="balanced", params={"ctas_per_sm": 1, **R1_TILE})
    assert p.num_splits.tolist() == [28] + [1] * 132
    # B = 2, target 132 (ctas_per_sm 1): chunk0 = roundup(ceil(4 * 400016 / 132) = 12122, 64) = 12160:
    # tiles0 = 4 * (ceil(400000 / 12160) = 33 + 1) = 136 > 132, <= 264; chunk_fit: ceil(400000 / c) <= 32 ->
    # c >= 12500 -> 12544; est0: the first 132 tiles are the long request's (400000 / 33 = 12121.2 tokens each),
    # the 4 overflow tiles (16 tokens) follow the first that free -> est0 = 12137.2 < 400000 / 32 = 12500 ->
    # chunk0 stays (no fixed cost per tile: the target, 132, is below one resident wave of 528)
    p = make_plan(
        [400_000, 16], num_kv_heads=4, device="NVIDIA H200", policy="balanced", params={"ctas_per_sm": 1, **R1_TILE}
    )
    assert p.num_splits.tolist() == [33, 1] and p.num_work_tiles == 136


def test_balanced_near_even_batch_keeps_one_tile_per_request():
    # B = 128 requests of 2,570 or 2,575 tokens (T = 329,280), H_kv = 4, BLOCK_N 64: target 528 slots.
    # chunk0 = roundup(ceil(4 * 329280 / 528) = 2495, 64) = 2496 -> 2 splits each, tiles0 = 1024 > 528, <= 1056.
    # H_kv * B = 512 <= 528 -> chunk_fit = smallest c with ceil(L / c) = 1 for all: roundup(2575, 64) = 2624.
    # Makespans in tokens, each tile + 64 of fixed cost: est0 = 2 * (2575 / 2 + 64) = 2703 (every slot runs two
    # halves); one tile per request: 2575 + 64 = 2639 <= 2703 -> 1 split each, 512 tiles, no merge. Without the
    # fixed cost the halves won (2575 > 2572.5) and the plan ran 1.248x the floor on the H200 where one tile per
    # request ran ~1.18x (measured 2026-12-01).
    L = np.array([2570, 2575] * 64)
    p = make_plan(L, num_kv_heads=4, device="NVIDIA H200", policy="balanced", params=R1_TILE)
    assert p.num_splits.tolist() == [1] * 128 and p.num_work_tiles == 512
    # a long request's halves still win where one tile per request would make it the makespan
    L2 = np.array([20_000] + [2570] * 127)
    q = make_plan(L2, num_kv_heads=4, device="NVIDIA H200", policy="balanced", params=R1_TILE)
    assert int(q.num_splits[0]) > 1


balanced_case_st = st.fixed_dictionaries(
    {
        "kv": st.lists(st.one_of(st.integers(0, 3000), st.integers(0, 300_000)), min_size=1, max_size=24),
        "hkv": st.sampled_from([1, 2, 4, 8]),
        "sms": st.sampled_from([1, 3, 16, 132]),
        "cps": st.sampled_from([0.5, 1, 2, 4, 6, 9]),
    }
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(c=balanced_case_st)
def test_balanced_wave_aware_properties(c):
    dev = dataclasses.replace(H200, num_sms=c["sms"])  # same name: measured residency 4 per SM applies
    L = np.asarray(c["kv"], dtype=np.int64)
    hkv, S, bn = c["hkv"], c["sms"], 64
    p = make_plan(L, num_kv_heads=hkv, device=dev, policy="balanced", params={"ctas_per_sm": c["cps"], **R1_TILE})
    check_invariants(p)
    slots = H200_DEFAULT_RESIDENCY * S
    target = max(1, int(math.floor(c["cps"] * S)))
    if target > slots:
        target = target // slots * slots
    chunk0 = _ceil(max(_ceil(int(L.sum()) * hkv, target), bn), bn) * bn
    splits0 = np.maximum(-(-L // chunk0), 1)
    tiles = hkv * int(p.num_splits.sum())
    assert p.num_work_tiles == tiles
    tiles0 = hkv * int(splits0.sum())
    # the wave-aware rule: either the tiles fit the target, or the chunk is the un-grown chunk0
    assert tiles <= target or p.num_splits.tolist() == splits0.tolist()
    if tiles0 <= target:
        assert p.num_splits.tolist() == splits0.tolist()  # nothing to fix
    if hkv * L.shape[0] > target or tiles0 > 2 * target:
        assert p.num_splits.tolist() == splits0.tolist()  # growing would leave too few tiles / too far off
    if p.num_splits.tolist() != splits0.tolist():
        # grown to the smallest multiple of block_n that fits: the chunk is at least max_b ceil(L_b / n_b)
        # (rounded up to block_n), and one block less no longer fits
        long = L > 0
        chunk = _ceil(max(int(_ceil_arr(L[long], p.num_splits[long].astype(np.int64)).max()), bn), bn) * bn
        assert chunk >= chunk0
        assert hkv * int(np.maximum(-(-L // chunk), 1).sum()) <= target
        if chunk - bn >= chunk0:
            assert hkv * int(np.maximum(-(-L // (chunk - bn)), 1).sum()) > target


def _ceil_arr(a, b):
    return -(-a // b)


def test_tuned_defaults_equal_balanced_where_residency_is_below_4():
    # L40S, head_dim 128 bf16, default config BLOCK_N 64 / 4 warps / 2 stages, not measured -> estimate:
    # smem 1 * 2 * 64 * 128 * 2 = 32768 -> 32768 + 1024 = 33792 per CTA, 102400 // 33792 = 3;
    # regs 128 -> 65536 // (4096 * 4) = 4; threads 1536 // 128 = 12 -> 3 CTAs/SM, 3 * 142 = 426 slots.
    # ctas_per_sm 4 wants 568 > 426 tiles -> one whole wave: target 426.
    # kv [262144], H_kv 4: chunk0 = roundup(ceil(1048576 / 426) = 2462, 64) = 2496 -> ceil(262144 / 2496) = 106
    # splits, 424 tiles <= 426. (Aiming at 568 tiles gave chunk 1856 -> 142 splits = 568 tiles: 1.33 waves.)
    for policy in ("balanced", "tuned"):
        p = make_plan([262144], num_kv_heads=4, device="NVIDIA L40S", policy=policy, params=R1_TILE)
        assert p.num_splits.tolist() == [106] and p.num_work_tiles == 424, policy
    rng = np.random.default_rng(7)
    for dev in ("NVIDIA L40S", "NVIDIA L4", "NVIDIA H200", "NVIDIA A100-SXM4-80GB"):
        for head_dim, dtype in ((128, "bfloat16"), (256, "bfloat16"), (256, "float32"), (64, "float16")):
            for _ in range(5):
                L = rng.integers(0, 300_000, size=int(rng.integers(1, 40)))
                a = make_plan(L, num_kv_heads=4, device=dev, policy="balanced", head_dim=head_dim, dtype=dtype)
                b = make_plan(L, num_kv_heads=4, device=dev, policy="tuned", head_dim=head_dim, dtype=dtype)
                assert a.num_splits.tolist() == b.num_splits.tolist(), (dev, head_dim, dtype)


def test_launch_sizes():
    """Plan.launch_sizes: the stage-1 tile count, the requests with more than one split and the most splits of
    any request, counted here from the plan's work list; a caller's change to the dict does not reach the plan."""
    lens = [700, 0, 5, 333, 64]
    plan = make_plan(
        lens,
        num_kv_heads=4,
        device="NVIDIA H200",
        policy="fixed",
        params={"num_splits": 3, "block_n": 16, "heads_per_tile": 2},
        head_dim=128,
        page_size=16,
        dtype="float16",
    )
    per_req = np.bincount(plan.work_request, minlength=len(lens))
    sizes = plan.launch_sizes()
    assert sizes == {
        "num_tiles": (len(plan.cta_indptr) - 1) * 2,
        "num_merge": int((per_req > 1).sum()),
        "max_splits": int(per_req.max()),
    }
    assert sizes["num_merge"] == 4 and sizes["max_splits"] == 3
    sizes["num_merge"] = 0
    assert plan.launch_sizes()["num_merge"] == 4


def test_work_key_is_the_launch_not_the_policy():
    """Plans of one batch with the same config and work list share a work key whatever policy made them (fixed with
    one split is no_split's launch); another split count or another kernel config is another key."""
    lens = [4096, 17, 9000]
    shape = dict(num_kv_heads=4, device=H200, head_dim=128, dtype="bfloat16")
    one = make_plan(lens, policy="fixed", params={"num_splits": 1, **R1_TILE}, **shape)
    none = make_plan(lens, policy="no_split", params=dict(R1_TILE), **shape)
    assert one.policy != none.policy and one.to_dict() != none.to_dict()
    assert one.work_key() == none.work_key() and hash(one.work_key()) == hash(none.work_key())
    three = make_plan(lens, policy="fixed", params={"num_splits": 3, **R1_TILE}, **shape)
    assert list(three.num_splits) == [3, 3, 3] and three.work_key() != one.work_key()
    wide = make_plan(lens, policy="fixed", params={"num_splits": 1, **R1_TILE, "block_n": 128}, **shape)
    assert np.array_equal(wide.work_request, one.work_request) and wide.work_key() != one.work_key()
