"""Workloads: jittered family draws, shipped traces, continuous-batching replay."""

from __future__ import annotations

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
    return w.Trace(name="tiny", prompt=np.array([100, 200, 300]), output=np.array([3, 2, 4]),
                   arrival_s=np.array([0.0, 0.0, 0.05]))


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
    assert np.mean(r.running[len(r.running) // 10: len(r.running) // 2] >= 0.9 * 128) > 0.5


def test_replay_rejects_bad_options():
    with pytest.raises(ValueError, match="max_batch_size"):
        w.replay_trace("azure_code", max_batch_size=0)
    with pytest.raises(ValueError, match="token_budget"):
        w.replay_trace("azure_code", max_batch_size=4, token_budget=0)
    with pytest.raises(ValueError, match="no arrival times"):
        w.replay_trace("sharegpt", max_batch_size=4)
