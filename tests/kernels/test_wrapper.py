"""DecodeWrapper decode loops on the CPU interpreter (fp16) against the fp32 reference.

Shuffled pages, NaN in every unused slot (tests/kernels/paged_case.py), kv_lens growing
across steps; eager mode, graph mode with the device planner and with the host
planner (the graph itself needs CUDA; the same buffers and launches run here).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvsplit.kernels.buckets import bucket_key
from kvsplit.kernels.decode import decode_attention, reference_decode_attention
from kvsplit.kernels.device import resolve_device
from kvsplit.kernels.plan import make_plan
from kvsplit.kernels.policy_table import PolicyTable
from kvsplit.kernels.residency import resident_ctas_per_sm
from kvsplit.kernels.wrapper import DecodeWrapper, GraphOptions

from .paged_case import make_case

H_Q, H_KV, D, PS = 4, 2, 64, 16


def _wrapper(hq=H_Q, hk=H_KV, d=D, **kw):
    """An fp16 DecodeWrapper on the CPU with page size PS, of the module's shape (H_Q, H_KV, D) unless given."""
    return DecodeWrapper(hq, hk, d, page_size=PS, dtype="float16", device="cpu", **kw)


def _loop(w, lens0, steps=3, grow=(1, 17, 40), seed=0, shape=(H_Q, H_KV, D)):
    lens = list(lens0)
    for step in range(steps):
        case = make_case(
            lens,
            num_qo_heads=shape[0],
            num_kv_heads=shape[1],
            head_dim=shape[2],
            page_size=PS,
            dtype=torch.float16,
            seed=seed + step,
        )
        w.plan(case["kv_indptr"], case["kv_indices"], case["kv_lens"], kv_lens_host=np.array(lens, dtype=np.int32))
        ref, ref_lse = reference_decode_attention(**case, return_lse=True)
        for _layer in range(2):
            out = torch.empty_like(case["q"])
            o, lse = w.run(case["q"], case["k_cache"], case["v_cache"], out=out, return_lse=True)
            assert o is out and not torch.isnan(o).any(), "NaN reached the output"
            err = (o.float() - ref.float()).abs().max().item()
            assert err < 5e-3, f"step {step}: max |o - ref| = {err}"
            fin = torch.isfinite(ref_lse)
            assert torch.equal(fin, torch.isfinite(lse))
            if fin.any():
                assert (lse[fin] - ref_lse[fin]).abs().max().item() < 1e-3
        lens = [n + grow[i % len(grow)] for i, n in enumerate(lens)]


def _stream_k_table(lens, params, name="stream_k", num_kv_heads=H_KV, head_dim=D):
    """A one-entry PolicyTable: policy ``name`` (default stream_k) with ``params`` for the bucket of ``lens``."""
    key = bucket_key(
        lens, num_kv_heads=num_kv_heads, head_dim=head_dim, dtype="float16", device="NVIDIA H200", page_size=PS
    )
    pol = {
        "id": 1,
        "version": 1,
        "bucket": str(key),
        "gpu": "NVIDIA H200",
        "num_kv_heads": num_kv_heads,
        "head_dim": head_dim,
        "dtype": "float16",
        "page_size": PS,
        "name": name,
        "params": params,
        "backend": "gpu",
    }
    return PolicyTable.from_json(PolicyTable.document([pol], version=1))


def test_eager_balanced():
    w = _wrapper(max_batch_size=8)
    _loop(w, [0, 5, 300, 1000, 33])


def test_dtype_given_as_a_torch_dtype():
    """``dtype=torch.float16`` (FlashInfer's q_data_type form) is the wrapper of ``"float16"``: same name, same
    outputs against the reference; an fp32 q for it is refused naming q."""
    w = DecodeWrapper(H_Q, H_KV, D, page_size=PS, dtype=torch.float16, device="cpu", max_batch_size=8)
    assert w.dtype == "float16"
    _loop(w, [0, 5, 300], steps=1)
    case = make_case([7], num_qo_heads=H_Q, num_kv_heads=H_KV, head_dim=D, page_size=PS, dtype=torch.float16)
    w.plan(case["kv_indptr"], case["kv_indices"], case["kv_lens"])
    with pytest.raises(ValueError, match=r"^q: expected torch.float16"):
        w.run(case["q"].float(), case["k_cache"], case["v_cache"])


def test_eager_with_table():
    lens = [0, 5, 300, 1000, 33]
    table = _stream_k_table(lens, {"ctas_per_sm": 0.25})
    w = _wrapper(max_batch_size=8, table=table)
    _loop(w, lens, steps=2)
    assert w._plan.policy == "stream_k"


