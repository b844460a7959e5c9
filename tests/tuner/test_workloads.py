"""Workloads: jittered family draws, shipped traces, continuous-batching replay."""

from __future__ import annotations

import collections
import hashlib
import re
from pathlib import Path

import numpy as np
import pytest

from kvsplit.tuner import workloads as w

# ---------------------------------------------------------------------------
# family draws
# ---------------------------------------------------------------------------


def test_family_batches_jitter_bounds_and_roles_differ():
    base = w.family_kv_lens("skewed80", 16, 100_000)
    tr = w.family_batches("skewed80", 16, 100_000, num_batches=5, seed=3, role="train")
    ho = w.family_batches("skewed80", 16, 100_000, num_batches=5, seed=3, role="heldout")
    for b in tr + ho:
        assert b.dtype == np.int64 and b.shape == base.shape
        # each length is base * U(0.9, 1.1), rounded
        assert np.all(b >= np.floor(0.9 * base)) and np.all(b <= np.ceil(1.1 * base))
    train_set = {b.tobytes() for b in tr}
    assert len(train_set) == 5
    assert not train_set & {b.tobytes() for b in ho}
    # reproducible
    again = w.family_batches("skewed80", 16, 100_000, num_batches=5, seed=3, role="train")
    assert all(np.array_equal(a, b) for a, b in zip(tr, again))


def test_jitter_keeps_zero_and_positive():
    rng = np.random.default_rng(0)
    out = w.jitter_lengths(np.array([0, 1, 2, 1000]), rng)
    assert out[0] == 0 and np.all(out[1:] >= 1)


@pytest.mark.parametrize("bad", [{"role": "test"}, {"num_batches": 0}, {"seed": -1}])
def test_family_batches_rejects(bad):
    kw = {"num_batches": 1, "seed": 0, "role": "train", **bad}
    with pytest.raises(ValueError, match=next(iter(bad))):
        w.family_batches("uniform", 4, 100, **kw)


# ---------------------------------------------------------------------------
# shipped trace files
# ---------------------------------------------------------------------------


def test_shipped_traces_match_readme_checksums_and_rows():
    readme = (w.TRACE_DIR / "README.md").read_text()
    sums = dict((m.group(2), m.group(1)) for m in re.finditer(r"^([0-9a-f]{64})  (\S+\.csv)$", readme, re.M))
    rows = {"azure_code": 8819, "azure_conv": 19366, "mooncake": 12031, "sharegpt": 30731, "arxiv": 28257}
    for name, spec in w.TRACES.items():
        path = w.TRACE_DIR / spec.file
        assert sums[spec.file] == spec.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
        tr = w.load_trace(name, verify=True)
        assert len(tr.prompt) == rows[name]
        assert tr.prompt.min() >= 1 and tr.output.min() >= 1
        if spec.time_col is None:
            assert tr.arrival_s is None
        else:
            assert tr.arrival_s[0] == 0 and np.all(np.diff(tr.arrival_s) >= 0)


def test_trace_readme_quantiles():
    # medians and means from the README's table (nearest-rank)
    tr = w.load_trace("mooncake")
    assert round(float(tr.prompt.mean())) == 12035 and round(float(tr.output.mean())) == 343
    az = w.load_trace("azure_code")
    assert int(np.sort(az.prompt)[int(np.ceil(0.5 * len(az.prompt))) - 1]) == 1469
    # Azure conversation spans about 58 minutes
    conv = w.load_trace("azure_conv")
    assert 57 * 60 < conv.arrival_s[-1] < 59 * 60


def test_traces_are_package_data():
    import fnmatch
    import tomllib

    root = Path(__file__).resolve().parents[2]
    cfg = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "kvsplit.tuner.traces" in cfg["packages"]
    patterns = cfg["package-data"]["kvsplit.tuner.traces"]
    files = sorted(p.name for p in (root / "tuner" / "traces").iterdir() if p.suffix in (".csv", ".md"))
    assert len(files) >= 6 and "README.md" in files
    assert [f for f in files if not any(fnmatch.fnmatch(f, pat) for pat in patterns)] == []


def test_unknown_trace():
    with pytest.raises(ValueError, match="unknown trace"):
        w.load_trace("burstgpt")


# ---------------------------------------------------------------------------
# replay, by hand
# ---------------------------------------------------------------------------


def _tiny():
    return w.Trace(
        name="tiny", prompt=np.array([100, 200, 300]), output=np.array([3, 2, 4]), arrival_s=np.array([0.0, 0.0, 0.05])
    )


