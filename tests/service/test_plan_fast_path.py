"""The hot path of ``POST /v1/plan``: the validation fast path and the ASGI dispatch ahead of FastAPI.

Every answer is compared with the full checks (the header cache cleared, so the
first request of a header takes them) or with ``make_plan`` directly.
"""

from __future__ import annotations

import json

import numpy as np
import orjson
import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from kvsplit.kernels.plan import make_plan  # noqa: E402
from kvsplit.service import validation  # noqa: E402
from kvsplit.service.app import create_app  # noqa: E402
from kvsplit.service.client import plan_from_response  # noqa: E402
from kvsplit.service.settings import Settings  # noqa: E402
from kvsplit.service.validation import RequestValidationFailed, parse_plan_request  # noqa: E402
from tests.service_support import GPU, SHAPE, fill_store


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    info = fill_store(f"sqlite:///{tmp_path_factory.mktemp('fast')}/store.db")
    app = create_app(Settings(database_url=info.url, admin_token=None, reload_interval_s=0))
    with TestClient(app) as c:
        yield c


def raw(kv_lens_json: str, **over) -> bytes:
    d = dict(SHAPE)
    d.update(over)
    head = json.dumps(d)[:-1]
    return (head + ', "kv_lens": ' + kv_lens_json + "}").encode()


def test_fast_path_equals_full_checks():
    rng = np.random.default_rng(7)
    lens = np.floor(2 ** (rng.random(300) * 15)).astype(np.int64)
    body = orjson.dumps(dict(SHAPE, kv_lens=lens.tolist()))
    validation.HEADER_CACHE.clear()
    full = parse_plan_request(body, max_kv_len=1 << 24)
    assert len(validation.HEADER_CACHE) == 1  # the full checks remembered the header
    fast = parse_plan_request(body, max_kv_len=1 << 24)
    assert fast.shape is full.shape and fast.device is full.device
    assert fast.kv_lens.dtype == np.int64 and np.array_equal(fast.kv_lens, lens) and np.array_equal(full.kv_lens, lens)
    assert fast[:6] == full[:6] == (GPU, 32, 4, 128, "bfloat16", 16)
    # a device object, an alias or an extra field is never served from the cache of another spelling
    alias = parse_plan_request(orjson.dumps(dict(SHAPE, gpu="h200", kv_lens=[5])), max_kv_len=1 << 24)
    assert alias.device == full.device and alias.gpu == "h200"


BAD_ON_WARM = [
    ("[1, true]", 1, "int_type"),
    ("[false, 3]", 0, "int_type"),
    ("[5, -1]", 1, "greater_than_equal"),
    ("[5, 6, 1.5]", 2, "int_type"),
    ("[2.0]", 0, "int_type"),
    ('["7"]', 0, "int_type"),
    ("[1, null]", 1, "int_type"),
    ("[[1]]", 0, "int_type"),
    ("[1, 16777217]", 1, "less_than_equal"),
    ("[0, 18446744073709551616]", 1, "less_than_equal"),
    ("[9223372036854775807]", 0, "less_than_equal"),
    ("[-9223372036854775808]", 0, "greater_than_equal"),
]


@pytest.mark.parametrize("kv,index,typ", BAD_ON_WARM, ids=[b[0] for b in BAD_ON_WARM])
def test_bad_kv_lens_named_after_a_good_request_of_the_same_header(client, kv, index, typ):
    assert (
        client.post("/v1/plan", content=raw("[4096, 17]"), headers={"Content-Type": "application/json"}).status_code
        == 200
    )  # the header is now cached
    r = client.post("/v1/plan", content=raw(kv), headers={"Content-Type": "application/json"})
    assert r.status_code == 422, r.text
    errs = r.json()["detail"]
    assert any(e["loc"] == ["body", "kv_lens", index] and e["type"] == typ for e in errs), errs
    with pytest.raises(RequestValidationFailed):
        parse_plan_request(raw(kv), max_kv_len=1 << 24)


def test_float_or_bool_header_field_not_taken_for_the_cached_int():
    parse_plan_request(raw("[4]"), max_kv_len=1 << 24)  # caches num_qo_heads=32 ...
    for over, loc in (
        ({"num_qo_heads": 32.0}, "num_qo_heads"),
        ({"page_size": True}, "page_size"),
        ({"head_dim": 128.0}, "head_dim"),
    ):
        with pytest.raises(RequestValidationFailed) as exc:
            parse_plan_request(raw("[4]", **over), max_kv_len=1 << 24)
        assert any(e["loc"] == ["body", loc] for e in exc.value.errors), exc.value.errors
    # a smaller limit applies to a cached header too
    with pytest.raises(RequestValidationFailed) as exc:
        parse_plan_request(raw("[4, 1000]"), max_kv_len=999)
    assert exc.value.errors[0]["loc"] == ["body", "kv_lens", 1]