@pytest.mark.parametrize(
    "policy,params,planner",
    [
        ("stream_k", {"ctas_per_sm": 0.25}, "device"),
        ("tuned", {"wave_aware": False, "ctas_per_sm": 0.1 + 0.15}, "device"),
        ("balanced", {}, "host"),
    ],
)
def test_graph_mode_buffers(policy, params, planner):
    w = _wrapper(
        max_batch_size=8,
        policy=policy,
        params=params,
        use_cuda_graph=True,
        graph=GraphOptions(num_programs=3, max_work_items=256, repick_every=2),
    )
    assert w.planner == planner
    _loop(w, [0, 5, 300, 1000, 33], steps=3)
    _loop(w, [7, 2000, 1], steps=2, seed=9)  # the batch size changes: re-pick


def test_graph_mode_keeps_the_prefetch_knob():
    # graph mode fixes the kernel config at construction: the given params.prefetch is part of it (an earlier
    # version dropped it, so the graph ran the plain loop)
    w = _wrapper(
        max_batch_size=4,
        policy="stream_k",
        params={"num_stages": 3, "prefetch": True},
        use_cuda_graph=True,
        graph=GraphOptions(num_programs=2, max_work_items=64),
    )
    _loop(w, [50, 700, 64], steps=2)
    assert w.config.prefetch and w.config.num_stages == 3


def test_graph_mode_batch_at_max_and_one():
    w = _wrapper(
        max_batch_size=6,
        policy="stream_k",
        use_cuda_graph=True,
        graph=GraphOptions(num_programs=2, max_work_items=64),
    )
    _loop(w, [50, 1, 0, 700, 64, 65], steps=2)
    _loop(w, [123], steps=2)


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match="num_qo_heads"):
        DecodeWrapper(6, 4, 64, device="cpu")
    with pytest.raises(ValueError, match="params.ctas_per_sm"):
        DecodeWrapper(4, 2, 64, device="cpu", params={"ctas_per_sm": -1})
    w = _wrapper(max_batch_size=4)
    case = make_case([5, 40], num_qo_heads=H_Q, num_kv_heads=H_KV, head_dim=D, page_size=PS, dtype=torch.float16)
    with pytest.raises(ValueError, match="plan"):
        w.run(case["q"], case["k_cache"], case["v_cache"])
    with pytest.raises(ValueError, match="kv_lens"):
        w.plan(case["kv_indptr"], case["kv_indices"], case["kv_lens"].long())
    bad = case["kv_lens"].clone()
    bad[1] = 999
    with pytest.raises(ValueError, match=r"kv_lens\[1\]"):
        w.plan(case["kv_indptr"], case["kv_indices"], bad)
    w.plan(case["kv_indptr"], case["kv_indices"], case["kv_lens"])
    with pytest.raises(ValueError, match="kv_indices"):
        w.run(case["q"], case["k_cache"][:1], case["v_cache"][:1])
    with pytest.raises(ValueError, match="q"):
        w.run(case["q"].float(), case["k_cache"], case["v_cache"])
    big = make_case([1] * 5, num_qo_heads=H_Q, num_kv_heads=H_KV, head_dim=D, page_size=PS, dtype=torch.float16)
    with pytest.raises(ValueError, match="max_batch_size"):
        w.plan(big["kv_indptr"], big["kv_indices"], big["kv_lens"])
    g = _wrapper(
        use_cuda_graph=True,
        max_batch_size=4,
        policy="balanced",
        graph=GraphOptions(num_programs=2, max_work_items=64),
    )  # the host planner needs kv_lens_host
    with pytest.raises(ValueError, match="kv_lens_host: required by the host planner"):
        g.plan(case["kv_indptr"], case["kv_indices"], case["kv_lens"])


def test_bfloat16_under_the_interpreter_is_refused():
    # Triton 3.6's interpreter computes tl.dot on bfloat16 wrongly (a newcomer's bf16 CPU run printed a max
    # error of 8e8 with no warning): a clear error naming the argument instead
    with pytest.raises(ValueError, match="dtype: bfloat16 under Triton's interpreter"):
        DecodeWrapper(H_Q, H_KV, D, page_size=PS, dtype="bfloat16", device="cpu")
    case = make_case([5, 40], num_qo_heads=H_Q, num_kv_heads=H_KV, head_dim=D, page_size=PS, dtype=torch.bfloat16)
    plan = make_plan(
        [5, 40], num_kv_heads=H_KV, device="NVIDIA H200", policy="balanced", head_dim=D, page_size=PS, dtype="bfloat16"
    )
    with pytest.raises(ValueError, match="q: bfloat16 under Triton's interpreter"):
        decode_attention(
            case["q"], case["k_cache"], case["v_cache"], case["kv_indptr"], case["kv_indices"], case["kv_lens"], plan
        )


