"""Decode kernel vs the fp32 torch reference on the CPU (TRITON_INTERPRET=1), fp32 and fp16.

Unused cache slots hold NaN and pages are shuffled (tests/kernels/paged_case.py), so any
load outside a request's kv_len shows up as NaN in the output.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from kvsplit.kernels.decode import decode_attention, make_workspace, reference_decode_attention
from kvsplit.kernels.device import DeviceSpec
from kvsplit.kernels.plan import make_plan

from .paged_case import TOL, make_case
from .paged_case import check_decode as _check

H_Q, H_KV, D = 4, 2, 64
NAMES = {torch.float32: "float32", torch.float16: "float16"}


def _plan(lens, dtype, page_size, policy="fixed", device="NVIDIA H200", **params):
    return make_plan(
        lens,
        num_kv_heads=H_KV,
        device=device,
        policy=policy,
        params=params,
        head_dim=D,
        page_size=page_size,
        dtype=NAMES[dtype],
    )


def _lens(block_n, page_size, rng, B):
    pool = [0, 1, block_n - 1, block_n, block_n + 1, max(page_size - 1, 1), page_size + 1, 2500]
    return [int(x) for x in rng.choice(pool, size=B)]


@pytest.mark.parametrize("block_n", [16, 32, 64, 128, 256])
@pytest.mark.parametrize("schedule", ["grid", "persistent"])
def test_every_block_n_and_schedule_fp32(block_n, schedule):
    rng = np.random.default_rng(block_n + len(schedule))
    page_size = 16
    lens = _lens(block_n, page_size, rng, 11)
    case = make_case(
        lens, num_qo_heads=H_Q, num_kv_heads=H_KV, head_dim=D, page_size=page_size, dtype=torch.float32, seed=block_n
    )
    extra = {"schedule": "persistent", "num_programs": 5} if schedule == "persistent" else {}
    _check(case, _plan(lens, torch.float32, page_size, num_splits=3, block_n=block_n, **extra), torch.float32)


@pytest.mark.parametrize("B", [1, 2, 3, 11])
@pytest.mark.parametrize("page_size", [1, 7, 16])
def test_batch_sizes_and_page_sizes_fp16(B, page_size):
    rng = np.random.default_rng(100 * B + page_size)
    lens = _lens(32, page_size, rng, B)
    if B == 1:
        lens = [777]
    case = make_case(
        lens,
        num_qo_heads=H_Q,
        num_kv_heads=H_KV,
        head_dim=D,
        page_size=page_size,
        dtype=torch.float16,
        seed=B + page_size,
    )
    _check(case, _plan(lens, torch.float16, page_size, num_splits=2, block_n=32), torch.float16)


def test_more_splits_than_kv_tiles():
    lens = [5, 40, 1]
    case = make_case(lens, num_qo_heads=H_Q, num_kv_heads=H_KV, head_dim=D, page_size=16, dtype=torch.float32, seed=1)
    plan = _plan(lens, torch.float32, 16, num_splits=30, block_n=64)
    # token-granular chunks, clamped to kv_len: 5 -> 5 items of 1 token, 40 -> 30 items
    assert plan.num_splits.tolist() == [5, 30, 1]
    _check(case, plan, torch.float32)


def test_unequal_lengths_with_splits_each_row_matches():
    lens = [3000, 17, 64, 0, 129, 1]
    small_gpu = dataclasses.replace(DeviceSpec.known("NVIDIA H200"), num_sms=2)
    plan = make_plan(
        lens,
        num_kv_heads=H_KV,
        device=small_gpu,
        policy="balanced",
        params={"block_n": 32},
        head_dim=D,
        page_size=16,
        dtype="float16",
    )
    # hand-computed: H_kv * sum = 2 * 3211 over 4 CTAs/SM x 2 SMs -> 803 tokens, rounded up to
    # BLOCK_N 32 -> chunk 832; ceil(3000 / 832) = 4, every other request fits one chunk
    assert plan.num_splits.tolist() == [4, 1, 1, 1, 1, 1]
    case = make_case(lens, num_qo_heads=H_Q, num_kv_heads=H_KV, head_dim=D, page_size=16, dtype=torch.float16, seed=2)
    o = _check(case, plan, torch.float16)
    ref = reference_decode_attention(**case)
    for b in range(len(lens)):
        assert (o[b].float() - ref[b].float()).abs().max().item() < TOL[torch.float16], f"row {b}"


@pytest.mark.parametrize("pack_tokens", [64, 4096])
def test_packed_ctas_heavy_first_persistent(pack_tokens):
    lens = [2000, 3, 30, 70, 0, 64, 5, 500]
    plan = _plan(
        lens,
        torch.float32,
        16,
        num_splits=2,
        block_n=32,
        pack_tokens=pack_tokens,
        order="heavy_first",
        schedule="persistent",
        num_programs=3,
    )
    assert plan.num_ctas < plan.num_work_items  # something was packed
    case = make_case(lens, num_qo_heads=H_Q, num_kv_heads=H_KV, head_dim=D, page_size=16, dtype=torch.float32, seed=3)
    _check(case, plan, torch.float32)


@pytest.mark.parametrize("group", [1, 4, 16])
def test_gqa_groups(group):
    lens = [33, 200, 0]
    case = make_case(
        lens, num_qo_heads=H_KV * group, num_kv_heads=H_KV, head_dim=D, page_size=8, dtype=torch.float32, seed=group
    )
    _check(case, _plan(lens, torch.float32, 8, num_splits=2, block_n=32), torch.float32)


def test_all_empty_batch_gives_zero_and_neg_inf():
    lens = [0, 0, 0]
    case = make_case(lens, num_qo_heads=H_Q, num_kv_heads=H_KV, head_dim=D, page_size=16, dtype=torch.float32, seed=4)
    o, lse = decode_attention(**case, plan=_plan(lens, torch.float32, 16, num_splits=4), return_lse=True)
    assert torch.equal(o, torch.zeros_like(o))
    assert torch.all(lse == float("-inf"))


def test_single_token_is_hand_computable():
    """kv_len = 1: softmax over one score is 1, so o = v and lse = q.k * scale."""
    lens = [1]
    case = make_case(
        lens, num_qo_heads=2, num_kv_heads=1, head_dim=D, page_size=4, dtype=torch.float32, seed=5, poison=True
    )
    plan = make_plan(
        lens, num_kv_heads=1, device="NVIDIA H200", policy="no_split", head_dim=D, page_size=4, dtype="float32"
    )
    o, lse = decode_attention(**case, plan=plan, return_lse=True)
    page = int(case["kv_indices"][0])
    k = case["k_cache"][page, 0, 0]
    v = case["v_cache"][page, 0, 0]
    for h in range(2):
        assert torch.allclose(o[0, h], v, atol=1e-6)
        assert math.isclose(float(lse[0, h]), float(case["q"][0, h] @ k) / math.sqrt(D), abs_tol=1e-4)


@pytest.mark.parametrize("schedule", ["grid", "persistent"])
def test_out_and_workspace_reused_and_custom_scale(schedule):
    lens = [300, 7, 1000]
    case = make_case(lens, num_qo_heads=H_Q, num_kv_heads=H_KV, head_dim=D, page_size=16, dtype=torch.float32, seed=6)
    extra = {"schedule": "persistent", "num_programs": 2} if schedule == "persistent" else {}
    # a persistent call must reset the work counter it leaves at the end of the previous call
    plan = _plan(lens, torch.float32, 16, num_splits=3, block_n=64, **extra)
    out = torch.full_like(case["q"], float("nan"))
    ws = make_workspace(H_Q, D, max_partials=plan.num_partials, max_batch=3, device="cpu")
    ref = reference_decode_attention(**case, sm_scale=0.05)
    for _ in range(2):
        res = decode_attention(**case, plan=plan, out=out, workspace=ws, sm_scale=0.05)
        assert res.data_ptr() == out.data_ptr()
        assert (out - ref).abs().max().item() < 2e-5


# ----------------------------------------------------------------------------- bad input


@pytest.fixture()
def good():
    lens = [40, 0, 17]
    case = make_case(lens, num_qo_heads=H_Q, num_kv_heads=H_KV, head_dim=D, page_size=16, dtype=torch.float32, seed=9)
    plan = _plan(lens, torch.float32, 16, num_splits=2)
    return case, plan


def _call(case, plan, **kw):
    return decode_attention(**case, plan=plan, **kw)


@pytest.mark.parametrize(
    "mutate, exc, needle",
    [
        (lambda c: c.update(q=c["q"][0]), ValueError, "q: expected 3 dimensions"),
        (lambda c: c.update(q=c["q"].double()), ValueError, "q: expected dtype"),
        (lambda c: c.update(k_cache=c["k_cache"].half()), ValueError, "k_cache: expected dtype"),
        (lambda c: c.update(v_cache=c["v_cache"][:, :8]), ValueError, "v_cache: expected shape"),
        (lambda c: c.update(q=torch.randn(3, 3, D)), ValueError, "multiple of the cache's H_kv"),
        (
            lambda c: c.update(kv_indptr=torch.tensor([0, 3, 2, 5], dtype=torch.int32)),
            ValueError,
            "kv_indptr: must be non-decreasing",
        ),
        (lambda c: c.update(kv_indptr=c["kv_indptr"].long()), ValueError, "kv_indptr: expected dtype torch.int32"),
        (lambda c: c.update(kv_indices=c["kv_indices"] + 1000), ValueError, "kv_indices: page ids must be in"),
        (lambda c: c.update(kv_lens=torch.tensor([40, 0, 40], dtype=torch.int32)), ValueError, "kv_lens[2]"),
        (
            lambda c: c.update(kv_lens=torch.tensor([40, 0, 16], dtype=torch.int32)),
            ValueError,
            "plan: made for kv_lens[2]",
        ),
        (lambda c: c.update(q="q"), TypeError, "q: expected a torch.Tensor"),
    ],
)
def test_bad_input_names_the_argument(good, mutate, exc, needle):
    case, plan = good
    case = dict(case)
    mutate(case)
    with pytest.raises(exc) as info:
        _call(case, plan)
    assert needle in str(info.value)


def test_plan_for_another_shape_is_rejected(good):
    case, _ = good
    lens = [40, 0, 17]
    for kw, needle in (
        (dict(num_kv_heads=1), "num_kv_heads"),
        (dict(head_dim=128), "head_dim"),
        (dict(page_size=8), "page_size"),
        (dict(dtype="float16"), "dtype"),
    ):
        args = dict(
            num_kv_heads=H_KV, device="NVIDIA H200", policy="no_split", head_dim=D, page_size=16, dtype="float32"
        )
        args.update(kw)
        with pytest.raises(ValueError, match=needle):
            _call(case, make_plan(lens, **args))
    other_b = make_plan(
        [40, 0], num_kv_heads=H_KV, device="NVIDIA H200", policy="no_split", head_dim=D, page_size=16, dtype="float32"
    )
    with pytest.raises(ValueError, match="B=2"):
        _call(case, other_b)
    with pytest.raises(TypeError, match="plan"):
        _call(case, {"num_splits": [1, 1, 1]})


def test_out_and_workspace_checked(good):
    case, plan = good
    with pytest.raises(ValueError, match="out: expected shape"):
        _call(case, plan, out=torch.empty(3, H_Q, D + 1))
    small = make_workspace(H_Q, D, max_partials=1, max_batch=3, device="cpu")
    with pytest.raises(ValueError, match="workspace: holds 1 partials"):
        _call(case, plan, workspace=small)


def test_kv_len_beyond_pages_rejected_before_launch():
    lens = [16]
    case = make_case(lens, num_qo_heads=H_Q, num_kv_heads=H_KV, head_dim=D, page_size=16, dtype=torch.float32)
    plan = _plan([17], torch.float32, 16, num_splits=1)
    case["kv_lens"] = torch.tensor([17], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"kv_lens\[0\]: 17 tokens exceed its 1 pages"):
        _call(case, plan)


# ----------------------------------------------------------------------------- stream_k and wave-aware plans

SMALL2 = dataclasses.replace(DeviceSpec.known("NVIDIA H200"), num_sms=2)


def test_stream_k_ctas_cross_requests_fp16():
    lens = [300, 7, 0, 129, 1000, 40]
    plan = make_plan(
        lens,
        num_kv_heads=H_KV,
        device=SMALL2,
        policy="stream_k",
        params={"ctas_per_sm": 3, "block_n": 32},
        head_dim=D,
        page_size=16,
        dtype="float16",
    )
    # hand-computed: n_b = ceil(len / 32) = [10, 1, 0, 5, 32, 2], o = 1 -> cost [11, 2, 1, 6, 33, 3] = 56;
    # C = floor(3 * 2) // 2 = 3, share = ceil(56 / 3) = 19; lo = [1, 12, 14, 15, 21, 54], hi = [11, 13, 14, 20,
    # 53, 56]: multiples of 19 inside: r3 (15, 20) holds 19 -> cut 4 blocks = 128 tokens (a 1-token last piece),
    # r4 (21, 53) holds 38 -> cut 17 blocks = 544 tokens.
    # CTAs: r0, r1, r2, r3a (lo // 19 = 0); r3b (19 // 19 = 1), r4a (21 // 19 = 1); r4b (38 // 19 = 2), r5 (54 // 19)
    assert plan.work_request.tolist() == [0, 1, 2, 3, 3, 4, 4, 5]
    assert plan.work_kv_start.tolist() == [0, 0, 0, 0, 128, 0, 544, 0]
    assert plan.work_kv_end.tolist() == [300, 7, 0, 128, 129, 544, 1000, 40]
    assert plan.cta_indptr.tolist() == [0, 4, 6, 8]
    case = make_case(lens, num_qo_heads=H_Q, num_kv_heads=H_KV, head_dim=D, page_size=16, dtype=torch.float16, seed=21)
    o = _check(case, plan, torch.float16)
    ref = reference_decode_attention(**case)
    for b in range(len(lens)):
        assert (o[b].float() - ref[b].float()).abs().max().item() < TOL[torch.float16], f"row {b}"


@pytest.mark.parametrize(
    "params",
    [
        {"ctas_per_sm": 8, "block_n": 16, "item_cost_blocks": 0},
        {"ctas_per_sm": 6, "block_n": 32, "min_piece_blocks": 2, "order": "heavy_first"},
        {"ctas_per_sm": 5, "block_n": 16, "schedule": "persistent", "num_programs": 3},
    ],
)
def test_stream_k_split_and_packed_fp16(params):
    lens = [700, 0, 33, 5, 260, 1, 90]
    plan = make_plan(
        lens,
        num_kv_heads=H_KV,
        device=SMALL2,
        policy="stream_k",
        params=params,
        head_dim=D,
        page_size=8,
        dtype="float16",
    )
    assert (plan.num_splits > 1).any(), "some request is split and merged"
    sizes = np.diff(plan.cta_indptr)
    multi = [len(set(plan.work_request[a:b].tolist())) > 1 for a, b in zip(plan.cta_indptr[:-1], plan.cta_indptr[1:])]
    assert (sizes > 1).any() and any(multi), "some CTA walks items of several requests"
    case = make_case(
        lens, num_qo_heads=H_Q, num_kv_heads=H_KV, head_dim=D, page_size=8, dtype=torch.float16, seed=22 + len(params)
    )
    _check(case, plan, torch.float16)


def test_wave_aware_balanced_plan_fp16():
    lens = [1000, 700]
    plan = make_plan(
        lens,
        num_kv_heads=H_KV,
        device=SMALL2,
        policy="balanced",
        params={"block_n": 32},
        head_dim=D,
        page_size=16,
        dtype="float16",
    )
    # residency of (32, 4 warps, 2 stages) at D 64 fp16 (estimate): smem 2 * 32 * 64 * 2 = 8192 B, regs 128 ->
    # 65536 // (4096 * 4) = 4 CTAs/SM -> 8 slots, target min(floor(4 * 2), 8) = 8.
    # chunk0 = roundup(ceil(2 * 1700 / 8) = 425, 32) = 448 -> splits [3, 2], 10 tiles > 8.
    # chunk_fit: ceil(1000 / c) + ceil(700 / c) <= 4 -> c >= 500 -> 512; est0: 8 first tiles (6 x 333.3,
    # 2 x 350, each + 32 of fixed cost), 2 overflow (382) behind two 365.3 -> 747.3 >= 500 + 32 (chunk_fit's
    # largest tile 1000 / 2 + 32) -> chunk 512: splits [2, 2], 8 tiles
    assert plan.num_splits.tolist() == [2, 2] and plan.num_work_tiles == 8
    assert plan.work_kv_start.tolist() == [0, 512, 0, 352] and plan.work_kv_end.tolist() == [512, 1000, 352, 700]
    case = make_case(lens, num_qo_heads=H_Q, num_kv_heads=H_KV, head_dim=D, page_size=16, dtype=torch.float16, seed=23)
    _check(case, plan, torch.float16)


@pytest.mark.parametrize(
    "mutate, exc, needle",
    [
        (lambda c: c.update(q=torch.randn(3, 3, D)), ValueError, "q: H_q=3 must be a multiple of the cache's H_kv"),
        (lambda c: c.update(q=c["q"][0]), ValueError, "q: expected 3 dimensions"),
        (lambda c: c.update(v_cache=c["v_cache"][:, :8]), ValueError, "v_cache: expected shape"),
        (lambda c: c.update(q=torch.randn(3, H_Q, D // 2)), ValueError, "k_cache: expected head_dim 32"),
        (lambda c: c.update(kv_lens=c["kv_lens"][:2]), ValueError, "kv_lens: expected shape (3,) for B=3"),
        (lambda c: c.update(kv_indptr=c["kv_indptr"][:3]), ValueError, "kv_indptr: expected shape (4,)"),
        (
            lambda c: c.update(kv_lens=torch.tensor([40, 0, 40], dtype=torch.int32)),
            ValueError,
            "kv_lens: request 2 has kv_len 40 but only 2 pages of 16 tokens",
        ),
        (lambda c: c.update(k_cache=None), TypeError, "k_cache: expected a torch.Tensor"),
    ],
)
def test_reference_bad_input_names_the_argument(good, mutate, exc, needle):
    # the reference validates shapes up front (it used to fail inside einsum with a RuntimeError)
    case = dict(good[0])
    reference_decode_attention(**case)  # the unmutated case is fine
    mutate(case)
    with pytest.raises(exc) as info:
        reference_decode_attention(**case)
    assert needle in str(info.value)


# ----------------------------------------------------------------------------- the page-id prefetching loop


@pytest.mark.parametrize(
    "block_n, page_size, policy",
    [(16, 16, "stream_k"), (32, 8, "fixed"), (64, 16, "no_split"), (16, 4, "balanced"), (128, 16, "fixed")],
)
def test_prefetching_loop_matches_reference_fp16(block_n, page_size, policy):
    """The stage-1 loop that loads the next tile's page ids one iteration ahead: same output as the plain
    loop and the reference, including tiles that end inside a page and the masked look-ahead past kv_len."""
    from kvsplit.kernels.decode import launch_decode

    lens = [300, 0, 1, 77, 160, 33, block_n, block_n + 1]
    params = {"block_n": block_n, **({"num_splits": 3} if policy == "fixed" else {})}
    plan = make_plan(
        lens,
        num_kv_heads=H_KV,
        device="NVIDIA H200",
        policy=policy,
        params=params,
        head_dim=D,
        page_size=page_size,
        dtype="float16",
    )
    case = make_case(
        lens,
        num_qo_heads=H_Q,
        num_kv_heads=H_KV,
        head_dim=D,
        page_size=page_size,
        dtype=torch.float16,
        seed=block_n + page_size,
    )
    ref, ref_lse = reference_decode_attention(**case, return_lse=True)
    outs = []
    for prefetch in (True, False):
        ws = make_workspace(H_Q, D, max_partials=plan.num_partials, max_batch=len(lens), device="cpu")
        o, lse = launch_decode(
            case["q"],
            case["k_cache"],
            case["v_cache"],
            case["kv_indptr"],
            case["kv_indices"],
            plan.to("cpu"),
            dataclasses.replace(plan.config, prefetch=prefetch),  # the stage-1 loop follows config.prefetch
            out=torch.empty_like(case["q"]),
            workspace=ws,
            **plan.launch_sizes(),
            return_lse=True,
        )
        assert not torch.isnan(o).any()
        assert (o.float() - ref.float()).abs().max().item() < TOL[torch.float16]
        fin = torch.isfinite(ref_lse)
        assert torch.equal(fin, torch.isfinite(lse)) and (lse[fin] - ref_lse[fin]).abs().max().item() < 1e-3
        outs.append(o.clone())
    assert (outs[0].float() - outs[1].float()).abs().max().item() < 1e-3


def test_prefetch_knob_is_checked_and_counted_in_residency():
    """params.prefetch: a bool, only with num_stages >= 3, kept in the plan's config (and its JSON form), and
    counted in the residency the wave-aware rules plan against (kernels/residency.py, MEASURED_PREFETCH)."""
    from kvsplit.kernels.plan import Plan
    from kvsplit.kernels.residency import resident_ctas_per_sm

    lens = [5000, 300, 7]
    for bad, msg in ((1, "params.prefetch: expected true or false"), ("yes", "params.prefetch: expected true")):
        with pytest.raises(ValueError, match=msg):
            make_plan(
                lens, num_kv_heads=4, device="NVIDIA H200", policy="balanced", params={"num_stages": 3, "prefetch": bad}
            )
    with pytest.raises(ValueError, match="params.prefetch: needs num_stages >= 3"):
        make_plan(lens, num_kv_heads=4, device="NVIDIA H200", policy="stream_k", params={"prefetch": True})
    p = make_plan(
        lens,
        num_kv_heads=4,
        device="NVIDIA H200",
        policy="stream_k",
        params={"block_n": 64, "num_stages": 3, "prefetch": True},
    )
    assert p.config.prefetch is True and p.to_dict()["config"]["prefetch"] is True
    assert Plan.from_dict(p.to_dict()).config == p.config
    h200 = DeviceSpec.known("NVIDIA H200")

    def res(bn, w, s, pf):
        return resident_ctas_per_sm(h200, 128, "bfloat16", 2, bn, w, s, prefetch=pf)

    # (128, 4, 3): 238 registers -> 65536 // (240 * 128) = 2 CTAs; prefetching, 168 registers but 139,264 B of
    # shared memory (two 64 KB K/V buffers) -> 233,472 // (139,264 + 1,024) = 1
    assert res(128, 4, 3, False) == 2 and res(128, 4, 3, True) == 1
    # (64, 4, 3): 156 registers -> 3; prefetching 164 registers -> 65536 // (168 * 128) = 3, 71,680 B -> 3
    assert res(64, 4, 3, False) == 3 and res(64, 4, 3, True) == 3
    # (64, 4, 4) prefetching: 104,448 B -> 233,472 // 105,472 = 2
    assert res(64, 4, 4, True) == 2
    # wave-aware balanced counts those slots: 132 SMs x 1 for (128, 4, 3) with prefetch
    from kvsplit.kernels.rulespec import PlanContext, resident_slots

    ctx = PlanContext(device=h200, num_kv_heads=4, head_dim=128, page_size=16, dtype="bfloat16")
    assert resident_slots(ctx, p.config.__class__(block_n=128, num_warps=4, num_stages=3, prefetch=True)) == 132
    assert resident_slots(ctx, p.config.__class__(block_n=128, num_warps=4, num_stages=3)) == 264


def test_cpu_tensors_without_the_interpreter_get_a_clear_error(monkeypatch, good):
    """Without TRITON_INTERPRET=1, CPU tensors would fail deep in Triton ("0 active drivers"): the launcher
    and DecodeWrapper refuse them first, naming the argument and the fix."""
    import kvsplit.kernels.decode as dec
    from kvsplit.kernels.wrapper import DecodeWrapper

    monkeypatch.setattr(dec, "_INTERPRETED", False)
    case, plan = good
    with pytest.raises(
        ValueError,
        match="q: tensors on the CPU run the Triton kernel only under Triton's interpreter: set TRITON_INTERPRET=1",
    ):
        decode_attention(**case, plan=plan)
    with pytest.raises(ValueError, match="device: tensors on the CPU .* TRITON_INTERPRET=1"):
        DecodeWrapper(H_Q, H_KV, D, device="cpu", dtype="float16")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="device: 'cuda' asked for, but torch sees no CUDA device"):
            DecodeWrapper(H_Q, H_KV, D, device="cuda")


@pytest.mark.parametrize("merge_dsplit, max_splits", [(1, 4), (4, None)])
def test_merge_over_head_dim_chunks_matches_reference_fp16(merge_dsplit, max_splits):
    """The merge cut into ``merge_dsplit`` chunks of the head dim (one program per request, query head and
    chunk), as launch_rule picks it: 4 for a few requests of more splits (70) than one full-D program folds at
    once (4096 / D = 64), 1 when the launch is told of at most 4 splits per request (BLOCK_S 4, so the
    running-max fold crosses chunks). The same output and LSE as the fp32 reference, with requests of 0, 1 and
    many splits, and empty splits past a short request's end."""
    from kvsplit.kernels.decode import launch_decode, launch_rule

    lens = [1200, 0, 5, 333, 64]
    plan = make_plan(
        lens,
        num_kv_heads=H_KV,
        device="NVIDIA H200",
        policy="fixed",
        params={"num_splits": 70, "block_n": 16},
        head_dim=D,
        page_size=16,
        dtype="float16",
    )
    assert int(plan.num_splits.max()) == 70
    sizes = {**plan.launch_sizes(), **({"max_splits": max_splits} if max_splits else {})}
    picked = launch_rule(
        plan.config,
        num_qo_heads=H_Q,
        num_kv_heads=H_KV,
        head_dim=D,
        dtype_bytes=2,
        num_merge=sizes["num_merge"],
        max_splits=sizes["max_splits"],
        merges=True,
        device_resident=False,
        pdl_available=False,
        sync_ok=True,
        compiled=False,
    )
    assert picked.merge_dsplit == merge_dsplit and not picked.merge_overlap
    case = make_case(
        lens, num_qo_heads=H_Q, num_kv_heads=H_KV, head_dim=D, page_size=16, dtype=torch.float16, seed=merge_dsplit
    )
    ref, ref_lse = reference_decode_attention(**case, return_lse=True)
    ws = make_workspace(H_Q, D, max_partials=plan.num_partials, max_batch=len(lens), device="cpu")
    out = torch.full_like(case["q"], float("nan"))
    o, lse = launch_decode(
        case["q"],
        case["k_cache"],
        case["v_cache"],
        case["kv_indptr"],
        case["kv_indices"],
        plan.to("cpu"),
        plan.config,
        out=out,
        workspace=ws,
        **sizes,
        return_lse=True,
    )
    assert not torch.isnan(o).any()
    assert (o.float() - ref.float()).abs().max().item() < TOL[torch.float16]
    fin = torch.isfinite(ref_lse)
    assert torch.equal(fin, torch.isfinite(lse)) and (lse[fin] - ref_lse[fin]).abs().max().item() < 1e-3