def test_answer_keeps_the_connection_and_counts_metrics(client):
    lens = [4096, 17, 9000, 1, 0]
    r = client.post("/v1/plan", json=dict(SHAPE, kv_lens=lens))
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    assert "connection" not in r.headers and int(r.headers["content-length"]) == len(r.content)
    d = r.json()
    assert plan_from_response(d) == make_plan(
        lens, num_kv_heads=4, device=GPU, policy=d["policy"]["name"], params=d["policy"]["params"]
    )
    before = client.get("/metrics").text
    client.post("/v1/plan", json=dict(SHAPE, kv_lens=[5, -1]))
    after = client.get("/metrics").text

    def count(text: str, status: int) -> float:
        line = f'kvsplit_http_requests_total{{method="POST",route="/v1/plan",status="{status}"}} '
        return next((float(x.split()[-1]) for x in text.splitlines() if x.startswith(line)), 0.0)

    assert count(after, 422) == count(before, 422) + 1
    assert count(after, 200) == count(before, 200)


def test_streamed_body_in_chunks_is_planned(client):
    body = orjson.dumps(dict(SHAPE, kv_lens=list(range(1, 2001))))

    def chunks():  # no Content-Length: several http.request messages
        for i in range(0, len(body), 1000):
            yield body[i : i + 1000]

    r = client.post("/v1/plan", content=chunks(), headers={"Content-Type": "application/json"})
    assert r.status_code == 200, r.text
    assert r.json()["kv_lens"] == list(range(1, 2001))
    r = client.post("/v1/plan", content=body, headers={"Content-Type": "text/plain"})
    assert r.status_code == 415
    r = client.post("/v1/plan", content=body, headers={"Content-Length": "abc"})
    assert r.status_code == 400 and r.headers["connection"] == "close"


def _outcome(body: bytes, max_kv_len: int = 1 << 24):
    try:
        r = parse_plan_request(body, max_kv_len=max_kv_len)
    except RequestValidationFailed as exc:
        return "error", exc.errors
    return "ok", (tuple(r[:6]), r.kv_lens.dtype.str, r.kv_lens.tolist(), r.shape)


def _three_ways(monkeypatch, body: bytes, max_kv_len: int = 1 << 24):
    """The outcome with the compiled scan, with orjson + array.array, and with the full checks only."""
    from kvsplit.service import fastparse

    warm = orjson.dumps(dict(SHAPE, kv_lens=[1]))
    parse_plan_request(warm, max_kv_len=1 << 24)  # the header is cached
    scan = _outcome(body, max_kv_len)
    with monkeypatch.context() as m:
        m.setattr(fastparse, "ENABLED", False)
        arr = _outcome(body, max_kv_len)
        m.setattr(validation, "HEADER_CACHE", {})
        full = _outcome(body, max_kv_len)
    return scan, arr, full


CRAFTED = [
    b'{"gpu":"NVIDIA H200","num_qo_heads":32,"num_kv_heads":4,"head_dim":128,"dtype":"bfloat16","page_size":16,'
    b'"kv_lens":[0,1,22,333]}',
    b'{"kv_lens" :\n[ 5 ,\t6\r\n, 0 ] , "gpu":"NVIDIA H200","num_qo_heads":32,"num_kv_heads":4,"head_dim":128,'
    b'"dtype":"bfloat16","page_size":16}',
]
TEMPLATE = (
    '{{"gpu":"NVIDIA H200","num_qo_heads":32,"num_kv_heads":4,"head_dim":128,"dtype":"bfloat16",'
    '"page_size":16,"kv_lens":{}}}'
)
for kv in (
    "[]",
    "[01]",
    "[1,]",
    "[,1]",
    "[1 2]",
    "[-1]",
    "[-0]",
    "[1.5]",
    "[1e3]",
    "[1E3]",
    "[2.0]",
    "[true]",
    "[1,false]",
    "[null]",
    '["5"]',
    "[[5]]",
    "[{}]",
    "[16777216]",
    "[16777217]",
    "[99999999999999999999999]",
    "[1,2",
    "[1,2]]",
    "0",
    "[+1]",
    "[ ]",
    "[1]  ",
    "[00]",
    "[0]",
    "[7,-8]",
):
    CRAFTED.append(TEMPLATE.format(kv).encode())