def test_graph_mode_leaves_the_whole_wave_rule_out():
    # the whole-wave rule picks a tile per batch; a captured graph keeps one, so graph mode plans with the
    # policy's own rule (on the device) and the wrapper's tile, whatever whole_wave says
    w = _wrapper(
        max_batch_size=8,
        policy="stream_k",
        params={"ctas_per_sm": 0.25, "whole_wave": 1.0},
        use_cuda_graph=True,
        graph=GraphOptions(num_programs=3, max_work_items=256),
    )
    assert w.planner == "device" and "whole_wave" not in w.spec.params and not w.spec.whole_wave_specs
    _loop(w, [64] * 8, steps=2)


def test_eager_and_graph_mode_with_heads_per_tile():
    # eager mode runs the plan's two KV heads per work tile (H_q 4 / H_kv 2: G = 2); so does graph mode, planned on
    # the device (num_tiles = num_ctas: one tile holds both KV heads) and on the host (uploaded counts)
    params = {"ctas_per_sm": 0.25, "heads_per_tile": 2}
    w = _wrapper(max_batch_size=8, policy="stream_k", params=params)
    _loop(w, [0, 5, 300, 1000, 33], steps=2)
    assert w._plan.config.heads_per_tile == 2 and w._plan.num_work_tiles == w._plan.num_ctas
    for planner in ("device", "host"):
        g = _wrapper(
            max_batch_size=8,
            policy="stream_k",
            params=params,
            use_cuda_graph=True,
            graph=GraphOptions(num_programs=3, max_work_items=256, planner=planner),
        )
        assert g.planner == planner and g.config.heads_per_tile == 2
        _loop(g, [0, 5, 300, 1000, 33], steps=2)
        C = int(g.bufs.counts[1])
        assert C >= 2 and int(g.bufs.counts[2]) == C  # tiles = CTAs x H_kv / heads_per_tile
    # a re-picked table entry keeps the wrapper's heads_per_tile: one tuned with one head per tile is on another
    # tile; this one holds several CTAs per SM, so the entry keeps its rule and its 2 CTAs per SM
    lens = [900, 40, 7]
    table = _stream_k_table(lens, {"ctas_per_sm": 2.0})
    g = _wrapper(
        max_batch_size=8,
        table=table,
        params={"heads_per_tile": 2},
        use_cuda_graph=True,
        graph=GraphOptions(num_programs=3, max_work_items=256),
    )
    _loop(g, lens, steps=1)
    assert (
        g.graph_residency
        == resident_ctas_per_sm(resolve_device("NVIDIA H200"), D, "float16", 2, 64, 4, 2, heads_per_tile=2)
        >= 2
    )
    assert (g.spec.policy, g.spec.params) == ("stream_k", {**g.spec.params, "ctas_per_sm": 2.0, "heads_per_tile": 2})


def test_graph_mode_heads_per_tile_beyond_the_gqa_rows_is_refused():
    # H_q 32 / H_kv 2: G = 16 query rows per KV head, so two heads (32 rows) do not fit one work tile
    with pytest.raises(ValueError, match="params.heads_per_tile: 2 KV heads of GQA group G=16"):
        _wrapper(
            32,
            2,
            D,
            max_batch_size=8,
            policy="stream_k",
            params={"heads_per_tile": 2},
            use_cuda_graph=True,
        )


