"""launch_decode's fixed launch rule against the launches its A/B switches' defaults picked (CPU, no kernel runs).

tests/data/launch_rule.json holds, for 2,652 inputs (GQA shape, head dim, K/V dtype, kernel config, host-known
or device-resident sizes, PDL available or not, compiled or interpreted, workspace counters full / missing /
short), the stage-1 and merge launch keywords of ``launch_decode`` as of revision d1c77fc, before the switches
(``prefetch``, ``next_item``, ``maxnreg``, ``merge_dsplit``, ``merge_warps``, ``merge_overlap``, ``timeline``)
and the ``_OVERLAP`` dict left it; its ``command`` field regenerates it (tests/kernels/launch_grid.py)."""

from __future__ import annotations

import pytest

from kvsplit.kernels import decode as dec
from kvsplit.kernels.decode import MERGE_POLL_NS, launch_rule

from .launch_grid import CONFIGS, as_row, grid, load, record

ROWS = load()


def test_the_recorded_grid_is_the_grid():
    """The JSON was recorded over the grid launch_grid.py builds today (same inputs, same order)."""
    assert [p for p, _ in ROWS] == [{**{k: None for k in ROWS[0][0]}, **p} for p in grid()]
    assert len(ROWS) == 2652
    # every regime the rule separates is in the grid
    stage1 = [r[1] for _, r in ROWS]
    merge = [r[2] for _, r in ROWS if r[2] is not None]
    assert {s[1] for s in stage1} == {None, 128}  # register cap: none, and the (64, 4, 2) tile's
    assert {m[3] for m in merge} >= {16, 32, 64, 128, 256}  # BLOCK_D: D / 4 and D
    assert {m[1] for m in merge} == {1, 4} and {m[4] for m in merge} == {True, False}  # warps; overlap
    assert {(s[4], s[5]) for s in stage1} == {(False, False), (True, False), (False, True)}  # PDL, PDL_LAST


def test_launch_decode_launches_as_before():
    """Today's launch_decode, recorded at every point, passes the same keywords to both kernels as the
    launcher with the A/B switches did at their defaults."""
    bad = [(p, r, got) for p, r in ROWS if (got := as_row(p, record(dec, p))) != r]
    assert not bad, f"{len(bad)} of {len(ROWS)} points differ, first: {bad[0]}"


@pytest.mark.parametrize("part", range(4))
def test_launch_rule_is_the_recorded_pick(part):
    """launch_rule, called as a pure function at every point, gives the recorded register cap, merge grid
    (programs per (request, head) = D / BLOCK_D), merge warps, overlap and PDL trigger."""
    for p, (_, s1, m) in ROWS[part::4]:
        cfg = CONFIGS[p["cfg"]]
        if p["schedule"] == "persistent":
            cfg = type(cfg)(**{**cfg.to_dict(), "schedule": "persistent", "num_programs": 528})
        merges = (min(4 * p["B"] if p["wide"] else p["B"], p["B"]) if p["resident"] else p["num_merge"]) > 0
        need = p["B"] * p["hq"] * dec.MERGE_SYNC_CHUNKS
        r = launch_rule(
            cfg,
            num_qo_heads=p["hq"],
            num_kv_heads=p["hkv"],
            head_dim=p["d"],
            dtype_bytes=2 if p["dtype"] == "bfloat16" else 4,
            num_merge=None if p["resident"] else p["num_merge"],
            max_splits=None if p["resident"] else p["max_splits"],
            merges=merges,
            device_resident=p["resident"],
            pdl_available=p["pdl"],
            sync_ok={"full": True, "none": False, "short": 5 >= need}[p["sync"]],
            compiled=p["compiled"],
        )
        _, maxnreg, signal, merge_ds, pdl, pdl_last = s1[:6]
        assert r.maxnreg == maxnreg, p
        assert (r.merge_overlap, r.pdl and not r.pdl_last, r.pdl_last) == (signal, pdl, pdl_last), p
        assert merge_ds == (r.merge_dsplit if r.merge_overlap else 1), p
        assert (m is not None) == merges, p
        if m is not None:
            grid_m, warps, _block_s, block_d, wait, poll_ns, relaxed, launch_pdl = m
            assert grid_m[2] == r.merge_dsplit == p["d"] // block_d, p
            assert (warps, wait, relaxed, bool(launch_pdl)) == (r.merge_warps, r.merge_overlap, r.merge_overlap, r.pdl)
            assert poll_ns == (MERGE_POLL_NS if r.pdl else 0) == r.poll_ns


def test_launch_decode_has_no_ab_switches():
    """The public launcher takes a plan's arrays, sizes and the call's options only."""
    import inspect

    params = set(inspect.signature(dec.launch_decode).parameters)
    assert not params & {"prefetch", "next_item", "maxnreg", "merge_dsplit", "merge_warps", "merge_overlap"}
    assert "timeline" not in params and not hasattr(dec, "_OVERLAP")
