"""Plans byte-identical to the recorded ones on the 182 evaluation batches (tests/data/golden_plans.json).

The GPU results of the evaluation sets (5 families x B 1..512 x T 2^18 / 2^20, jittered draws, untuned B,
the Llama-3.1-8B shape and trace batches) were measured on these plans; a change of the planner that changes
one of them changes what was measured. The file holds each batch's kv_lens and shape and, per batch, the
sha256 (first 16 hex digits) of the canonical JSON (sorted keys, no spaces) of ``Plan.to_dict()`` for:

- ``served``: the plan the shipped table (kernels/data/h200_policies.json) serves (``PolicyTable.plan``), and
  ``served_answer`` its ``{bucket, policy}`` objects;
- ``named``: ``make_plan`` with each entry of ``policies`` (kvsplit's and the peers' baselines, and every
  distinct (policy, params) of the shipped table), params fitted to the GQA group as the table fits them;
- ``device``: the device planner's buffers (work list, CTA runs, merge layout, counts) for ``device_policies``,
  on the Triton interpreter.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from kvsplit.kernels import fastplan
from kvsplit.kernels.plan import make_plan
from kvsplit.kernels.policy_table import PolicyTable
from kvsplit.kernels.rulespec import fit_heads_per_tile
from kvsplit.kernels.shape import Shape

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = json.loads((ROOT / "tests/data/golden_plans.json").read_text())
CASES = GOLDEN["cases"]


def digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def _table() -> PolicyTable:
    return PolicyTable.from_export(json.loads((ROOT / "kernels/data/h200_policies.json").read_text()))


def _shape(case) -> dict:
    return dict(
        gpu=GOLDEN["gpu"],
        num_qo_heads=case["num_qo_heads"],
        num_kv_heads=case["num_kv_heads"],
        head_dim=GOLDEN["head_dim"],
        dtype=GOLDEN["dtype"],
        page_size=GOLDEN["page_size"],
    )


def test_file_covers_the_evaluation_sets():
    assert len(CASES) == 182
    assert {c["set"] for c in CASES} == {"ref", "jitter", "untuned", "llama8b", "trace"}
    assert len(GOLDEN["policies"]) >= 40


@pytest.mark.parametrize("core", ["compiled", "python"])
def test_served_plans(core):
    """``PolicyTable.plan`` (int32 array and list input) and ``plan_buffers`` serve the recorded plans."""
    table = _table()
    ctx = fastplan.python() if core == "python" else contextlib.nullcontext()
    with ctx:
        for c in CASES:
            kw = _shape(c)
            for L in (np.array(c["kv_lens"], np.int32), c["kv_lens"]):
                plan, bucket, info = table.plan(L, **kw)
                assert digest(plan.to_dict()) == c["served"], c["id"]
                assert digest({"bucket": bucket, "policy": info}) == c["served_answer"], c["id"]
            shape = Shape.of(device=kw.pop("gpu"), **kw)
            raw = table.plan_buffers(np.array(c["kv_lens"], np.int64), shape)
            if core == "compiled":
                B, W, nc, b64, b32, sp, key, entry, dist = raw
                assert b64[:B].tolist() == c["kv_lens"]
                assert B + 2 * W <= b64.shape[0] and nc == plan.cta_indptr.shape[0]
                assert b64[B : B + W].tolist() == plan.work_kv_start.tolist()
                assert b64[B + W : B + 2 * W].tolist() == plan.work_kv_end.tolist()
                assert b32[:B].tolist() == plan.num_splits.tolist()
                assert b32[B : B + W].tolist() == plan.work_request.tolist()
                assert b32[B + W : B + W + nc].tolist() == plan.cta_indptr.tolist()
                assert key.tobytes().decode() == bucket["key"] and dist == bucket["distance"]


@pytest.mark.parametrize("core", ["compiled", "python"])
def test_named_policy_plans(core):
    """``make_plan`` with every recorded (policy, params) gives the recorded plan on every batch."""
    ctx = fastplan.python() if core == "python" else contextlib.nullcontext()
    with ctx:
        for c in CASES:
            hq, hkv = c["num_qo_heads"], c["num_kv_heads"]
            for (name, params), want in zip(GOLDEN["policies"], c["named"]):
                p = make_plan(
                    c["kv_lens"],
                    num_kv_heads=hkv,
                    device=GOLDEN["gpu"],
                    policy=name,
                    params=fit_heads_per_tile(params, hq, hkv),
                )
                assert digest(p.to_dict()) == want, (c["id"], name, params)


@pytest.mark.slow
def test_device_planner_work_lists():
    """The device planner writes the recorded buffers for the rules it runs: on a GPU for every case, under the
    Triton interpreter (no GPU) for every third case (61 of 182, every length family and batch size among them),
    each interpreted call costing about 0.1 s whatever the batch."""
    torch = pytest.importorskip("torch")
    from kvsplit.kernels.device_plan import alloc_device_plan, check_device_rule, device_plan
    from kvsplit.kernels.rulespec import resolve

    cases = CASES if torch.cuda.is_available() else CASES[::3]
    assert torch.cuda.is_available() or len(cases) == 61
    for c in cases:
        L = c["kv_lens"]
        for (name, params), want in zip(GOLDEN["device_policies"], c["device"]):
            rule = resolve(name, params, num_kv_heads=c["num_kv_heads"], device=GOLDEN["gpu"])
            check_device_rule(rule)
            dev = "cuda" if torch.cuda.is_available() else "cpu"  # the interpreter without a GPU
            bufs = alloc_device_plan(len(L), 8 * len(L) + 4096, dev)
            device_plan(
                torch.tensor(L, dtype=torch.int32, device=dev), rule, bufs, torch.ones(1, dtype=torch.int32, device=dev)
            )
            W, C, T, M = bufs.counts.tolist()
            got = {
                "counts": [W, C, T, M],
                "work_request": bufs.work_request[:W].tolist(),
                "work_kv_start": bufs.work_kv_start[:W].tolist(),
                "work_kv_end": bufs.work_kv_end[:W].tolist(),
                "work_slot": bufs.work_slot[:W].tolist(),
                "cta_indptr": bufs.cta_indptr[: C + 1].tolist(),
                "merge_request": bufs.merge_request[:M].tolist(),
                "merge_slot_start": bufs.merge_slot_start[:M].tolist(),
                "merge_num": bufs.merge_num[:M].tolist(),
            }
            assert digest(got) == want, (c["id"], name, params)