def test_register_cap_table():
    """kernels/residency.register_cap: the (64, 4, 2) tile (D 128) is capped at 128 registers -- 4 CTAs per SM
    by the occupancy rule -- for every group but the one MEASURED was read at; other tiles are not capped."""
    from kvsplit.kernels.device import resolve_device
    from kvsplit.kernels.residency import MEASURED, MEASURED_GROUP, occupancy, register_cap

    assert MEASURED_GROUP == 8
    for g in (1, 2, 3, 4, 5, 6, 7, 16):
        assert register_cap(128, g, 64, 4, 2) == 128
        assert register_cap(128, g, 64, 4, 2, dtype_bytes=4) is None  # fp32: not measured
        assert register_cap(128, g, 64, 4, 2, prefetch=True) is None
        for bn, w, s in ((64, 4, 3), (64, 8, 2), (128, 4, 2), (128, 8, 3), (256, 8, 2)):
            assert register_cap(128, g, bn, w, s) is None
    assert register_cap(128, 8, 64, 4, 2) is None
    assert register_cap(128, 32, 64, 4, 2) is None  # a 32-row query tile: not measured
    assert register_cap(64, 4, 64, 4, 2) is None  # measured at D = 128 only
    h200 = resolve_device("NVIDIA H200")
    regs8, smem = MEASURED[("NVIDIA H200", 128, "bfloat16", 64, 4, 2)]
    assert occupancy(h200, 4, 128, smem) == occupancy(h200, 4, regs8, smem) == 4
    assert occupancy(h200, 4, 166, smem) == 3  # the uncapped G = 4 compile


