"""The compiled answer path of ``POST /v1/plan`` (routers/plan._fast_answer) answers what the full path does.

References, independent of the compiled path:

* the planner's loop-form rules run as plain Python (``fastplan.python()``: bucket key, lookup and plan), its answer
  serialized with ``json.dumps`` of ``Plan.to_dict()`` + bucket + policy (JSON-equal) and with the orjson
  writer ``plan_answer`` (byte-equal);
* the full path of ``handle_plan`` with the compiled writer switched off (byte-equal), and the errors
  (422 bodies) of the full path for requests the compiled path hands over.

Bodies: random batches (B = 1 .. 600, zeros, lengths up to the service limit, 2^31 - 1 included), plain
and spaced lists, kv_lens first or last; tables with every compiled policy (no_split, fixed, balanced,
stream_k, tuned with both partitions, heavy-first order and packing), policies the compiled core does not
plan (flashinfer, fa3), GPU-tuned and simulated entries and the fallback, and the shipped H200 table.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import orjson
import pytest

from kvsplit.kernels import fastplan
from kvsplit.kernels.buckets import bucket_key
from kvsplit.kernels.limits import MAX_KV_LEN
from kvsplit.kernels.policy_table import PolicyTable
from kvsplit.service import fastjson, fastparse, validation
from kvsplit.service.routers import plan as plan_router
from kvsplit.service.routers.plan import handle_plan, plan_answer

pytestmark = pytest.mark.skipif(
    not (fastjson.ENABLED and fastparse.ENABLED and fastplan.ENABLED), reason="numba off: there is no compiled path"
)

ROOT = Path(__file__).resolve().parents[2]
GPU = "NVIDIA H200"
JSON = b"application/json"


def _shape(H=4, D=128, dtype="bfloat16", ps=16, hq=None):
    return dict(gpu=GPU, num_qo_heads=hq or 8 * H, num_kv_heads=H, head_dim=D, dtype=dtype, page_size=ps)


def _key(lens, s):
    return str(
        bucket_key(
            np.asarray(lens),
            num_kv_heads=s["num_kv_heads"],
            head_dim=s["head_dim"],
            dtype=s["dtype"],
            device=GPU,
            page_size=s["page_size"],
        )
    )


POLICIES = [
    ("no_split", {}),
    ("fixed", {"num_splits": 3}),
    ("balanced", {"ctas_per_sm": 2.0}),
    ("stream_k", {"ctas_per_sm": 3.0, "block_n": 64}),
    ("stream_k", {"item_cost_blocks": 2, "min_piece_blocks": 3}),
    ("tuned", {"partition": "stream_k", "order": "heavy_first", "ctas_per_sm": 5.0}),
    ("tuned", {"pack_tokens": 512, "wave_aware": False, "max_splits": 4}),
    ("tuned", {"min_chunk_tokens": 256, "order": "heavy_first"}),
    ("flashinfer", {}),
    ("fa3", {}),
]


def _batch(rng, limit):
    n = int(rng.choice([1, 2, 7, int(rng.integers(1, 600))]))
    lens = np.floor(2 ** (rng.random(n) * rng.uniform(0, np.log2(limit + 1)))).astype(np.int64)
    r = rng.random()
    if r < 0.1:
        lens[:] = 0
    elif r < 0.2:
        lens[rng.random(n) < 0.3] = 0
    elif r < 0.3:
        lens[rng.integers(n)] = limit
    return np.minimum(lens, limit)


def _mixed_table(shape, rng):
    """One entry per POLICIES item (GPU-tuned), the same buckets again simulator-tuned, for one shape family."""
    pols = []
    for i, (name, params) in enumerate(POLICIES * 2):
        lens = _batch(rng, 1 << 20)
        pols.append(
            {
                "id": i + 1,
                "version": 1 + i % 3,
                "bucket": _key(lens, shape),
                "gpu": GPU,
                "num_kv_heads": shape["num_kv_heads"],
                "head_dim": shape["head_dim"],
                "dtype": shape["dtype"],
                "page_size": shape["page_size"],
                "name": name,
                "params": params,
                "backend": "gpu" if i < len(POLICIES) else "sim",
            }
        )
    return PolicyTable.from_json(PolicyTable.document(pols, version=7, distance_limit=3.0))


def _state(table, max_kv_len=1 << 24):
    return SimpleNamespace(
        settings=SimpleNamespace(max_kv_len=max_kv_len), holder=SimpleNamespace(current=SimpleNamespace(table=table))
    )


def _body(shape, lens, rng) -> tuple[bytes, bool]:
    """A request body in one of several spellings, and whether its kv_lens list is plain."""
    style = int(rng.integers(4))
    if style == 0:
        return orjson.dumps(dict(shape, kv_lens=lens.tolist())), True
    if style == 1:
        return json.dumps(dict(shape, kv_lens=lens.tolist())).encode(), lens.shape[0] == 1  # ", " separators
    if style == 2:
        return orjson.dumps(dict(kv_lens=lens.tolist(), **shape)), True
    sep = [" ,", ",\n", "\t,\t"][int(rng.integers(3))]
    return (json.dumps(shape)[:-1] + ', "kv_lens" : [ ' + sep.join(map(str, lens.tolist())) + " ] }").encode(), False


def _reference(table, shape, lens):
    """The answer of the planner's rules run as plain Python: (orjson bytes, the json.dumps dict)."""
    with fastplan.python():
        p, bucket, policy = table.plan(lens.tolist(), **shape)
    d = p.to_dict()
    d["bucket"], d["policy"] = bucket, policy
    return plan_answer(p, bucket, policy), json.loads(json.dumps(d))


