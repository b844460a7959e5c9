"""The head-fused stage-1 prototypes (bench/kernel_hf.py, both layouts) vs the fp32 torch reference on the CPU
interpreter.

Runs under Triton's interpreter only (TRITON_INTERPRET=1, which tests/conftest.py sets without a GPU), in
float16 / float32 like tests/kernels/test_decode.py. Pages are shuffled and every slot no request owns holds
NaN (tests/kernels/paged_case.py), so a load outside a request's kv_len shows up as NaN.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest
import torch

from kvsplit.kernels import decode as dec
from kvsplit.kernels.device import DeviceSpec
from kvsplit.kernels.plan import make_plan

from .paged_case import make_case

pytestmark = pytest.mark.skipif(not dec._INTERPRETED, reason="CPU interpreter test: needs TRITON_INTERPRET=1")

_spec = importlib.util.spec_from_file_location(
    "kernel_hf", Path(__file__).resolve().parents[2] / "bench" / "kernel_hf.py")
khf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(khf)

D = 64
TOL = {torch.float32: 2e-5, torch.float16: 5e-3}
NAMES = {torch.float32: "float32", torch.float16: "float16"}
# a 2-SM device, so the planners split these tiny batches
SMALL = dataclasses.replace(DeviceSpec.known("NVIDIA H200"), num_sms=2)
LENS = [0, 1, 37, 16, 250, 513, 3]


def _check(case, plan, dtype, return_lse=False, **kw):
    got = khf.hf_decode(**case, plan=plan, return_lse=return_lse, **kw)
    ref, ref_lse = dec.reference_decode_attention(**case, return_lse=True)
    o = got[0] if return_lse else got
    assert o.dtype == dtype and o.shape == case["q"].shape
    assert not torch.isnan(o).any(), "NaN reached the output"
    err = (o.float() - ref.float()).abs().max().item()
    assert err < TOL[dtype], f"max |o - ref| = {err}"
    if return_lse:
        lse = got[1]
        finite = torch.isfinite(ref_lse)
        assert torch.equal(finite, torch.isfinite(lse))
        assert torch.all(lse[~finite] == float("-inf"))
        assert (lse[finite] - ref_lse[finite]).abs().max().item() < 1e-3


@pytest.mark.parametrize("layout", ["3d", "2d"])
@pytest.mark.parametrize("num_kv_heads", [1, 2, 4])
@pytest.mark.parametrize("group", [1, 4, 8])
def test_matches_reference_split_and_unsplit(num_kv_heads, group, layout):
    dtype = torch.float16 if (num_kv_heads + group) % 2 else torch.float32
    case = make_case(LENS, num_qo_heads=num_kv_heads * group, num_kv_heads=num_kv_heads, head_dim=D, page_size=16,
                     dtype=dtype, seed=10 * num_kv_heads + group)
    for i, (policy, cps) in enumerate((("stream_k", 2.0 * num_kv_heads), ("balanced", 4.0 * num_kv_heads))):
        plan = make_plan(LENS, num_kv_heads=num_kv_heads, device=SMALL, policy=policy,
                         params={"ctas_per_sm": cps, "block_n": 32}, head_dim=D, page_size=16, dtype=NAMES[dtype])
        splits = plan.num_splits.tolist()
        assert max(splits) >= 3 and min(splits) == 1, (policy, splits)  # split requests and unsplit ones
        block_n, prefetch = ((16, True), (32, False))[(i + group) % 2]
        _check(case, plan, dtype, block_n=block_n, prefetch=prefetch, num_stages=3 if prefetch else 2, layout=layout)


@pytest.mark.parametrize("layout", ["3d", "2d"])
def test_unsplit_plan_packed_items_fp16(layout):
    # no_split: every item writes the final output directly; several items per CTA when packed
    lens = [5, 0, 16, 33, 1, 100]
    case = make_case(lens, num_qo_heads=8, num_kv_heads=2, head_dim=D, page_size=16, dtype=torch.float16, seed=3)
    plan = make_plan(lens, num_kv_heads=2, device=SMALL, policy="no_split", params={"pack_tokens": 128},
                     head_dim=D, page_size=16, dtype="float16")
    assert plan.num_partials == 0 and plan.num_ctas < len(lens)
    _check(case, plan, torch.float16, block_n=16, layout=layout)


@pytest.mark.parametrize("layout", ["3d", "2d"])
def test_return_lse_and_empty_requests_fp32(layout):
    lens = [0, 200, 0, 17, 1]
    case = make_case(lens, num_qo_heads=16, num_kv_heads=4, head_dim=D, page_size=16, dtype=torch.float32, seed=4)
    plan = make_plan(lens, num_kv_heads=4, device=SMALL, policy="fixed", params={"num_splits": 3, "block_n": 16},
                     head_dim=D, page_size=16, dtype="float32")
    _check(case, plan, torch.float32, return_lse=True, block_n=16, prefetch=True, num_stages=3, layout=layout)
