"""The plan service in-process (FastAPI TestClient): plan answers, bad input, ETag, admin, reload, metrics, CLI."""

from __future__ import annotations

import datetime
import json
import logging
import re
import time

import numpy as np
import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from kvsplit.db import store  # noqa: E402
from kvsplit.kernels.plan import make_plan  # noqa: E402
from kvsplit.service.app import create_app  # noqa: E402
from kvsplit.service.client import plan_from_response  # noqa: E402
from kvsplit.service.settings import Settings  # noqa: E402
from kvsplit.tuner.workloads import family_kv_lens  # noqa: E402
from tests.service_support import GPU, SHAPE, SHAPE_ARGS, TOTAL, add_bucket, fill_store, key_of

TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def info(tmp_path_factory):
    return fill_store(f"sqlite:///{tmp_path_factory.mktemp('svc')}/store.db")


@pytest.fixture(scope="module")
def client(info):
    app = create_app(Settings(database_url=info.url, admin_token=None, reload_interval_s=0))
    with TestClient(app) as c:
        yield c


@pytest.fixture()
def fresh(tmp_path):
    """A store of its own and an app with admin routes on and a fast reload poll."""
    info = fill_store(f"sqlite:///{tmp_path}/store.db")
    app = create_app(Settings(database_url=info.url, admin_token=TOKEN, reload_interval_s=0.05))
    with TestClient(app) as c:
        yield info, c


def body(kv_lens, **over):
    d = dict(SHAPE, kv_lens=list(kv_lens))
    d.update(over)
    return d


# --------------------------------------------------------------------------- plan answers


def test_fallback_plan_hand_computed(client):
    # balanced with the default tile (128, 4 warps, 2 stages; 3 resident CTAs/SM measured on the H200):
    # target min(4 * 132, 3 * 132) = 396 tiles; H_kv = 8: fair = cdiv(8 * 13113, 396) = 265 -> chunk 384
    # -> [ceil(4096/384), 1, ceil(9000/384)] = [11, 1, 24], 8 * 36 = 288 tiles <= 396 (nothing to grow)
    r = client.post("/v1/plan", json=body([4096, 17, 9000], num_kv_heads=8, num_qo_heads=64))
    assert r.status_code == 200, r.text
    d = r.json()
    assert d["num_splits"] == [11, 1, 24]
    assert d["policy"] == {"id": None, "version": None, "name": "balanced", "params": {}, "source": "fallback"}
    assert d["bucket"]["matched"] is None and d["bucket"]["distance"] is None
    assert d["bucket"]["key"] == key_of([4096, 17, 9000], num_kv_heads=8)
    # 32 blocks of 128 over 11 items: starts 128 * floor(j * 32 / 11) = 0, 256, 640
    assert d["work_kv_start"][:3] == [0, 256, 640] and d["work_kv_end"][10] == 4096
    assert d["made_for"] == {"num_kv_heads": 8, "head_dim": 128, "page_size": 16, "dtype": "bfloat16", "gpu": GPU}
    assert plan_from_response(d) == make_plan([4096, 17, 9000], num_kv_heads=8, device=GPU, policy="balanced")


def test_tuned_bucket_exact_match(client, info):
    lens = family_kv_lens("skewed80", 64, TOTAL)
    key = key_of(lens)
    r = client.post("/v1/plan", json=body(lens.tolist()))
    assert r.status_code == 200, r.text
    d = r.json()
    assert d["bucket"] == {"key": key, "matched": key, "distance": 0.0}
    assert d["policy"] == {
        "id": info.published[key],
        "version": 1,
        "name": "balanced",
        "params": {"ctas_per_sm": 3.0},
        "source": "tuned",
    }
    ref = make_plan(lens, num_kv_heads=4, device=GPU, policy="balanced", params={"ctas_per_sm": 3.0})
    assert plan_from_response(d) == ref
    assert d["num_splits"] == ref.num_splits.tolist()


def test_near_bucket_and_simulated_source(client, info):
    # the same family drawn with +-10 % jitter lands on (or next to) the tuned bucket
    lens = family_kv_lens("uniform", 256, TOTAL)
    jittered = (lens * np.random.default_rng(0).uniform(0.9, 1.1, lens.shape)).astype(np.int64)
    d = client.post("/v1/plan", json=body(jittered.tolist())).json()
    assert d["policy"]["source"] == "tuned"
    assert d["bucket"]["matched"] == key_of(lens) and d["bucket"]["distance"] <= 1.0
    # only a simulated policy near 4000 one-token requests
    d = client.post("/v1/plan", json=body([1] * 4000)).json()
    assert d["policy"]["source"] == "simulated" and d["policy"]["id"] == info.sim_id
    assert d["num_splits"] == [1] * 4000


