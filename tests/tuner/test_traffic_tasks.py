"""Tuning tasks from recorded traffic (kvsplit.tuner.traffic): batches with exactly the recorded key,
drawn within the recorded ranges, and the keys picked by fallback + far requests."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvsplit.db import store
from kvsplit.kernels.buckets import DISTANCE_LIMIT, BucketKey, bucket_key, distance, log2_class
from kvsplit.kernels.shape import Shape
from kvsplit.tuner.traffic import (
    TrafficDemand,
    batches_for_key,
    bin_range,
    class_range,
    traffic_demand,
    traffic_picks,
    traffic_tasks,
)
from kvsplit.tuner.workloads import FAMILIES, family_kv_lens

SHAPE = Shape.of(device="NVIDIA H200", num_qo_heads=32, num_kv_heads=8, head_dim=128, dtype="bfloat16")


def _key(lens) -> str:
    return str(bucket_key(np.asarray(lens), num_kv_heads=8, head_dim=128, dtype="bfloat16", device="NVIDIA H200"))


def test_class_and_bin_ranges_match_the_key_definitions():
    for c in range(0, 40):
        lo, hi = class_range(c)
        assert log2_class(lo) == c == log2_class(hi), c
        assert log2_class(hi + 1) == c + 1 and (lo == 1 or log2_class(lo - 1) == c - 1), c
    bins = [math.floor(2 * math.log2(x)) for x in range(1, 1 << 14)]  # brute force over 1..16383
    for k in range(0, 27):
        inside = [x for x, b in zip(range(1, 1 << 14), bins) if b == k]
        lo, hi = bin_range(k)
        assert (lo, hi) == (inside[0], inside[-1]) if inside else lo > hi, (k, lo, hi, inside[:3])
    for k in range(27, 62):
        lo, hi = bin_range(k)
        assert math.floor(2 * math.log2(lo)) == k == math.floor(2 * math.log2(hi)), k
        assert math.floor(2 * math.log2(lo - 1)) == k - 1 and math.floor(2 * math.log2(hi + 1)) == k + 1, k


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("B,T", [(3, 5000), (16, 262_144), (100, 262_144), (1000, 5000), (1000, 1 << 20)])
def test_batches_have_exactly_the_recorded_key_and_stay_in_the_recorded_ranges(family, B, T):
    if family == "2x40" and B < 3:
        pytest.skip("2x40 needs B >= 3")
    key = _key(family_kv_lens(family, B, T))
    rng = np.random.default_rng(7)
    got = batches_for_key(key, batch_range=(B, B), tokens_range=(T, T), num_batches=4, shape=SHAPE, rng=rng)
    assert len({b.tobytes() for b in got}) == 4  # different draws
    for b in got:
        assert _key(b) == key and b.dtype == np.int64 and b.min() >= 1
        assert np.all(np.diff(b) <= 0)  # heavy requests first
        lo, hi = class_range(log2_class(B))
        assert lo <= len(b) <= hi


def test_an_all_empty_key_is_refused():
    with pytest.raises(ValueError, match="all-empty batch signature"):
        batches_for_key(
            _key([0, 0]),
            batch_range=(2, 2),
            tokens_range=(0, 0),
            num_batches=1,
            shape=SHAPE,
            rng=np.random.default_rng(0),
        )


def test_keys_are_picked_by_fallback_plus_far_requests(tmp_path):
    url = f"sqlite:///{tmp_path / 'k.db'}"
    store.upgrade(url)
    keys = [_key(family_kv_lens(f, 64, 262_144)) for f in ("uniform", "skewed40", "skewed80", "2x40")]
    h4 = _key(family_kv_lens("uniform", 64, 262_144)).replace(".kv8.", ".kv4.")
    cells = [
        store.TrafficCell(keys[0], 100, requests=50, n_tuned=50, batch_min=64, batch_max=64, tokens_min=262_000),
        store.TrafficCell(keys[1], 100, requests=10, n_fallback=10, batch_min=60, batch_max=70),
        store.TrafficCell(keys[2], 100, requests=30, n_simulated=30, n_far=12, batch_min=64, batch_max=64),
        store.TrafficCell(keys[3], 99, requests=5, n_fallback=5, batch_min=64, batch_max=64),
        store.TrafficCell(keys[3], 90, requests=500, n_fallback=500, batch_min=64, batch_max=64),  # out of the window
        store.TrafficCell(h4, 100, requests=99, n_fallback=99, batch_min=64, batch_max=64),
    ]
    for c in cells:
        c.tokens_min = c.tokens_max = 262_144
    # all-empty batches served by the fallback: no KV to read, no length signature: never demand
    cells.append(store.TrafficCell(_key([0, 0]), 100, requests=400, n_fallback=400, batch_min=2, batch_max=2))
    with store.session_scope(url, write=True) as s:
        store.add_traffic(s, cells)
    demand = traffic_demand(url, hours=2, now_hour=100)
    assert [(d.key, d.unserved) for d in demand] == [(h4, 99), (keys[2], 12), (keys[1], 10), (keys[3], 5)]
    tasks, notes = traffic_tasks(
        url, 2, gpu="h200", group_size=4, hours=2, now_hour=100, num_train=2, num_heldout=2, seed=3
    )
    assert [t.key for t in tasks] == [h4, keys[2]] and notes == []
    t = tasks[1]
    assert (t.num_qo_heads, t.num_kv_heads, t.page_size, t.gpu) == (32, 8, 16, "NVIDIA H200")
    assert all(_key(b) == keys[2] for b in t.train + t.heldout) and not set(t.train) & set(t.heldout)
    # skewed80 and 2x40 are 0.8125 apart (within the limit): skewed80's policy serves both, and 2x40 is no pick
    assert distance(keys[2], keys[3]) == 0.8125
    assert t.source.startswith("traffic:17/35 requests fallback or far over 2 keys")
    assert len(traffic_tasks(url, 5, gpu="h200", group_size=4, hours=2, now_hour=100)[0]) == 3
    assert traffic_tasks(url, 2, gpu="NVIDIA H100 80GB HBM3", group_size=4, hours=2, now_hour=100)[0] == []
    # the model named (H_kv 8, G 4): the H_kv-4 key is left with a note, not tuned at that model's group
    tasks, notes = traffic_tasks(url, 5, gpu="h200", group_size=4, num_kv_heads=8, hours=2, now_hour=100)
    assert [t.key for t in tasks] == [keys[2], keys[1]] and all(t.num_qo_heads == 32 for t in tasks)
    assert notes == [
        "1 recorded key(s) of H_kv 4 left: another model's (this run tunes H_kv 8, and a key does not record H_q); "
        "tune them with that model's --num-qo-heads/--num-kv-heads"
    ]
    tasks, notes = traffic_tasks(url, 5, gpu="h200", group_size=8, num_kv_heads=4, hours=2, now_hour=100)
    assert [(t.key, t.num_qo_heads) for t in tasks] == [(h4, 32)] and "3 recorded key(s) of H_kv 8 left" in notes[0]


def test_picks_cover_a_fragmented_workload_once_then_the_next_workload():
    # one workload (skewed40 at B = 64, lengths jittered +-10 %, B +-10 %) lands on many nearby keys; a second
    # workload (uniform at B = 512) has fewer requests. Ranked by requests per key, the first picks are
    # near-duplicates of the first workload; the cover picks one of them, then the second workload.
    rng = np.random.default_rng(7)
    counts: dict[str, int] = {}
    for _ in range(60):
        B = int(rng.integers(58, 71))
        L = family_kv_lens("skewed40", B, 262_144)
        L = np.maximum(1, np.rint(L * rng.uniform(0.9, 1.1, L.size))).astype(np.int64)
        counts[_key(L)] = counts.get(_key(L), 0) + 1
    other = _key(family_kv_lens("uniform", 512, 1_048_576))
    top = sorted(counts.values(), reverse=True)
    assert len(counts) >= 4 and top[1] > 15  # by requests per key, two fragments rank above the other workload
    demand = [TrafficDemand(k, n, n, 0, (64, 64), (1, 1)) for k, n in counts.items()] + [
        TrafficDemand(other, 15, 15, 0, (512, 512), (1, 1))
    ]
    demand.sort(key=lambda d: (-d.unserved, -d.requests, d.key))
    picks = traffic_picks(demand)
    # a partition of the keys; every covered key within the limit of its pick, in its family
    covered = [c.key for p in picks for c in p.covers]
    assert sorted(covered) == sorted(d.key for d in demand)
    for p in picks:
        assert p.covers[0] == p.demand
        assert all(distance(p.demand.key, c.key) <= DISTANCE_LIMIT for c in p.covers)
    # the greedy rule, checked by brute force at each step: no key covers more of what is left
    left = {d.key: d.unserved for d in demand}
    for p in picks:
        gain = sum(left.get(c.key, 0) for c in p.covers)
        for d in demand:
            if d.key in left:
                assert gain >= sum(n for k, n in left.items() if distance(d.key, k) <= DISTANCE_LIMIT)
        for c in p.covers:
            left.pop(c.key)
    assert picks[0].unserved >= 40 and picks[1].demand.key == other
    # past the first cover_keys keys, each key joins the nearest pick within the limit or becomes its own
    few = traffic_picks(demand, cover_keys=2)
    assert sorted(c.key for p in few for c in p.covers) == sorted(d.key for d in demand)
    assert all(distance(p.demand.key, c.key) <= DISTANCE_LIMIT for p in few for c in p.covers)
    assert other in [p.demand.key for p in few] and len(few) <= len(demand) - 2
    assert BucketKey.parse(picks[0].demand.key).batch_class == 6


def test_fp8_and_q_len_keys_become_tasks_of_their_own_family_tuned_under_the_recorded_key(tmp_path):
    """Recorded traffic of an fp8-KV key and of a q_len-4 key: each becomes a task of that KV dtype and q_len
    whose batches all have the recorded key (kv_lens >= q_len), and tuning it on the simulator stores the tuned
    policy under that very key. (A task without the key's KV dtype and q_len draws batches whose key lacks
    ``.kvfp8`` / ``.q4``: the key was skipped.)"""
    from kvsplit.tuner import search

    url = f"sqlite:///{tmp_path / 'k.db'}"
    store.upgrade(url)
    kw = dict(num_kv_heads=8, head_dim=128, dtype="bfloat16", device="NVIDIA H200")
    fp8 = str(bucket_key(family_kv_lens("skewed80", 64, 262_144), **kw, kv_dtype="fp8"))
    q4 = str(bucket_key(np.maximum(family_kv_lens("uniform", 16, 65_536), 4), **kw, q_len=4))
    assert ".kvfp8." in fp8 and ".q4." in q4 and ".kvfp8." not in q4
    cells = [
        store.TrafficCell(fp8, 100, requests=40, n_fallback=40, batch_min=64, batch_max=64),
        store.TrafficCell(q4, 100, requests=30, n_fallback=30, batch_min=16, batch_max=16),
    ]
    for c, T in zip(cells, (262_144, 65_536)):
        c.tokens_min = c.tokens_max = T
    with store.session_scope(url, write=True) as s:
        store.add_traffic(s, cells)
    tasks, notes = traffic_tasks(
        url, 2, gpu="h200", group_size=4, hours=1, now_hour=100, num_train=2, num_heldout=2, seed=3
    )
    assert notes == [] and [t.key for t in tasks] == [fp8, q4]
    want = {fp8: ("float8_e4m3fn", 1), q4: (None, 4)}
    for t in tasks:
        kd, ql = want[t.key]
        assert (t.kv_dtype, t.q_len, t.num_qo_heads, t.num_kv_heads) == (kd, ql, 32, 8)
        assert t.shape.family[5:] == (kd or "bfloat16", ql)
        for b in t.train + t.heldout:
            assert str(bucket_key(np.asarray(b), **kw, kv_dtype=kd, q_len=ql)) == t.key
            assert min(b) >= ql
        r = search.tune_task(t, search.TuneConfig(database_url=url, n_trials=3, progress=False, verify=False))
        assert r.status == "finished" and r.bucket_key == t.key
        with store.session_scope(url) as s:
            b = store.get_bucket(s, t.key)
            assert b is not None and [tuple(x) for x in b.sample_batches["train"]] == list(t.train)
            (run,) = store.list_runs(s, bucket_key=t.key)
            assert run.backend == "sim" and run.status == "finished"