def _check(table, shape, lens, body, plain, max_kv_len, monkeypatch):
    state = _state(table, max_kv_len)
    ref_bytes, ref_dict = _reference(table, shape, lens)
    status, got = handle_plan(body, state, JSON)
    assert status == 200
    assert got == ref_bytes
    assert json.loads(got) == ref_dict
    fast = plan_router._fast_answer(body, state)
    assert fast is not None, (ref_dict["policy"], body[:120])  # the compiled path took it
    if True:
        assert fast == ref_bytes
        found = validation.scan_request(body, max_kv_len)
        assert found is not None and found[4] == plain
        assert found[5] == sum(ref_dict["kv_lens"]) and type(found[5]) is int  # the scan's total tokens
    with monkeypatch.context() as m:  # the full path, compiled writer off
        m.setattr(fastjson, "ENABLED", False)
        assert handle_plan(body, state, JSON) == (200, ref_bytes)
    return ref_dict["policy"]["source"], ref_dict["policy"]["name"]


@pytest.mark.parametrize(
    "shape",
    [_shape(), _shape(H=1, D=64, dtype="float16", ps=1), _shape(H=8, D=256, dtype="float32", ps=64)],
    ids=["kv4-d128-bf16", "kv1-d64-f16", "kv8-d256-f32"],
)
def test_answers_equal_the_reference_on_random_bodies(shape, monkeypatch):
    rng = np.random.default_rng(shape["num_kv_heads"])
    table = _mixed_table(shape, rng)
    validation.HEADER_CACHE.clear()
    seen = set()
    for i in range(150):
        limit = [1 << 24, MAX_KV_LEN, 1 << 16][i % 3]
        lens = _batch(rng, limit)
        body, plain = _body(shape, lens, rng)
        handle_plan(body, _state(table, limit), JSON)  # the first request of a header takes the full checks
        seen.add(_check(table, shape, lens, body, plain, limit, monkeypatch))
    sources = {s for s, _ in seen}
    assert {"tuned", "fallback"} <= sources, seen
    assert len({n for _, n in seen}) >= 4, seen