def test_same_request_same_answer_and_zero_lengths(client):
    b = body([0, 5, 0, 70000, 1])
    a1, a2 = client.post("/v1/plan", json=b), client.post("/v1/plan", json=b)
    assert a1.content == a2.content
    d = a1.json()
    starts = [s for s, r in zip(d["work_kv_start"], d["work_request"]) if r == 0]
    assert starts == [0] and d["num_splits"][0] == 1


def test_unknown_gpu_with_device_object(client):
    dev = {
        "num_sms": 100,
        "hbm_bandwidth_gbps": 3000.0,
        "l2_bytes": 50 << 20,
        "smem_per_sm_bytes": 228 << 10,
        "smem_per_block_bytes": 227 << 10,
    }
    r = client.post("/v1/plan", json=body([8192] * 8, gpu="ACME X1", device=dev))
    assert r.status_code == 200, r.text
    d = r.json()
    assert d["made_for"]["gpu"] == "ACME X1" and d["policy"]["source"] == "fallback"
    # balanced on 100 SMs, default tile (128, 4, 2), residency estimated (an unmeasured GPU): smem 65536 + 1024
    # -> 233472 // 66560 = 3, regs 128 -> 4, threads 16 -> 3 CTAs/SM: target min(400, 300) = 300 tiles.
    # fair = cdiv(4 * 65536, 300) = 874 -> chunk0 896 -> 10 splits, 320 tiles > 300; growing: 8 * ceil(8192 / c)
    # <= 75 -> c = 1024, one wave of 1024 tokens vs chunk0's two waves of 819 -> 8 splits, 256 tiles
    assert d["num_splits"] == [8] * 8


def test_max_batch_accepted(client):
    r = client.post("/v1/plan", json=body([3] * 65536))
    assert r.status_code == 200
    assert len(r.json()["num_splits"]) == 65536


# --------------------------------------------------------------------------- bad input


BAD = [
    ("empty", {"kv_lens": []}, ["body", "kv_lens"], "too_short"),
    ("negative", {"kv_lens": [5, -1]}, ["body", "kv_lens", 1], "greater_than_equal"),
    ("fraction", {"kv_lens": [5, 6, 1.5]}, ["body", "kv_lens", 2], "int_type"),
    ("float", {"kv_lens": [2.0]}, ["body", "kv_lens", 0], "int_type"),
    ("bool", {"kv_lens": [1, True]}, ["body", "kv_lens", 1], "int_type"),
    ("string", {"kv_lens": ["7"]}, ["body", "kv_lens", 0], "int_type"),
    ("null item", {"kv_lens": [1, None]}, ["body", "kv_lens", 1], "int_type"),
    ("over max", {"kv_lens": [1, 2, (1 << 24) + 1]}, ["body", "kv_lens", 2], "less_than_equal"),
    ("int32 max", {"kv_lens": [2**31 - 1]}, ["body", "kv_lens", 0], "less_than_equal"),
    ("int64 overflow", {"kv_lens": [0, 2**64]}, ["body", "kv_lens", 1], "less_than_equal"),
    ("2^70", {"kv_lens": [2**70]}, ["body", "kv_lens", 0], "less_than_equal"),
    ("too many", {"kv_lens": [1] * 65537}, ["body", "kv_lens"], "too_long"),
    ("not a list", {"kv_lens": 5}, ["body", "kv_lens"], "list_type"),
    ("zero kv heads", {"num_kv_heads": 0}, ["body", "num_kv_heads"], "greater_than_equal"),
    ("zero qo heads", {"num_qo_heads": 0}, ["body", "num_qo_heads"], "greater_than_equal"),
    ("not multiple", {"num_qo_heads": 6}, ["body", "num_qo_heads"], "value_error"),
    ("dtype", {"dtype": "int8"}, ["body", "dtype"], "literal_error"),
    ("head_dim", {"head_dim": 96}, ["body", "head_dim"], "literal_error"),
    ("page_size", {"page_size": 0}, ["body", "page_size"], "greater_than_equal"),
    ("unknown gpu", {"gpu": "ACME X1"}, ["body", "gpu"], "value_error"),
    ("blank gpu", {"gpu": "  "}, ["body", "gpu"], "string_type"),
    ("extra field", {"foo": 1}, ["body", "foo"], "extra_forbidden"),
    (
        "device extra",
        {"gpu": "ACME", "device": {"num_sms": 1, "bogus": 2}},
        ["body", "device", "bogus"],
        "extra_forbidden",
    ),
    ("device missing", {"gpu": "ACME", "device": {"num_sms": 10}}, ["body", "device", "hbm_bandwidth_gbps"], "missing"),
    ("q_len zero", {"q_len": 0}, ["body", "q_len"], "greater_than_equal"),
    ("q_len nine", {"q_len": 9}, ["body", "q_len"], "less_than_equal"),
    ("q_len bool", {"q_len": True}, ["body", "q_len"], "int_type"),
    ("q_len rows", {"num_qo_heads": 128, "num_kv_heads": 8, "q_len": 8}, ["body", "q_len"], "value_error"),
    ("kv_dtype unknown", {"kv_dtype": "int4"}, ["body", "kv_dtype"], "literal_error"),
    ("kv_dtype other 16-bit", {"kv_dtype": "float16"}, ["body", "kv_dtype"], "literal_error"),
    ("kv_dtype fp8 fp32 q", {"dtype": "float32", "kv_dtype": "fp8"}, ["body", "kv_dtype"], "literal_error"),
]


