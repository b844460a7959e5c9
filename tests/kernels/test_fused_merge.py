"""The merge fused into stage 1 (issue 12) on the CPU interpreter: against the fp32 reference and the
separate merge launch, semaphores back to zero after every call, and the launcher's choice of path."""

from __future__ import annotations

import pytest
import torch

from kvsplit.kernels import decode as dec
from kvsplit.kernels.decode import decode_attention, launch_decode, make_workspace, reference_decode_attention
from kvsplit.kernels.plan import make_plan

from .paged_case import make_case

D = 64
TOL = {torch.float32: 2e-5, torch.float16: 5e-3}
NAMES = {torch.float32: "float32", torch.float16: "float16"}


def _setup(lens, h_q, h_kv, dtype, splits, page_size=16, seed=0, **params):
    plan = make_plan(lens, num_kv_heads=h_kv, device="NVIDIA H200", policy="fixed",
                     params={"num_splits": splits, "block_n": 16, **params}, head_dim=D, page_size=page_size,
                     dtype=NAMES[dtype])
    case = make_case(lens, num_qo_heads=h_q, num_kv_heads=h_kv, head_dim=D, page_size=page_size, dtype=dtype,
                     seed=seed)
    ws = make_workspace(h_q, D, max_partials=plan.num_partials, max_batch=len(lens), device="cpu")
    return plan, case, ws


def _launch(plan, case, ws, fuse, return_lse=True):
    out = torch.empty_like(case["q"])
    h_kv = case["k_cache"].shape[2]
    return launch_decode(case["q"], case["k_cache"], case["v_cache"], case["kv_indptr"], case["kv_indices"],
                         plan.to("cpu"), plan.config, out=out, workspace=ws, num_tiles=plan.num_ctas * h_kv,
                         num_merge=int(plan.merge_layout()[1].shape[0]), max_splits=int(plan.num_splits.max()),
                         return_lse=return_lse, fuse_merge=fuse)


def _assert_close(o, lse, case, dtype):
    ref, ref_lse = reference_decode_attention(**case, return_lse=True)
    assert not torch.isnan(o).any()
    assert (o.float() - ref.float()).abs().max().item() < TOL[dtype]
    fin = torch.isfinite(ref_lse)
    assert torch.equal(fin, torch.isfinite(lse))
    assert (lse[fin] - ref_lse[fin]).abs().max().item() < 1e-3


class _NoMergeLaunch:
    def __getitem__(self, grid):
        raise AssertionError("the separate merge kernel was launched")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("h_q, h_kv", [(4, 4), (6, 2), (8, 2)])  # GQA groups 1, 3 (columns masked), 4
def test_fused_merge_matches_reference_and_separate_merge(dtype, h_q, h_kv, monkeypatch):
    lens = [300, 0, 1, 77, 160]  # kv_len 0 and 1 stay single items; the others split in 5
    plan, case, ws = _setup(lens, h_q, h_kv, dtype, splits=5, seed=h_q + h_kv)
    assert (plan.num_splits > 1).sum() == 3
    o_sep, lse_sep = _launch(plan, case, ws, fuse=False)
    o_sep, lse_sep = o_sep.clone(), lse_sep.clone()
    monkeypatch.setattr(dec, "_decode_merge_kernel", _NoMergeLaunch())
    for _ in range(2):  # the second call finds every semaphore back at zero
        o, lse = _launch(plan, case, ws, fuse=True)
        _assert_close(o, lse, case, dtype)
        assert int(ws.merge_sem.abs().sum()) == 0, "a semaphore was not reset by its last arrival"
    assert (o.float() - o_sep.float()).abs().max().item() < TOL[dtype]
    assert (lse - lse_sep)[torch.isfinite(lse)].abs().max().item() < 1e-5


def test_fused_merge_of_many_splits_odd_count_fp16():
    # 37 splits: 19 chunks of FUSED_MERGE_BLOCK_S = 2 partials, the last one half masked
    lens = [37 * 16 + 5, 9, 600]
    plan, case, ws = _setup(lens, 4, 2, torch.float16, splits=37, seed=5)
    assert int(plan.num_splits.max()) == 37
    o, lse = _launch(plan, case, ws, fuse=True)
    _assert_close(o, lse, case, torch.float16)
    assert int(ws.merge_sem.abs().sum()) == 0


def test_auto_choice_fuses_few_splits_only(monkeypatch):
    few, case_few, ws_few = _setup([200, 50], 4, 2, torch.float16, splits=dec.FUSE_MAX_SPLITS, seed=6)
    many, case_many, ws_many = _setup([800, 50], 4, 2, torch.float16, splits=dec.FUSE_MAX_SPLITS + 1, seed=7)
    calls = []
    real = dec._decode_merge_kernel

    class Spy:
        def __getitem__(self, grid):
            calls.append(grid)
            return real[grid]

    monkeypatch.setattr(dec, "_decode_merge_kernel", Spy())
    o, lse = decode_attention(**case_few, plan=few, workspace=ws_few, out=torch.empty_like(case_few["q"]),
                              return_lse=True)
    _assert_close(o, lse, case_few, torch.float16)
    assert calls == [], "a plan with <= FUSE_MAX_SPLITS splits per request merges inside stage 1"
    o, lse = decode_attention(**case_many, plan=many, workspace=ws_many, return_lse=True)
    _assert_close(o, lse, case_many, torch.float16)
    merged = int((many.num_splits > 1).sum())
    assert calls == [(merged, 4)], "more splits keep the parallel merge launch, one program per (request, head)"


def test_fused_merge_needs_its_inputs():
    plan, case, ws = _setup([300, 40], 4, 2, torch.float16, splits=3)
    ws.merge_sem = None
    with pytest.raises(ValueError, match="fuse_merge"):
        _launch(plan, case, ws, fuse=True)
    o, lse = _launch(plan, case, ws, fuse=None)  # a workspace without merge_sem: the separate merge
    _assert_close(o, lse, case, torch.float16)
    ws.merge_sem = torch.zeros(8, dtype=torch.int64)
    with pytest.raises(ValueError, match="workspace.merge_sem"):
        decode_attention(**case, plan=plan, workspace=ws)
    ws.merge_sem = torch.zeros(3, dtype=torch.int32)  # B * H_kv = 4 counters needed
    with pytest.raises(ValueError, match="workspace.merge_sem: holds 3 counters"):
        decode_attention(**case, plan=plan, workspace=ws)