def test_replay_by_hand_batch_cap():
    # step 0.025 s: arrivals at steps 0, 0, 2; two slots
    r = w.replay_trace(_tiny(), max_batch_size=2, rate_scale=1.0, step_s=0.025)
    assert r.start.tolist() == [0, 0, 2] and r.end.tolist() == [3, 2, 6]
    assert r.running.tolist() == [2, 2, 2, 1, 1, 1]
    assert r.batch_at(0).tolist() == [100, 200]
    assert r.batch_at(1).tolist() == [101, 201]
    assert r.batch_at(2).tolist() == [102, 300]
    assert r.batch_at(5).tolist() == [303]  # prompt + output - 1 at its last step


def test_replay_by_hand_token_budget():
    # reservations 103, 202, 304: with 400 tokens request 2 waits for request 0 to finish
    r = w.replay_trace(_tiny(), max_batch_size=8, rate_scale=1.0, step_s=0.025, token_budget=400)
    assert r.start.tolist() == [0, 0, 3] and r.end.tolist() == [3, 2, 7]
    # 250 tokens: request 1 waits for 0, request 2 never fits
    r = w.replay_trace(_tiny(), max_batch_size=8, rate_scale=1.0, step_s=0.025, token_budget=250)
    assert r.start.tolist() == [0, 3, -1] and r.end.tolist() == [3, 5, -1]


def test_replay_rate_scale_compresses_arrivals():
    slow = w.replay_trace(_tiny(), max_batch_size=8, rate_scale=1.0, step_s=0.025)
    fast = w.replay_trace(_tiny(), max_batch_size=8, rate_scale=2.0, step_s=0.025)
    assert slow.start[2] == 2 and fast.start[2] == 1


