"""Device planner (kernels/device_plan.py) == host plan, on the Triton CPU interpreter."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvsplit.kernels.device_plan import alloc_device_plan, check_device_rule, device_plan
from kvsplit.kernels.plan import make_plan
from kvsplit.kernels.rulespec import resolve

H200 = "NVIDIA H200"
RULES = [
    ("fixed", {"num_splits": 3}),
    ("no_split", {}),
    ("stream_k", {}),
    ("stream_k", {"ctas_per_sm": 1, "item_cost_blocks": 2, "min_piece_blocks": 3}),
    ("stream_k", {"ctas_per_sm": 0.25, "block_n": 16}),
    ("tuned", {"wave_aware": False, "ctas_per_sm": 3, "min_chunk_tokens": 100, "max_splits": 5}),
    ("tuned", {"partition": "stream_k", "min_piece_blocks": 2, "item_cost_blocks": 0}),
    # GQA-packed work tiles: the partitions count H_kv / heads_per_tile tiles per work item
    ("stream_k", {"ctas_per_sm": 1, "heads_per_tile": 2}),
    ("tuned", {"wave_aware": False, "ctas_per_sm": 2, "block_n": 32, "heads_per_tile": 4}),
    ("fixed", {"num_splits": 2, "heads_per_tile": 2}),
]


def _check(L, policy, params, hkv=4, max_batch=64, max_items=2048):
    rule = resolve(policy, params, num_kv_heads=hkv, device=H200)
    check_device_rule(rule)
    bufs = alloc_device_plan(max_batch, max_items, "cpu")
    counter = torch.ones(1, dtype=torch.int32)
    bufs.work_slot.fill_(-7)
    device_plan(torch.tensor(L, dtype=torch.int32), rule, bufs, counter)
    p = make_plan(L, num_kv_heads=hkv, device=H200, policy=policy, params=params)
    W, C = p.num_work_items, p.num_ctas
    ws, mr, ms, mn = p.merge_layout()
    M = mr.shape[0]
    assert p.num_work_tiles == C * hkv // params.get("heads_per_tile", 1)
    assert bufs.counts.tolist() == [W, C, p.num_work_tiles, M]
    assert bufs.work_request[:W].tolist() == p.work_request.tolist()
    assert bufs.work_kv_start[:W].tolist() == p.work_kv_start.tolist()
    assert bufs.work_kv_end[:W].tolist() == p.work_kv_end.tolist()
    assert bufs.work_slot[:W].tolist() == ws.tolist()
    assert bufs.cta_indptr[: C + 1].tolist() == p.cta_indptr.tolist()
    assert bufs.merge_request[:M].tolist() == mr.tolist()
    assert bufs.merge_slot_start[:M].tolist() == ms.tolist()
    assert bufs.merge_num[:M].tolist() == mn.tolist()
    assert counter.item() == 0


@pytest.mark.parametrize("policy,params", RULES)
def test_random_batches(policy, params):
    rng = np.random.default_rng(len(policy) + len(params))
    for _ in range(4):
        B = int(rng.integers(1, 64))
        hkv = int(rng.choice([1, 4, 8] if params.get("heads_per_tile", 1) == 1 else [4, 8]))
        _check(rng.integers(0, 20000, B).tolist(), policy, params, hkv=hkv)


@pytest.mark.parametrize("policy,params", RULES)
def test_edge_cases(policy, params):
    _check([0], policy, params)  # B = 1, empty
    _check([1], policy, params)
    _check([300000], policy, params)  # B = 1, long
    _check([0, 0, 5, 0], policy, params)  # zeros
    _check([7] * 64, policy, params, max_batch=64)  # batch at the maximum size
    rng = np.random.default_rng(3)
    _check(rng.integers(0, 3000, 2000).tolist(), policy, params, max_batch=2048, max_items=8192)  # > one block


def test_host_only_rules_say_so():
    with pytest.raises(NotImplementedError, match="wave-aware"):
        check_device_rule(resolve("balanced", {}, num_kv_heads=4, device=H200))
    with pytest.raises(NotImplementedError, match="heavy_first"):
        check_device_rule(resolve("stream_k", {"order": "heavy_first"}, num_kv_heads=4, device=H200))
    with pytest.raises(ValueError, match="params.ctas_per_sm"):
        check_device_rule(resolve("stream_k", {"ctas_per_sm": 0}, num_kv_heads=4, device=H200))
