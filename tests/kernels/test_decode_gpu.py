"""Kernel correctness on a CUDA GPU in bf16 and fp16, once under every knob value.

Skipped without CUDA (CI); on a CUDA machine: ``python -m pytest -m gpu tests/kernels/test_decode_gpu.py``.
"""

from __future__ import annotations

import pytest
import torch

from kvsplit.kernels.decode import decode_attention, reference_decode_attention
from kvsplit.kernels.plan import make_plan
from kvsplit.kernels.policy_table import FP8_FALLBACK

from .paged_case import make_case

pytestmark = pytest.mark.gpu

LENS = [0, 1, 15, 16, 17, 31, 63, 64, 65, 127, 129, 255, 257, 1000, 3001, 4096]

# every value of every knob at least once (the interpreter ignores warps/stages)
KNOBS = (
    [dict(block_n=b, num_warps=4, num_stages=2) for b in (16, 32, 64, 128, 256)]
    + [dict(block_n=64, num_warps=w, num_stages=2) for w in (1, 2, 4, 8)]
    + [dict(block_n=64, num_warps=4, num_stages=s) for s in (1, 2, 3, 4)]
    + [dict(block_n=64, schedule="persistent", num_programs=n) for n in (1, 7, 528)]
    + [dict(block_n=32, pack_tokens=p, order="heavy_first") for p in (64, 4096)]
)


def _rel_err(o, ref):
    ref = ref.to(o.device)
    return float((o.float() - ref.float()).abs().max() / ref.float().abs().max())


