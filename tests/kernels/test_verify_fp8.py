"""q_len 2-8 query tokens per request (speculative-decoding verify steps) and the float8_e4m3fn KV cache, on the
CPU interpreter (TRITON_INTERPRET=1) against an fp32 reference written for the tests
(tests/kernels/paged_case.py::reference_verify: pages gathered, the causal mask of the q_len new tokens, softmax).

fp8 under the interpreter: Triton 3.6's interpreter loads ``torch.float8_e4m3fn`` tensors and converts them to
float16 exactly for every finite byte (all 254 finite codes checked); only the NaN codes (0x7F, 0xFF) read back
as 480, so a NaN planted in an unused fp8 slot reads as a large finite value there (a leak still shows, as a
large error). So the fp8 tests run here with float16 q (bfloat16 tl.dot is wrong under the interpreter), and
on the GPU with bfloat16 q (tests/kernels/test_decode_gpu.py).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from kvsplit.kernels.decode import decode_attention, launch_decode, make_workspace
from kvsplit.kernels.limits import MAX_TILE_ROWS
from kvsplit.kernels.plan import make_plan

from .paged_case import make_case, reference_verify

H_KV, D, PAGE = 2, 64, 16
FP8 = torch.float8_e4m3fn


def _plan(lens, *, dtype="float16", hkv=H_KV, **params):
    return make_plan(
        lens,
        num_kv_heads=hkv,
        device="NVIDIA H200",
        policy="fixed",
        params=params,
        head_dim=D,
        page_size=PAGE,
        dtype=dtype,
    )


def _to_fp8(case):
    """The case's cache stored as float8_e4m3fn (NaN slots stay NaN codes)."""
    return {**case, "k_cache": case["k_cache"].float().to(FP8), "v_cache": case["v_cache"].float().to(FP8)}


def _check(case, plan, *, q_len, tol, **kw):
    o, lse = decode_attention(**case, plan=plan, return_lse=True, q_len=q_len, **kw)
    ref, ref_lse = reference_verify(**case, q_len=q_len, k_scale=kw.get("k_scale"), v_scale=kw.get("v_scale"))
    assert o.shape == case["q"].shape and lse.shape == case["q"].shape[:2]
    assert not torch.isnan(o).any(), "NaN reached the output"
    err = (o.float() - ref).abs().max().item()
    assert err < tol * max(1.0, ref.abs().max().item()), f"max |o - ref| = {err}"
    assert torch.isfinite(lse).all() and (lse - ref_lse).abs().max().item() < 1e-3
    return o


def _cuts_inside_drafts(plan, lens, q_len):
    """Whether some work item starts inside a request's q_len new tokens (a split cutting the draft tokens)."""
    return any(lens[r] - q_len < s < lens[r] for r, s in zip(plan.work_request.tolist(), plan.work_kv_start.tolist()))