@pytest.mark.parametrize("name,over,loc,typ", BAD, ids=[b[0] for b in BAD])
def test_bad_input_422_with_location(client, name, over, loc, typ):
    b = body([4096, 17])
    b.update(over)
    r = client.post("/v1/plan", content=json.dumps(b))
    assert r.status_code == 422, r.text
    errs = r.json()["detail"]
    assert any(e["loc"] == loc and e["type"] == typ for e in errs), errs
    assert all(set(e) >= {"type", "loc", "msg"} for e in errs)
    if name == "kv_dtype fp8 fp32 q":  # the allowed values it lists are those of a float32 q: no fp8 among them
        (e,) = [e for e in errs if e["loc"] == loc]
        assert e["msg"] == (
            "Input should be null or 'float32' with dtype 'float32': FP8 K/V ('fp8') need a float16 or bfloat16 q"
        ), e


def test_kv_dtype_and_q_len_are_their_own_families(client):
    # the store holds bf16 q_len-1 policies only: the same batch with an FP8 cache or q_len 4 gets the fallback,
    # planned for its own shape (the family's default fallback: FP8_FALLBACK for FP8 at q_len 1, else balanced,
    # as make_plan plans it), its key carrying the family's parts
    from kvsplit.kernels.policy_table import FP8_FALLBACK, default_fallback

    lens = [4096, 17, 9000]
    plain = client.post("/v1/plan", json=body(lens)).json()
    for over, part, kw in (
        ({"kv_dtype": "fp8"}, ".kvfp8.", {"kv_dtype": "float8_e4m3fn"}),
        ({"q_len": 4}, ".q4.", {"q_len": 4, "num_qo_heads": SHAPE["num_qo_heads"]}),
        ({"kv_dtype": "float8_e4m3fn", "q_len": 8}, ".kvfp8.q8.", {"kv_dtype": "float8_e4m3fn", "q_len": 8}),
    ):
        for _ in range(2):  # the second request takes the compiled path (its header is known): the same answer
            r = client.post("/v1/plan", json=body(lens, **over))
            assert r.status_code == 200, r.text
            d = r.json()
            assert d["policy"]["source"] == "fallback" and part in d["bucket"]["key"]
            assert d["bucket"]["key"].replace(part, ".") == plain["bucket"]["key"]
            name, params = default_fallback(kw.get("kv_dtype"), kw.get("q_len", 1))
            assert (d["policy"]["name"], d["policy"]["params"]) == (name, params)
            shape = {"num_qo_heads": SHAPE["num_qo_heads"], **kw}
            want = make_plan(lens, num_kv_heads=SHAPE["num_kv_heads"], device=GPU, policy=name, params=params, **shape)
            assert plan_from_response(d) == want
            # the plan says which family it was made for (kv_dtype and q_len only where not the defaults)
            fam = {k: v for k, v in kw.items() if k in ("kv_dtype", "q_len")}
            assert d["made_for"] == {**plain["made_for"], **fam}
            assert (want.kv_dtype, want.q_len) == (fam.get("kv_dtype"), fam.get("q_len", 1))
    assert default_fallback("float8_e4m3fn") == FP8_FALLBACK and default_fallback("float8_e4m3fn", 8)[0] == "balanced"
    # the defaults written out are the plain request
    d = client.post("/v1/plan", json=body(lens, kv_dtype=None, q_len=1)).json()
    assert d == plain
    d = client.post("/v1/plan", json=body(lens, kv_dtype="bfloat16")).json()
    assert d == plain


