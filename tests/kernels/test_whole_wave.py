"""The whole-wave rule (``params.whole_wave``; kernels/policies.py ``whole_wave_config``).

Hand-computed picks on the H200 (132 SMs; resident CTAs per SM at D = 128 bf16: 4 for the
(64, 4, 2) tile, 3 for (128, 4, 2), kernels/residency.py), the plan it makes (one work item per
request, batch order, one CTA each, on the picked tile), batches it must leave to the policy's own
rule, its parameter errors, and the compiled core, the policy table and the device planner agreeing
with the NumPy reference.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsplit.kernels import fastplan
from kvsplit.kernels.buckets import bucket_key
from kvsplit.kernels.device import DeviceSpec
from kvsplit.kernels.device_plan import check_device_rule
from kvsplit.kernels.limits import KernelConfig
from kvsplit.kernels.plan import make_plan
from kvsplit.kernels.policy_table import PolicyTable
from kvsplit.kernels.rulespec import WHOLE_WAVE_MAX_WAVES, PlanContext, resolve

from .oracle import make_plan as oracle_plan
from .oracle import whole_wave_config

H200 = DeviceSpec.known("NVIDIA H200")
SK = {"ctas_per_sm": 3.0, "block_n": 128, "num_warps": 4, "num_stages": 2}  # the table's default plan


def _ctx(hkv=4):
    return PlanContext(H200, hkv, 128, 16, "bfloat16")


def _plan(lens, policy="stream_k", params=None, hkv=4, ref=True):
    fn = oracle_plan if ref else make_plan
    return fn(lens, num_kv_heads=hkv, device=H200, policy=policy, params=params if params is not None else SK)


def test_residency_the_hand_computations_assume():
    from kvsplit.kernels.rulespec import resident_slots

    assert resident_slots(_ctx(), KernelConfig(64, 4, 2)) == 4 * 132
    assert resident_slots(_ctx(), KernelConfig(128, 4, 2)) == 3 * 132


@pytest.mark.parametrize(
    "lens,eps,want",
    [
        # 512 tiles for 528 slots of (64, 4, 2): excess 1 * 2048 * 528 / (4 * 262144) = 1.03125; (128, 4, 2): 2 waves
        # of 396, 2 * 2048 * 396 / (4 * 262144) = 1.546875
        ([2048] * 128, 0.05, (64, 4, 2)),
        ([2048] * 128, 0.03, None),  # 1.03125 > 1.03
        # 384 tiles: (64, 4, 2) 5461 * 528 / (4 * 524256) = 1.375; (128, 4, 2) 5461 * 396 / (4 * 524256) = 1.03125
        ([5461] * 96, 0.05, (128, 4, 2)),
        # 1024 tiles: (64, 4, 2) two waves of 528: 2 * 1024 * 528 / (4 * 262144) = 1.03125
        ([1024] * 256, 0.05, (64, 4, 2)),
        # 4096 tiles: 8 waves of (64, 4, 2), 11 of (128, 4, 2): above WHOLE_WAVE_MAX_WAVES
        ([256] * 1024, 1.0, None),
        # one long request: 132 tiles of which one is 10x the others' length
        ([20000] + [2000] * 131, 0.05, None),
        ([2048] * 128, 0.0, None),  # off
        ([0] * 128, 0.05, None),  # nothing to read
    ],
)
def test_whole_wave_config_hand_computed(lens, eps, want):
    cfg = whole_wave_config(np.asarray(lens, dtype=np.int64), _ctx(), eps)
    if want is None:
        assert cfg is None
    else:
        assert cfg == KernelConfig(*want)
    assert WHOLE_WAVE_MAX_WAVES == 2


@pytest.mark.parametrize(
    "policy,params",
    [
        ("stream_k", SK),
        ("balanced", {"ctas_per_sm": 4.0}),
        ("tuned", {"partition": "stream_k", "ctas_per_sm": 3.0, "block_n": 128, "item_cost_blocks": 2}),
        ("tuned", {"ctas_per_sm": 8.0, "min_chunk_tokens": 64}),
    ],
)
@pytest.mark.parametrize("ref", [True, False])
def test_the_rule_plans_one_item_per_request_on_its_tile(policy, params, ref):
    lens = [2048] * 128
    p = _plan(lens, policy, {**params, "whole_wave": 0.05}, ref=ref)
    assert (p.config.block_n, p.config.num_warps, p.config.num_stages) == (64, 4, 2)
    assert p.config.schedule == "grid" and not p.config.prefetch
    np.testing.assert_array_equal(p.num_splits, np.ones(128))
    np.testing.assert_array_equal(p.work_request, np.arange(128))
    np.testing.assert_array_equal(p.work_kv_start, np.zeros(128))
    np.testing.assert_array_equal(p.work_kv_end, np.full(128, 2048))
    np.testing.assert_array_equal(p.cta_indptr, np.arange(129))
    # the plan names the policy and params that made it, so re-planning from them gives it again
    assert p.policy == policy and p.params == {**params, "whole_wave": 0.05}
    assert _plan(lens, p.policy, p.params, ref=not ref) == p


@pytest.mark.parametrize(
    "lens",
    [
        [2048] * 127 + [2600],
        [256] * 1024,
        [3000] * 64 + [300] * 64,
        list(np.random.default_rng(5).integers(1800, 2300, 128)),
    ],
)
def test_batches_the_rule_leaves_get_the_policy_own_plan(lens):
    for ref in (True, False):
        assert _plan(lens, params={**SK, "whole_wave": 0.05}, ref=ref).config == _plan(lens, ref=ref).config
        a, b = _plan(lens, params={**SK, "whole_wave": 0.05}, ref=ref), _plan(lens, ref=ref)
        for f in ("num_splits", "work_request", "work_kv_start", "work_kv_end", "cta_indptr"):
            np.testing.assert_array_equal(getattr(a, f), getattr(b, f))


@pytest.mark.parametrize("bad", [-0.1, 1.5, "0.05", True, float("nan"), None])
@pytest.mark.parametrize("policy", ["stream_k", "balanced", "tuned"])
def test_bad_whole_wave_names_the_parameter(bad, policy):
    for fn in (oracle_plan, make_plan):
        with pytest.raises(ValueError, match="params.whole_wave"):
            fn([2048] * 128, num_kv_heads=4, device=H200, policy=policy, params={"whole_wave": bad})


def test_whole_wave_is_not_a_parameter_of_other_policies():
    with pytest.raises(ValueError, match="unknown parameters"):
        make_plan([5, 6], num_kv_heads=4, device=H200, policy="fixed", params={"num_splits": 2, "whole_wave": 0.1})


@pytest.mark.skipif(not fastplan.HAVE_NUMBA, reason="numba is not installed")
def test_compiled_core_matches_reference_on_near_even_batches():
    rng = np.random.default_rng(7)
    hits = 0
    for _ in range(200):
        B = int(rng.choice([32, 64, 96, 100, 128, 132, 192, 256, 264, 384, 512]))
        hkv = int(rng.choice([1, 2, 4, 8]))
        spread = float(rng.choice([0.0, 0.005, 0.02, 0.06]))
        lens = np.maximum(np.rint(int(rng.integers(50, 30000)) * rng.uniform(1 - spread, 1 + spread, B)), 0)
        params = {**SK, "whole_wave": float(rng.choice([0.01, 0.04, 0.1, 0.3]))}
        for arr in (lens.astype(np.int32), lens.astype(np.int64).tolist()):
            ref, fast = _plan(arr, params=params, hkv=hkv), _plan(arr, params=params, hkv=hkv, ref=False)
            assert fast == ref
        hits += whole_wave_config(lens.astype(np.int64), _ctx(hkv), params["whole_wave"]) is not None
    assert hits > 20  # the rule took a good share of these batches


@pytest.mark.skipif(not fastplan.HAVE_NUMBA, reason="numba is not installed")
def test_policy_table_applies_the_matched_entry_rule():
    def entry(i, lens, params):
        key = str(bucket_key(np.asarray(lens), num_kv_heads=4, head_dim=128, dtype="bfloat16", device=H200))
        return {
            "id": i,
            "version": 1,
            "bucket": key,
            "gpu": "NVIDIA H200",
            "num_kv_heads": 4,
            "head_dim": 128,
            "dtype": "bfloat16",
            "page_size": 16,
            "name": "stream_k",
            "params": params,
            "backend": "gpu",
        }

    doc = PolicyTable.document(
        [entry(1, [2048] * 128, {**SK, "whole_wave": 0.05}), entry(2, [4096] * 64, SK)], version=3
    )
    table = PolicyTable.from_json(doc)
    shape = dict(gpu="NVIDIA H200", num_qo_heads=32, num_kv_heads=4, head_dim=128, dtype="bfloat16", page_size=16)
    for lens, tile, entry_id in (
        ([2048] * 128, (64, 4, 2), 1),
        ([4096] * 64, (128, 4, 2), 2),
        ([4096] * 128, (128, 4, 2), None),
    ):
        with fastplan.python():
            ref = table.plan(np.asarray(lens), **shape)
        got = table.plan(np.asarray(lens, dtype=np.int32), **shape)
        assert got[0] == ref[0] and got[1] == ref[1] and got[2] == ref[2]
        assert (got[0].config.block_n, got[0].config.num_warps, got[0].config.num_stages) == tile
        if entry_id is not None:
            assert got[2]["id"] == entry_id and got[2]["params"] == doc["data"][entry_id - 1]["params"]
    # the whole-wave plan of entry 1: one tile per request; the buffers the plan service writes from agree
    from kvsplit.kernels.shape import Shape

    sh = Shape.of(device="NVIDIA H200", num_qo_heads=32, num_kv_heads=4)
    B, W, nc, b64, b32, sp, key, ent, dist = table.plan_buffers(np.asarray([2048] * 128, np.int32), sh)
    assert (W, nc, ent.id, sp.fields["config"].block_n) == (128, 129, 1, 64)
    assert sp.params == {**SK, "whole_wave": 0.05}


def test_device_planner_refuses_the_rule():
    with pytest.raises(NotImplementedError, match="whole_wave"):
        check_device_rule(resolve("stream_k", {**SK, "whole_wave": 0.05}, num_kv_heads=4, device=H200))
    check_device_rule(resolve("stream_k", SK, num_kv_heads=4, device=H200))


@given(
    B=st.integers(1, 700),
    base=st.integers(1, 40000),
    spread=st.sampled_from([0.0, 0.004, 0.03, 0.2]),
    hkv=st.sampled_from([1, 2, 4, 8]),
    eps=st.sampled_from([0.01, 0.05, 0.3]),
    seed=st.integers(0, 2**16),
)
@settings(max_examples=150, deadline=None)
def test_whole_wave_property_tiles_against_slots(B, base, spread, hkv, eps, seed):
    """Property: the rule takes a batch exactly when some candidate tile's whole-request tiles fit at most
    WHOLE_WAVE_MAX_WAVES resident waves within 1 + eps (computed here from the residency table, in exact
    rationals), and then the plan is one non-empty item per request on that tile."""
    from fractions import Fraction

    from kvsplit.kernels.rulespec import WHOLE_WAVE_TILES, resident_slots

    rng = np.random.default_rng(seed)
    L = np.maximum(np.rint(base * rng.uniform(1 - spread, 1 + spread, B)), 1).astype(np.int64)
    ok = []
    for tile in WHOLE_WAVE_TILES:
        slots = resident_slots(_ctx(hkv), KernelConfig(*tile))
        k = -(-hkv * B // slots)
        excess = Fraction(k * int(L.max()) * slots, hkv * int(L.sum()))
        if k <= WHOLE_WAVE_MAX_WAVES and excess <= 1 + Fraction(eps).limit_denominator(10**6):
            ok.append((excess, tile))
    p = _plan(L, params={**SK, "whole_wave": eps}, hkv=hkv, ref=False)
    if ok:
        tile = min(ok)[1]
        assert (p.config.block_n, p.config.num_warps, p.config.num_stages) == tile
        assert p.num_splits.max() == 1 and p.work_request.shape[0] == B
        assert np.all(p.work_kv_end - p.work_kv_start == L)
    else:
        own = _plan(L, hkv=hkv, ref=False)  # the policy's own plan
        assert p.config == own.config
        for f in ("num_splits", "work_request", "work_kv_start", "work_kv_end", "cta_indptr"):
            np.testing.assert_array_equal(getattr(p, f), getattr(own, f))


def test_whole_wave_heads_tile_hand_computed():
    """``whole_wave_heads = 2`` adds (64, 4, 3, prefetch, 2 heads per tile), one resident CTA per SM (132 slots)."""
    from kvsplit.kernels.rulespec import WHOLE_WAVE_HEADS_TILES, resident_slots

    h2 = KernelConfig(64, 4, 3, prefetch=True, heads_per_tile=2)
    assert WHOLE_WAVE_HEADS_TILES == (h2,) and resident_slots(_ctx(), h2) == 132
    L = np.full(64, 4096, dtype=np.int64)
    # 64 x 4 = 256 one-head tiles: (64, 4, 2) 528 * 4096 / (4 * 262144) = 2.06, (128, 4, 2) 1.55; the two-head
    # tile: 64 x 2 = 128 tiles, 132 * 4096 / (2 * 262144) = 1.03125
    assert whole_wave_config(L, _ctx(), 0.05) is None
    assert whole_wave_config(L, _ctx(), 0.05, heads=2) == h2
    assert whole_wave_config(L, _ctx(), 0.03, heads=2) is None
    # a tie (B = 128: 1.03125 on (64, 4, 2) and on two waves of the two-head tile) keeps the one-head tile
    assert whole_wave_config(np.full(128, 2048, np.int64), _ctx(), 0.05, heads=2) == KernelConfig(64, 4, 2)
    # H_kv = 1: no pair of heads; H_kv = 8, B = 32: 128 tiles of two heads
    assert whole_wave_config(np.full(130, 4096, np.int64), _ctx(1), 0.05, heads=2) in (
        None,
        KernelConfig(64, 4, 2),
        KernelConfig(128, 4, 2),
    )
    assert whole_wave_config(np.full(32, 4096, np.int64), _ctx(8), 0.05, heads=2) == h2
    for ref in (True, False):
        p = _plan(L, params={**SK, "whole_wave": 0.05, "whole_wave_heads": 2}, ref=ref)
        assert p.config == h2 and p.num_splits.max() == 1 and p.num_work_tiles == 128
        assert _plan(L, params={**SK, "whole_wave": 0.05}, ref=ref).config == KernelConfig(*[128, 4, 2])


@pytest.mark.parametrize("bad", [0, 17, 1.5, True, "2", None])
@pytest.mark.parametrize("policy", ["stream_k", "balanced", "tuned"])
def test_bad_whole_wave_heads_names_the_parameter(bad, policy):
    for fn in (make_plan, oracle_plan):
        with pytest.raises(ValueError, match="params.whole_wave_heads"):
            fn(
                [4096] * 64,
                num_kv_heads=4,
                device=H200,
                policy=policy,
                params={"whole_wave": 0.05, "whole_wave_heads": bad},
            )


def test_table_refits_whole_wave_heads_to_the_gqa_group():
    """A policy with ``whole_wave_heads = 2`` (tuned at G = 8) serves a G = 16 model with the one-head tiles only."""
    from kvsplit.kernels import fastplan

    L = [4096] * 64
    doc = PolicyTable.document(
        [
            {
                "id": 1,
                "version": 1,
                "name": "stream_k",
                "backend": "gpu",
                "params": {**SK, "whole_wave": 0.05, "whole_wave_heads": 2},
                "bucket": str(bucket_key(np.asarray(L), num_kv_heads=4, head_dim=128, dtype="bfloat16", device=H200)),
                "gpu": "NVIDIA H200",
                "num_kv_heads": 4,
                "head_dim": 128,
                "dtype": "bfloat16",
                "page_size": 16,
            }
        ],
        version=1,
    )
    table = PolicyTable.from_json(doc)
    for ref in (True, False):
        with fastplan.python() if ref else contextlib.nullcontext():
            p8 = table.plan(
                L, gpu="NVIDIA H200", num_qo_heads=32, num_kv_heads=4, head_dim=128, dtype="bfloat16", page_size=16
            )[0]
            p16 = table.plan(
                L, gpu="NVIDIA H200", num_qo_heads=64, num_kv_heads=4, head_dim=128, dtype="bfloat16", page_size=16
            )[0]
        assert p8.config.heads_per_tile == 2 and p8.num_splits.max() == 1
        assert p16.config == KernelConfig(128, 4, 2) and p16.num_splits.max() > 1  # the policy's own plan
        assert p16 == _plan(L, params={**SK, "whole_wave": 0.05, "whole_wave_heads": 1}, ref=False)


@given(
    B=st.integers(1, 300),
    base=st.integers(1, 40000),
    spread=st.sampled_from([0.0, 0.004, 0.03]),
    hkv=st.sampled_from([1, 2, 4, 8]),
    seed=st.integers(0, 2**16),
)
@settings(max_examples=100, deadline=None)
def test_whole_wave_heads_compiled_equals_reference(B, base, spread, hkv, seed):
    rng = np.random.default_rng(seed)
    L = np.maximum(np.rint(base * rng.uniform(1 - spread, 1 + spread, B)), 1).astype(np.int64)
    for pol, prm in (("stream_k", SK), ("balanced", {"ctas_per_sm": 3.0}), ("tuned", {"ctas_per_sm": 4.0})):
        prm = {**prm, "whole_wave": 0.05, "whole_wave_heads": 2}
        assert _plan(L, pol, prm, hkv=hkv, ref=False) == _plan(L, pol, prm, hkv=hkv, ref=True)