@pytest.mark.parametrize(
    "q_len, dtype, knobs",
    [
        (2, torch.float32, {}),
        (4, torch.float16, {"heads_per_tile": 2}),
        (5, torch.float16, {"block_n": 32, "num_stages": 3, "prefetch": True, "next_item": True}),
        (8, torch.float16, {"schedule": "persistent", "num_programs": 3}),
    ],
)
def test_causal_q_len_at_page_boundaries(q_len, dtype, knobs):
    """kv_lens at and around multiples of the page size (the new tokens straddle a page boundary), cut into 3
    splits, some of which start inside the draft tokens, so the rows before such a split's start get an empty
    partial (LSE -inf) that the merge must drop; NaN in every unused slot and spare page."""
    lens = [q_len, PAGE - 1, PAGE, PAGE + 1, 2 * PAGE + q_len // 2, 3 * PAGE - 1]
    lens = [max(n, q_len) for n in lens]
    hq = 8 if knobs.get("heads_per_tile") == 2 else 4  # G = 4: with 2 KV heads per tile 2 * 4 * q_len rows
    case = make_case(
        lens, num_qo_heads=hq, num_kv_heads=H_KV, head_dim=D, page_size=PAGE, dtype=dtype, seed=q_len, q_len=q_len
    )
    plan = _plan(
        lens,
        dtype={torch.float32: "float32", torch.float16: "float16"}[dtype],
        num_splits=3,
        **{"block_n": 16, **knobs},
    )
    assert _cuts_inside_drafts(plan, lens, q_len)
    _check(case, plan, q_len=q_len, tol=2e-5 if dtype == torch.float32 else 5e-3)


def test_q_len_one_row_per_token_matches_single_token_calls():
    """Token j of a q_len = 3 request equals a q_len = 1 call on the same cache with kv_len - 2 + j: the causal
    rule expressed through the kernel's own single-token path."""
    lens = [19, 40]
    q_len = 3
    case = make_case(
        lens, num_qo_heads=4, num_kv_heads=H_KV, head_dim=D, page_size=PAGE, dtype=torch.float32, seed=3, q_len=q_len
    )
    o = decode_attention(**case, plan=_plan(lens, dtype="float32", num_splits=2, block_n=16), q_len=q_len)
    for j in range(q_len):
        lj = [n - q_len + 1 + j for n in lens]
        cj = {**case, "q": case["q"][j::q_len].contiguous(), "kv_lens": torch.tensor(lj, dtype=torch.int32)}
        oj = decode_attention(**cj, plan=_plan(lj, dtype="float32", num_splits=2, block_n=16))
        assert (o[j::q_len] - oj).abs().max().item() < 2e-5, j


@pytest.mark.parametrize("q_len, scales", [(1, "tensor"), (3, "tensor"), (2, "head")])
def test_fp8_kv_matches_dequantized_reference(q_len, scales):
    """fp16 q with a float8_e4m3fn cache and scales != 1 (per tensor, per KV head; heads_per_tile 2 with
    per-head scales, so one tile holds two KV heads' scales), split and unsplit, against the fp32 reference on
    the dequantized values; the LSE is that of the scaled scores."""
    lens = [max(q_len, 3), 33, 100]
    hq = 8
    case = _to_fp8(
        make_case(
            lens,
            num_qo_heads=hq,
            num_kv_heads=H_KV,
            head_dim=D,
            page_size=PAGE,
            dtype=torch.float16,
            seed=10 + q_len,
            q_len=q_len,
        )
    )
    if scales == "tensor":
        kw = {"k_scale": 0.37, "v_scale": 2.5}
        plans = [_plan(lens, num_splits=1, block_n=32), _plan(lens, num_splits=4, block_n=16)]
    else:
        kw = {"k_scale": torch.tensor([0.5, 1.75]), "v_scale": torch.tensor([3.0, 0.25])}
        plans = [_plan(lens, num_splits=3, block_n=16, heads_per_tile=2)]
    for plan in plans:
        _check(case, plan, q_len=q_len, tol=5e-3, **kw)


def test_fp8_per_head_scales_are_read_per_head():
    """Swapping the two KV heads' scales changes each head's output as the reference says (a scale applied to
    the wrong head, or a per-tensor fold of the first, would fail here)."""
    lens = [40]
    case = _to_fp8(
        make_case(lens, num_qo_heads=4, num_kv_heads=H_KV, head_dim=D, page_size=PAGE, dtype=torch.float16, seed=21)
    )
    plan = _plan(lens, num_splits=2, block_n=16)
    for ks, vs in (([1.0, 4.0], [0.5, 1.0]), ([4.0, 1.0], [1.0, 0.5])):
        _check(case, plan, q_len=1, tol=5e-3, k_scale=torch.tensor(ks), v_scale=torch.tensor(vs))


def _good(q_len=2, hq=4):
    lens = [5, 20]
    case = make_case(
        lens, num_qo_heads=hq, num_kv_heads=H_KV, head_dim=D, page_size=PAGE, dtype=torch.float16, q_len=q_len
    )
    return case, _plan(lens, num_splits=2, block_n=16)


@pytest.mark.parametrize(
    "mutate, kw, needle",
    [
        (
            lambda c: {**c, "kv_lens": torch.tensor([1, 20], dtype=torch.int32)},
            {},
            r"^kv_lens\[0\]: 1 tokens, fewer than q_len=2",
        ),
        (lambda c: {**c, "q": c["q"][:3]}, {}, r"^q: expected \[B \* q_len, H_q, D\]"),
        (lambda c: c, {"q_len": 9}, r"^q_len: expected an integer in \[1, 8\]"),
        (lambda c: c, {"q_len": True}, r"^q_len: expected an integer"),
        (
            lambda c: {**c, "q": c["q"].float(), "k_cache": c["k_cache"].to(FP8), "v_cache": c["v_cache"].to(FP8)},
            {},
            r"^k_cache: a float8_e4m3fn KV cache needs a float16 or bfloat16 q",
        ),
        (lambda c: {**c, "k_cache": c["k_cache"].to(FP8)}, {}, r"^v_cache: expected dtype torch.float8_e4m3fn"),
        (lambda c: c, {"k_scale": 0.0}, r"^k_scale: expected a finite scale > 0, got 0.0"),
        (lambda c: c, {"v_scale": float("nan")}, r"^v_scale: expected a finite scale > 0"),
        (lambda c: c, {"k_scale": "1"}, r"^k_scale: expected a float or a float32 tensor"),
        (lambda c: c, {"k_scale": torch.ones(2), "v_scale": 1.0}, r"^v_scale: expected a float32 tensor \[2\]"),
        (
            lambda c: c,
            {"k_scale": torch.ones(3), "v_scale": torch.ones(3)},
            r"^k_scale: expected a float32 tensor of shape \(2,\)",
        ),
        (
            lambda c: c,
            {"k_scale": torch.ones(2, dtype=torch.float16), "v_scale": torch.ones(2)},
            r"^k_scale: expected a float32",
        ),
        (
            lambda c: c,
            {"k_scale": torch.tensor([1.0, -1.0]), "v_scale": torch.ones(2)},
            r"^k_scale\[1\]: expected a finite scale > 0",
        ),
    ],
)
def test_bad_q_len_and_fp8_inputs_name_the_argument(mutate, kw, needle):
    case, plan = _good()
    kw = {"q_len": 2, **kw}
    with pytest.raises(ValueError, match=needle):
        decode_attention(**mutate(case), plan=plan, **kw)


def test_too_many_tile_rows_and_a_q_len_one_workspace_are_refused():
    """G = 16 (H_q 32 / H_kv 2) x q_len 8 = 128 rows of one work tile: refused naming q_len before any launch;
    a workspace made for q_len = 1 is refused naming the workspace (its rows would be too few)."""
    lens = [9, 20]
    case = make_case(lens, num_qo_heads=32, num_kv_heads=H_KV, head_dim=D, page_size=PAGE, dtype=torch.float16, q_len=8)
    plan = _plan(lens, num_splits=2, block_n=16)
    out = torch.full_like(case["q"], float("nan"))
    with pytest.raises(ValueError, match=rf"^q_len: 8 tokens x GQA group G=16 .* 128 query rows .* {MAX_TILE_ROWS}"):
        decode_attention(**case, plan=plan, q_len=8, out=out)
    assert torch.isnan(out).all()
    case4, plan4 = _good(q_len=4)
    ws = make_workspace(4, D, max_partials=plan4.num_partials, max_batch=2, device="cpu")
    with pytest.raises(
        ValueError, match=r"^workspace.part_o: expected shape \(n, 16, 64\) \(make_workspace\(\.\.\., q_len=4\)\)"
    ):
        decode_attention(**case4, plan=plan4, q_len=4, workspace=ws)
    with pytest.raises(ValueError, match=r"^kv_lens: required with q_len=4"):
        launch_decode(
            case4["q"],
            case4["k_cache"],
            case4["v_cache"],
            case4["kv_indptr"],
            case4["kv_indices"],
            plan4.to("cpu"),
            plan4.config,
            out=torch.empty_like(case4["q"]),
            workspace=make_workspace(4, D, max_partials=plan4.num_partials, max_batch=2, device="cpu", q_len=4),
            **plan4.launch_sizes(),
            q_len=4,
        )


def test_wrapper_q_len_fp8_eager_and_device_planned_steps():
    """DecodeWrapper(q_len=4, kv_dtype fp8): eager steps over growing kv_lens, and the graph mode's device
    planner (persistent schedule, device-resident plan; replayed without capture on the CPU) on the same steps,
    both against the reference; kv_lens below q_len refused by plan()."""
    from kvsplit.kernels.wrapper import DecodeWrapper

    q_len, hq = 4, 4
    lens0 = [4, 13, 30]
    final = [n + 2 * q_len for n in lens0]
    case = _to_fp8(
        make_case(
            final,
            num_qo_heads=hq,
            num_kv_heads=H_KV,
            head_dim=D,
            page_size=PAGE,
            dtype=torch.float16,
            seed=31,
            q_len=q_len,
        )
    )
    scales = {"k_scale": torch.tensor([0.5, 2.0]), "v_scale": torch.tensor([1.5, 0.75])}
    eager = DecodeWrapper(
        hq,
        H_KV,
        D,
        page_size=PAGE,
        dtype="float16",
        device="cpu",
        policy="fixed",
        params={"num_splits": 3, "block_n": 16},
        q_len=q_len,
        kv_dtype="float8_e4m3fn",
    )
    graph = DecodeWrapper(
        hq,
        H_KV,
        D,
        page_size=PAGE,
        dtype="float16",
        device="cpu",
        max_batch_size=4,
        policy="stream_k",
        params={"block_n": 16, "num_warps": 4, "num_stages": 2},
        use_cuda_graph=True,
        q_len=q_len,
    )
    out = torch.empty_like(case["q"])
    kv_lens = case["kv_lens"].clone()
    for step in range(2):
        lens = [n + q_len * step for n in lens0]
        kv_lens.copy_(torch.tensor(lens, dtype=torch.int32))
        ref, _ = reference_verify(**{**case, "kv_lens": kv_lens}, q_len=q_len, **scales)
        for w in (eager, graph):
            w.plan(case["kv_indptr"], case["kv_indices"], kv_lens, kv_lens_host=np.asarray(lens, dtype=np.int32))
            out.fill_(float("nan"))
            o = w.run(case["q"], case["k_cache"], case["v_cache"], out=out, **scales)
            assert not torch.isnan(o).any()
            assert (o.float() - ref).abs().max().item() < 5e-3 * ref.abs().max().item(), (step, w.use_cuda_graph)
    assert graph.planner == "device"
    kv_lens.copy_(torch.tensor([3, 13, 30], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"^kv_lens\[0\]: 3 tokens, fewer than q_len=4"):
        eager.plan(case["kv_indptr"], case["kv_indices"], kv_lens)
    with pytest.raises(ValueError, match=r"^kv_lens_host\[0\]: 3 tokens, fewer than q_len=4"):
        graph.plan(case["kv_indptr"], case["kv_indices"], kv_lens, kv_lens_host=np.array([3, 13, 30]))
    with pytest.raises(ValueError, match=r"^k_cache: expected torch.float8_e4m3fn"):
        eager.run(case["q"], case["k_cache"].half(), case["v_cache"].half())
    with pytest.raises(ValueError, match=r"^kv_dtype: float8_e4m3fn needs a float16 or bfloat16 q"):
        DecodeWrapper(hq, H_KV, D, dtype="float32", device="cpu", kv_dtype=FP8)
    with pytest.raises(ValueError, match=r"^q_len: expected an integer in \[1, 8\]"):
        DecodeWrapper(hq, H_KV, D, dtype="float16", device="cpu", q_len=0)


def test_table_entry_with_two_heads_per_tile_keeps_its_work_list_at_q_len_8():
    """The shipped table serves entries with two KV heads per tile (2 x G 8 = 16 rows); at q_len 8 their rows
    (128) exceed a work tile's 64, so the eager wrapper (kernels/wrapper.py::fit_tile_rows) runs the same work
    list with one KV head per tile; at q_len 4 (64 rows) the entry's tile is kept."""
    import json
    from pathlib import Path

    from kvsplit.kernels.policy_table import PolicyTable
    from kvsplit.kernels.wrapper import fit_tile_rows

    raw = json.loads((Path(__file__).resolve().parents[2] / "kernels/data/h200_policies.json").read_text())
    table = PolicyTable.from_export(raw, version=raw.get("policies_version"))
    served, _, info = table.plan(
        np.array([100_000, 3000]),
        gpu="NVIDIA H200",
        num_qo_heads=32,
        num_kv_heads=4,
        head_dim=128,
        dtype="bfloat16",
        page_size=16,
        device="NVIDIA H200",
    )
    assert info["source"] == "tuned" and served.config.heads_per_tile == 2
    assert fit_tile_rows(served, 8, 4) is served
    p = fit_tile_rows(served, 8, 8)
    assert p.config.heads_per_tile == 1 and p.num_work_tiles == 2 * served.num_work_tiles
    assert p.config == dataclasses.replace(served.config, heads_per_tile=1)
    for name in ("work_request", "work_kv_start", "work_kv_end", "cta_indptr", "kv_lens"):
        assert np.array_equal(getattr(p, name), getattr(served, name)), name


def test_bf16_q_beyond_float16_range_is_refused_with_an_fp8_cache():
    """The FP8 kernel dots q and K/V in float16: a finite bfloat16 |q| above 65,504 would become inf there, so the
    validating call refuses it naming q; at the limit, with NaN / inf (as with 16-bit K/V), with a float16 q and
    with a 16-bit cache the check passes. (The interpreter does not take bf16 q, so the check is called directly.)"""
    from kvsplit.kernels.decode import FP16_MAX, check_fp8_q_range

    fp8 = torch.float8_e4m3fn
    q = torch.zeros(2, 4, 8, dtype=torch.bfloat16)
    q[1, 2, 3] = -70_000.0
    with pytest.raises(ValueError, match=r"^q: holds \|q\| = 70144, beyond float16's range \(65504\)"):
        check_fp8_q_range(q, fp8)
    check_fp8_q_range(q, torch.bfloat16)  # a bf16 cache is dotted in bf16
    q[1, 2, 3] = 65_280.0  # the largest bfloat16 within float16's range (65,504 itself rounds to 65,536 in bf16)
    assert float(q.abs().amax()) <= FP16_MAX < float(torch.tensor(FP16_MAX, dtype=torch.bfloat16))
    check_fp8_q_range(q, fp8)
    for special in (float("inf"), float("nan")):
        q[1, 2, 3] = special
        check_fp8_q_range(q, fp8)
    check_fp8_q_range(torch.full((1, 1, 1), 6e4, dtype=torch.float16), fp8)
    check_fp8_q_range(torch.empty(0, 4, 8, dtype=torch.bfloat16), fp8)


def test_eager_auto_wrapper_plans_an_fp8_cache_with_the_fp8_fallback():
    """DecodeWrapper(policy="auto") in eager mode plans with the default table's fallback of its family: at q_len 1
    over an FP8 cache that is FP8_FALLBACK (two KV heads per tile where they fit), so a wrapper without a table and
    one with an empty table plan the same; its output matches the reference. At q_len 4, and for a 16-bit cache,
    balanced."""
    from kvsplit.kernels.policy_table import FALLBACK_POLICY, FP8_FALLBACK, PolicyTable
    from kvsplit.kernels.wrapper import DecodeWrapper

    hq, hkv, d = 8, 2, 64
    lens = [40, 300, 7, 129]
    case = _to_fp8(
        make_case(lens, num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, page_size=PAGE, dtype=torch.float16, seed=5)
    )
    kw = dict(page_size=PAGE, dtype="float16", device="cpu", kv_dtype="float8_e4m3fn")
    alone = DecodeWrapper(hq, hkv, d, **kw)
    tabled = DecodeWrapper(hq, hkv, d, table=PolicyTable.from_json(PolicyTable.document([], version=1)), **kw)
    assert (alone.policy, alone.params) == FP8_FALLBACK  # G = 4: two heads are 8 rows, they fit
    plans = []
    for w in (alone, tabled):
        w.plan(case["kv_indptr"], case["kv_indices"], case["kv_lens"])
        o = w.run(case["q"], case["k_cache"], case["v_cache"])
        args = {f: case[f] for f in ("kv_indptr", "kv_indices", "kv_lens")}
        ref, _ = reference_verify(case["q"], case["k_cache"], case["v_cache"], **args, q_len=1)
        assert float((o.float() - ref.float()).abs().max() / ref.float().abs().max()) < 2e-2
        plans.append(w._plan)
    want = make_plan(
        lens,
        policy="stream_k",
        params=FP8_FALLBACK[1],
        num_kv_heads=hkv,
        num_qo_heads=hq,
        head_dim=d,
        page_size=PAGE,
        dtype="float16",
        device="NVIDIA H200",
        kv_dtype="float8_e4m3fn",
    )
    assert plans[0] == plans[1] == want
    assert DecodeWrapper(hq, hkv, d, **kw, q_len=4).policy == FALLBACK_POLICY
    assert DecodeWrapper(hq, hkv, d, page_size=PAGE, dtype="float16", device="cpu").policy == FALLBACK_POLICY