def test_graph_mode_plan_with_the_overlapped_merge(monkeypatch):
    """A device-resident plan (the device planner's buffers, a merge grid of max_batch_size programs per query
    head) run with the overlapped merge (what launch_rule picks for it where PDL runs; forced here, where the
    interpreter has none): the split items count their arrivals in ``workspace.sync``, the merge programs of the
    merged requests wait for them and reset their counters, and the idle programs past ``counts[3]`` touch none.
    Under the interpreter the merge runs after stage 1: the output and LSE match the fp32 reference and every
    counter is zero after each of two calls (a graph replay)."""
    import dataclasses

    from kvsplit.kernels import decode as dec
    from kvsplit.kernels.decode import launch_decode

    rule = dec.launch_rule
    monkeypatch.setattr(dec, "launch_rule", lambda *a, **kw: dataclasses.replace(rule(*a, **kw), merge_overlap=True))

    lens = [0, 900, 5, 300, 1000]
    w = _wrapper(
        max_batch_size=8,
        policy="stream_k",
        params={"ctas_per_sm": 0.25},
        use_cuda_graph=True,
        graph=GraphOptions(num_programs=3, max_work_items=256),
    )
    case = make_case(lens, num_qo_heads=H_Q, num_kv_heads=H_KV, head_dim=D, page_size=PS, dtype=torch.float16, seed=4)
    w.plan(case["kv_indptr"], case["kv_indices"], case["kv_lens"], kv_lens_host=np.array(lens))
    assert w.planner == "device" and int(w.bufs.counts[3]) >= 2  # two or more requests are split and merged
    ref, ref_lse = reference_decode_attention(**case, return_lse=True)
    for call in range(2):
        out = torch.full_like(case["q"], float("nan"))
        o, lse = launch_decode(
            case["q"],
            case["k_cache"],
            case["v_cache"],
            case["kv_indptr"],
            case["kv_indices"],
            w.bufs.arrays(),
            w.config,
            out=out,
            workspace=w.workspace,
            counts=w.bufs.counts,
            max_merge=w.max_batch_size,
            return_lse=True,
        )
        assert (o.float() - ref.float()).abs().max().item() < 5e-3, call
        fin = torch.isfinite(ref_lse)
        assert torch.equal(fin, torch.isfinite(lse)) and (lse[fin] - ref_lse[fin]).abs().max().item() < 1e-3
        assert int(w.workspace.sync.abs().sum()) == 0, f"call {call}: counters left at {w.workspace.sync.nonzero()}"


@pytest.mark.parametrize(
    "name, entry, want",
    [
        # a one-CTA-per-SM look-ahead tile's parameters: raised to the graph tile's residency
        (
            "stream_k",
            {
                "ctas_per_sm": 1.0,
                "block_n": 32,
                "num_warps": 4,
                "num_stages": 3,
                "prefetch": True,
                "next_item": True,
                "heads_per_tile": 2,
            },
            "residency",
        ),
        # tuned on other tiles at 2 or more CTAs per SM: kept, rule and all
        ("stream_k", {"ctas_per_sm": 2.0, "block_n": 32, "num_warps": 4, "num_stages": 3, "prefetch": True}, 2.0),
        ("balanced", {"ctas_per_sm": 3.0, "block_n": 32, "num_warps": 4, "num_stages": 3, "prefetch": True}, 3.0),
        ("stream_k", {"ctas_per_sm": 1.0}, 1.0),  # tuned on the graph's own tile (the default one): kept
    ],
)
def test_graph_mode_repick_on_another_tile(name, entry, want):
    """Graph mode keeps its tile. On a tile of several resident CTAs per SM (head_dim 64's default, 4 on the
    H200), a re-picked entry tuned on another tile with fewer than 2 CTAs per SM gets the graph tile's residency
    and others keep their rule and ctas_per_sm (docs/decisions/graph-default.md); one tuned on the graph's tile is
    kept as it is."""
    from kvsplit.kernels.limits import default_config

    lens = [900, 40, 7]
    table = _stream_k_table(lens, entry, name=name)
    w = _wrapper(
        max_batch_size=8,
        table=table,
        use_cuda_graph=True,
        graph=GraphOptions(num_programs=3, max_work_items=256),
    )
    case = make_case(lens, num_qo_heads=H_Q, num_kv_heads=H_KV, head_dim=D, page_size=PS, dtype=torch.float16)
    w.plan(case["kv_indptr"], case["kv_indices"], case["kv_lens"], kv_lens_host=np.array(lens))
    # head_dim 64 has no graph tile of its own: the eager default config, one head per tile
    cfg = default_config(D, "float16")
    assert (w.config.block_n, w.config.num_warps, w.config.num_stages, w.config.heads_per_tile) == (
        cfg.block_n,
        cfg.num_warps,
        cfg.num_stages,
        1,
    )
    if want == "residency":
        want = float(
            resident_ctas_per_sm(
                resolve_device("NVIDIA H200"), D, "float16", 2, cfg.block_n, cfg.num_warps, cfg.num_stages
            )
        )
        assert want >= 2 and want == w.graph_residency
    assert w.spec.policy == name and w.spec.params["ctas_per_sm"] == want
    assert w.planner == ("host" if name == "balanced" else "device")
    ref = reference_decode_attention(**case)
    out = w.run(case["q"], case["k_cache"], case["v_cache"], out=torch.empty_like(case["q"]))
    assert (out.float() - ref.float()).abs().max().item() < 5e-3