def _graph_replayed(case, plan):
    """``plan``'s output on ``case`` replayed from a CUDA graph on the hot path (``out``, a workspace,
    ``validate=False``, the plan uploaded), the output buffer filled with NaN before the replay."""
    from kvsplit.kernels.decode import make_workspace

    B, hq, d = case["q"].shape
    out = torch.empty_like(case["q"])
    ws = make_workspace(hq, d, max_partials=plan.num_partials, max_batch=B, device="cuda")
    plan.to("cuda")
    decode_attention(**case, plan=plan, out=out, workspace=ws, validate=False)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        decode_attention(**case, plan=plan, out=out, workspace=ws, validate=False)
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    return out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("knobs", KNOBS, ids=lambda k: "-".join(f"{a}{b}" for a, b in k.items()))
def test_knobs(dtype, knobs):
    lens = LENS[:: 1 if knobs.get("block_n", 64) <= 64 else 2]
    case = make_case(
        lens, num_qo_heads=32, num_kv_heads=4, head_dim=128, page_size=16, dtype=dtype, device="cuda", seed=7
    )
    name = "bfloat16" if dtype == torch.bfloat16 else "float16"
    for policy, extra in (("no_split", {}), ("fixed", {"num_splits": 5})):
        try:
            plan = make_plan(
                lens,
                num_kv_heads=4,
                device="NVIDIA H200",
                policy=policy,
                params={**knobs, **extra},
                head_dim=128,
                page_size=16,
                dtype=name,
            )
        except ValueError:
            continue  # rejected by the planner: allowed, with a clear error
        o, lse = decode_attention(**case, plan=plan, return_lse=True)
        ref, ref_lse = reference_decode_attention(**case, return_lse=True)
        torch.cuda.synchronize()
        assert not torch.isnan(o).any()
        assert _rel_err(o, ref) < 2e-2
        finite = torch.isfinite(ref_lse)
        assert torch.equal(finite, torch.isfinite(lse))
        assert float((lse[finite] - ref_lse[finite]).abs().max()) < 2e-2


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("group", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("page_size", [1, 7, 16, 256])
def test_shapes(head_dim, group, page_size):
    lens = [0, 1, page_size - 1 or 1, page_size + 1, 777, 2048]
    hkv = 2
    case = make_case(
        lens,
        num_qo_heads=hkv * group,
        num_kv_heads=hkv,
        head_dim=head_dim,
        page_size=page_size,
        dtype=torch.bfloat16,
        device="cuda",
        seed=head_dim + group + page_size,
    )
    plan = make_plan(
        lens,
        num_kv_heads=hkv,
        device="NVIDIA H200",
        policy="fixed",
        params={"num_splits": 3},
        head_dim=head_dim,
        page_size=page_size,
        dtype="bfloat16",
    )
    o = decode_attention(**case, plan=plan)
    ref = reference_decode_attention(**case)
    assert _rel_err(o, ref) < 2e-2


def test_graph_replay_matches():
    lens = [5000, 17, 300, 0, 9000]
    case = make_case(
        lens, num_qo_heads=32, num_kv_heads=4, head_dim=128, page_size=16, dtype=torch.bfloat16, device="cuda", seed=3
    )
    from kvsplit.kernels.decode import make_workspace

    for params in ({"num_splits": 4}, {"num_splits": 4, "schedule": "persistent", "num_programs": 64}):
        plan = make_plan(lens, num_kv_heads=4, device="NVIDIA H200", policy="fixed", params=params, dtype="bfloat16")
        plan.to("cuda")
        out = torch.empty_like(case["q"])
        ws = make_workspace(32, 128, max_partials=plan.num_partials, max_batch=len(lens), device="cuda")
        decode_attention(**case, plan=plan, out=out, workspace=ws)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            decode_attention(**case, plan=plan, out=out, workspace=ws, validate=False)
        for _ in range(3):
            out.fill_(float("nan"))
            g.replay()
        torch.cuda.synchronize()
        assert _rel_err(out, reference_decode_attention(**case)) < 2e-2


def test_int64_offsets():
    """A cache of more than 2^31 elements: pages past the int32 range are read right."""
    page_size, hkv, d = 16, 8, 128
    per_page = page_size * hkv * d
    num_pages = (2**31 // per_page) + 64
    k = torch.randn((num_pages, page_size, hkv, d), dtype=torch.bfloat16, device="cuda")
    v = torch.randn_like(k)
    lens = [64, 100]
    pages = [num_pages - 4, num_pages - 3, num_pages - 2, num_pages - 1] + [num_pages - 20 + i for i in range(7)]
    case = dict(
        q=torch.randn((2, 32, d), dtype=torch.bfloat16, device="cuda"),
        k_cache=k,
        v_cache=v,
        kv_indptr=torch.tensor([0, 4, 11], dtype=torch.int32, device="cuda"),  # 64 -> 4 pages, 100 -> 7
        kv_indices=torch.tensor(pages, dtype=torch.int32, device="cuda"),
        kv_lens=torch.tensor(lens, dtype=torch.int32, device="cuda"),
    )
    plan = make_plan(
        lens, num_kv_heads=hkv, device="NVIDIA H200", policy="fixed", params={"num_splits": 2}, dtype="bfloat16"
    )
    assert k.numel() > 2**31
    assert _rel_err(decode_attention(**case, plan=plan), reference_decode_attention(**case)) < 2e-2


# ----------------------------------------------------------------------------- stream_k, wave-aware, wrapper


@pytest.mark.parametrize(
    "policy, params",
    [
        ("stream_k", {}),
        ("stream_k", {"ctas_per_sm": 1, "block_n": 256, "num_warps": 8}),
        ("stream_k", {"ctas_per_sm": 3, "min_piece_blocks": 4, "item_cost_blocks": 2, "order": "heavy_first"}),
        ("stream_k", {"ctas_per_sm": 2, "schedule": "persistent", "num_programs": 100}),
        ("balanced", {}),
        ("balanced", {"ctas_per_sm": 4, "block_n": 64}),
        ("tuned", {"partition": "stream_k", "ctas_per_sm": 6}),
    ],
)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_split_policies_match_the_reference(policy, params, dtype):
    lens = [70000, 0, 1, 17, 3000, 129, 5000, 255, 40000, 16]
    case = make_case(
        lens, num_qo_heads=32, num_kv_heads=4, head_dim=128, page_size=16, dtype=dtype, device="cuda", seed=11
    )
    name = "bfloat16" if dtype == torch.bfloat16 else "float16"
    plan = make_plan(
        lens, num_kv_heads=4, device="NVIDIA H200", policy=policy, params=params, head_dim=128, page_size=16, dtype=name
    )
    o, lse = decode_attention(**case, plan=plan, return_lse=True)
    ref, ref_lse = reference_decode_attention(**case, return_lse=True)
    torch.cuda.synchronize()
    assert not torch.isnan(o).any()
    assert _rel_err(o, ref) < 2e-2
    finite = torch.isfinite(ref_lse)
    assert torch.equal(finite, torch.isfinite(lse))
    assert float((lse[finite] - ref_lse[finite]).abs().max()) < 2e-2


@pytest.mark.parametrize(
    "policy, params",
    [
        ("auto", None),  # the graph default: graph_default_config's packed look-ahead tile, stream_k at its residency
        ("stream_k", {}),
        ("tuned", {"wave_aware": False}),
        ("balanced", {}),
        # GQA-packed work tiles (two KV heads of G = 8 per tile) on the device planner and on the host planner
        (
            "stream_k",
            {
                "heads_per_tile": 2,
                "ctas_per_sm": 1.0,
                "block_n": 64,
                "num_warps": 8,
                "num_stages": 3,
                "prefetch": True,
                "next_item": True,
            },
        ),
        ("balanced", {"heads_per_tile": 2, "block_n": 32, "num_stages": 3, "prefetch": True}),
    ],
)
def test_wrapper_graph_replays_across_growing_lens(policy, params):
    """DecodeWrapper in CUDA-graph mode: one capture of run(), replayed for 4 steps while kv_lens grow;
    the work list is planned on the device (stream_k, tuned without the wave search) or on the host."""
    import numpy as np

    from kvsplit.kernels.wrapper import DecodeWrapper

    lens0 = [9000, 0, 17, 300, 65000, 1, 2048]
    w = DecodeWrapper(
        32,
        4,
        128,
        page_size=16,
        dtype="bfloat16",
        device="cuda",
        max_batch_size=16,
        policy=policy,
        params=params,
        use_cuda_graph=True,
    )
    # one cache big enough for every step: make_case's pages for the final lengths, reused by every step
    final = [n + 40 for n in lens0]
    case = make_case(
        final, num_qo_heads=32, num_kv_heads=4, head_dim=128, page_size=16, dtype=torch.bfloat16, device="cuda", seed=5
    )
    out = torch.empty_like(case["q"])
    kv_lens = case["kv_lens"].clone()
    graph = None
    for step in range(4):
        lens = [n + 10 * step for n in lens0]
        kv_lens.copy_(torch.tensor(lens, dtype=torch.int32))
        w.plan(case["kv_indptr"], case["kv_indices"], kv_lens, kv_lens_host=np.asarray(lens, dtype=np.int32))
        if graph is None:
            w.run(case["q"], case["k_cache"], case["v_cache"], out=out)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                w.run(case["q"], case["k_cache"], case["v_cache"], out=out)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref = reference_decode_attention(**{**case, "kv_lens": kv_lens})
        assert not torch.isnan(out).any(), f"step {step}"
        assert _rel_err(out, ref) < 2e-2, f"step {step}"


# ----------------------------------------------------------------------------- the page-id prefetching loop


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("cfg", [(32, 4, 3), (64, 4, 3), (64, 8, 3), (128, 8, 3), (64, 4, 4), (128, 4, 3)])
@pytest.mark.parametrize("schedule", ["grid", "persistent"])
def test_prefetching_loop(dtype, cfg, schedule):
    """params.prefetch on and off on the same partition (stream_k, CTAs crossing requests), against the reference."""
    lens = LENS + [70000]
    case = make_case(
        lens,
        num_qo_heads=32,
        num_kv_heads=4,
        head_dim=128,
        page_size=16,
        dtype=dtype,
        device="cuda",
        seed=cfg[0] + cfg[2],
    )
    name = "bfloat16" if dtype == torch.bfloat16 else "float16"
    ref = reference_decode_attention(**case)
    for prefetch in (True, False):
        params = {
            "ctas_per_sm": 2,
            "block_n": cfg[0],
            "num_warps": cfg[1],
            "num_stages": cfg[2],
            "schedule": schedule,
            "prefetch": prefetch,
        }
        plan = make_plan(lens, num_kv_heads=4, device="NVIDIA H200", policy="stream_k", params=params, dtype=name)
        out = decode_attention(**case, plan=plan, out=torch.full_like(case["q"], float("nan")))
        torch.cuda.synchronize()
        assert not torch.isnan(out).any()
        assert _rel_err(out, ref) < 2e-2


@pytest.mark.parametrize("group", [1, 4, 8, 16])
def test_register_cap_keeps_the_counted_residency(group, monkeypatch):
    """The (64, 4, 2) tile launched at any GQA group compiles to at most the 128 registers its 4 resident
    CTAs per SM need (kernels/residency.py, REGISTER_CAPS; uncapped it takes 150-166 at G != 8), and its
    output (with a merge) matches the reference."""
    from kvsplit.kernels import decode as dec
    from kvsplit.kernels.residency import register_cap

    real, launched = dec._decode_stage1_kernel, []

    class Spy:  # records the compiled kernel of each stage-1 launch (JITFunction.run returns it)
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                k = real[grid](*args, **kwargs)
                launched.append((kwargs.get("maxnreg"), k))
                return k

            return launch

    monkeypatch.setattr(dec, "_decode_stage1_kernel", Spy())
    lens = [5000, 17, 0, 3001, 640]
    hkv = 4
    case = make_case(
        lens,
        num_qo_heads=hkv * group,
        num_kv_heads=hkv,
        head_dim=128,
        page_size=16,
        dtype=torch.bfloat16,
        device="cuda",
        seed=group,
    )
    plan = make_plan(
        lens,
        num_kv_heads=hkv,
        device="NVIDIA H200",
        policy="fixed",
        params={"num_splits": 4, "block_n": 64, "num_warps": 4, "num_stages": 2},
        head_dim=128,
        page_size=16,
        dtype="bfloat16",
    )
    o = decode_attention(**case, plan=plan)
    assert _rel_err(o, reference_decode_attention(**case)) < 2e-2
    cap = register_cap(128, group, 64, 4, 2)
    assert (cap is None) == (group == 8)
    ((maxnreg, kernel),) = launched
    assert maxnreg == cap
    kernel._init_handles()
    assert kernel.n_regs <= 128, (group, kernel.n_regs)


@pytest.mark.parametrize(
    "lens", [[2048] * 128, [5461] * 96, [1024] * 256, [4096] * 64], ids=["b128", "b96", "b256", "b64"]
)
def test_whole_wave_plans_of_the_shipped_table(lens):
    """Batches the shipped H200 table serves with the whole-wave rule (one tile per request on the rule's tile,
    docs/decisions/whole-wave-rule.md; B = 64 on the tile of two KV heads) in bf16 against the fp32 reference, through the table as
    a server answers them."""
    import json
    from pathlib import Path

    from kvsplit.kernels.policy_table import PolicyTable

    raw = json.loads((Path(__file__).resolve().parents[2] / "kernels/data/h200_policies.json").read_text())
    table = PolicyTable.from_export(raw)
    plan, _, policy = table.plan(
        lens, gpu="NVIDIA H200", num_qo_heads=32, num_kv_heads=4, head_dim=128, dtype="bfloat16", page_size=16
    )
    assert policy["params"].get("whole_wave") and int(plan.num_splits.max()) == 1
    case = make_case(
        lens, num_qo_heads=32, num_kv_heads=4, head_dim=128, page_size=16, dtype=torch.bfloat16, device="cuda", seed=13
    )
    o, lse = decode_attention(**case, plan=plan, return_lse=True)
    ref, ref_lse = reference_decode_attention(**case, return_lse=True)
    torch.cuda.synchronize()
    assert not torch.isnan(o).any()
    assert _rel_err(o, ref) < 2e-2
    assert float((lse - ref_lse).abs().max()) < 2e-2


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("hq, hkv, heads", [(32, 4, 2), (32, 8, 2), (32, 8, 4), (16, 4, 4), (4, 4, 2)])
@pytest.mark.parametrize(
    "policy, params",
    [
        ("balanced", {"block_n": 64, "ctas_per_sm": 3}),
        ("stream_k", {"block_n": 32, "num_stages": 3, "prefetch": True, "ctas_per_sm": 6}),
        ("fixed", {"num_splits": 5, "block_n": 16, "schedule": "persistent", "num_programs": 300}),
        ("stream_k", {"block_n": 32, "pack_tokens": 0, "order": "heavy_first", "ctas_per_sm": 2}),
    ],
)
def test_heads_per_tile(dtype, hq, hkv, heads, policy, params):
    """heads_per_tile > 1 (several KV heads' GQA groups in one 16-row tile) against the fp32 reference, and
    replayed from a CUDA graph on the hot path (out, workspace, validate=False)."""
    name = "bfloat16" if dtype == torch.bfloat16 else "float16"
    case = make_case(
        LENS, num_qo_heads=hq, num_kv_heads=hkv, head_dim=128, page_size=16, dtype=dtype, device="cuda", seed=heads
    )
    plan = make_plan(
        LENS,
        num_kv_heads=hkv,
        device="NVIDIA H200",
        policy=policy,
        params={**params, "heads_per_tile": heads},
        head_dim=128,
        page_size=16,
        dtype=name,
    )
    assert plan.num_work_tiles == plan.num_ctas * hkv // heads
    ref, ref_lse = reference_decode_attention(**case, return_lse=True)
    o, lse = decode_attention(**case, plan=plan, return_lse=True)
    torch.cuda.synchronize()
    assert not torch.isnan(o).any() and _rel_err(o, ref) < 2e-2
    finite = torch.isfinite(ref_lse)
    assert torch.equal(finite, torch.isfinite(lse))
    assert float((lse[finite] - ref_lse[finite]).abs().max()) < 2e-2
    out = _graph_replayed(case, plan)
    assert not torch.isnan(out).any() and _rel_err(out, ref) < 2e-2


# ----------------------------------------------------------------------------- the look-ahead over items


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "policy, params",
    [
        ("stream_k", {"ctas_per_sm": 1, "block_n": 64, "num_warps": 8, "num_stages": 3, "heads_per_tile": 2}),
        ("stream_k", {"ctas_per_sm": 1, "block_n": 64, "num_warps": 4, "num_stages": 3}),
        ("fixed", {"num_splits": 3, "block_n": 32, "num_stages": 4, "pack_tokens": 4096}),
        (
            "fixed",
            {
                "num_splits": 1,
                "block_n": 16,
                "num_stages": 3,
                "pack_tokens": 8192,
                "schedule": "persistent",
                "num_programs": 5,
                "heads_per_tile": 2,
            },
        ),
        # a pool plan: balanced puts one item in each CTA, so the look-ahead has no next item there
        ("balanced", {"ctas_per_sm": 2, "block_n": 32, "num_warps": 4, "num_stages": 3, "heads_per_tile": 2}),
        ("stream_k", {"ctas_per_sm": 2, "block_n": 32, "num_warps": 4, "num_stages": 3, "heads_per_tile": 2}),
    ],
)
def test_next_item(dtype, policy, params):
    """params.next_item (the look-ahead over a CTA's items) on CTAs of many items, split and packed (and on
    balanced's CTAs of one item), against the fp32 reference; its output equals the same plan's without the
    look-ahead bit for bit (same math, same order), also replayed from a CUDA graph on the hot path."""
    lens = LENS + [70000, 3, 0, 900]
    name = "bfloat16" if dtype == torch.bfloat16 else "float16"
    case = make_case(
        lens, num_qo_heads=32, num_kv_heads=4, head_dim=128, page_size=16, dtype=dtype, device="cuda", seed=11
    )
    ref, ref_lse = reference_decode_attention(**case, return_lse=True)
    outs, plans = [], []
    for nx in (True, False):
        plan = make_plan(
            lens,
            num_kv_heads=4,
            device="NVIDIA H200",
            policy=policy,
            params={**params, "prefetch": True, "next_item": nx},
            dtype=name,
        )
        assert plan.config.next_item is nx
        items = int((plan.cta_indptr[1:] - plan.cta_indptr[:-1]).max())
        assert items == 1 if policy == "balanced" else items >= 3  # CTAs of several items
        o, lse = decode_attention(**case, plan=plan, return_lse=True)
        torch.cuda.synchronize()
        assert not torch.isnan(o).any() and _rel_err(o, ref) < 2e-2
        finite = torch.isfinite(ref_lse)
        assert torch.equal(finite, torch.isfinite(lse))
        assert float((lse[finite] - ref_lse[finite]).abs().max()) < 2e-2
        outs.append(o)
        plans.append(plan)
    assert torch.equal(outs[0], outs[1])
    assert torch.equal(_graph_replayed(case, plans[0]), outs[0])  # the next_item plan


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "policy, params",
    [
        (
            "stream_k",
            {
                "ctas_per_sm": 2,
                "block_n": 32,
                "num_warps": 4,
                "num_stages": 3,
                "prefetch": True,
                "heads_per_tile": 2,
                "next_item": True,
            },
        ),
        (
            "stream_k",
            {
                "ctas_per_sm": 1,
                "block_n": 64,
                "num_warps": 8,
                "num_stages": 3,
                "prefetch": True,
                "heads_per_tile": 2,
                "next_item": True,
            },
        ),
        (
            "balanced",
            {"ctas_per_sm": 3, "block_n": 32, "num_warps": 4, "num_stages": 3, "prefetch": True, "heads_per_tile": 2},
        ),
        ("fixed", {"num_splits": 40}),
        ("fixed", {"num_splits": 5, "schedule": "persistent", "num_programs": 64}),
    ],
    ids=["sk_c2_h2_nx", "sk_c1_w8_nx", "bal_c3_h2", "fixed40", "fixed5_persistent"],
)
def test_overlapped_merge(dtype, policy, params):
    """The overlapped merge (the merge launched with PDL, waiting on per-(request, head, chunk) arrival
    counters), which launch_rule picks from 256 merged (request, query head) pairs on: bit-identical to the
    merge after stage 1 (what the rule runs for a workspace without counters; the same fold in the same order),
    eagerly and on 40 CUDA-graph replays (a race on a partial shows up as a differing replay), and every counter
    back at zero afterwards."""
    import dataclasses

    from kvsplit.kernels.decode import launch_decode, make_workspace

    lens = [60000, 17, 300, 0, 9000] + [1000 + 37 * i for i in range(120)]
    name = "bfloat16" if dtype == torch.bfloat16 else "float16"
    case = make_case(
        lens, num_qo_heads=32, num_kv_heads=4, head_dim=128, page_size=16, dtype=dtype, device="cuda", seed=21
    )
    plan = make_plan(
        lens, num_kv_heads=4, device="NVIDIA H200", policy=policy, params=params, head_dim=128, page_size=16, dtype=name
    )
    assert plan.launch_sizes()["num_merge"] * 32 >= 256  # the overlapped merge's regime
    arrays = plan.to("cuda")
    ws = make_workspace(32, 128, max_partials=plan.num_partials, max_batch=len(lens), device="cuda")
    args = (case["q"], case["k_cache"], case["v_cache"], case["kv_indptr"], case["kv_indices"], arrays, plan.config)
    base = torch.empty_like(case["q"])  # the merge after stage 1: no counters in the workspace
    launch_decode(*args, out=base, workspace=dataclasses.replace(ws, sync=None), **plan.launch_sizes())
    out = torch.full_like(case["q"], float("nan"))
    launch_decode(*args, out=out, workspace=ws, **plan.launch_sizes())
    torch.cuda.synchronize()
    assert torch.equal(out, base)
    assert _rel_err(out, reference_decode_attention(**case)) < 2e-2
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        launch_decode(*args, out=out, workspace=ws, **plan.launch_sizes())
    bad = 0
    for _ in range(40):
        out.fill_(float("nan"))
        g.replay()
        bad += int(not torch.equal(out, base))
    torch.cuda.synchronize()
    assert bad == 0, f"{bad} of 40 replays differ from the merge after stage 1"
    assert int(ws.sync.abs().sum()) == 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_overlapped_merge_device_resident(dtype):
    """The overlapped merge on DecodeWrapper's CUDA-graph buffers (the device planner's work list, a persistent
    stage 1, a merge grid of max_batch_size programs per query head, idle ones past counts[3]): bit-identical to
    the merge after stage 1 on 40 replays of one graph, the counters zero afterwards."""
    import dataclasses

    import numpy as np

    from kvsplit.kernels.decode import launch_decode
    from kvsplit.kernels.wrapper import DecodeWrapper

    lens = [60000, 17, 300, 0, 9000] + [1000 + 37 * i for i in range(60)]
    name = "bfloat16" if dtype == torch.bfloat16 else "float16"
    case = make_case(
        lens, num_qo_heads=32, num_kv_heads=4, head_dim=128, page_size=16, dtype=dtype, device="cuda", seed=23
    )
    w = DecodeWrapper(
        32, 4, 128, page_size=16, dtype=name, device="cuda", max_batch_size=256, policy="stream_k", use_cuda_graph=True
    )
    w.plan(case["kv_indptr"], case["kv_indices"], case["kv_lens"], kv_lens_host=np.asarray(lens))
    assert w.planner == "device"
    args = (
        case["q"],
        case["k_cache"],
        case["v_cache"],
        case["kv_indptr"],
        case["kv_indices"],
        w.bufs.arrays(),
        w.config,
    )
    kw = dict(workspace=w.workspace, counts=w.bufs.counts, max_merge=w.max_batch_size)
    base = torch.empty_like(case["q"])  # the merge after stage 1: no counters in the workspace
    launch_decode(*args, out=base, **{**kw, "workspace": dataclasses.replace(w.workspace, sync=None)})
    torch.cuda.synchronize()
    assert int(w.bufs.counts[3]) > 0
    assert _rel_err(base, reference_decode_attention(**case)) < 2e-2
    out = torch.full_like(case["q"], float("nan"))
    launch_decode(*args, out=out, **kw)
    torch.cuda.synchronize()
    assert torch.equal(out, base)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        launch_decode(*args, out=out, **kw)
    bad = 0
    for _ in range(40):
        out.fill_(float("nan"))
        g.replay()
        bad += int(not torch.equal(out, base))
    torch.cuda.synchronize()
    assert bad == 0, f"{bad} of 40 replays differ from the merge after stage 1"
    assert int(w.workspace.sync.abs().sum()) == 0


