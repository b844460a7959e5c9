"""The one rule of a work tile's KV heads and query rows (kernels/limits.py ``tile_problem``): ``heads_fit``, the
launch's ``check_heads_per_tile``, the planner's refit and the real launch agree, for q_len 1-8.

The independent statement checked here is read off the kernel (kernels/decode.py): a tile of h adjacent KV heads
puts head j's G query heads x q_len tokens on rows ``j * G * q_len ..`` of one ``tl.dot`` of
``BLOCK_H = max(16, next_pow2(h * G * q_len))`` rows, compiled up to 64 rows (limits.MAX_TILE_ROWS); several heads
share a tile only where their groups fit the first 16 rows (h * G <= 16); h divides H_kv.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsplit.kernels.decode import check_heads_per_tile, decode_attention
from kvsplit.kernels.limits import HEADS_PER_TILE_CHOICES, heads_fit, tile_rows
from kvsplit.kernels.plan import make_plan
from kvsplit.kernels.rulespec import fit_heads_per_tile

from .paged_case import make_case, reference_verify


def _kernel_takes(h: int, G: int, hkv: int, q_len: int) -> bool:
    return h * G * q_len <= 64 and hkv % h == 0 and (h == 1 or h * G <= 16)


def _accepted(h, hq, hkv, q_len) -> tuple[bool, str]:
    try:
        check_heads_per_tile(h, hq, hkv, q_len=q_len, name="params.heads_per_tile")
    except ValueError as exc:
        return False, str(exc)
    return True, ""


@settings(max_examples=400, deadline=None)
@given(
    h=st.sampled_from(HEADS_PER_TILE_CHOICES),
    G=st.sampled_from([1, 2, 3, 4, 5, 6, 8, 12, 16, 32, 64]),
    hkv=st.integers(1, 16),
    q_len=st.integers(1, 8),
)
def test_heads_fit_is_what_the_launch_check_accepts(h, G, hkv, q_len):
    ok, msg = _accepted(h, G * hkv, hkv, q_len)
    assert heads_fit(h, G * hkv, hkv, q_len) == ok == _kernel_takes(h, G, hkv, q_len)
    assert tile_rows(h, G, q_len) == h * G * q_len
    if not ok:  # too many rows names q_len (as the launch), else the argument that holds heads_per_tile
        assert msg.startswith("q_len: " if h * G * q_len > 64 else "params.heads_per_tile: "), msg
    # at q_len 1 the rule is the one the launch had before q_len existed
    if q_len == 1:
        assert ok == (hkv % h == 0 and (h == 1 or h * G <= 16))
    # the planner's refit lands on the largest choice <= h the launch takes (one head when G * q_len alone is the
    # problem: no head count fixes that; the shape's q_len check names it)
    got = fit_heads_per_tile({"heads_per_tile": h}, G * hkv, hkv, q_len).get("heads_per_tile", 1)
    want = max(c for c in HEADS_PER_TILE_CHOICES if c == 1 or (c <= h and _kernel_takes(c, G, hkv, q_len)))
    assert got == want and (got == 1 or heads_fit(got, G * hkv, hkv, q_len))


def test_launch_takes_the_64_row_tile_and_refuses_one_more_head():
    """G = 4, two KV heads per tile, q_len 8: 64 rows, the largest tile the rule takes, runs on the interpreter and
    matches the fp32 reference; four heads per tile at q_len 8 (128 rows) are refused before any launch, naming
    q_len, while heads_fit says the same."""
    lens, q_len = [8, 23], 8
    case = make_case(
        lens, num_qo_heads=8, num_kv_heads=2, head_dim=64, page_size=16, dtype=torch.float32, seed=5, q_len=q_len
    )
    kw = dict(num_kv_heads=2, device="NVIDIA H200", policy="fixed", head_dim=64, dtype="float32", num_qo_heads=8)
    plan = make_plan(lens, params={"num_splits": 2, "block_n": 16, "heads_per_tile": 2}, q_len=q_len, **kw)
    assert plan.config.heads_per_tile == 2 and heads_fit(2, 8, 2, q_len)
    o = decode_attention(**case, plan=plan, q_len=q_len)
    ref, _ = reference_verify(**case, q_len=q_len)
    assert (o.float() - ref).abs().max().item() < 2e-5 * max(1.0, ref.abs().max().item())

    case4 = make_case(
        lens, num_qo_heads=16, num_kv_heads=4, head_dim=64, page_size=16, dtype=torch.float32, seed=5, q_len=q_len
    )
    plan4 = make_plan(lens, params={"num_splits": 2, "block_n": 16, "heads_per_tile": 4}, **{**kw, "num_kv_heads": 4})
    assert not heads_fit(4, 16, 4, q_len) and heads_fit(4, 16, 4, 1)
    out = torch.full_like(case4["q"], float("nan"))
    with pytest.raises(ValueError, match=r"^q_len: 8 tokens x GQA group G=4 x heads_per_tile=4 are 128 query rows"):
        decode_attention(**case4, plan=plan4, q_len=q_len, out=out)
    assert torch.isnan(out).all()


def test_next_pow2_is_tritons_next_power_of_2():
    """The launch's host-side block sizes: the same numbers as triton.next_power_of_2 (the reference), 1..70,000."""
    import triton

    from kvsplit.kernels.limits import next_pow2

    for x in range(1, 70_001):
        assert next_pow2(x) == triton.next_power_of_2(x), x
    assert next_pow2(0) == 1