def test_graph_mode_default_tile_at_head_dim_128():
    """No policy, no params, head_dim 128: graph mode runs limits.graph_default_config's tile ((64, 8, 3) with the
    prefetch and the look-ahead) with two KV heads per work tile and stream_k at its residency (one CTA per SM on
    the H200; docs/decisions/graph-default.md), planned on the device, against the fp32 reference; a table entry tuned on
    that tile keeps its own parameters, one tuned on (128, 4, 2) gets the graph's rule (docs/decisions/graph-default.md).
    Eager mode's default stays balanced."""
    hq, hk, d = 8, 2, 128
    w = _wrapper(
        hq,
        hk,
        d,
        max_batch_size=4,
        use_cuda_graph=True,
        graph=GraphOptions(num_programs=2, max_work_items=64),
    )
    c = w.config
    assert (c.block_n, c.num_warps, c.num_stages, c.prefetch, c.next_item, c.heads_per_tile) == (
        64,
        8,
        3,
        True,
        True,
        2,
    )
    res = resident_ctas_per_sm(
        resolve_device("NVIDIA H200"), d, "float16", 2, 64, 8, 3, prefetch=True, next_item=True, heads_per_tile=2
    )
    assert w.graph_residency == res == 1
    assert w.planner == "device" and w.spec.policy == "stream_k" and w.spec.params["ctas_per_sm"] == 1.0
    _loop(w, [70, 3, 400], steps=2, shape=(hq, hk, d))
    assert int(w.bufs.counts[2]) == int(w.bufs.counts[1])  # tiles = CTAs x H_kv / 2
    assert _wrapper(hq, hk, d).policy == "balanced"
    lens = [700, 90, 5]
    tile = {"block_n": 64, "num_warps": 8, "num_stages": 3, "prefetch": True, "next_item": True, "heads_per_tile": 2}
    # on this one-CTA-per-SM tile an entry tuned elsewhere (here (128, 4, 2), balanced at 3) runs the graph's rule
    for name, entry, want in (
        ("stream_k", {"ctas_per_sm": 2.0, **tile}, ("stream_k", 2.0)),
        ("balanced", {"ctas_per_sm": 3.0}, ("stream_k", 1.0)),
    ):
        t = _wrapper(
            hq,
            hk,
            d,
            max_batch_size=4,
            table=_stream_k_table(lens, entry, name=name, num_kv_heads=hk, head_dim=d),
            use_cuda_graph=True,
            graph=GraphOptions(num_programs=2, max_work_items=64),
        )
        _loop(t, lens, steps=1, shape=(hq, hk, d))
        assert (t.spec.policy, t.spec.params["ctas_per_sm"]) == want and t.config.heads_per_tile == 2


@pytest.mark.parametrize("hq, hk", [(32, 2), (8, 1), (6, 3)])
def test_graph_mode_default_tile_without_two_heads(hq, hk):
    # two KV heads per tile need an even H_kv and 2 * G <= 16 query rows; else the graph default is the eager
    # default tile ((128, 4, 2) at head_dim 128), one head per tile, not the look-ahead tile with one head (which
    # ran 1.441x the served plan against 1.309x at H_kv 8: docs/decisions/graph-default.md), stream_k at its residency (3)
    from kvsplit.kernels.limits import default_config

    w = _wrapper(
        hq,
        hk,
        128,
        max_batch_size=4,
        use_cuda_graph=True,
        graph=GraphOptions(num_programs=2, max_work_items=64),
    )
    cfg = default_config(128, "float16")
    c = w.config
    assert (
        (c.block_n, c.num_warps, c.num_stages, c.prefetch, c.next_item, c.heads_per_tile)
        == (cfg.block_n, cfg.num_warps, cfg.num_stages, False, False, 1)
        == (128, 4, 2, False, False, 1)
    )
    assert w.spec.policy == "stream_k" and w.spec.params["ctas_per_sm"] == float(w.graph_residency) == 3.0