# ----------------------------------------------------------------------------- fp8 KV cache, q_len 2-8

FP8_CONFIGS = [
    ("fixed", {"num_splits": 1, "block_n": 128, "num_warps": 4, "num_stages": 2}),
    ("fixed", {"num_splits": 5, "block_n": 64, "num_warps": 4, "num_stages": 3}),
    ("stream_k", {"block_n": 32, "num_stages": 3, "prefetch": True, "ctas_per_sm": 4}),
    (
        "stream_k",
        {"heads_per_tile": 2, "block_n": 64, "num_warps": 8, "num_stages": 3, "prefetch": True, "next_item": True},
    ),
    ("balanced", {"block_n": 64, "schedule": "persistent", "num_programs": 264}),
    FP8_FALLBACK,  # what an fp8 family without a tuned bucket is served
]
VERIFY_LENS = [8, 15, 16, 17, 64, 65, 129, 1000, 3001, 4096, 9000]


def _verify_case(lens, q_len, *, fp8, seed, hq=32, hkv=4):
    from .paged_case import make_case as _make

    case = _make(
        lens,
        num_qo_heads=hq,
        num_kv_heads=hkv,
        head_dim=128,
        page_size=16,
        dtype=torch.bfloat16,
        device="cuda",
        seed=seed,
        q_len=q_len,
    )
    if fp8:
        for name in ("k_cache", "v_cache"):
            case[name] = case[name].float().to(torch.float8_e4m3fn)
    return case