def test_kv_len_below_q_len_is_refused_naming_the_entry(client):
    """A verify step's kv_len counts its q_len new tokens: one below q_len (0 included) is a 422 at that entry,
    on the compiled path (a known header) as on the full one; at q_len 1 a 0 is an empty slot, served."""
    assert client.post("/v1/plan", json=body([4, 4096], q_len=4)).status_code == 200  # the header is now known
    for _ in range(2):
        r = client.post("/v1/plan", json=body([4096, 3, 9000], q_len=4))
        assert r.status_code == 422, r.text
        (err,) = r.json()["detail"]
        assert err["loc"] == ["body", "kv_lens", 1] and err["input"] == 3
        assert err["msg"].startswith("Value error, 3 tokens, fewer than q_len=4")
    r = client.post("/v1/plan", json=body([0, 5], q_len=2, kv_dtype="fp8"))
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "kv_lens", 0]
    assert client.post("/v1/plan", json=body([0, 4096])).status_code == 200


def test_missing_field_invalid_json_and_non_object(client):
    b = body([1])
    del b["dtype"]
    errs = client.post("/v1/plan", json=b).json()["detail"]
    assert errs == [{"type": "missing", "loc": ["body", "dtype"], "msg": "Field required", "input": None}]
    r = client.post("/v1/plan", content=b'{"gpu": "NVIDIA H200", "kv_lens": [1,')
    assert r.status_code == 422 and r.json()["detail"][0]["type"] == "json_invalid"
    for raw in (b"[1, 2]", b"null", b"17", b'"x"', b"", b"\xff\xfe"):
        r = client.post("/v1/plan", content=raw)
        assert r.status_code == 422, raw


def test_body_over_2mib_refused_before_parsing(client):
    big = b'{"kv_lens": [' + b"1," * (1 << 20) + b"1]}"  # > 2 MiB, valid JSON start
    r = client.post("/v1/plan", content=big)
    assert r.status_code == 413 and "2097152" in r.json()["detail"]

    def chunks():  # no Content-Length: streamed, counted
        for _ in range(40):
            yield b"9" * 65536

    r = client.post("/v1/plan", content=chunks())
    assert r.status_code == 413


# --------------------------------------------------------------------------- policies, ETag, store routes


def test_policies_table_etag_and_filters(client, info):
    r = client.get("/v1/policies")
    assert r.status_code == 200
    doc = r.json()
    assert (
        doc["format"] == "kvsplit.policy_table/2" and doc["count"] == len(doc["data"]) and doc["distance_limit"] == 2.5
    )
    assert doc["fallback"] == {"name": "balanced", "params": {}}
    assert {p["bucket"] for p in doc["data"]} == set(info.published) | {info.sim_key}
    assert info.draft_key not in {p["bucket"] for p in doc["data"]}
    etag = r.headers["etag"]
    r2 = client.get("/v1/policies", headers={"If-None-Match": etag})
    assert r2.status_code == 304 and r2.headers["etag"] == etag and r2.content == b""
    assert client.get("/v1/policies", headers={"If-None-Match": '"other"'}).status_code == 200
    f = client.get("/v1/policies", params={"gpu": "h200", "num_kv_heads": 4, "head_dim": 128})
    assert len(f.json()["data"]) == len(doc["data"]) and f.headers["etag"] == etag
    f = client.get("/v1/policies", params={"num_kv_heads": 8})
    assert f.json()["data"] == [] and f.headers["etag"] != etag
    assert client.get("/v1/policies", params={"num_kv_heads": 0}).status_code == 422


def test_policy_detail_buckets_runs_measurements(client, info):
    pid = next(iter(info.published.values()))
    d = client.get(f"/v1/policies/{pid}").json()
    assert d["id"] == pid and d["status"] == "published" and d["source"] == "tuned"
    assert client.get(f"/v1/policies/{info.draft_id}").json()["status"] == "draft"
    assert client.get("/v1/policies/999999").status_code == 404
    assert client.get(f"/v1/policies/{2**70}").status_code == 422
    b = client.get("/v1/buckets").json()
    assert b["count"] == 14
    assert sum(1 for x in b["data"] if x["published_policy_id"] is not None) == 13
    assert client.get("/v1/buckets", params={"num_kv_heads": 8}).json()["count"] == 1
    runs = client.get("/v1/runs").json()
    assert runs["count"] == 13 and runs["data"][0]["status"] in ("finished", "running")
    m = client.get("/v1/measurements", params={"policy_name": "tuned", "limit": 5}).json()
    assert m["count"] == 5 and all(x["policy_name"] == "tuned" for x in m["data"])