def test_every_source_and_policy_of_the_mixed_table(monkeypatch):
    """Batches made to land on each entry of the table (and far from all: the fallback)."""
    shape = _shape()
    rng = np.random.default_rng(99)
    pols = []
    batches = []
    for i, (name, params) in enumerate(POLICIES):
        lens = np.full(int(rng.integers(1, 300)), int(2 ** rng.uniform(4, 20)), np.int64)
        batches.append(lens)
        for j, backend in enumerate(("gpu", "sim")):
            # the simulated entries get buckets of their own (a gpu entry would win theirs)
            key_lens = lens if backend == "gpu" else np.full(lens.shape[0] * 2 + 1, int(lens[0]) // 3 + 1)
            if backend == "sim":
                batches.append(key_lens)
            pols.append(
                {
                    "id": 2 * i + j + 1,
                    "version": 1,
                    "bucket": _key(key_lens, shape),
                    "gpu": GPU,
                    "num_kv_heads": 4,
                    "head_dim": 128,
                    "dtype": "bfloat16",
                    "page_size": 16,
                    "name": name,
                    "params": params,
                    "backend": backend,
                }
            )
    table = PolicyTable.from_json(PolicyTable.document(pols, version=1, distance_limit=0.0))
    batches.append(np.ones(5000, np.int64))  # far from every entry: the fallback
    batches.append(np.zeros(3, np.int64))
    validation.HEADER_CACHE.clear()
    seen = set()
    for lens in batches:
        body = orjson.dumps(dict(shape, kv_lens=lens.tolist()))
        handle_plan(body, _state(table), JSON)
        seen.add(_check(table, shape, lens, body, True, 1 << 24, monkeypatch))
    assert {s for s, _ in seen} == {"tuned", "simulated", "fallback"}
    assert {n for _, n in seen} >= {p[0] for p in POLICIES}, seen


def test_shipped_h200_table(monkeypatch):
    """The table ``make run`` serves (stream_k and balanced policies), bodies as bench/plan_post.lua sends."""
    from kvsplit.tuner.workloads import plan_request_mix

    raw = json.loads((ROOT / "kernels" / "data" / "h200_policies.json").read_text())
    table = PolicyTable.from_export(raw, version=raw["policies_version"])
    shape = _shape(hq=32)
    validation.HEADER_CACHE.clear()
    for lens in plan_request_mix(60, seed=4):
        body = orjson.dumps(dict(shape, kv_lens=lens.tolist()))
        handle_plan(body, _state(table), JSON)
        _check(table, shape, lens, body, True, 1 << 24, monkeypatch)
    # near-even batches whose matched policies have the whole-wave rule on: the answer's config is the rule's
    # tile, written by the compiled path from the rule's own spec
    rng = np.random.default_rng(5)
    tiles = set()
    for lens in (
        np.full(128, 2048),
        np.full(96, 5461),
        np.full(256, 1024),
        np.rint(2572 * rng.uniform(0.995, 1.005, 128)).astype(np.int64),
    ):
        body = orjson.dumps(dict(shape, kv_lens=lens.tolist()))
        _check(table, shape, lens, body, True, 1 << 24, monkeypatch)
        d = json.loads(handle_plan(body, _state(table), JSON)[1])
        assert d["policy"]["params"].get("whole_wave") == 0.05 and max(d["num_splits"]) == 1
        tiles.add(d["config"]["block_n"])
    assert tiles == {64, 128}


@pytest.mark.parametrize(
    "kv",
    [
        "[1, 16777217]",
        "[9223372036854775807]",
        "[0, -1]",
        "[1.0]",
        "[true]",
        "[]",
        "[01]",
        "[1,2,]",
        "[" + ",".join(["3"] * 65537) + "]",
    ],
)
def test_requests_the_compiled_path_hands_over_get_the_full_path_errors(kv, monkeypatch):
    shape = _shape()
    table = _mixed_table(shape, np.random.default_rng(1))
    state = _state(table)
    handle_plan(orjson.dumps(dict(shape, kv_lens=[5])), state, JSON)  # header known
    body = (json.dumps(shape)[:-1] + ', "kv_lens": ' + kv + "}").encode()
    assert plan_router._fast_answer(body, state) is None
    got = handle_plan(body, state, JSON)
    with monkeypatch.context() as m:
        m.setattr(fastjson, "ENABLED", False)
        m.setattr(fastparse, "ENABLED", False)
        m.setattr(validation, "HEADER_CACHE", {})
        assert handle_plan(body, state, JSON) == got
    assert got[0] == 422


def test_too_many_work_items_is_the_full_paths_422(monkeypatch):
    """A plan over MAX_WORK_ITEMS (a ValueError of the planner) falls back and gets the same 422."""
    shape = _shape()
    lens = [1 << 24] * 2048
    pols = [
        {
            "id": 1,
            "version": 1,
            "bucket": _key(lens, shape),
            "gpu": GPU,
            "num_kv_heads": 4,
            "head_dim": 128,
            "dtype": "bfloat16",
            "page_size": 16,
            "name": "fixed",
            "params": {"num_splits": 16384},
            "backend": "gpu",
        }
    ]
    table = PolicyTable.from_json(PolicyTable.document(pols, version=1))
    state = _state(table)
    body = orjson.dumps(dict(shape, kv_lens=lens))
    handle_plan(orjson.dumps(dict(shape, kv_lens=[5])), state, JSON)
    assert plan_router._fast_answer(body, state) is None
    status, out = handle_plan(body, state, JSON)
    assert status == 422 and b"work items" in out
    with monkeypatch.context() as m:
        m.setattr(fastjson, "ENABLED", False)
        assert handle_plan(body, state, JSON) == (status, out)


def test_no_table_yet_is_503():
    shape = _shape()
    state = SimpleNamespace(settings=SimpleNamespace(max_kv_len=1 << 24), holder=SimpleNamespace(current=None))
    validation.HEADER_CACHE.clear()
    body = orjson.dumps(dict(shape, kv_lens=[5, 6]))
    assert handle_plan(body, state, JSON)[0] == 503  # full checks, header remembered
    assert handle_plan(body, state, JSON) == (503, b'{"detail":"policy table not loaded yet"}')


def test_metric_shortcuts_count_like_the_client():
    """metrics.adder / observer leave the same samples as Counter.inc / Histogram.observe."""
    from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

    from kvsplit.service import metrics

    bounds = (0.0005, 0.001, 0.0025, 0.005, 0.01)
    texts = []
    for fast in (False, True):
        reg = CollectorRegistry()
        c = Counter("c", "c", ["k"], registry=reg).labels("x")
        h = Histogram("h", "h", ["k"], buckets=bounds, registry=reg).labels("x")
        inc, obs = (metrics.adder(c), metrics.observer(h)) if fast else (c.inc, h.observe)
        assert fast is False or (inc is not c.inc and obs is not h.observe)  # the shortcuts apply here
        for v in [0.0, 0.0005, 0.00050001, 0.001, 0.3, 0.01, 1e-9] + list(np.random.default_rng(0).random(200) / 50):
            inc()
            obs(float(v))
        texts.append([ln for ln in generate_latest(reg).splitlines() if b"_created" not in ln])
    assert texts[0] == texts[1]


def test_requests_through_the_app_are_counted(tmp_path):
    from fastapi.testclient import TestClient

    from kvsplit.service.app import create_app
    from kvsplit.service.settings import Settings
    from tests.service_support import SHAPE, fill_store

    info = fill_store(f"sqlite:///{tmp_path}/store.db")
    app = create_app(Settings(database_url=info.url, admin_token=None, reload_interval_s=0))

    def sample(text: str, prefix: str) -> float:
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))

    route = 'route="/v1/plan"'
    with TestClient(app) as client:
        client.post("/v1/plan", json=dict(SHAPE, kv_lens=[5]))  # header known
        before = client.get("/metrics").text
        rng = np.random.default_rng(2)
        for _ in range(25):
            body = orjson.dumps(dict(SHAPE, kv_lens=np.floor(2 ** (rng.random(64) * 15)).astype(int).tolist()))
            assert plan_router._fast_answer(body, app.state) is not None
            assert (
                client.post("/v1/plan", content=body, headers={"Content-Type": "application/json"}).status_code == 200
            )
        after = client.get("/metrics").text
    for prefix in (
        'kvsplit_http_requests_total{method="POST",' + route + ',status="200"}',
        'kvsplit_http_request_duration_seconds_count{method="POST",' + route + "}",
        'kvsplit_http_request_duration_seconds_bucket{le="+Inf",method="POST",' + route + "}",
    ):
        assert sample(after, prefix) - sample(before, prefix) == 25, prefix
    # 25 requests and the 25 direct _fast_answer calls above
    assert sample(after, "kvsplit_plan_lookups_total{") - sample(before, "kvsplit_plan_lookups_total{") == 50