CRAFTED += [
    TEMPLATE.format("[1, 2]")[:-1].encode() + b',"kv_lens":[3]}',  # duplicate key: the last one wins
    TEMPLATE.format("[1, 2]")[:-1].encode() + b',"kv_lens":0}',
    b'{"kv_lens":[1],' + TEMPLATE.format("[1, 2]")[1:].encode(),
    TEMPLATE.format("[1, 2]").replace('"NVIDIA H200"', '"NVIDIA H200\\"kv_lens\\":[4]"').encode(),
    TEMPLATE.format("[1, 2]").replace('"NVIDIA H200"', '"kv_lens"').encode(),
    TEMPLATE.format("[1, 2]").replace('"gpu"', '"x\\"kv_lens"').encode(),
    TEMPLATE.format("[1, 2]").replace('"page_size":16', '"page_size":16,"device":null').encode(),
    TEMPLATE.format("[1, 2]").replace('"page_size":16', '"page_size":16.0').encode(),
    TEMPLATE.format("[1, 2]").replace('"num_qo_heads":32', '"num_qo_heads":{"kv_lens":[1]}').encode(),
    TEMPLATE.format("[1, 2]").replace("}", ",}").encode(),
    TEMPLATE.format("[1, 2]").encode() + b" x",
    TEMPLATE.format("[1, 2]").encode()[:-1],
    TEMPLATE.format("[3]").replace('"NVIDIA H200"', '"h200"').encode(),
    TEMPLATE.format("[3]").replace('"NVIDIA H200"', '"NVIDIA \\u00e9"').encode(),
    TEMPLATE.format("[3]").encode().replace(b"H200", b"H\xff00"),
    TEMPLATE.format("[" + ",".join(["3"] * 65536) + "]").encode(),
    TEMPLATE.format("[" + ",".join(["3"] * 65537) + "]").encode(),
]


@pytest.mark.parametrize("body", CRAFTED, ids=range(len(CRAFTED)))
def test_compiled_scan_agrees_with_orjson_and_the_full_checks(monkeypatch, body):
    scan, arr, full = _three_ways(monkeypatch, body)
    assert scan == arr == full, body[:200]


def test_compiled_scan_takes_the_plain_forms():
    from kvsplit.service import fastparse

    if not fastparse.ENABLED:
        pytest.skip("numba off")
    kv, start, end, plain, total = fastparse.scan_kv_lens(CRAFTED[1], 1 << 24, 65536)
    assert kv.tolist() == [5, 6, 0] and CRAFTED[1][start:end] == b"[ 5 ,\t6\r\n, 0 ]" and not plain
    assert total == 11 and type(total) is int
    kv, start, end, plain, total = fastparse.scan_kv_lens(CRAFTED[0], 1 << 24, 65536)
    assert kv.tolist() == [0, 1, 22, 333] and plain and CRAFTED[0][start:end] == b"[0,1,22,333]" and total == 356
    assert fastparse.scan_kv_lens(CRAFTED[0], 332, 65536) is None  # over the limit: the full checks say where
    assert fastparse.scan_kv_lens(CRAFTED[0], 1 << 24, 3) is None  # more than max_n


def test_compiled_scan_agrees_on_random_bodies(monkeypatch):
    from kvsplit.service import fastparse

    if not fastparse.ENABLED:
        pytest.skip("numba off: only the orjson path runs")
    rng = np.random.default_rng(11)
    for _ in range(200):
        lens = np.floor(2 ** (rng.random(int(rng.integers(1, 300))) * 25)).astype(np.int64).tolist()
        sep = [",", ", ", " ,\n"][int(rng.integers(3))]
        body = TEMPLATE.format("[" + sep.join(map(str, lens)) + "]").encode()
        limit = int(rng.choice([1 << 24, 1 << 20, 0, 2**31 - 1]))
        scan, arr, full = _three_ways(monkeypatch, body, limit)
        assert scan == arr == full
        assert scan[0] == ("ok" if max(lens) <= limit else "error")
        found = fastparse.scan_kv_lens(body, limit, 65536)
        assert (found is not None) == (scan[0] == "ok")  # the scan took it
        assert found is None or found[4] == sum(lens)  # and added the total tokens up


def test_dtype_aliases_as_the_cli_and_plan_client_take(client):
    """'bf16' (the CLI's and PlanClient's alias) plans like 'bfloat16' over HTTP, on the first (full-check)
    request and on the cached-header one; a bad dtype's 422 names the field and lists the aliases."""
    lens = [210000] + [3400] * 15
    want = client.post("/v1/plan", content=raw(json.dumps(lens))).json()
    for _ in range(2):
        got = client.post("/v1/plan", content=raw(json.dumps(lens), dtype="bf16"))
        assert got.status_code == 200
        got = got.json()
        assert got["made_for"]["dtype"] == "bfloat16"
        assert got["num_splits"] == want["num_splits"] and got["work_kv_end"] == want["work_kv_end"]
        assert got["policy"] == want["policy"]
    bad = client.post("/v1/plan", content=raw(json.dumps(lens), dtype="bfloat"))
    assert bad.status_code == 422
    (err,) = bad.json()["detail"]
    assert err["loc"] == ["body", "dtype"] and "'bf16'" in err["msg"] and err["input"] == "bfloat"