def test_healthz_metrics_and_openapi(client):
    client.post("/v1/plan", json=body([100, 200]))
    h = client.get("/healthz").json()
    assert h["status"] == "ok" and h["policies_loaded"] == 13
    text = client.get("/metrics").text
    assert 'kvsplit_http_requests_total{method="POST",route="/v1/plan",status="200"}' in text
    assert 'kvsplit_plan_lookups_total{source="fallback"}' in text
    assert 'kvsplit_policies_loaded{source="tuned"} 12.0' in text
    assert 'kvsplit_http_request_duration_seconds_bucket{le="0.001",method="POST",route="/v1/plan"}' in text
    spec = client.get("/v1/openapi.json").json()
    ops = {op["operationId"] for p in spec["paths"].values() for op in p.values()}
    assert ops == {
        "plan",
        "list_policies",
        "get_policy",
        "import_policies",
        "publish_policy",
        "retire_policy",
        "list_buckets",
        "list_runs",
        "list_measurements",
        "get_traffic",
        "healthz",
        "metrics",
    }
    req = spec["components"]["schemas"]["PlanRequest"]
    assert req["properties"]["kv_lens"]["items"]["maximum"] == 1 << 24
    assert spec["paths"]["/v1/plan"]["post"]["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/PlanRequest"
    }


def test_head_policies_has_the_get_headers_and_no_body(client):
    g = client.get("/v1/policies", params={"num_kv_heads": 4})
    h = client.head("/v1/policies", params={"num_kv_heads": 4})
    assert h.status_code == 200 and h.content == b""
    assert h.headers["etag"] == g.headers["etag"] and int(h.headers["content-length"]) == len(g.content)
    assert h.headers["content-type"] == "application/json"
    assert client.head("/v1/policies", headers={"If-None-Match": g.headers["etag"]}).status_code == 304
    assert client.head("/v1/policies", params={"num_kv_heads": 0}).status_code == 422


def test_non_json_content_type_is_415(client, fresh):
    raw = json.dumps(body([100, 200]))
    for ct in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
        r = client.post("/v1/plan", content=raw, headers={"Content-Type": ct})
        assert r.status_code == 415, (ct, r.text)
        assert r.json()["detail"] == f"Content-Type: expected application/json, got {ct!r}"
    for ct in ("application/json; charset=utf-8", "Application/JSON", "application/vnd.kvsplit+json"):
        assert client.post("/v1/plan", content=raw, headers={"Content-Type": ct}).status_code == 200, ct
    _, c = fresh
    auth = {"Authorization": f"Bearer {TOKEN}"}
    r = c.post("/v1/policies/import", content=b"format=x", headers={**auth, "Content-Type": "text/csv"})
    assert r.status_code == 415 and "application/json" in r.json()["detail"]
    # auth is checked first: no token, no hint about the body
    assert c.post("/v1/policies/import", content=b"x", headers={"Content-Type": "text/csv"}).status_code == 401
    spec = client.get("/v1/openapi.json").json()
    assert "415" in spec["paths"]["/v1/plan"]["post"]["responses"]
    assert "415" in spec["paths"]["/v1/policies/import"]["post"]["responses"]


def test_timestamps_carry_their_zone(client):
    stamps = [p["published_at"] for p in client.get("/v1/policies").json()["data"]]
    runs = client.get("/v1/runs").json()["data"]
    stamps += [r["started_at"] for r in runs] + [client.get("/v1/buckets").json()["data"][0]["created_at"]]
    assert stamps and all(isinstance(t, str) for t in stamps)
    for t in stamps:
        dt = datetime.datetime.fromisoformat(t)
        assert dt.utcoffset() == datetime.timedelta(0), t
        # stored as "now" when fill_store ran: within a day of this test
        assert abs(datetime.datetime.now(datetime.UTC) - dt) < datetime.timedelta(days=1), t


