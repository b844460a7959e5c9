"""kvsplit.tuner.pool: the candidate-name grammar, the pick with margin / neighbours / hysteresis, the
whole-wave decision, on H200 timings recorded in tests/data/h200_pool_timings.jsonl; and the campaign's trial
allocation."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest

from kvsplit.kernels.buckets import bucket_key, distance
from kvsplit.kernels.plan import make_plan
from kvsplit.tuner import pool as P
from kvsplit.tuner.campaign import allocate_trials, parse_model_shape
from kvsplit.tuner.space import complete_defaults
from kvsplit.tuner.tasks import family_task
from kvsplit.tuner.worker import task_params

DATA = Path(__file__).resolve().parents[1] / "data" / "h200_pool_timings.jsonl"


def _recorded():
    rows = [json.loads(line) for line in DATA.read_text().splitlines()]
    rows = [r for r in rows if "times" in r]
    for r in rows:
        r["key"] = str(
            bucket_key(
                np.asarray(r["kv_lens"], dtype=np.int64),
                num_kv_heads=r["num_kv_heads"],
                head_dim=128,
                dtype="bfloat16",
                device="NVIDIA H200",
                page_size=16,
            )
        )
    return rows


def test_grammar_round_trips_every_pool_name_and_rejects_others():
    for name in P.SERVED_POOL:
        policy, params = P.candidate_policy(name)
        assert P.candidate_name(policy, params) == name
        assert P.candidate_name(policy, {**params, "whole_wave": 0.05, "whole_wave_heads": 2}) == name
    assert P.candidate_policy("stream_k|c3|n128w4s2|o2m4|pf|h2|nx") == (
        "stream_k",
        {
            "ctas_per_sm": 3.0,
            "block_n": 128,
            "num_warps": 4,
            "num_stages": 2,
            "item_cost_blocks": 2,
            "min_piece_blocks": 4,
            "prefetch": True,
            "heads_per_tile": 2,
            "next_item": True,
        },
    )
    for bad in ("fa3", "balanced", "stream_k|c3|n128w4", "stream_k|c3|n128w4s2|nx|pf"):
        assert P.candidate_policy(bad) is None
        with pytest.raises(ValueError, match="candidate"):
            P.parse_candidate(bad)
    # params the grammar cannot name: no name
    assert P.candidate_name("stream_k", {"ctas_per_sm": 3.0, "block_n": 128, "num_warps": 4}) is None
    assert (
        P.candidate_name(
            "tuned", {"ctas_per_sm": 3.0, "block_n": 128, "num_warps": 4, "num_stages": 2, "partition": "stream_k"}
        )
        is None
    )


@pytest.mark.parametrize("lens", [[262_144], [2048] * 128, [100_000] + [1200] * 63, [5, 17, 40_000]])
def test_tuned_equivalent_plans_exactly_the_candidate(lens):
    # what the Optuna study is warm-started with must be the plan the pool timed
    task = family_task(
        "skewed80",
        64,
        262_144,
        gpu="NVIDIA H200",
        num_qo_heads=32,
        num_kv_heads=4,
        head_dim=128,
        dtype="bfloat16",
        page_size=16,
    )
    for name in P.SERVED_POOL:
        policy, params = P.parse_candidate(name)
        a = make_plan(lens, num_kv_heads=4, device="NVIDIA H200", policy=policy, params=params)
        b = make_plan(
            lens,
            num_kv_heads=4,
            device="NVIDIA H200",
            policy="tuned",
            params=task_params(task, complete_defaults(task, P.tuned_equivalent(name))),
        )
        assert a.config == b.config, name
        for f in ("num_splits", "work_request", "work_kv_start", "work_kv_end", "cta_indptr"):
            assert np.array_equal(getattr(a, f), getattr(b, f)), (name, f)


def _reference_choose(batches, pool, previous, default, margin):
    # written independently: a ratio matrix, geomeans by numpy, the keep rule spelled out
    names = [n for n in pool if all(b.get(n) for b in batches)]
    M = np.array([[b[n] for n in names] for b in batches], dtype=float)
    R = M / M.min(axis=1, keepdims=True)
    g = np.exp(np.log(R).mean(axis=0))
    order = sorted(range(len(names)), key=lambda i: (g[i], names[i]))
    best = names[order[0]]
    for keep in (previous, default):
        if keep in names and g[names.index(best)] / g[names.index(keep)] >= 1 - margin:
            return keep
    return best


def test_choose_matches_a_reference_on_recorded_timings():
    rows = _recorded()
    assert len(rows) >= 20
    picks = set()
    for r in rows:
        for prev in (None, "balanced|c3|n32w4s3|pf|h2", "stream_k|c1|n64w8s3|pf|h2|nx"):
            got = P.choose([r["times"]], P.SERVED_POOL, prev)
            assert got == _reference_choose([r["times"]], P.SERVED_POOL, prev, P.DEFAULT, P.MARGIN)
            picks.add(got)
    assert len(picks) >= 3  # the recorded batches do not all pick one plan
    # several batches at once: a pair of recorded batches of the same family and B
    for a, b in itertools.combinations(rows[:8], 2):
        got = P.choose([a["times"], b["times"]])
        assert got == _reference_choose([a["times"], b["times"]], P.SERVED_POOL, None, P.DEFAULT, P.MARGIN)


def test_margin_and_hysteresis():
    pool = ("stream_k|c3|n128w4s2", "balanced|c3|n32w4s3|pf|h2", "stream_k|c1|n64w8s3|pf|h2|nx")
    t = {"stream_k|c3|n128w4s2": 1.10, "balanced|c3|n32w4s3|pf|h2": 1.004, "stream_k|c1|n64w8s3|pf|h2|nx": 1.0}
    assert P.choose([t], pool) == "stream_k|c1|n64w8s3|pf|h2|nx"
    # the previous table's plan is kept when the new best is less than 1 % faster
    assert P.choose([t], pool, previous="balanced|c3|n32w4s3|pf|h2") == "balanced|c3|n32w4s3|pf|h2"
    t["balanced|c3|n32w4s3|pf|h2"] = 1.02
    assert P.choose([t], pool, previous="balanced|c3|n32w4s3|pf|h2") == "stream_k|c1|n64w8s3|pf|h2|nx"
    # the default within the margin wins over a marginally faster plan; an untimed previous is ignored
    t = {"stream_k|c3|n128w4s2": 1.005, "balanced|c3|n32w4s3|pf|h2": 1.0}
    assert P.choose([t], pool[:2], previous="stream_k|c1|n64w8s3|pf|h2|nx") == "stream_k|c3|n128w4s2"
    # a candidate missing on one batch does not compete
    assert P.choose([{"a|c1|n64w4s2": 1.0, DEF: 1.2}, {DEF: 1.0}], ("a|c1|n64w4s2", DEF)) == DEF
    with pytest.raises(ValueError, match="batches"):
        P.choose([{"x": 1.0}], pool)
    with pytest.raises(ValueError, match="scores"):
        P.choose_scores({})


def test_choose_published_keeps_the_pool_pick_within_the_margin_then_the_replaced_plan():
    # the replaced plan 0.4 % faster on the bucket's own batch (a near-tie): the pool pick stays
    assert P.choose_published({"best": 1.000, "pool": 1.004, "previous": 1.000}) == "pool"
    # the replaced plan more than 1 % faster: it stays, unless the study's best beats it by the margin too
    assert P.choose_published({"best": 1.000, "pool": 1.020, "previous": 1.005}) == "previous"
    assert P.choose_published({"best": 0.980, "pool": 1.020, "previous": 1.000}) == "best"
    # no pool pick among the trials (it was not timed) or no replaced table: the rest of the order
    assert P.choose_published({"best": 1.000, "previous": 1.008}) == "previous"
    assert P.choose_published({"best": 0.950, "pool": 1.000}) == "best"
    assert P.choose_published({"best": 1.0}) == "best"
    assert P.choose_published({"best": 1.000, "pool": 1.004, "previous": 1.000}, margin=0.001) == "previous"
    with pytest.raises(ValueError, match="scores"):
        P.choose_published({"best": 0.0, "pool": 1.0})


DEF = P.DEFAULT


def test_pick_per_key_judges_a_key_on_its_neighbours_batches():
    rows = _recorded()
    timings: dict[str, list] = {}
    for r in rows:
        timings.setdefault(r["key"], []).append(r["times"])
    keys = list(timings)
    near = [(a, b) for a, b in itertools.combinations(keys, 2) if distance(a, b) <= P.NEIGHBOUR_DISTANCE]
    assert near, "the recorded subset holds neighbouring keys"
    got = P.pick_per_key(timings)
    for k in keys:
        batches = timings[k] + [
            t for k2 in keys if k2 != k and distance(k, k2) <= P.NEIGHBOUR_DISTANCE for t in timings[k2]
        ]
        assert got[k] == _reference_choose(batches, P.SERVED_POOL, None, P.DEFAULT, P.MARGIN)
    # the neighbours change at least one pick from what the key's own batches alone would choose
    alone = {k: P.choose(timings[k]) for k in keys}
    assert any(alone[k] != got[k] for a, b in near for k in (a, b))
    # no candidate common to a key's and its neighbour's batches: the key's own batches decide; a key with no
    # candidate timed on its own batches is left out
    a, b = near[0]
    other = P.SERVED_POOL[4]
    assert P.pick_per_key({a: [{other: 1.0}], b: [{P.DEFAULT: 1.0}]}) == {a: other, b: P.DEFAULT}
    assert P.pick_per_key({a: [{other: None}], b: [{P.DEFAULT: 1.0}]}) == {b: P.DEFAULT}
    # hysteresis: a previous pick within the margin over the key's and neighbours' batches stays
    k0 = keys[0]
    batches = timings[k0] + [
        t for k2 in keys if k2 != k0 and distance(k0, k2) <= P.NEIGHBOUR_DISTANCE for t in timings[k2]
    ]
    second = sorted(P.SERVED_POOL, key=lambda n: math.prod(b[n] / min(b.values()) for b in batches))[1]
    keep = P.pick_per_key(timings, previous={k0: second})[k0]
    ratio = math.prod(b[got[k0]] / b[second] for b in batches) ** (1 / len(batches))
    assert keep == (second if ratio >= 1 - P.MARGIN else got[k0])


def test_previous_picks_maps_an_export_to_pool_names(tmp_path):
    def entry(key, name, params):
        return {"id": 1, "bucket": {"key": key}, "name": name, "params": params}

    doc = {
        "format": "kvsplit.policies",
        "policies": [
            entry(
                "k1",
                "balanced",
                {
                    "ctas_per_sm": 3.0,
                    "block_n": 32,
                    "num_warps": 4,
                    "num_stages": 3,
                    "prefetch": True,
                    "heads_per_tile": 2,
                    "whole_wave": 0.05,
                    "whole_wave_heads": 2,
                },
            ),
            entry(
                "k2",
                "stream_k",
                {
                    "ctas_per_sm": 1.0,
                    "block_n": 64,
                    "num_warps": 8,
                    "num_stages": 3,
                    "prefetch": True,
                    "heads_per_tile": 2,
                    "next_item": True,
                },
            ),
            entry("k3", "stream_k", {"ctas_per_sm": 5.0, "block_n": 64, "num_warps": 4, "num_stages": 2}),
        ],
    }
    assert P.previous_picks(doc) == {"k1": "balanced|c3|n32w4s3|pf|h2", "k2": "stream_k|c1|n64w8s3|pf|h2|nx"}
    p = tmp_path / "prev.json"
    p.write_text(json.dumps(doc))
    assert P.previous_picks(p) == P.previous_picks(doc)
    p.write_text(json.dumps({"cases": []}))
    with pytest.raises(ValueError, match="--previous"):
        P.previous_picks(p)


def test_whole_wave_decision():
    assert P.whole_wave_decision([0.97, 0.99, 1.005])["on"]
    d = P.whole_wave_decision([0.95, 1.02])  # geomean below 1 but one batch 2 % slower
    assert not d["on"] and d["worst"] == pytest.approx(1.02)
    assert not P.whole_wave_decision([0.9], untimed=1)["on"]
    assert not P.whole_wave_decision([])["on"]
    assert not P.whole_wave_decision([1.001, 1.002])["on"]
    assert not P.whole_wave_decision([0.995, 0.996])["on"]  # faster, but not by more than the margin
    assert P.whole_wave_decision([0.995, 0.996], gain=0.0)["on"]


def test_whole_wave_by_bucket_on_recorded_h200_timings():
    # the H200 campaign's whole-wave step (tests/data/h200_whole_wave_rows.json): the rule acted on 10 probe
    # batches only, 0.93-1.03x; over all of them it fails the 1.01 worst bound, yet three buckets win on their own
    doc = json.loads((DATA.parent / "h200_whole_wave_rows.json").read_text())
    rows, owner, variants = doc["rows"], doc["owner"], doc["variants"]
    got = P.whole_wave_by_bucket(rows, owner, variants)

    # reference: group the ratios by owner by hand, per variant, and apply the stated rule
    def geo(xs):
        return math.exp(sum(math.log(x) for x in xs) / len(xs))

    expect = {}
    for key in set(owner.values()):
        best = None
        for i, v in enumerate(variants):
            rs = [r[i] for g, per in rows.items() if owner.get(g) == key for r in per if r[i] not in (None, 1.0)]
            if rs and geo(rs) < 1 - P.MARGIN and max(rs) <= P.WHOLE_WAVE_WORST and (best is None or geo(rs) < best[1]):
                best = (v, geo(rs), max(rs), len(rs))
        if best:
            expect[key] = best
    assert set(got["buckets"]) == set(expect)
    for key, (v, g, w, n) in expect.items():
        d = got["buckets"][key]
        assert d["params"] == v and d["geomean"] == pytest.approx(g) and d["worst"] == pytest.approx(w)
        assert d["batches"] == n
    assert got["on"] and len(got["buckets"]) == 3
    # B = 64 and 96 at T = 393,216 (2 probes) won 1.1 % with two-head tiles; B = 256 lost 3 %: off in its bucket
    b6 = got["buckets"]["nvidia-h200.kv4.d128.bf16.p16.b6.t18.w24x16"]
    assert b6["params"] == {"whole_wave": 0.05, "whole_wave_heads": 2} and b6["batches"] == 2
    assert b6["geomean"] == pytest.approx(math.sqrt(0.98240 * 0.99600), abs=2e-4)
    assert owner["probe:B256:T393216"] not in got["buckets"]
    # the family-wide figures (what the summary gives when no bucket is on) fail the old per-family rule
    assert got["batches"] == 10 and got["worst"] > P.WHOLE_WAVE_WORST and got["geomean"] < 1.0
    assert not P.whole_wave_decision([r[1] for per in rows.values() for r in per if r[1] not in (None, 1.0)])["on"]
    # a group without an owner is not counted; an empty campaign decides nothing
    assert P.whole_wave_by_bucket(rows, {}, variants) == {
        "on": False,
        "buckets": {},
        "batches": 0,
        "geomean": pytest.approx(float("nan"), nan_ok=True),
        "worst": pytest.approx(float("nan"), nan_ok=True),
    }


def test_allocate_trials_shares_the_budget_by_weight():
    w = {"a": 1.0, "b": 3.0, "c": 1.0}
    cost = {"a": 1.0, "b": 1.0, "c": 2.0}
    got = allocate_trials(w, 60.0, cost, cap=100)
    assert sum(got[k] * cost[k] for k in got) <= 60.0
    assert got["b"] > got["a"] > got["c"] >= 1
    assert 60.0 - sum(got[k] * cost[k] for k in got) < 4.0  # little left unspent
    capped = allocate_trials(w, 60.0, cost, cap=20)
    assert capped["b"] == 20 and capped["a"] > got["a"]  # b's capped share goes to the others
    assert allocate_trials(w, 0.0, cost, cap=10) == {"a": 1, "b": 1, "c": 1}


def test_model_shapes():
    assert parse_model_shape("qwen3-30b-a3b") == (32, 4, 128)
    assert parse_model_shape("Llama-3.1-8B") == (32, 8, 128)
    assert parse_model_shape("llama-3.1-70b-tp8") == (8, 1, 128)
    assert parse_model_shape("64/8/128") == (64, 8, 128)
    for bad in ("32/5/128", "qwen", "32/4", "0/0/128"):
        with pytest.raises(ValueError, match="--model-shape"):
            parse_model_shape(bad)


def test_campaign_tasks_cover_the_default_workloads():
    from kvsplit.tuner.campaign import FAMILY_BATCH_SIZES, TOTALS, CampaignConfig, campaign_tasks
    from kvsplit.tuner.workloads import FAMILIES, TRACES

    tasks = campaign_tasks(CampaignConfig(database_url="sqlite:///unused.db"))
    assert len({t.key for t in tasks}) == len(tasks)
    sources = {t.source for t in tasks}
    # every family at every B it can form (2x40 needs B >= 3 or B == 1) has its bucket (the first source of a
    # key is kept)
    keys = {t.key for t in tasks}
    shape = dict(
        gpu="NVIDIA H200",
        num_qo_heads=32,
        num_kv_heads=4,
        head_dim=128,
        dtype="bfloat16",
        page_size=16,
        num_train=1,
        num_heldout=1,
    )
    for f in FAMILIES:
        for B in FAMILY_BATCH_SIZES:
            for T in TOTALS:
                if f == "2x40" and B == 2:
                    with pytest.raises(ValueError, match="batch_size"):
                        family_task(f, B, T, **shape)
                    continue
                assert family_task(f, B, T, **shape).key in keys, (f, B, T)
    assert not any(s.startswith("family:2x40:B2:") for s in sources)
    assert {s.split(":")[1] for s in sources if s.startswith("trace:")} == set(TRACES)
    for t in tasks:
        assert t.train and t.heldout and not set(t.train) & set(t.heldout)


class _RefusesTwoHeadTiles:
    """The simulator's timings, except that plans of two KV heads per tile raise the ValueError a launch raises for a
    kernel over the GPU's shared memory per CTA (kvsplit.kernels.decode): fault injection for the one case a
    GPU-free test cannot reach."""

    def __init__(self, sim):
        self.sim = sim

    def time_plan(self, plan):
        if plan.config.heads_per_tile == 2:
            raise ValueError(
                "params: ... heads_per_tile=2 at q_len=4: the compiled kernel needs 278528 of shared memory"
            )
        return self.sim.time_plan(plan)

    def hbm_floor_s(self, lens):
        return self.sim.hbm_floor_s(lens)


def test_a_pool_candidate_the_gpu_cannot_load_is_left_out_not_fatal():
    from kvsplit.tuner.campaign import CampaignConfig, _time_pool_batch, campaign_tasks
    from kvsplit.tuner.tasks import backend_for_task

    task = next(t for t in campaign_tasks(CampaignConfig(database_url="sqlite:///unused.db")) if len(t.train[0]) == 64)
    sim = backend_for_task(task, "sim")
    lens = task.train[0]
    rows = _time_pool_batch(task, lens, P.SERVED_POOL, sim, sim)
    two = {n for n, params, _, _ in rows if params.get("heads_per_tile", 1) == 2}
    assert two and len(rows) > len(two)  # the batch has candidates of both kinds
    got = _time_pool_batch(task, lens, P.SERVED_POOL, _RefusesTwoHeadTiles(sim), sim)
    assert [r for r in rows if r[0] not in two] == got


# --------------------------------------------------------------------------- the pool a shape's launch takes
@pytest.mark.parametrize(
    "num_qo_heads,num_kv_heads,q_len",
    [(32, 4, 1), (32, 4, 2), (32, 4, 4), (32, 4, 8), (32, 8, 8), (8, 1, 1), (64, 4, 1), (64, 4, 4)],
)
def test_fitted_pool_is_what_the_launch_takes_and_the_served_plan(num_qo_heads, num_kv_heads, q_len):
    from kvsplit.kernels.decode import check_heads_per_tile

    fitted = P.fitted_pool(P.SERVED_POOL, num_qo_heads, num_kv_heads, q_len)
    G = num_qo_heads // num_kv_heads
    # the kernel's tile (kernels/decode.py): h KV heads x G x q_len rows <= 64, h divides H_kv, and two heads
    # share one 16-row MMA tile (h * G <= 16)
    two_fit = 2 * G * q_len <= 64 and num_kv_heads % 2 == 0 and 2 * G <= 16
    feasible = [n for n in P.SERVED_POOL if "|h2" not in n or two_fit]
    # every candidate the launch takes is kept as it is and in its place; the others at one head per tile
    assert [n for n in fitted if n in feasible] == feasible
    one_head = [n.replace("|h2", "") for n in P.SERVED_POOL if n not in feasible]
    assert set(fitted) == set(feasible) | set(one_head) and len(fitted) == len(set(fitted))
    assert P.DEFAULT in fitted
    kw = dict(num_kv_heads=num_kv_heads, num_qo_heads=num_qo_heads, device="NVIDIA H100 80GB HBM3", q_len=q_len)
    for name in fitted:
        policy, params = P.parse_candidate(name)
        check_heads_per_tile(params.get("heads_per_tile", 1), num_qo_heads, num_kv_heads, q_len=q_len)  # no error
        make_plan([5000, 300, 70_000, 12], policy=policy, params=params, **kw)
    if two_fit:
        assert fitted == P.SERVED_POOL  # a shape whose tiles take two heads: the pool itself


def test_fitted_pool_at_q_len_8_restores_the_one_and_two_cta_candidates():
    fitted = P.fitted_pool(P.SERVED_POOL, 32, 4, 8)
    # G = 8 x 8 tokens: 64 rows per head, so no two-head tile; 7 candidates fit as they are, 12 more at one head
    # (none of which repeats one of the 7)
    assert len(fitted) == 19 and not any("|h2" in n for n in fitted)
    assert {"stream_k|c1|n64w8s3|pf|nx", "stream_k|c1|n64w4s3|pf|nx", "balanced|c2|n32w4s3|pf|nx"} <= set(fitted)
    assert fitted[:7] == tuple(n for n in P.SERVED_POOL if "|h2" not in n)
    # the restated candidate is the plan a PolicyTable serves the two-head policy to this shape
    from kvsplit.kernels.rulespec import fit_heads_per_tile

    _, params = P.parse_candidate("stream_k|c1|n64w8s3|pf|h2|nx")
    restated = P.parse_candidate("stream_k|c1|n64w8s3|pf|nx")[1]
    assert {**restated, "heads_per_tile": 1} == dict(fit_heads_per_tile(params, 32, 4, 8))
    with pytest.raises(ValueError, match="not a candidate name"):
        P.fitted_pool(("stream_k|c3|n128w4s2", "fa3"), 32, 4, 8)