def _verify_plan(lens, policy, params, hkv=4):
    return make_plan(
        lens,
        num_kv_heads=hkv,
        device="NVIDIA H200",
        policy=policy,
        params=params,
        head_dim=128,
        page_size=16,
        dtype="bfloat16",
    )


def _check_verify(case, plan, q_len, **kw):
    """decode_attention with q_len / scales against the fp32 reference on the dequantized cache (bf16-level
    tolerance), then the same call replayed from a CUDA graph on the hot path."""
    from kvsplit.kernels.decode import make_workspace

    from .paged_case import reference_verify

    ref, ref_lse = reference_verify(**case, q_len=q_len, k_scale=kw.get("k_scale"), v_scale=kw.get("v_scale"))
    ref = ref.to("cuda")  # (the reference runs on the CPU)
    o, lse = decode_attention(**case, plan=plan, return_lse=True, q_len=q_len, **kw)
    torch.cuda.synchronize()
    assert not torch.isnan(o).any()
    assert _rel_err(o, ref) < 2e-2
    assert float((lse.cpu() - ref_lse).abs().max()) < 2e-2
    rows, hq, d = case["q"].shape
    out = torch.empty_like(case["q"])
    ws = make_workspace(hq, d, max_partials=plan.num_partials, max_batch=rows // q_len, device="cuda", q_len=q_len)
    plan.to("cuda")
    decode_attention(**case, plan=plan, out=out, workspace=ws, validate=False, q_len=q_len, **kw)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        decode_attention(**case, plan=plan, out=out, workspace=ws, validate=False, q_len=q_len, **kw)
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert not torch.isnan(out).any() and _rel_err(out, ref) < 2e-2


@pytest.mark.parametrize("q_len", [1, 4])
@pytest.mark.parametrize("scales", ["tensor", "head"])
@pytest.mark.parametrize("policy, params", FP8_CONFIGS, ids=lambda x: str(x) if isinstance(x, str) else None)
def test_fp8_kv_cache(q_len, scales, policy, params):
    """bf16 q with a float8_e4m3fn cache, scales != 1 per tensor and per KV head, under several tiles and plans
    (split and unsplit, two KV heads per tile, persistent), against the fp32 reference on the dequantized values."""
    case = _verify_case(VERIFY_LENS, q_len, fp8=True, seed=q_len + len(params))
    if scales == "tensor":
        kw = {"k_scale": 0.37, "v_scale": 2.5}
    else:
        kw = {
            "k_scale": torch.tensor([0.5, 1.75, 0.3, 1.0], device="cuda"),
            "v_scale": torch.tensor([3.0, 0.25, 1.2, 0.9], device="cuda"),
        }
    _check_verify(case, _verify_plan(VERIFY_LENS, policy, params), q_len, **kw)


@pytest.mark.parametrize("policy, params", [FP8_CONFIGS[1], FP8_CONFIGS[3]], ids=["fixed5", "stream_k_hpt2"])
def test_fp8_v_widening_by_ptx_matches_tritons_conversion(monkeypatch, policy, params):
    """The inline-PTX V widening (``KV_FP8 = 2``, ``cvt.rn.f16x2.e4m3x2``, what a launch on sm_89+ runs) gives
    the output of Triton's own float8_e4m3fn -> float16 conversion (``KV_FP8 = 1``, forced here): both widen
    exactly (every e4m3 value is a float16 value), so the two outputs differ by accumulation order at most.
    Per-head scales, q_len 4, a split plan and a two-heads-per-tile stream-K plan."""
    import kvsplit.kernels.decode as dec

    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("cvt.rn.f16x2.e4m3x2 needs compute capability 8.9+")
    assert dec._fp8_widen_mode(torch.device("cuda")) == 2
    case = _verify_case(VERIFY_LENS, 4, fp8=True, seed=23)
    kw = {
        "k_scale": torch.tensor([0.5, 1.75, 0.3, 1.0], device="cuda"),
        "v_scale": torch.tensor([3.0, 0.25, 1.2, 0.9], device="cuda"),
    }
    plan = _verify_plan(VERIFY_LENS, policy, params)
    o_ptx, lse_ptx = decode_attention(**case, plan=plan, return_lse=True, q_len=4, **kw)
    monkeypatch.setattr(dec, "_fp8_widen_mode", lambda device: 1)
    o_cvt, lse_cvt = decode_attention(**case, plan=plan, return_lse=True, q_len=4, **kw)
    torch.cuda.synchronize()
    assert not torch.isnan(o_ptx).any() and not torch.isnan(o_cvt).any()
    assert _rel_err(o_ptx, o_cvt) < 2e-3
    # the LSE comes from Q @ K alone, which the V widening does not touch
    assert float((lse_ptx - lse_cvt).abs().max()) < 1e-5


@pytest.mark.parametrize("q_len", [2, 4, 8])
@pytest.mark.parametrize("policy, params", FP8_CONFIGS, ids=lambda x: str(x) if isinstance(x, str) else None)
def test_q_len_bf16(q_len, policy, params):
    """q_len 2, 4, 8 query tokens per request in bf16 (causal within the new tokens), kv_lens around page and
    tile boundaries, NaN in unused slots; two KV heads per tile only where their rows fit (2 * 8 * q_len <= 64)."""
    if params.get("heads_per_tile", 1) * 8 * q_len > 64:
        pytest.skip("heads_per_tile 2 x G 8 x q_len 8 = 128 rows: refused (tests/kernels/test_verify_fp8.py)")
    case = _verify_case(VERIFY_LENS, q_len, fp8=False, seed=q_len)
    _check_verify(case, _verify_plan(VERIFY_LENS, policy, params), q_len)


def test_a_kernel_too_large_for_a_cta_is_a_clear_error_and_the_process_goes_on():
    """(64, 4, 4) with the prefetch and two KV heads per tile at q_len 4 (G = 8) compiles to 278,528 B of shared
    memory for sm_90 (bench/compile_sm90.py --configs 64,4,4 --variants prefetch --heads 2 --q-len 4), over the
    232,448 B a CTA may have. Planned at q_len 1 (where the planner takes it) and launched at q_len 4, the launch
    raises ValueError naming the knobs (a tuner's trial is pruned for it), nothing ran, and the next plan of the
    process runs and is right."""
    from kvsplit.tuner.gpu import GpuTimer

    big = {"block_n": 64, "num_warps": 4, "num_stages": 4, "prefetch": True, "heads_per_tile": 2}
    case = _verify_case(VERIFY_LENS, 4, fp8=False, seed=11)
    plan = _verify_plan(VERIFY_LENS, "stream_k", big)
    want = r"^params: block_n=64, num_warps=4, num_stages=4, prefetch=True, heads_per_tile=2 at q_len=4.*278528"
    with pytest.raises(ValueError, match=want):
        decode_attention(**case, plan=plan, q_len=4)
    timer = GpuTimer(num_qo_heads=32, num_kv_heads=4, head_dim=128, max_tokens=1 << 17, max_batch=64, q_len=4)
    lens = [4096] * 16
    with pytest.raises(ValueError, match=want):
        timer.time_plan(_verify_plan(lens, "stream_k", big))
    assert timer.time_plan(_verify_plan(lens, "stream_k", {**big, "num_stages": 3})) > 0
    _check_verify(case, _verify_plan(VERIFY_LENS, "stream_k", {**big, "num_stages": 3}), 4)


@pytest.mark.parametrize("kv_fp8", [False, True])
@pytest.mark.parametrize("policy, params", [("auto", None), ("balanced", {})])
def test_wrapper_q_len4_graph_and_eager_over_growing_lens(kv_fp8, policy, params):
    """DecodeWrapper(q_len=4) in CUDA-graph mode (one capture replayed for 4 steps while kv_lens grow; the device
    planner for the default rule, the host planner for balanced) and in eager mode, bf16 or fp8 cache with
    per-head scales read on the device, against the reference every step."""
    import numpy as np

    from kvsplit.kernels.wrapper import DecodeWrapper

    from .paged_case import reference_verify

    q_len = 4
    lens0 = [9000, 4, 17, 300, 65000, 13, 2048]
    final = [n + 10 * 4 for n in lens0]
    case = _verify_case(final, q_len, fp8=kv_fp8, seed=41)
    kw = {}
    if kv_fp8:
        kw = {
            "k_scale": torch.tensor([0.5, 1.5, 0.8, 1.1], device="cuda"),
            "v_scale": torch.tensor([2.0, 0.6, 1.0, 1.3], device="cuda"),
        }
    wrappers = {
        "graph": DecodeWrapper(
            32,
            4,
            128,
            dtype="bfloat16",
            device="cuda",
            max_batch_size=16,
            policy=policy,
            params=params,
            use_cuda_graph=True,
            q_len=q_len,
        ),
        "eager": DecodeWrapper(32, 4, 128, dtype="bfloat16", device="cuda", q_len=q_len),
    }
    out = torch.empty_like(case["q"])
    kv_lens = case["kv_lens"].clone()
    graph = None
    for step in range(4):
        lens = [n + 10 * step for n in lens0]
        kv_lens.copy_(torch.tensor(lens, dtype=torch.int32))
        ref = reference_verify(**{**case, "kv_lens": kv_lens}, q_len=q_len, **kw)[0].to("cuda")
        host = np.asarray(lens, dtype=np.int32)
        w = wrappers["graph"]
        w.plan(case["kv_indptr"], case["kv_indices"], kv_lens, kv_lens_host=host)
        if graph is None:
            w.run(case["q"], case["k_cache"], case["v_cache"], out=out, **kw)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                w.run(case["q"], case["k_cache"], case["v_cache"], out=out, **kw)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert not torch.isnan(out).any(), f"graph step {step}"
        assert _rel_err(out, ref) < 2e-2, f"graph step {step}"
        e = wrappers["eager"]
        e.plan(case["kv_indptr"], case["kv_indices"], kv_lens)
        o = e.run(case["q"], case["k_cache"], case["v_cache"], **kw)
        torch.cuda.synchronize()
        assert not torch.isnan(o).any() and _rel_err(o, ref) < 2e-2, f"eager step {step}"


@pytest.mark.parametrize("host_copies", ["page_ids", True, False], ids=["host_page_ids", "host_copies", "device_read"])
def test_eager_wrapper_loop_with_the_shipped_table(host_copies):
    """Eager DecodeWrapper on CUDA with the shipped table: plan() from the engine's host copies (with the page ids
    too: no wait for the device; or reading the device tensors back), its arrays uploaded through the pinned
    buffers by one asynchronous copy, then run() on every layer; 6 steps of growing lengths (the buffers grow and
    are reused), each against the fp32 reference, the launch arrays equal to the host plan's; then a negative page
    id refused naming kv_indices (kv_indices_host when given)."""
    import numpy as np

    from kvsplit.kernels import load_shipped_table
    from kvsplit.kernels.wrapper import DecodeWrapper

    w = DecodeWrapper(32, 4, 128, page_size=16, device="cuda", max_batch_size=256, table=load_shipped_table())
    rng = np.random.default_rng(3)
    lens = list(rng.integers(1, 9000, 200)) + [0, 70000]
    for step in range(6):
        case = make_case(
            lens, num_qo_heads=32, num_kv_heads=4, head_dim=128, page_size=16, dtype=torch.bfloat16, device="cuda",
            seed=step,
        )  # fmt: skip
        host = (
            dict(kv_lens_host=np.asarray(lens), kv_indptr_host=case["kv_indptr"].cpu().numpy()) if host_copies else {}
        )
        if host_copies == "page_ids":
            host["kv_indices_host"] = case["kv_indices"].cpu().numpy()
        assert w.plan(case["kv_indptr"], case["kv_indices"], case["kv_lens"], **host) is None
        want = w.last_plan.to("cuda")
        for name, t in w._arrays.items():
            assert torch.equal(t[: want[name].shape[0]], want[name]), (step, name)  # its region's start
            assert t.data_ptr() % 16 == 0, (step, name)
        ref = reference_decode_attention(**case)
        for _layer in range(2):
            o = w.run(case["q"], case["k_cache"], case["v_cache"])
            torch.cuda.synchronize()
            assert not torch.isnan(o).any() and _rel_err(o, ref) < 2e-2, step
        lens = [n + 1 + 37 * (i % 3) * step for i, n in enumerate(lens)]
    bad = case["kv_indices"].clone()
    bad[3] = -1
    if host_copies == "page_ids":
        host["kv_indices_host"] = bad.cpu().numpy()
    with pytest.raises(ValueError, match=r"^kv_indices(_host\[3\])?: negative page id -1"):
        w.plan(case["kv_indptr"], bad, case["kv_lens"], **host)