def test_graph_options_and_a_callers_workspace():
    with pytest.raises(ValueError, match="graph.planner"):
        GraphOptions(planner="gpu")
    with pytest.raises(ValueError, match="graph.repick_every"):
        GraphOptions(repick_every=0)
    with pytest.raises(ValueError, match="graph"):
        _wrapper(graph=GraphOptions())
    from kvsplit.kernels.decode import make_workspace

    # eager mode: the caller's workspace is used as it is, and one too small for a step's plan is named
    ws = make_workspace(H_Q, D, max_partials=256, max_batch=8, device="cpu")
    w = _wrapper(
        max_batch_size=8,
        workspace=ws,
        policy="fixed",
        params={"num_splits": 3},
    )
    _loop(w, [40, 300, 7], steps=1)
    assert w.workspace is ws and w.last_plan is not None and w.last_plan.num_partials == 9  # 3 requests x 3 splits
    small = make_workspace(H_Q, D, max_partials=2, max_batch=8, device="cpu")
    w = _wrapper(
        max_batch_size=8,
        workspace=small,
        policy="fixed",
        params={"num_splits": 3},
    )
    case = make_case(
        [40, 300, 7], num_qo_heads=H_Q, num_kv_heads=H_KV, head_dim=D, page_size=PS, dtype=torch.float16, seed=1
    )
    with pytest.raises(ValueError, match="workspace"):
        w.plan(case["kv_indptr"], case["kv_indices"], case["kv_lens"])
    # graph mode: it must hold max_work_items partials; the device planner's steps answer None, as last_plan
    with pytest.raises(ValueError, match="workspace"):
        _wrapper(
            max_batch_size=4,
            policy="stream_k",
            use_cuda_graph=True,
            graph=GraphOptions(num_programs=2, max_work_items=64),
            workspace=small,
        )
    big = make_workspace(H_Q, D, max_partials=64, max_batch=4, device="cpu")
    g = _wrapper(
        max_batch_size=4,
        policy="stream_k",
        use_cuda_graph=True,
        graph=GraphOptions(num_programs=2, max_work_items=64),
        workspace=big,
    )
    assert g.workspace is big and g.planner == "device"
    case = make_case([40, 300], num_qo_heads=H_Q, num_kv_heads=H_KV, head_dim=D, page_size=PS, dtype=torch.float16)
    assert g.plan(case["kv_indptr"], case["kv_indices"], case["kv_lens"], kv_lens_host=[40, 300]) is None
    assert g.last_plan is None


def test_eager_plan_from_host_copies_equals_the_device_read_and_runs():
    """Eager plan() given the engine's host copies (kv_lens_host, kv_indptr_host as a list, a NumPy array, a CPU
    tensor) makes the same plan as plan() reading kv_indptr / kv_lens back from the device, and answers None in
    both modes (as FlashInfer's plan); last_plan holds the host plan. The launch arrays (views of one uploaded
    buffer) are the plan's: the run matches the fp32 reference."""
    lens = [700, 0, 5, 333, 64, 17]
    case = make_case(lens, num_qo_heads=H_Q, num_kv_heads=H_KV, head_dim=D, page_size=PS, dtype=torch.float16, seed=9)
    w = _wrapper(max_batch_size=8)
    assert w.policy == "balanced" and w.spec.policy == "balanced"  # policy "auto", eager: AUTO_RULE["eager"]
    assert w.plan(case["kv_indptr"], case["kv_indices"], case["kv_lens"]) is None
    read = w.last_plan
    assert read == make_plan(
        lens, num_kv_heads=H_KV, device="NVIDIA H200", policy="balanced", head_dim=D, page_size=PS, dtype="float16"
    )
    indptr = case["kv_indptr"].tolist()
    for lh, ih in ((lens, indptr), (np.array(lens), np.array(indptr)), (case["kv_lens"], case["kv_indptr"])):
        assert (
            w.plan(case["kv_indptr"], case["kv_indices"], case["kv_lens"], kv_lens_host=lh, kv_indptr_host=ih) is None
        )
        assert w.last_plan == read
        want = read.to("cpu")
        for name, t in w._arrays.items():
            assert torch.equal(t[: want[name].shape[0]], want[name]), name  # the start of its region
        ref = reference_decode_attention(**case)
        o = w.run(case["q"], case["k_cache"], case["v_cache"])
        assert (o.float() - ref.float()).abs().max().item() < 5e-3