@pytest.mark.parametrize(
    "lens, max_splits, dsplit, warps",
    [
        ([5000] * 2, 40, 4, 4),  # 2 x 32 (request, head) pairs, 40 splits > 4096 / 128: 4 programs each
        ([5000] * 2, 32, 1, 4),  # a single full-D fold holds 32 splits
        ([5000] * 7, 40, 4, 4),  # 7 x 32 = 224 pairs < 256: four warps
        ([5000] * 8, 40, 4, 1),  # 8 x 32 = 256 pairs: one warp per program
        ([5000] * 33, 40, 1, 1),  # 33 x 32 = 1056 pairs > 1024: one program per pair
    ],
)
def test_merge_default_rules(lens, max_splits, dsplit, warps, monkeypatch):
    """launch_decode's default merge grid: (merged requests, H_q, 4) only when few (request, head) pairs fold
    many splits, else (merged requests, H_q, 1); one warp per merge program from 256 merged (request, head) pairs
    on, else four (docs/decisions/overlapped-merge.md)."""
    from kvsplit.kernels import decode as dec

    grids = []

    class Rec:  # records the launch grid instead of running the kernel
        def __getitem__(self, grid):
            return lambda *a, **k: grids.append((grid, k.get("BLOCK_D"), k.get("num_warps")))

    monkeypatch.setattr(dec, "_decode_stage1_kernel", Rec())
    monkeypatch.setattr(dec, "_decode_merge_kernel", Rec())
    d, hq, hkv = 128, 32, 4
    plan = make_plan(
        lens,
        num_kv_heads=hkv,
        device="NVIDIA H200",
        policy="fixed",
        params={"num_splits": max_splits},
        head_dim=d,
        page_size=16,
        dtype="float16",
    )
    q = torch.zeros((len(lens), hq, d), dtype=torch.float16)
    k = torch.zeros((sum(-(-n // 16) for n in lens) + 1, 16, hkv, d), dtype=torch.float16)
    ws = make_workspace(hq, d, max_partials=plan.num_partials, max_batch=len(lens), device="cpu")
    nm = int(plan.merge_layout()[1].shape[0])
    dec.launch_decode(
        q,
        k,
        k,
        torch.zeros(len(lens) + 1, dtype=torch.int32),
        torch.zeros(1, dtype=torch.int32),
        plan.to("cpu"),
        plan.config,
        out=torch.empty_like(q),
        workspace=ws,
        num_tiles=plan.num_work_tiles,
        num_merge=nm,
        max_splits=int(plan.num_splits.max()),
    )
    (_, _, _), (merge_grid, block_d, num_warps) = grids
    assert merge_grid == (nm, hq, dsplit) and block_d == d // dsplit and num_warps == warps


@pytest.mark.parametrize("B, splits, on", [(8, 2, True), (7, 2, False), (2, 64, False), (64, 3, True)])
def test_overlapped_merge_default_rule(B, splits, on, monkeypatch):
    """launch_decode's default turns the overlapped merge on from 256 merged (request, query head) pairs on
    (H_q 32: 8 merged requests) where PDL is available, the workspace holds the counters and merge_dsplit fits
    them (docs/decisions/overlapped-merge.md); never on the CPU interpreter, for a workspace without counters, or for a
    device-resident plan."""
    from kvsplit.kernels import decode as dec

    calls = []

    class Rec:  # records the launch keywords instead of running the kernel
        def __getitem__(self, grid):
            return lambda *a, **k: calls.append({**k, "grid": grid})

    monkeypatch.setattr(dec, "_decode_stage1_kernel", Rec())
    monkeypatch.setattr(dec, "_decode_merge_kernel", Rec())
    d, hq, hkv = 128, 32, 4
    lens = [4096] * B
    plan = make_plan(
        lens,
        num_kv_heads=hkv,
        device="NVIDIA H200",
        policy="fixed",
        params={"num_splits": splits},
        head_dim=d,
        page_size=16,
        dtype="float16",
    )
    q = torch.zeros((B, hq, d), dtype=torch.float16)
    k = torch.zeros((B * 256 + 1, 16, hkv, d), dtype=torch.float16)
    ws = make_workspace(hq, d, max_partials=plan.num_partials, max_batch=B, device="cpu")

    def launch(workspace, **kw):
        calls.clear()
        dec.launch_decode(
            q,
            k,
            k,
            torch.zeros(B + 1, dtype=torch.int32),
            torch.zeros(1, dtype=torch.int32),
            plan.to("cpu"),
            plan.config,
            out=torch.empty_like(q),
            workspace=workspace,
            **plan.launch_sizes(),
            **kw,
        )
        (s1, m) = calls
        assert s1["SIGNAL"] == m["WAIT"]
        return m["WAIT"], ("launch_pdl" in m)

    assert launch(ws) == (False, False)  # the interpreter: no PDL, no overlap
    monkeypatch.setattr(dec, "_pdl_available", lambda device: True)
    assert launch(ws) == (on, on)
    assert launch(dataclasses.replace(ws, sync=None)) == (False, False)
    # a device-resident plan (DecodeWrapper's CUDA-graph path): overlapped on one warp, its grid held to B
    calls.clear()
    dec.launch_decode(
        q,
        k,
        k,
        torch.zeros(B + 1, dtype=torch.int32),
        torch.zeros(1, dtype=torch.int32),
        plan.to("cpu"),
        dataclasses.replace(plan.config, schedule="persistent", num_programs=4),
        out=torch.empty_like(q),
        workspace=ws,
        counts=torch.tensor([1, 1, 1, 1], dtype=torch.int32),
        max_merge=4 * B,
    )
    (s1, m) = calls
    assert s1["SIGNAL"] and m["WAIT"] and "launch_pdl" in m and m["num_warps"] == 1 and m["grid"][0] == B


def test_compiled_residency_table_matches_an_sm90_compile(tmp_path):
    """kernels/residency.py COMPILED holds registers / shared memory of plain-loop configs from Triton's sm_90
    compile on the CPU: compiling two of them again (bench/compile_sm90.py, a subprocess without the interpreter)
    gives the same figures, and the residency the planner counts is the one those figures give."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from kvsplit.kernels.device import resolve_device
    from kvsplit.kernels.residency import COMPILED, MEASURED, occupancy, resident_ctas_per_sm

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "c.jsonl"
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    subprocess.run(
        [
            sys.executable,
            str(root / "bench/compile_sm90.py"),
            "--configs",
            "64,2,3",
            "64,4,4",
            "--variants",
            "plain",
            "--json",
            str(out),
        ],
        check=True,
        env=env,
        cwd=root,
        capture_output=True,
    )
    h200 = resolve_device("NVIDIA H200")
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == 2
    for r in rows:
        bn, w, st = r["cfg"]
        key = ("NVIDIA H200", 128, "bfloat16", bn, w, st)
        assert key not in MEASURED and COMPILED[key] == (r["regs"], r["shared"])
        assert resident_ctas_per_sm(h200, 128, "bfloat16", 2, bn, w, st) == occupancy(h200, w, r["regs"], r["shared"])
    assert {tuple(r["cfg"]): r["resident"] for r in rows} == {(64, 2, 3): 4, (64, 4, 4): 3}


def test_fp8_residency_tables_match_an_sm90_compile(tmp_path):
    """COMPILED_FP8 (q_len 1) and COMPILED_QLEN's FP8 rows hold the sm_90 compile of the kernel that widens V before
    its shared-memory copy (``_widen_fp8``'s inline PTX, which the compile records as an sm_90 launch picks it):
    compiling the FP8 fallback's tile (32, 4, 3, prefetch, two heads) and a q_len-4 tile again gives the tables'
    figures, and the planner counts their residency on the H200 and the H100 alike (the table is keyed by arch)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from kvsplit.kernels.device import resolve_device
    from kvsplit.kernels.residency import COMPILED_FP8, COMPILED_QLEN, occupancy, resident_ctas_per_sm

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "c.jsonl"
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    base = [sys.executable, str(root / "bench/compile_sm90.py"), "--kv-dtype", "fp8", "--scales", "tensor"]
    for extra in (
        ["--configs", "32,4,3", "--variants", "prefetch", "--heads", "2"],
        ["--configs", "64,4,3", "--variants", "prefetch", "--heads", "1", "--q-len", "4", "--maxnreg", "auto"],
    ):
        subprocess.run([*base, *extra, "--json", str(out)], check=True, env=env, cwd=root, capture_output=True)
    q1, q4 = [json.loads(x) for x in out.read_text().splitlines()]
    assert (q1["regs"], q1["shared"]) == COMPILED_FP8[("sm_90", 128, "bfloat16", 32, 4, 3, True, 2, False)]
    assert (q4["regs"], q4["shared"]) == COMPILED_QLEN[("sm_90", 128, "bfloat16", 1, 64, 4, 3, True, False, 1, 32)]
    assert q1["tile_loop"]["LDS.U8"] == 0  # V is read by ldmatrix from its float16 copy, not byte by byte
    for gpu in ("NVIDIA H200", "h100"):
        dev = resolve_device(gpu)
        fb = resident_ctas_per_sm(dev, 128, "bfloat16", 2, 32, 4, 3, prefetch=True, heads_per_tile=2, kv_bytes=1)
        assert fb == occupancy(dev, 4, q1["regs"], q1["shared"]) == 4


@pytest.mark.parametrize(
    "merge_dsplit,heads,schedule", [(1, 1, "grid"), (4, 2, "grid"), (4, 1, "persistent"), (1, 2, "persistent")]
)
def test_overlapped_merge_matches_reference_and_leaves_counters_zero_fp16(merge_dsplit, heads, schedule, monkeypatch):
    """The overlapped merge (``LaunchRule.merge_overlap``): stage 1 counts each split's arrival per (request,
    query head, head-dim chunk) in ``workspace.sync`` and each merge program waits for its count, then resets
    it. launch_rule picks it only where PDL runs (sm_90+), so here the rule is forced to it (with the merge
    after stage 1, as the interpreter runs it): this checks the protocol's bookkeeping: the same output and LSE
    as the fp32 reference, every counter back at zero after each call, and a second call on the same
    workspace (what a CUDA-graph replay does) giving the same result."""
    from kvsplit.kernels import decode as dec
    from kvsplit.kernels.decode import MERGE_SYNC_CHUNKS, launch_decode

    rule = dec.launch_rule
    monkeypatch.setattr(
        dec,
        "launch_rule",
        lambda *a, **kw: dataclasses.replace(rule(*a, **kw), merge_overlap=True, merge_dsplit=merge_dsplit),
    )

    lens = [700, 0, 5, 333, 64]
    extra = {"schedule": "persistent", "num_programs": 3} if schedule == "persistent" else {}
    hq = H_Q * heads  # heads_per_tile 2 needs 2 * G <= 16 and H_kv divisible: H_kv 2, G 4
    plan = make_plan(
        lens,
        num_kv_heads=H_KV,
        device="NVIDIA H200",
        policy="fixed",
        params={"num_splits": 7, "block_n": 16, "heads_per_tile": heads, **extra},
        head_dim=D,
        page_size=16,
        dtype="float16",
    )
    case = make_case(
        lens, num_qo_heads=hq, num_kv_heads=H_KV, head_dim=D, page_size=16, dtype=torch.float16, seed=11 + merge_dsplit
    )
    ref, ref_lse = reference_decode_attention(**case, return_lse=True)
    ws = make_workspace(hq, D, max_partials=plan.num_partials, max_batch=len(lens), device="cpu")
    assert ws.sync.shape == (len(lens) * hq * MERGE_SYNC_CHUNKS,) and int(ws.sync.abs().sum()) == 0
    arrays = plan.to("cpu")
    for call in range(2):
        out = torch.full_like(case["q"], float("nan"))
        o, lse = launch_decode(
            case["q"],
            case["k_cache"],
            case["v_cache"],
            case["kv_indptr"],
            case["kv_indices"],
            arrays,
            plan.config,
            out=out,
            workspace=ws,
            **plan.launch_sizes(),
            return_lse=True,
        )
        assert not torch.isnan(o).any()
        assert (o.float() - ref.float()).abs().max().item() < TOL[torch.float16], call
        fin = torch.isfinite(ref_lse)
        assert torch.equal(fin, torch.isfinite(lse)) and (lse[fin] - ref_lse[fin]).abs().max().item() < 1e-3
        assert int(ws.sync.abs().sum()) == 0, f"call {call}: counters left at {ws.sync.nonzero().flatten()}"
