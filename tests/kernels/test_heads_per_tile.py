"""Work tiles of several KV heads (``KernelConfig.heads_per_tile``, docs/decisions/two-heads-per-tile.md): the kernel against the
fp32 reference on the CPU interpreter, the planner's tile count, residency, the simulator's tiles and the checks.

With ``heads_per_tile = k`` a work tile is (CTA, k adjacent KV heads): the k GQA groups share the 16 query rows of
one ``tl.dot``, so the output of every head must still be its own head's attention: the reference computes each
head alone.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvsplit.kernels.decode import decode_attention, make_workspace, reference_decode_attention
from kvsplit.kernels.device import resolve_device
from kvsplit.kernels.plan import make_plan
from kvsplit.kernels.residency import COMPILED_HEADS, occupancy, resident_ctas_per_sm

from .paged_case import check_decode as _check
from .paged_case import make_case

H200 = resolve_device("NVIDIA H200")


# (H_q, H_kv, heads_per_tile): G * heads = 16, 8 (rows padded) and 2 (G = 1)
SHAPES = [(16, 4, 2), (16, 4, 4), (8, 4, 2), (4, 4, 2)]


@pytest.mark.parametrize("hq, hkv, heads", SHAPES)
@pytest.mark.parametrize(
    "policy, params",
    [
        ("balanced", {"block_n": 16, "ctas_per_sm": 0.25}),
        ("stream_k", {"block_n": 32, "ctas_per_sm": 0.5}),
        ("stream_k", {"block_n": 16, "num_stages": 3, "prefetch": True, "ctas_per_sm": 0.25}),
        ("no_split", {"block_n": 16, "schedule": "persistent", "num_programs": 3}),
    ],
)
def test_heads_per_tile_matches_reference_fp16(hq, hkv, heads, policy, params):
    lens = [0, 1, 15, 16, 17, 300, 45, 1000]
    case = make_case(
        lens, num_qo_heads=hq, num_kv_heads=hkv, head_dim=64, page_size=16, dtype=torch.float16, seed=hq + heads
    )
    p1 = make_plan(
        lens, num_kv_heads=hkv, device="NVIDIA H200", policy=policy, params=params, head_dim=64, dtype="float16"
    )
    pk = make_plan(
        lens,
        num_kv_heads=hkv,
        device="NVIDIA H200",
        policy=policy,
        params={**params, "heads_per_tile": heads},
        head_dim=64,
        dtype="float16",
    )
    assert pk.config.heads_per_tile == heads and pk.num_work_tiles == pk.num_ctas * hkv // heads
    o1 = _check(case, p1, torch.float16)
    ok = _check(case, pk, torch.float16)
    if policy == "no_split":  # the same items: one head per tile and k per tile agree to rounding
        assert (o1.float() - ok.float()).abs().max().item() < 2e-3


def test_heads_per_tile_fp32_split_and_packed():
    lens = [2500, 3, 0, 700, 64, 65, 1, 129]
    case = make_case(lens, num_qo_heads=8, num_kv_heads=4, head_dim=64, page_size=7, dtype=torch.float32, seed=3)
    for params in ({"num_splits": 3, "block_n": 32}, {"num_splits": 1, "block_n": 16, "pack_tokens": 4096}):
        p = make_plan(
            lens,
            num_kv_heads=4,
            device="NVIDIA H200",
            policy="fixed",
            params={**params, "heads_per_tile": 4},
            head_dim=64,
            page_size=7,
            dtype="float32",
        )
        _check(case, p, torch.float32)


def test_workspace_reuse_with_heads_per_tile():
    lens = [40, 5000, 7]
    case = make_case(lens, num_qo_heads=16, num_kv_heads=4, head_dim=64, page_size=16, dtype=torch.float16, seed=9)
    p = make_plan(
        lens,
        num_kv_heads=4,
        device="NVIDIA H200",
        policy="stream_k",
        params={"block_n": 32, "ctas_per_sm": 0.25, "heads_per_tile": 2},
        head_dim=64,
        dtype="float16",
    )
    ws = make_workspace(16, 64, max_partials=p.num_partials, max_batch=3, device="cpu")
    out = torch.full_like(case["q"], float("nan"))
    ref = reference_decode_attention(**case)
    for _ in range(2):
        o = decode_attention(**case, plan=p, out=out, workspace=ws, validate=False)
        assert o.data_ptr() == out.data_ptr() and (o.float() - ref.float()).abs().max().item() < 5e-3


def test_heads_per_tile_is_checked():
    lens = [100, 200]
    for bad, msg in (
        (3, "params.heads_per_tile: expected one of"),
        (True, "params.heads_per_tile: expected an integer"),
        ("2", "expected an integer"),
    ):
        with pytest.raises(ValueError, match=msg):
            make_plan(lens, num_kv_heads=4, device="NVIDIA H200", policy="balanced", params={"heads_per_tile": bad})
    with pytest.raises(ValueError, match="params.heads_per_tile: expected a divisor of num_kv_heads=2"):
        make_plan(
            lens, num_kv_heads=2, device="NVIDIA H200", policy="balanced", params={"heads_per_tile": 4, "block_n": 64}
        )
    with pytest.raises(ValueError, match="heads_per_tile=2 needs about 256 KB"):
        make_plan(
            lens,
            num_kv_heads=4,
            device="NVIDIA H200",
            policy="balanced",
            params={"heads_per_tile": 2, "block_n": 128, "num_stages": 3},
        )
    # G * heads_per_tile above the 16 query rows of one tile: refused before any launch, naming the knob
    case = make_case(lens, num_qo_heads=32, num_kv_heads=4, head_dim=64, page_size=16, dtype=torch.float16)
    p = make_plan(
        lens,
        num_kv_heads=4,
        device="NVIDIA H200",
        policy="balanced",
        params={"heads_per_tile": 4, "block_n": 16},
        head_dim=64,
        dtype="float16",
    )
    with pytest.raises(
        ValueError,
        match=r"plan.config.heads_per_tile: 4 KV heads of GQA group G=8 .* are 32 query "
        r"rows, above the 16 of one work tile: use heads_per_tile <= 2",
    ):
        decode_attention(**case, plan=p)
    # the JSON form keeps the knob, and a document whose knob does not divide H_kv is refused
    d = p.to_dict()
    assert d["config"]["heads_per_tile"] == 4
    assert type(p).from_dict(d) == p
    d["made_for"]["num_kv_heads"] = 2
    with pytest.raises(ValueError, match="heads_per_tile: expected a divisor of num_kv_heads=2"):
        type(p).from_dict(d)


def test_tiles_counted_per_group_of_heads():
    """The partitions count ``H_kv / heads_per_tile`` tiles per work item (policies.tile_heads): stream_k's CTAs
    per KV head double at heads_per_tile 2 for the same target of work tiles per SM, and a wave-aware balanced
    plan fills the resident slots of the heads-per-tile config."""
    L = np.full(8, 131072)
    s1 = make_plan(L, num_kv_heads=4, device="NVIDIA H200", policy="stream_k", params={"ctas_per_sm": 3, "block_n": 64})
    s2 = make_plan(
        L,
        num_kv_heads=4,
        device="NVIDIA H200",
        policy="stream_k",
        params={"ctas_per_sm": 3, "block_n": 64, "heads_per_tile": 2},
    )
    assert s1.num_ctas == 3 * 132 // 4 and s2.num_ctas == 3 * 132 // 2
    assert s1.num_work_tiles == s2.num_work_tiles == 396
    # (64, 4, 2) with 2 heads per tile: 168 registers, 71,680 B of shared memory -> 3 CTAs per SM
    assert resident_ctas_per_sm(H200, 128, "bfloat16", 2, 64, 4, 2, heads_per_tile=2) == 3
    b2 = make_plan(
        L,
        num_kv_heads=4,
        device="NVIDIA H200",
        policy="balanced",
        params={"ctas_per_sm": 4, "block_n": 64, "heads_per_tile": 2},
    )
    # 4 x 132 = 528 tiles wanted, cut to one whole wave of the 3 x 132 slots; per-request rounding stays below
    assert 380 <= b2.num_work_tiles <= 396


def test_compiled_heads_table_is_consistent():
    """Every COMPILED_HEADS entry's residency is the occupancy of its figures, heads_per_tile 2 takes more shared
    memory than the one-head tile of the same config (its heads' K/V buffers), and unknown configs fall back to
    the estimate, which counts the heads' buffers too."""
    from kvsplit.kernels.residency import COMPILED, MEASURED, MEASURED_PREFETCH, estimate

    assert len(COMPILED_HEADS) >= 40
    for (gpu, d, dt, bn, w, s, pf, h), (regs, smem) in COMPILED_HEADS.items():
        assert resident_ctas_per_sm(H200, d, dt, 2, bn, w, s, prefetch=pf, heads_per_tile=h) == occupancy(
            H200, w, regs, smem
        )
        one = (MEASURED_PREFETCH if pf else {**COMPILED, **MEASURED}).get((gpu, d, dt, bn, w, s))
        if one is not None:
            assert smem > one[1]
    assert estimate(H200, 128, 2, 128, 8, 2, heads_per_tile=2) <= estimate(H200, 128, 2, 128, 8, 2)


def test_simulator_counts_heads_per_tile():
    from kvsplit.tuner.simulate import Calibration, config_key, predict, prepare_tiles

    L = np.full(8, 131072)
    p1 = make_plan(L, num_kv_heads=4, device="NVIDIA H200", policy="stream_k", params={"ctas_per_sm": 3, "block_n": 64})
    p2 = make_plan(
        L,
        num_kv_heads=4,
        device="NVIDIA H200",
        policy="stream_k",
        params={"ctas_per_sm": 3, "block_n": 64, "heads_per_tile": 2},
    )
    t1, t2 = prepare_tiles(p1, H200), prepare_tiles(p2, H200)
    assert t2.tile_bytes.shape[0] == p2.num_work_tiles == 396
    assert t1.total_bytes == t2.total_bytes and t1.tile_bytes.sum() == pytest.approx(t2.tile_bytes.sum())
    assert t2.resident == 3 and config_key(p2.config) == "n64w4s2h2"
    cal = Calibration.default("NVIDIA H200")
    c = Calibration(hbm_bw=cal.hbm_bw, sm_bw=cal.sm_bw, cta_bw=cal.cta_bw, per_config={"n64w4s2": {"cta_bw": 1e10}})
    assert c.for_config("n64w4s2h2").cta_bw == 1e10  # a heads key without its own entry takes its tile's
    floor = t2.total_bytes / c.hbm_bw
    assert floor < predict(p2, "NVIDIA H200", calibration=c) < 3 * floor


def test_device_planner_counts_packed_tiles():
    # the device planner runs GQA-packed tiles: H_kv / heads_per_tile tiles per work item, the host partitions'
    # count (tests/kernels/test_device_plan.py checks its arrays against the host plan's)
    from kvsplit.kernels.device_plan import check_device_rule
    from kvsplit.kernels.rulespec import resolve

    def device_rule(policy, params, **kw):
        r = resolve(policy, params, **kw)
        check_device_rule(r)
        return r

    r = device_rule("stream_k", {"heads_per_tile": 2}, num_kv_heads=4, device="NVIDIA H200")
    assert r.config.heads_per_tile == 2 and r.tile_heads == 2 and r.num_kv_heads == 4
    r = device_rule("stream_k", {}, num_kv_heads=4, device="NVIDIA H200")
    assert r.config.heads_per_tile == 1 and r.tile_heads == 4
    with pytest.raises(ValueError, match="heads_per_tile"):
        device_rule("stream_k", {"heads_per_tile": 3}, num_kv_heads=4, device="NVIDIA H200")


def test_fit_heads_per_tile():
    from kvsplit.kernels.rulespec import fit_heads_per_tile

    p = {"ctas_per_sm": 3.0, "heads_per_tile": 2}
    assert fit_heads_per_tile(p, 32, 4) is p  # G = 8: 16 rows, fits
    assert fit_heads_per_tile(p, 64, 4) == {"ctas_per_sm": 3.0, "heads_per_tile": 1}  # G = 16: 32 rows
    assert p["heads_per_tile"] == 2  # the table's params untouched
    assert fit_heads_per_tile({"heads_per_tile": 4}, 32, 8) == {"heads_per_tile": 4}  # G = 4
    assert fit_heads_per_tile({"heads_per_tile": 4}, 64, 8) == {"heads_per_tile": 2}  # G = 8
    assert fit_heads_per_tile({"heads_per_tile": 4}, 6, 6) == {"heads_per_tile": 2}  # G = 1: 4 does not divide 6
    assert fit_heads_per_tile({"heads_per_tile": 8}, 128, 8) == {"heads_per_tile": 1}  # G = 16
    assert fit_heads_per_tile({"whole_wave_heads": 2}, 64, 4) == {"whole_wave_heads": 1}
    assert fit_heads_per_tile({"whole_wave_heads": 16}, 32, 4) == {"whole_wave_heads": 2}
    # every refit is a plan the planner makes and the launch accepts, for every shape and request
    from kvsplit.kernels.decode import check_heads_per_tile

    for hkv in (1, 2, 3, 4, 6, 8):
        for G in (1, 2, 3, 4, 8, 16):
            for h in (1, 2, 4, 8):
                got = fit_heads_per_tile({"heads_per_tile": h, "block_n": 16}, G * hkv, hkv)
                plan = make_plan([40, 7], num_kv_heads=hkv, device=H200, policy="balanced", params=got)
                check_heads_per_tile(plan.config.heads_per_tile, G * hkv, hkv)
                assert plan.config.heads_per_tile <= h
    q = {"block_n": 64}
    assert fit_heads_per_tile(q, 128, 4) is q


@pytest.mark.parametrize("reference", [False, True])
def test_table_refits_heads_per_tile_to_the_gqa_group(reference):
    """Buckets are keyed by H_kv, not H_q: the shipped H200 table's two-heads-per-tile policies (tuned at
    Qwen3-30B-A3B's G = 8) serve a G = 16 model (64/4) with one KV head per tile, through the compiled pass and
    the reference alike (the launch would refuse two heads of 16 query rows each)."""
    import contextlib
    import json
    from pathlib import Path

    from kvsplit.kernels import fastplan
    from kvsplit.kernels.policy_table import PolicyTable
    from kvsplit.kernels.rulespec import fit_heads_per_tile

    raw = json.loads((Path(__file__).resolve().parents[2] / "kernels/data/h200_policies.json").read_text())
    table = PolicyTable.from_export(raw)
    lens = np.array([30000, 100, 2000, 800] * 4)
    shape = dict(gpu="NVIDIA H200", num_kv_heads=4, head_dim=128, dtype="bfloat16", page_size=16)
    with fastplan.python() if reference else contextlib.nullcontext():
        p8, _, pol8 = table.plan(lens, num_qo_heads=32, **shape)
        p16, _, pol16 = table.plan(lens, num_qo_heads=64, **shape)
    assert pol8 == pol16 and pol8["params"].get("heads_per_tile") == 2  # one bucket, a two-heads policy
    assert p8.config.heads_per_tile == 2 and p16.config.heads_per_tile == 1
    want = make_plan(
        lens, num_kv_heads=4, device=H200, policy=pol16["name"], params=fit_heads_per_tile(pol16["params"], 64, 4)
    )
    assert p16 == want
    assert p16.num_work_tiles == p16.num_ctas * 4 and p8.num_work_tiles == p8.num_ctas * 2
    # what the launch checks before any kernel runs: the refitted plan passes, the unrefitted one is refused
    from kvsplit.kernels.decode import check_heads_per_tile

    check_heads_per_tile(p16.config.heads_per_tile, 64, 4)
    with pytest.raises(ValueError, match="heads_per_tile"):
        check_heads_per_tile(p8.config.heads_per_tile, 64, 4)