def test_docs_load_their_assets_from_this_server(client):
    r = client.get("/v1/docs")
    assert r.status_code == 200
    urls = re.findall(r'(?:src|href)="([^"]+)"', r.text) + re.findall(r"url: '([^']+)'", r.text)
    assert len(urls) >= 4, urls  # css, icon, js, openapi
    assert not any("://" in u or u.startswith("//") for u in urls), urls
    want = {".js": "text/javascript", ".css": "text/css", ".ico": "image/", ".json": "application/json"}
    for u in urls:
        a = client.get(u)
        assert a.status_code == 200, u
        ext = u[u.rfind(".") :]
        assert a.headers["content-type"].startswith(want[ext]), (u, a.headers["content-type"])
    js = client.get(next(u for u in urls if u.endswith(".js"))).content
    assert b"SwaggerUIBundle" in js and len(js) > 100_000
    assert client.get("/favicon.ico").content[:8] == b"\x89PNG\r\n\x1a\n"


def test_empty_store_warns_at_startup(tmp_path, caplog):
    url = f"sqlite:///{tmp_path}/empty.db"
    store.upgrade(url)
    with caplog.at_level(logging.WARNING, logger="kvsplit.service"):
        with TestClient(create_app(Settings(database_url=url, reload_interval_s=0))) as c:
            assert c.get("/healthz").json()["policies_loaded"] == 0
    warn = [r for r in caplog.records if r.levelno == logging.WARNING and "no published policies" in r.getMessage()]
    assert len(warn) == 1 and "'balanced' fallback" in warn[0].getMessage()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="kvsplit.service"):
        with TestClient(
            create_app(Settings(database_url=fill_store(f"sqlite:///{tmp_path}/full.db").url, reload_interval_s=0))
        ):
            pass
    assert not [r for r in caplog.records if "no published policies" in r.getMessage()]


# --------------------------------------------------------------------------- admin, reload


def test_admin_disabled_without_token(client, info):
    r = client.post(f"/v1/policies/{info.draft_id}/publish", headers={"Authorization": "Bearer x"})
    assert r.status_code == 403 and "KVSPLIT_ADMIN_TOKEN" in r.json()["detail"]


def test_admin_publish_retire_import(fresh, tmp_path):
    info, c = fresh
    lens = family_kv_lens("uniform", 64, TOTAL)
    b8 = body(lens.tolist(), num_kv_heads=8, num_qo_heads=32)
    assert c.post("/v1/plan", json=b8).json()["policy"]["source"] == "fallback"
    assert c.post(f"/v1/policies/{info.draft_id}/publish").status_code == 401
    assert c.post(f"/v1/policies/{info.draft_id}/publish", headers={"Authorization": "Bearer nope"}).status_code == 401
    auth = {"Authorization": f"Bearer {TOKEN}"}
    v0 = c.get("/healthz").json()["policies_version"]
    r = c.post(f"/v1/policies/{info.draft_id}/publish", headers=auth)
    assert r.status_code == 200 and r.json()["status"] == "published" and r.json()["policies_version"] == v0 + 1
    d = c.post("/v1/plan", json=b8).json()  # served at once, no poll wait
    assert d["policy"]["id"] == info.draft_id and d["policy"]["params"] == {"ctas_per_sm": 5.0}
    assert c.post("/v1/policies/999999/publish", headers=auth).status_code == 404
    r = c.post(f"/v1/policies/{info.draft_id}/retire", headers=auth)
    assert r.status_code == 200 and r.json()["status"] == "retired"
    assert c.post("/v1/plan", json=b8).json()["policy"]["source"] == "fallback"
    # import: export this store, import into an empty one through the API
    with store.session_scope(info.url) as s:
        export = store.export_published(s)
    other = f"sqlite:///{tmp_path}/other.db"
    store.upgrade(other)
    app2 = create_app(Settings(database_url=other, admin_token=TOKEN, reload_interval_s=0))
    with TestClient(app2) as c2:
        assert c2.get("/v1/policies").json()["data"] == []
        bad = json.loads(json.dumps(export))
        bad["policies"][-1]["params"] = {"ctas_per_sm": "many"}
        r = c2.post("/v1/policies/import", json=bad, headers=auth)
        assert r.status_code == 422 and "ctas_per_sm" in r.json()["detail"][0]["msg"]
        assert c2.get("/v1/policies").json()["data"] == []  # nothing stored
        r = c2.post("/v1/policies/import", json=export, headers=auth)
        assert r.status_code == 200, r.text
        assert r.json()["imported"] == 13
        lens = family_kv_lens("skewed80", 256, TOTAL)
        a = c.post("/v1/plan", json=body(lens.tolist())).json()
        b = c2.post("/v1/plan", json=body(lens.tolist())).json()
        assert a["policy"]["source"] == b["policy"]["source"] == "tuned"
        assert plan_from_response(a) == plan_from_response(b)