@pytest.mark.parametrize("name", ["azure_code", "azure_conv", "mooncake"])
def test_replay_real_trace_invariants(name):
    r = w.replay_trace(name, max_batch_size=64, token_budget=2_000_000)
    tr = r.trace
    assert r.running.max() <= 64
    ok = r.start >= 0
    assert np.all(r.end[ok] - r.start[ok] == tr.output[ok])
    # FCFS: admission order follows arrival order
    assert np.all(np.diff(r.start[ok]) >= 0)
    for step in (len(r.running) // 3, len(r.running) // 2):
        b = r.batch_at(step)
        assert len(b) == r.running[step]
        live = np.flatnonzero((r.start <= step) & (step < r.end))
        assert np.all(b >= tr.prompt[live].min())
        # the budget holds at every sampled step (reservations of prompt + output)
        assert (tr.prompt[live] + tr.output[live]).sum() <= 2_000_000


def test_trace_batches_sizes_and_disjoint_roles():
    tr, ho = w.trace_batches("mooncake", 32, num_train=4, num_heldout=4, seed=1)
    assert len(tr) == 4 and len(ho) == 4
    assert all(29 <= len(b) <= 32 for b in tr + ho)
    assert not {b.tobytes() for b in tr} & {b.tobytes() for b in ho}
    tr2, ho2 = w.trace_batches("mooncake", 32, num_train=4, num_heldout=4, seed=1)
    assert all(np.array_equal(a, b) for a, b in zip(tr + ho, tr2 + ho2))


def test_iid_trace_batches_ranges():
    tr, ho = w.trace_batches("arxiv", 50, num_train=3, num_heldout=2, seed=0, max_kv_len=3000)
    t = w.load_trace("arxiv")
    lo = int(t.prompt.min())
    for b in tr + ho:
        assert len(b) == 50 and b.min() >= lo and b.max() <= 3000
    assert not {b.tobytes() for b in tr} & {b.tobytes() for b in ho}


def test_auto_rate_scale_reaches_batch():
    # Little's law: at the auto rate the running batch reaches its cap
    r = w.replay_trace("azure_conv", max_batch_size=128)
    assert r.running.max() == 128
    assert np.mean(r.running[len(r.running) // 10 : len(r.running) // 2] >= 0.9 * 128) > 0.5


def test_replay_rejects_bad_options():
    with pytest.raises(ValueError, match="max_batch_size"):
        w.replay_trace("azure_code", max_batch_size=0)
    with pytest.raises(ValueError, match="token_budget"):
        w.replay_trace("azure_code", max_batch_size=4, token_budget=0)
    with pytest.raises(ValueError, match="no arrival times"):
        w.replay_trace("sharegpt", max_batch_size=4)


# ---------------------------------------------------------------------------
# case sets of the GPU benchmarks
# ---------------------------------------------------------------------------

# sha256 of json.dumps([[H_q, H_kv, kv_lens], ...]) of the case sets the recorded H200 timings were taken on
# (tests/data/h200_*.jsonl, and the training timings the shipped table and calibration were built from): a
# change of any batch would make those timings describe other batches
EVAL_SHA256 = "93df4621af5422ed98776a7e4562cdb09db9e85b96de148f02ce3d7dd3b38831"
TRAIN_SHA256 = "a23fa97c306946afcc86958dee27848dabd09b2b0f7d372a84d2b8fb5a1b09ed"


def _digest(cases):
    import json

    return hashlib.sha256(
        json.dumps([[c["num_qo_heads"], c["num_kv_heads"], c["kv_lens"]] for c in cases]).encode()
    ).hexdigest()


def test_peer_reference_cases_grid():
    for T in w.REFERENCE_TOTALS:
        cases = w.peer_reference_cases(T)
        assert len(cases) == 49 and len(set(cases)) == 49
        assert set(cases) - set(w.reference_cases(T)) == {("2x40", 1)}
        for fam in w.FAMILIES:
            bs = [B for f, B in cases if f == fam]
            assert bs == sorted(bs) and set(bs) <= set(w.REFERENCE_BATCH_SIZES)
            assert len(bs) == (9 if fam == "2x40" else 10)  # 2x40: B = 1, then 4..512
        for fam, B in cases:
            L = w.family_kv_lens(fam, B, T)
            assert L.shape == (B,) and int(L.sum()) == T and L.min() >= 1


def test_evaluation_cases_sets_sizes_totals_and_recorded_batches():
    cases = w.evaluation_cases()
    assert [c["id"] for c in cases] == list(range(182))
    assert collections.Counter(c["set"] for c in cases) == {
        "ref": 96,
        "jitter": 30,
        "untuned": 20,
        "llama8b": 11,
        "trace": 25,
    }
    for c in cases:
        assert c["B"] == len(c["kv_lens"]) and min(c["kv_lens"]) >= 1
        if c["set"] in ("ref", "untuned", "llama8b", "trace"):  # exact totals (a trace case's T is its own sum)
            assert sum(c["kv_lens"]) == c["T"], c["id"]
        if c["set"] == "jitter":  # each length within U(0.9, 1.1) of the family batch's
            base = w.family_kv_lens(c["family"], c["B"], c["T"])
            assert np.all(np.asarray(c["kv_lens"]) <= np.ceil(1.1 * base)), c["id"]
            assert np.all(np.asarray(c["kv_lens"]) >= np.floor(0.9 * base)), c["id"]
        assert (c["num_qo_heads"], c["num_kv_heads"]) == ((32, 8) if c["set"] == "llama8b" else (32, 4))
    ref = [c for c in cases if c["set"] == "ref"]
    assert [(c["family"], c["B"]) for c in ref[:48]] == w.reference_cases(262_144)
    assert {c["T"] for c in ref[48:]} == {1_048_576}
    assert {c["family"] for c in cases if c["set"] == "trace"} == set(w.TRACES)
    assert _digest(cases) == EVAL_SHA256
    assert w.evaluation_cases() == cases  # deterministic


def test_training_cases_sets_and_recorded_batches():
    cases = w.training_cases()
    assert [c["id"] for c in cases] == list(range(280))
    assert collections.Counter(c["set"] for c in cases) == {
        "train": 100,
        "train_even": 88,
        "train_trace": 40,
        "train_32_8": 26,
        "train_8_1": 26,
    }
    ev = {tuple(c["kv_lens"]) for c in w.evaluation_cases()}
    assert not ev & {tuple(c["kv_lens"]) for c in cases}  # no evaluation batch is trained on
    for c in cases:
        assert c["B"] == len(c["kv_lens"]) and min(c["kv_lens"]) >= 1
        if c["set"] == "train_even":
            L = np.asarray(c["kv_lens"])
            assert sum(c["kv_lens"]) == c["T"] and L.max() <= np.ceil(L.mean() * 1.005 / 0.995) + 1
    assert _digest(cases) == TRAIN_SHA256


def test_trace_cases_are_the_evaluation_trace_set():
    tc = w.trace_cases()
    ev = [c for c in w.evaluation_cases() if c["set"] == "trace"]
    assert [(c["family"], c["B_nominal"], c["kv_lens"]) for c in tc] == [
        (c["family"], c["B_nominal"], c["kv_lens"]) for c in ev
    ]
    assert all(c["T"] == sum(c["kv_lens"]) for c in tc)


def test_plan_request_mix_distribution():
    mix = w.plan_request_mix(50, 256, seed=3)
    assert len(mix) == 50 and all(m.shape == (256,) and m.dtype == np.int64 for m in mix)
    allv = np.concatenate(mix)
    assert allv.min() >= 1 and allv.max() <= 32_767
    # log2 of the lengths is U(0, 15) floored: about a fifteenth of them in each octave
    counts = np.bincount(np.floor(np.log2(allv)).astype(int), minlength=15)
    assert counts.shape == (15,) and np.all(np.abs(counts / allv.size - 1 / 15) < 0.02)
    assert [m.tolist() for m in w.plan_request_mix(50, 256, seed=3)] == [m.tolist() for m in mix]
    assert w.plan_request_mix(2, 4, seed=4)[0].tolist() != mix[0][:4].tolist()
