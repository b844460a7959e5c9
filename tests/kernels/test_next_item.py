"""The look-ahead over a CTA's work items (``KernelConfig.next_item``, docs/decisions/look-ahead.md): the kernel against the
fp32 reference on the CPU interpreter, bit-equal to the same plan without it, its checks, its residency and the
tuner's space.

With ``next_item`` a CTA loads item i + 1's q and first page ids and items i + 1 .. i + 3's work entries while item
i streams: every CTA below walks several items (packed, split, persistent, two heads per tile, empty items), so
an entry carried to the wrong item would give another request's attention.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kvsplit.kernels import decode as dec
from kvsplit.kernels.device import resolve_device
from kvsplit.kernels.plan import TUNED_PARAM_SPACE, make_plan
from kvsplit.kernels.residency import COMPILED_NEXT, NEXT_ITEM_EXTRA_REGS, _table, occupancy, resident_ctas_per_sm
from kvsplit.tuner.simfit import candidate_policy

from .paged_case import check_decode, make_case

H200 = resolve_device("NVIDIA H200")
LENS = [0, 1, 15, 16, 17, 300, 45, 1000, 33, 2, 64, 65, 129, 7, 0, 500]


@pytest.mark.parametrize("hq, hkv, heads", [(8, 4, 1), (16, 4, 2)])
@pytest.mark.parametrize(
    "policy, params",
    [
        ("fixed", {"block_n": 16, "num_splits": 1, "pack_tokens": 4096}),  # one CTA of all 16 items
        ("fixed", {"block_n": 16, "num_splits": 3, "pack_tokens": 600}),  # split and packed
        ("stream_k", {"block_n": 16, "ctas_per_sm": 0.25}),  # CTAs cut across items
        ("stream_k", {"block_n": 32, "ctas_per_sm": 0.25, "schedule": "persistent", "num_programs": 2}),
    ],
)
def test_next_item_matches_reference_and_the_plain_loop(hq, hkv, heads, policy, params):
    case = make_case(
        LENS, num_qo_heads=hq, num_kv_heads=hkv, head_dim=64, page_size=16, dtype=torch.float16, seed=hq + heads
    )
    outs = []
    for nx in (True, False):
        plan = make_plan(
            LENS,
            num_kv_heads=hkv,
            device="NVIDIA H200",
            policy=policy,
            params={**params, "num_stages": 3, "prefetch": True, "next_item": nx, "heads_per_tile": heads},
            head_dim=64,
            dtype="float16",
        )
        assert plan.config.next_item is nx
        assert int((plan.cta_indptr[1:] - plan.cta_indptr[:-1]).max()) >= 3
        outs.append(check_decode(case, plan, torch.float16))
    assert torch.equal(outs[0], outs[1])


def test_next_item_fp32_page_size_7_and_one_item_ctas():
    lens = [2500, 3, 0, 700, 64, 65, 1, 129]
    case = make_case(lens, num_qo_heads=8, num_kv_heads=4, head_dim=64, page_size=7, dtype=torch.float32, seed=5)
    for params in (
        {"num_splits": 3, "block_n": 32},
        {"num_splits": 1, "block_n": 16, "pack_tokens": 4096},
        {"num_splits": 1, "block_n": 16},
    ):  # the last: one item per CTA (nothing to look ahead to)
        plan = make_plan(
            lens,
            num_kv_heads=4,
            device="NVIDIA H200",
            policy="fixed",
            params={**params, "num_stages": 4, "prefetch": True, "next_item": True},
            head_dim=64,
            page_size=7,
            dtype="float32",
        )
        check_decode(case, plan, torch.float32)


def test_next_item_is_checked():
    with pytest.raises(ValueError, match="params.next_item: needs prefetch"):
        make_plan(
            [100, 200],
            num_kv_heads=4,
            device="NVIDIA H200",
            policy="stream_k",
            params={"num_stages": 3, "next_item": True},
        )
    with pytest.raises(ValueError, match="params.next_item: expected true or false"):
        make_plan(
            [100, 200],
            num_kv_heads=4,
            device="NVIDIA H200",
            policy="stream_k",
            params={"num_stages": 3, "prefetch": True, "next_item": 1},
        )
    # a config with the look-ahead but not the prefetching loop (a hand-built one: make_plan refuses it) is refused
    # by the launcher, naming the config's knob
    lens = [40, 300]
    case = make_case(lens, num_qo_heads=8, num_kv_heads=4, head_dim=64, page_size=16, dtype=torch.float16)
    plan = make_plan(
        lens,
        num_kv_heads=4,
        device="NVIDIA H200",
        policy="fixed",
        params={"num_splits": 2},
        head_dim=64,
        dtype="float16",
    )
    ws = dec.make_workspace(8, 64, max_partials=plan.num_partials, max_batch=2, device="cpu")
    with pytest.raises(ValueError, match="config.next_item: needs the prefetching loop"):
        dec.launch_decode(
            case["q"],
            case["k_cache"],
            case["v_cache"],
            case["kv_indptr"],
            case["kv_indices"],
            plan.to("cpu"),
            dataclasses.replace(plan.config, next_item=True),
            out=torch.empty_like(case["q"]),
            workspace=ws,
            **plan.launch_sizes(),
        )


def test_next_item_residency():
    # compiled: (32, 4, 3) with two heads per tile keeps 3 CTAs per SM without the look-ahead, 2 with it
    assert resident_ctas_per_sm(H200, 128, "bfloat16", 2, 32, 4, 3, prefetch=True, heads_per_tile=2) == 3
    assert (
        resident_ctas_per_sm(H200, 128, "bfloat16", 2, 32, 4, 3, prefetch=True, heads_per_tile=2, next_item=True) == 2
    )
    # the one-CTA tile of the stream-K plans it is for keeps its residency
    for heads in (1, 2):
        assert (
            resident_ctas_per_sm(
                H200, 128, "bfloat16", 2, 64, 8, 3, prefetch=True, heads_per_tile=heads, next_item=True
            )
            >= 1
        )
    # every compiled config: its own figures; never more resident CTAs than the compiled config without the
    # look-ahead (where that one was compiled too: the others are estimates)
    compared = 0
    for (_gpu, d, dt, bn, w, s, h), (regs, smem) in COMPILED_NEXT.items():
        with_nx = resident_ctas_per_sm(H200, d, dt, 2, bn, w, s, prefetch=True, heads_per_tile=h, next_item=True)
        assert with_nx == occupancy(H200, w, regs, smem)
        base = _table(H200, d, dt, bn, w, s, True, h)
        if base is not None:
            assert regs >= base[0] and with_nx <= occupancy(H200, w, *base)
            compared += 1
    assert compared >= 20
    # a config not compiled: the prefetching config's registers plus NEXT_ITEM_EXTRA_REGS
    d, bn, w, s = 64, 64, 4, 3
    assert ("NVIDIA H200", d, "bfloat16", bn, w, s, 1) not in COMPILED_NEXT
    got = resident_ctas_per_sm(H200, d, "bfloat16", 2, bn, w, s, prefetch=True, next_item=True)
    smem = (s - 1) * 2 * bn * d * 2
    assert got == occupancy(H200, w, 128 + NEXT_ITEM_EXTRA_REGS, smem)


def test_planner_counts_the_look_ahead_residency():
    # stream_k sizes its grid to the resident slots: fewer with the look-ahead on (32, 4, 3) x 2 heads
    lens = [4096] * 64
    kw = dict(num_kv_heads=4, device="NVIDIA H200", policy="balanced", dtype="bfloat16")
    base = {"ctas_per_sm": 3, "block_n": 32, "num_warps": 4, "num_stages": 3, "prefetch": True, "heads_per_tile": 2}
    p0 = make_plan(lens, params=base, **kw)
    p1 = make_plan(lens, params={**base, "next_item": True}, **kw)
    assert p1.config.next_item and not p0.config.next_item
    assert p1.num_work_tiles <= p0.num_work_tiles


def test_tuned_space_suggests_next_item_only_with_prefetch():
    spec = TUNED_PARAM_SPACE["next_item"]
    assert spec["search"] and spec["condition"] == {"prefetch": True} and spec["default"] is False
    optuna = pytest.importorskip("optuna")
    from kvsplit.tuner.space import suggest_params

    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    seen = set()
    for _ in range(60):
        trial = study.ask()
        p = suggest_params(trial)
        assert ("next_item" in p) == bool(p.get("prefetch"))
        seen.add(p.get("next_item"))
        study.tell(trial, 1.0)
    assert {True, False} <= seen


def test_candidate_names_carry_the_knob():
    assert candidate_policy("stream_k|c1|n64w8s3|pf|h2|nx") == (
        "stream_k",
        {
            "ctas_per_sm": 1.0,
            "block_n": 64,
            "num_warps": 8,
            "num_stages": 3,
            "prefetch": True,
            "heads_per_tile": 2,
            "next_item": True,
        },
    )
    assert "next_item" not in candidate_policy("stream_k|c1|n64w8s3|pf|h2")[1]


def test_next_item_refuses_more_than_two_heads_per_tile():
    with pytest.raises(ValueError, match="params.next_item: not with heads_per_tile=4"):
        make_plan(
            [100, 200],
            num_kv_heads=4,
            device="NVIDIA H200",
            policy="stream_k",
            params={"num_stages": 3, "prefetch": True, "next_item": True, "heads_per_tile": 4},
        )