def test_reload_by_polling_a_change_from_another_writer(fresh):
    info, c = fresh
    lens = family_kv_lens("uniform", 64, TOTAL)
    b8 = body(lens.tolist(), num_kv_heads=8, num_qo_heads=32)
    assert c.post("/v1/plan", json=b8).json()["policy"]["source"] == "fallback"
    with store.session_scope(info.url, write=True) as s:  # e.g. a tuning job in another process
        store.publish(s, info.draft_id)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if c.post("/v1/plan", json=b8).json()["policy"]["source"] == "tuned":
            break
        time.sleep(0.05)
    else:
        pytest.fail("published policy not picked up by the version poll within 5 s")


# --------------------------------------------------------------------------- CLI


def test_cli_plan_prints_the_http_answer(client, info):
    from typer.testing import CliRunner

    from kvsplit.service.cli import app

    lens = family_kv_lens("2x40", 16, TOTAL).tolist()
    res = CliRunner().invoke(
        app, ["plan", *SHAPE_ARGS, "--kv-lens", ",".join(map(str, lens)), "--database-url", info.url]
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout) == client.post("/v1/plan", json=body(lens)).json()
    res = CliRunner().invoke(app, ["plan", *SHAPE_ARGS, "--kv-lens", "5,x", "--database-url", info.url])
    assert res.exit_code == 2 and "kv_lens[1]" in res.output


def _train_timings(s, bucket_id, lens, tuned_params) -> None:
    """GPU timings of one training batch of a bucket: tuned (``tuned_params``) 2.2 us and balanced 3.3 us over a
    2.0 us floor."""
    for name, params, t in (("tuned", tuned_params, 2.2e-6), ("balanced", {}, 3.3e-6)):
        store.record_measurement(
            s,
            bucket_id=bucket_id,
            policy_name=name,
            params=params,
            kv_lens=lens.tolist(),
            time_s=t,
            floor_s=2.0e-6,
            role="train",
            batch_index=0,
            stage="verify",
            backend="gpu",
        )


def test_dashboard_shows_only_the_published_policys_own_figures(tmp_path):
    """A later, unpublished tuning of a bucket (e.g. `make run`'s simulated demo beside a shipped GPU policy)
    must not lend its held-out figures to the published policy; a published policy with only training-batch
    timings shows those, labelled as such."""
    from kvsplit.service.queries import dashboard_data

    url = f"sqlite:///{tmp_path}/d.db"
    store.upgrade(url)
    lens = family_kv_lens("skewed80", 64, TOTAL)
    with store.session_scope(url, write=True) as s:
        b = add_bucket(s, lens, "family:skewed80 B=64")
        run = store.start_run(s, bucket_id=b.id, study_name="grid", backend="gpu", n_trials=2)
        pub = store.create_policy(
            s,
            bucket_id=b.id,
            params={"ctas_per_sm": 3.0},
            backend="gpu",
            score=1.1,
            tuning_run_id=run.id,
            name="balanced",
        )
        store.publish(s, pub.id)
        _train_timings(s, b.id, lens, {"ctas_per_sm": 3.0})  # the published policy's training-batch timings
        # a later simulated tuning of the same bucket, not published, with held-out figures of its own
        run2 = store.start_run(s, bucket_id=b.id, study_name="demo", backend="sim", n_trials=2)
        cand = store.create_policy(
            s, bucket_id=b.id, params={"ctas_per_sm": 57.0}, backend="sim", score=1.0, tuning_run_id=run2.id
        )
        for i in range(2):
            for name, t in (("tuned", 2.1e-6), ("balanced", 2.4e-6), ("fa3", 40e-6)):
                store.record_measurement(
                    s,
                    bucket_id=b.id,
                    policy_name=name,
                    kv_lens=lens.tolist(),
                    time_s=t,
                    floor_s=2.0e-6,
                    role="heldout",
                    batch_index=i,
                    stage="verify",
                    tuning_run_id=run2.id,
                    policy_id=cand.id if name == "tuned" else None,
                    backend="sim",
                )
    (bucket,) = dashboard_data(url)["shapes"][0]["buckets"]
    assert bucket["policy"]["id"] == pub.id
    assert bucket["evidence"] == "training" and bucket["n_train"] == 1 and bucket["n_heldout"] == 0
    assert bucket["ratios"]["tuned"] == pytest.approx(1.1)  # 2.2 / 2.0, not the candidate's 1.05
    assert bucket["speedups"] == {"balanced": pytest.approx(1.5)}  # 3.3 / 2.2; no fa3 from the other run
    assert bucket["measured_on"] == ["gpu"]