def test_fp8_fallback_on_the_compiled_and_full_paths(monkeypatch):
    """An FP8 batch far from every bucket of a table with the default fallback gets FP8_FALLBACK on both HTTP paths
    (the same bytes as the in-process plan); a 16-bit batch of the same lengths the balanced fallback. The plan is
    make_plan's of FP8_FALLBACK's rule, its two heads per tile fitted to the shape (H_kv 4, G 8: two)."""
    from kvsplit.kernels.plan import make_plan
    from kvsplit.kernels.policy_table import FP8_FALLBACK

    shape = _shape()
    table = PolicyTable.from_json(PolicyTable.document([], version=1))
    lens = np.asarray([70_000, 300, 5_000, 17] * 4, np.int64)
    rng = np.random.default_rng(3)
    names = {}
    for kv in (None, "fp8", "float8_e4m3fn"):
        s = dict(shape, **({"kv_dtype": kv} if kv else {}))
        body, plain = _body(s, lens, rng)
        handle_plan(body, _state(table), JSON)
        names[kv] = _check(table, s, lens, body, plain, 1 << 24, monkeypatch)
    assert names == {None: ("fallback", "balanced"), "fp8": ("fallback", "stream_k"), "float8_e4m3fn": names["fp8"]}
    p, _, pol = table.plan(lens.tolist(), **shape, kv_dtype="fp8")
    assert (pol["name"], pol["params"]) == FP8_FALLBACK
    ref = make_plan(
        lens,
        policy="stream_k",
        params=FP8_FALLBACK[1],
        num_kv_heads=4,
        num_qo_heads=32,
        device=GPU,
        kv_dtype="float8_e4m3fn",
    )
    assert p == ref and p.config.heads_per_tile == 2 and p.config.block_n == 32