def test_eager_host_copies_are_checked_naming_them():
    """Bad host copies are refused naming kv_lens_host / kv_indptr_host; the page ids are still read (a negative
    one is refused naming kv_indices), and a refused step leaves no plan to run."""
    lens = [40, 300]
    case = make_case(lens, num_qo_heads=H_Q, num_kv_heads=H_KV, head_dim=D, page_size=PS, dtype=torch.float16)
    w = _wrapper(max_batch_size=4)
    indptr = case["kv_indptr"].tolist()
    args = (case["kv_indptr"], case["kv_indices"], case["kv_lens"])
    with pytest.raises(ValueError, match=r"^kv_lens_host: expected 2 integers"):
        w.plan(*args, kv_lens_host=[40], kv_indptr_host=indptr)
    with pytest.raises(ValueError, match=r"^kv_indptr_host: expected 3 integers"):
        w.plan(*args, kv_lens_host=lens, kv_indptr_host=indptr[:2])
    with pytest.raises(ValueError, match=r"^kv_lens_host: expected 2 integers .* dtype float64"):
        w.plan(*args, kv_lens_host=[40.0, 300.0], kv_indptr_host=indptr)
    with pytest.raises(ValueError, match=r"^kv_lens_host\[1\]: negative kv_len -3"):
        w.plan(*args, kv_lens_host=[40, -3], kv_indptr_host=indptr)
    with pytest.raises(ValueError, match=r"^kv_lens_host\[0\]: 999 tokens exceed its 3 pages"):
        w.plan(*args, kv_lens_host=[999, 300], kv_indptr_host=indptr)
    with pytest.raises(ValueError, match=r"^kv_indptr_host: expected kv_indptr\[0\] == 0"):
        w.plan(*args, kv_lens_host=lens, kv_indptr_host=[1] + indptr[1:])
    with pytest.raises(ValueError, match=r"^kv_indptr_host: must be non-decreasing"):
        w.plan(*args, kv_lens_host=lens, kv_indptr_host=[0, indptr[2], indptr[1]])
    with pytest.raises(ValueError, match=r"^kv_indptr_host: last entry"):
        w.plan(*args, kv_lens_host=lens, kv_indptr_host=indptr[:2] + [case["kv_indices"].shape[0] + 1])
    with pytest.raises(ValueError, match=r"^kv_indptr_host: expected a host copy"):
        w.plan(*args, kv_lens_host=lens, kv_indptr_host=torch.tensor(indptr, device="meta"))
    w.plan(*args, kv_lens_host=lens, kv_indptr_host=indptr)
    w.run(case["q"], case["k_cache"], case["v_cache"])
    bad = case["kv_indices"].clone()
    bad[1] = -5
    with pytest.raises(ValueError, match=r"^kv_indices: negative page id -5"):
        w.plan(case["kv_indptr"], bad, case["kv_lens"], kv_lens_host=lens, kv_indptr_host=indptr)
    with pytest.raises(ValueError, match="^plan: call plan"):
        w.run(case["q"], case["k_cache"], case["v_cache"])


def _sizes(p):
    """The lengths of an eager plan's launch arrays, in the wrapper's order."""
    ws, mr, ms, mn = p.merge_layout()
    return [a.shape[0] for a in (p.work_request, p.work_kv_start, p.work_kv_end, ws, p.cta_indptr, mr, ms, mn)]


def test_eager_launch_arrays_stay_16_byte_aligned_and_are_made_once_per_layout():
    """The eager plan's launch arrays are views of one device buffer at fixed, 16-byte-aligned offsets (Triton
    specializes a pointer argument on 16-byte alignment: views at offsets that moved with each plan's sizes would
    compile a new kernel variant per combination); the views are made once per layout and kept while plans fit,
    and every run matches the fp32 reference."""
    w = _wrapper(max_batch_size=16)
    views, layouts = None, 0
    for step, lens in enumerate(([700, 0, 5], [333, 64, 17, 2048, 1], [9, 9, 9, 9, 9, 9, 9], [40] * 13 + [3000])):
        case = make_case(
            lens, num_qo_heads=H_Q, num_kv_heads=H_KV, head_dim=D, page_size=PS, dtype=torch.float16, seed=step
        )
        w.plan(case["kv_indptr"], case["kv_indices"], case["kv_lens"], kv_lens_host=lens,
               kv_indptr_host=case["kv_indptr"].numpy(), kv_indices_host=case["kv_indices"].numpy())  # fmt: skip
        if w._arrays is not views:
            views, layouts = w._arrays, layouts + 1
        want = w.last_plan.to("cpu")
        for name, t in w._arrays.items():
            assert t.data_ptr() % 16 == 0, (step, name)
            assert torch.equal(t[: want[name].shape[0]], want[name]), (step, name)
        ref = reference_decode_attention(**case)
        o = w.run(case["q"], case["k_cache"], case["v_cache"])
        assert (o.float() - ref.float()).abs().max().item() < 5e-3, step
    assert layouts == 1  # the first layout (64-item regions) held every plan