def test_dashboard_figures_of_a_policy_given_the_whole_wave_rule_after_its_timing(tmp_path):
    """The shipped H_kv 4 policies got ``whole_wave`` / ``whole_wave_heads`` after their grid search timed them
    (docs/decisions/whole-wave-rule.md), so their training timings carry params without those keys. Such a timing is
    the served plan's where the rule leaves the batch alone (a skewed batch: shown), and not where the rule serves
    another plan (128 requests of 2,048 tokens get one BLOCK_N-64 tile per request: left out)."""
    from kvsplit.service.queries import dashboard_data

    url = f"sqlite:///{tmp_path}/w.db"
    store.upgrade(url)
    tile = {
        "ctas_per_sm": 1.0,
        "block_n": 64,
        "num_warps": 4,
        "num_stages": 3,
        "prefetch": True,
        "heads_per_tile": 2,
        "next_item": True,
    }
    served = {**tile, "whole_wave": 0.05, "whole_wave_heads": 2}
    cases = {"skewed80": family_kv_lens("skewed80", 64, TOTAL), "uniform": np.full(128, 2048)}
    shape = dict(num_kv_heads=4, device=GPU, head_dim=128, page_size=16, dtype="bfloat16")
    # the premise, from the planner: the rule replaces the uniform batch's plan only
    for fam, lens in cases.items():
        a = make_plan(lens, policy="stream_k", params=served, **shape)
        b = make_plan(lens, policy="stream_k", params=tile, **shape)
        assert (a.config == b.config) == (fam == "skewed80"), fam
    with store.session_scope(url, write=True) as s:
        for fam, lens in cases.items():
            bk = add_bucket(s, lens, f"family:{fam}")
            run = store.start_run(s, bucket_id=bk.id, study_name="grid", backend="gpu", n_trials=2)
            pol = store.create_policy(
                s, bucket_id=bk.id, params=served, backend="gpu", score=1.1, tuning_run_id=run.id, name="stream_k"
            )
            store.publish(s, pol.id)
            _train_timings(s, bk.id, lens, tile)
    got = {b["family"]: b for b in dashboard_data(url)["shapes"][0]["buckets"]}
    assert got["skewed80"]["evidence"] == "training" and got["skewed80"]["n_train"] == 1
    assert got["skewed80"]["ratios"]["tuned"] == pytest.approx(1.1)  # 2.2 / 2.0
    assert got["skewed80"]["batch_size"] == 64
    assert got["uniform"]["n_train"] == 0 and "tuned" not in got["uniform"]["ratios"]
    # the bucket's batch is still shown (B and tokens of the timed batch), with why there is no time
    assert got["uniform"]["batch_size"] == 128 and got["uniform"]["total_tokens"] == 128 * 2048
    assert got["uniform"]["evidence"] == "none" and "whole-wave" in got["uniform"]["time_note"]
    # a published policy whose params changed otherwise since its timing (another tile): no time, and not blamed on
    # the whole-wave rule
    with store.session_scope(url, write=True) as s:
        bk = store.get_bucket(s, key_of(cases["uniform"]))
        pol = store.create_policy(s, bucket_id=bk.id, params={**tile, "block_n": 32}, backend="gpu", name="stream_k")
        store.publish(s, pol.id)
    got = {b["family"]: b for b in dashboard_data(url)["shapes"][0]["buckets"]}
    assert got["uniform"]["evidence"] == "none" and "tuned" not in got["uniform"]["ratios"]
    assert "whole-wave" not in got["uniform"]["time_note"] and "params changed" in got["uniform"]["time_note"]


def test_unknown_gpu_answer_speaks_http(client):
    r = client.post("/v1/plan", json=body([100, 200], gpu="ACME X9"))
    assert r.status_code == 422
    (err,) = r.json()["detail"]
    assert err["loc"] == ["body", "gpu"]
    assert err["msg"].startswith("Value error, unknown GPU 'ACME X9'; known: ")
    assert "NVIDIA H200" in err["msg"] and err["msg"].endswith("send a `device` object with its numbers")
    assert "DeviceSpec" not in err["msg"]  # Python-API advice does not belong in an HTTP answer