def test_eager_plan_with_host_page_ids_equals_the_device_check_and_runs():
    """Given kv_indices_host too (as an engine that builds its block table on the host has it), the eager plan
    checks the page ids on the host: the same plan, the same launch arrays and the same run as the device check,
    a longer host copy (the page ids past kv_indptr[-1]) accepted, across steps that reuse both pinned buffers."""
    w = _wrapper(max_batch_size=8)
    for step, lens in enumerate(([700, 0, 5, 333, 64, 17], [1, 2048, 3], [40, 300, 90, 17, 0, 5, 6])):
        case = make_case(
            lens, num_qo_heads=H_Q, num_kv_heads=H_KV, head_dim=D, page_size=PS, dtype=torch.float16, seed=step
        )
        args = (case["kv_indptr"], case["kv_indices"], case["kv_lens"])
        w.plan(*args)
        read = w.last_plan
        read_arrays = {k: t[:n].clone() for k, t, n in zip(w._arrays, w._arrays.values(), _sizes(read))}
        ids = case["kv_indices"].numpy()
        for ih in (ids, list(ids) + [10**6, -7]):  # entries past kv_indptr[-1] are not the step's
            host = dict(kv_lens_host=lens, kv_indptr_host=case["kv_indptr"].numpy(), kv_indices_host=ih)
            assert w.plan(*args, **host) is None
            assert w.last_plan == read and w._max_page == int(ids[: int(case["kv_indptr"][-1])].max())
            for name, t in w._arrays.items():
                assert torch.equal(t[: read_arrays[name].shape[0]], read_arrays[name]), name
            o = w.run(case["q"], case["k_cache"], case["v_cache"])
            ref = reference_decode_attention(**case)
            assert (o.float() - ref.float()).abs().max().item() < 5e-3


def test_eager_host_page_ids_are_checked_naming_them():
    """kv_indices_host: a negative page id refused naming its position, a page id past the cache refused by run()
    naming kv_indices, too short a copy, a device tensor, no other host copies, and graph mode all refused naming
    kv_indices_host; a refused plan leaves the previous step's plan to run."""
    lens = [40, 300]
    case = make_case(lens, num_qo_heads=H_Q, num_kv_heads=H_KV, head_dim=D, page_size=PS, dtype=torch.float16)
    w = _wrapper(max_batch_size=4)
    args = (case["kv_indptr"], case["kv_indices"], case["kv_lens"])
    indptr, ids = case["kv_indptr"].numpy(), case["kv_indices"].numpy().copy()
    host = dict(kv_lens_host=lens, kv_indptr_host=indptr)
    w.plan(*args, **host, kv_indices_host=ids)
    before = w.last_plan
    bad = ids.copy()
    bad[4] = -3
    with pytest.raises(ValueError, match=r"^kv_indices_host\[4\]: negative page id -3"):
        w.plan(*args, **host, kv_indices_host=bad)
    assert w.last_plan is before  # checked before the upload: the previous step's plan still runs
    w.run(case["q"], case["k_cache"], case["v_cache"])
    used = int(indptr[-1])  # 3 + 19 pages
    assert used == 22
    with pytest.raises(ValueError, match=r"^kv_indices_host: expected at least 22 integers .* shape \(21,\)"):
        w.plan(*args, **host, kv_indices_host=ids[: used - 1])
    with pytest.raises(ValueError, match=r"^kv_indices_host: expected at least 22 integers .* dtype float64"):
        w.plan(*args, **host, kv_indices_host=ids.astype(np.float64))
    with pytest.raises(ValueError, match=r"^kv_indices_host: expected a host copy"):
        w.plan(*args, **host, kv_indices_host=torch.tensor(ids, device="meta"))
    with pytest.raises(ValueError, match=r"^kv_indices_host: needs kv_lens_host and kv_indptr_host"):
        w.plan(*args, kv_lens_host=lens, kv_indices_host=ids)
    past = ids.copy()
    past[0] = case["k_cache"].shape[0]
    w.plan(*args, **host, kv_indices_host=past)  # the cache is run()'s argument: checked there
    with pytest.raises(ValueError, match=rf"^kv_indices: page id {case['k_cache'].shape[0]} out of range"):
        w.run(case["q"], case["k_cache"], case["v_cache"])
    g = _wrapper(max_batch_size=4, use_cuda_graph=True)
    with pytest.raises(ValueError, match=r"^kv_indices_host: eager mode only"):
        g.plan(*args, **host, kv_indices_host=ids)


def test_policy_auto_is_the_default_in_both_modes():
    """policy="auto" (the default) is AUTO_RULE's rule of the mode: balanced eagerly, stream_k at the graph tile's
    resident CTAs per SM in graph mode; None is refused naming policy."""
    from kvsplit.kernels.wrapper import AUTO_RULE

    assert AUTO_RULE == {"eager": "balanced", "graph": "stream_k"}
    e = _wrapper()
    assert e.spec == _wrapper(policy="balanced").spec
    g = _wrapper(use_cuda_graph=True)
    assert g.policy == "stream_k" and g.params["ctas_per_sm"] == float(max(1, g.graph_residency))
    assert g.spec.policy == "stream_k"
    with pytest.raises(ValueError, match="^policy: expected a policy name or 'auto', got None"):
        _wrapper(policy=None)
