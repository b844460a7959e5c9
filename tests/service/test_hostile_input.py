"""Hostile bodies, methods and imports against a real ``kvsplit serve`` process.

Every answer of the service to a request that reaches it is a 2xx or a 4xx with
a JSON ``detail`` message: nesting swept from 1 to 100,000 levels in every field
of a plan body (and an unknown one), huge numbers, bad UTF-8, duplicate keys and
wrong types, while the server's resident memory (``VmRSS`` of
``/proc/PID/status``) stays flat. Any HTTP method on any path adds no metric
series beyond the bounded labels, an unhandled exception is counted as
``status="500"``, and an import whose JSON fields nest too deeply or are too
large is refused (route and ``kvsplit db import``) while every stored policy
stays readable.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvsplit.db import store
from kvsplit.db.checks import MAX_JSON_DEPTH
from kvsplit.db.transfer import MAX_IMPORT_FIELD_BYTES
from kvsplit.service.middleware import METHODS
from kvsplit.service.validation import MAX_DEPTH

from ..service_support import ROOT, LiveServer, free_port

SHIPPED = ROOT / "kernels" / "data" / "h200_policies.json"
TOKEN = "hostile-test-token"
HEADER = {
    "gpu": "NVIDIA H200",
    "num_qo_heads": 32,
    "num_kv_heads": 4,
    "head_dim": 128,
    "dtype": "bfloat16",
    "page_size": 16,
}
GOOD = dict(HEADER, kv_lens=[4096, 17, 0])
FIELDS = ("gpu", "num_qo_heads", "num_kv_heads", "head_dim", "dtype", "page_size", "kv_lens", "device", "zz_unknown")
# coarse: every level up to 12 (the limit is 8), both sides of orjson's writer (254) and parser (1,024) limits
DEPTHS = sorted(
    set(range(1, 13))
    | {16, 31, 32, 33, 64, 128}
    | set(range(250, 261))
    | {500, 1000}
    | set(range(1020, 1028))
    | {2048, 4096, 10_000, 50_000, 100_000}
)
# llhttp's methods (CONNECT left out: it opens a tunnel)
LLHTTP_METHODS = (
    "DELETE GET HEAD POST PUT OPTIONS TRACE COPY LOCK MKCOL MOVE PROPFIND PROPPATCH SEARCH UNLOCK BIND "
    "REBIND UNBIND ACL REPORT MKACTIVITY CHECKOUT MERGE M-SEARCH NOTIFY SUBSCRIBE UNSUBSCRIBE PATCH "
    "PURGE MKCALENDAR LINK UNLINK SOURCE QUERY"
).split()


class Client:
    """One keep-alive HTTP/1.1 connection to the server; reconnects after an answer that closed it."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.conn: http.client.HTTPConnection | None = None

    def request(
        self, method: str, path: str, body: bytes | None = None, headers: dict | None = None
    ) -> tuple[int, str, bytes]:
        for attempt in range(2):
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
            try:
                h = {"Content-Type": "application/json"} if body is not None else {}
                self.conn.request(method, path, body=body, headers={**h, **(headers or {})})
                r = self.conn.getresponse()
                data = r.read()
                if r.getheader("connection", "").lower() == "close":
                    self.conn.close()
                    self.conn = None
                return r.status, r.getheader("content-type", ""), data
            except (ConnectionError, http.client.HTTPException):
                self.conn.close()
                self.conn = None
                if attempt:
                    raise
        raise AssertionError("unreachable")


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('hostile')}/k.db"
    store.upgrade(url)
    with store.session_scope(url, write=True) as s:
        store.import_policies(s, json.loads(SHIPPED.read_text()))
    with LiveServer(url, admin_token=TOKEN, reload_interval=0) as srv:
        srv.client = Client(srv.port)
        srv.db_url = url
        yield srv


def assert_json_4xx(status: int, ctype: str, data: bytes, what: str) -> dict:
    assert 400 <= status < 500, f"{what}: {status} {data[:300]!r}"
    assert ctype.startswith("application/json"), f"{what}: {ctype} {data[:300]!r}"
    assert len(data) < 64 * 1024, f"{what}: an error answer of {len(data)} bytes"  # echoes are bounded
    doc = json.loads(data)
    assert doc.get("detail"), f"{what}: {doc}"
    if isinstance(doc["detail"], list):
        assert all(e.get("msg") and "loc" in e and e.get("type") for e in doc["detail"]), f"{what}: {doc}"
    return doc


def nested(field: str, depth: int, opener: str) -> bytes:
    """A good plan body whose ``field`` holds ``depth`` levels of arrays (``[``) or objects (``{``) around 1."""
    head, tail = ("[" * depth, "]" * depth) if opener == "[" else ('{"a":' * depth, "}" * depth)
    doc = dict(GOOD)
    doc[field] = "@@"
    return json.dumps(doc, separators=(",", ":")).replace('"@@"', head + "1" + tail).encode()


def sweep(c: Client) -> int:
    """The nesting sweep of every field; returns the number of requests."""
    n = 0
    for depth in DEPTHS:
        for field in FIELDS:
            for opener in "[{":
                status, ctype, data = c.request("POST", "/v1/plan", nested(field, depth, opener))
                n += 1
                if (field, depth, opener) == ("kv_lens", 1, "["):  # kv_lens [1]: a good body
                    assert status == 200 and json.loads(data)["kv_lens"] == [1], data[:300]
                    continue
                doc = assert_json_4xx(status, ctype, data, f"{field} {opener}x{depth}")
                if depth + 1 > MAX_DEPTH:  # the body's object is level 1
                    e = doc["detail"][0]
                    assert e["type"] == "json_too_deep" and "nested deeper than" in e["msg"], (field, depth, e)
                    # up to orjson's parser limit the field is named; past it, the byte position
                    assert e["loc"][1] == field if depth + 1 <= 1024 else isinstance(e["loc"][1], int), e
                else:
                    assert all(e["type"] != "json_too_deep" for e in doc["detail"]), (field, depth, doc)
    return n


def test_plan_nesting_sweep_no_5xx_and_flat_rss(server):
    c = server.client
    status, _, data = c.request("POST", "/v1/plan", json.dumps(GOOD).encode())
    assert status == 200, data
    t0 = time.monotonic()
    n = sweep(c)  # warm-up pass: first allocations, caches
    rss0 = rss_kib(server.proc.pid)
    for _ in range(2):
        n += sweep(c)
    rss1 = rss_kib(server.proc.pid)
    elapsed = time.monotonic() - t0
    assert n == 3 * len(DEPTHS) * len(FIELDS) * 2
    # flat: the two later sweeps (each with 100,000-level bodies of 600 kB) leave the RSS where the first left it
    assert rss1 - rss0 < 4 * 1024, f"RSS grew {rss0} -> {rss1} KiB over {n} requests"
    assert elapsed < 60, f"the sweep took {elapsed:.1f} s"
    status, _, data = c.request("POST", "/v1/plan", json.dumps(GOOD).encode())
    assert status == 200, data


def _huge_numbers() -> list[bytes]:
    nums = [
        "1e400",
        "-1e400",
        "1e308",
        "123456789012345678901234567890",
        "-99999999999999999999",
        str(2**63),
        str(2**64),
        str(2**64 + 1),
        "-0.0",
        "0.5",
        "1E2",
        str(10**4000),
    ]
    out = []
    for field in ("num_qo_heads", "num_kv_heads", "head_dim", "page_size", "gpu", "dtype"):
        for v in nums:
            doc = json.dumps(dict(GOOD, **{field: "@@"})).replace('"@@"', v)
            out.append(doc.encode())
    for v in nums:
        out.append(json.dumps(dict(GOOD, kv_lens=[1, "@@"])).replace('"@@"', v).encode())
        out.append(json.dumps(dict(GOOD, kv_lens="@@")).replace('"@@"', v).encode())
    return out


def _bad_utf8() -> list[bytes]:
    good = json.dumps(GOOD).encode()
    return [
        good.replace(b"NVIDIA H200", b"NVIDIA \xff\xfe"),
        good.replace(b"NVIDIA H200", b"\xc0\xaf"),  # overlong '/'
        good.replace(b"NVIDIA H200", b"\xed\xa0\x80"),  # a UTF-16 surrogate in UTF-8
        good.replace(b"NVIDIA H200", b"\\ud800"),  # a lone surrogate escape
        good.replace(b"NVIDIA H200", b"a\x00b"),
        good.replace(b'"gpu"', b'"g\xffpu"'),
        b"\xef\xbb\xbf" + good,  # a byte-order mark
        good[:-1] + b"\x80}",
        b"\xff" * 64,
        good.replace(b"bfloat16", b"bfloat16\xf0\x9f"),  # truncated 4-byte sequence
    ]


def _duplicates() -> list[bytes]:
    g = json.dumps(GOOD)[1:-1]
    return [
        ("{" + g + ',"kv_lens":[1,2]}').encode(),
        ("{" + g + ',"kv_lens":"x"}').encode(),
        ('{"kv_lens":[5],' + g + "}").encode(),
        ("{" + g + ',"gpu":"ACME X1"}').encode(),
        ("{" + g + ',"gpu":{"a":[1]}}').encode(),
        ("{" + g + ',"head_dim":96,"head_dim":128}').encode(),
        ("{" + g + ',"device":{"num_sms":1,"num_sms":{"x":1}}}').encode(),
    ]


def _wrong_types() -> list[bytes]:
    out = []
    for field in FIELDS:
        for v in (
            None,
            True,
            False,
            "s",
            "",
            1.5,
            -1,
            0,
            [],
            {},
            [None],
            [True],
            {"": 1},
            "x" * 100_000,
            list(range(70_000)),
            {str(i): i for i in range(20_000)},
        ):
            out.append(json.dumps(dict(GOOD, **{field: v})).encode())
    dev = {
        "num_sms": 132,
        "hbm_bandwidth_gbps": 4800.0,
        "l2_bytes": 1 << 25,
        "smem_per_sm_bytes": 1 << 17,
        "smem_per_block_bytes": 1 << 16,
    }
    for k in list(dev) + ["name", "compute_capability", "regs_per_sm", "max_threads_per_sm"]:
        for v in (None, True, "s", 1e300, -1, [1, [2]], {"a": {"b": 1}}, "x" * 5000, 2**70):
            out.append(json.dumps(dict(GOOD, gpu="ACME X1", device=dict(dev, **{k: v}))).encode())
    # the largest echo: 20 unknown fields, each 16 long keys of 8 long strings, and nested deeper than echoed
    wide = {"k" * 60 + str(i): ["s" * 300] * 8 for i in range(16)}
    out.append(json.dumps(dict(GOOD, **{f"x{i}" * 40: wide for i in range(20)})).encode())
    out.append(json.dumps(dict(GOOD, kv_lens=[[["s" * 300] * 8] * 8] * 8, gpu=[[1] * 8] * 8)).encode())
    out += [
        b"",
        b" ",
        b"null",
        b"[]",
        b"[[[[1]]]]",
        b'"x"',
        b"1e400",
        b"{",
        b'{"a":',
        b"{}" * 1000,
        b'{"kv_lens": [' + b"1," * 65_536 + b"1]}",
        json.dumps(dict(GOOD, kv_lens=[0] * 65_537)).encode(),
    ]
    return out


@pytest.mark.parametrize("kind", ["huge_numbers", "bad_utf8", "duplicate_keys", "wrong_types"])
def test_plan_hostile_values_answer_json_4xx_or_200(server, kind):
    bodies = {
        "huge_numbers": _huge_numbers,
        "bad_utf8": _bad_utf8,
        "duplicate_keys": _duplicates,
        "wrong_types": _wrong_types,
    }[kind]()
    ok = 0
    for raw in bodies:
        status, ctype, data = server.client.request("POST", "/v1/plan", raw)
        if status == 200:
            doc = json.loads(data)
            assert doc["num_splits"] and doc["policy"], raw[:200]
            ok += 1
        else:
            assert_json_4xx(status, ctype, data, repr(raw[:200]))
    if kind == "duplicate_keys":
        assert ok >= 1  # JSON's last member wins: '{...,"kv_lens":[1,2]}' is a good body
        status, _, data = server.client.request("POST", "/v1/plan", _duplicates()[0])
        assert status == 200 and json.loads(data)["kv_lens"] == [1, 2]


TRAFFIC_BAD_QUERIES = [
    ("hours=0", "hours"),
    ("hours=-1", "hours"),
    ("hours=87601", "hours"),
    ("hours=abc", "hours"),
    ("hours=1.5", "hours"),
    ("hours=1e3", "hours"),
    ("hours=99999999999999999999999999", "hours"),
    ("hours=%00", "hours"),
    ("hours=%F0%9F%92%A5", "hours"),
    ("hours=" + "9" * 5000, "hours"),
    ("hours=", "hours"),
    ("limit=0", "limit"),
    ("limit=10001", "limit"),
    ("limit=x", "limit"),
    ("hours=24&limit=-5", "limit"),
    ("hours=true", "hours"),
]


@pytest.mark.parametrize("query,param", TRAFFIC_BAD_QUERIES)
def test_traffic_hostile_query_params_are_422_naming_the_param(server, query, param):
    status, ctype, data = server.client.request("GET", "/v1/traffic?" + query)
    assert status == 422, (query, status, data[:300])
    doc = assert_json_4xx(status, ctype, data, query)
    assert [e["loc"] for e in doc["detail"]] == [["query", param]], (query, doc)


def test_traffic_good_query_answers_and_counts_what_was_served(server):
    before = json.loads(server.client.request("GET", "/v1/traffic?hours=1&limit=10000")[2])["requests"]
    for _ in range(3):
        assert server.client.request("POST", "/v1/plan", json.dumps(GOOD).encode())[0] == 200
    status, ctype, data = server.client.request("GET", "/v1/traffic?hours=1&limit=10000&unknown=1")
    doc = json.loads(data)
    assert status == 200 and doc["hours"] == 1 and doc["requests"] == before + 3, doc


def _series(text: str) -> set[tuple[str, str, str]]:
    return set(re.findall(r'kvsplit_http_requests_total\{method="([^"]*)",route="([^"]*)",status="([^"]*)"\}', text))


def _raw_request(port: int, method: str, path: str) -> int:
    """One request with any method (http.client would refuse some): the answer's status."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    status = int(data.split(b" ", 2)[1])
    assert status < 500, (method, path, data[:300])
    return status


def test_any_method_on_any_path_adds_a_bounded_set_of_metric_series(server):
    paths = [
        "/",
        "/healthz",
        "/v1/plan",
        "/v1/policies",
        "/v1/policies/1",
        "/v1/policies/import",
        "/v1/runs",
        "/metrics",
        "/favicon.ico",
    ]
    for i, m in enumerate(LLHTTP_METHODS):
        for p in paths + [f"/nope/{i}/{j}" for j in range(3)] + [f"/v1/policies/{i}x"]:
            _raw_request(server.port, m, p)
    status, _, text = server.client.request("GET", "/metrics")
    first = _series(text.decode())
    methods = {s[0] for s in first}
    assert methods <= METHODS | {"other"} and "other" in methods, methods
    routes = {s[1] for s in first}
    assert "unmatched" in routes and not any(r.startswith("/nope") for r in routes), routes
    # the same again with other methods' spellings and other random paths: not one series more
    for i, m in enumerate(LLHTTP_METHODS):
        for p in [f"/again/{i}/{j}" for j in range(3)] + [f"/v1/runs/{i}", f"/v1/policies/{i}zz"]:
            _raw_request(server.port, m, p)
        _raw_request(server.port, m, "/healthz")
    status, _, text = server.client.request("GET", "/metrics")
    second = _series(text.decode())
    assert second == first | {("GET", "/metrics", "200")}, second - first
    assert len(second) < 120, len(second)


def test_an_unhandled_exception_is_a_json_500_counted_as_500(tmp_path, monkeypatch):
    """A test-only app instance with a route that raises, and a plan handler that raises: JSON 500s, counted
    with status="500" (an alert on status=~"5.." fires)."""
    from fastapi.testclient import TestClient

    from kvsplit.service import middleware
    from kvsplit.service.app import create_app
    from kvsplit.service.settings import Settings

    url = f"sqlite:///{tmp_path}/k.db"
    store.upgrade(url)
    app = create_app(Settings(database_url=url))

    @app.get("/test-only/boom")
    def boom() -> None:
        raise RuntimeError("a bug")

    def count(text: str, route: str, status: str) -> float:
        m = re.search(
            rf'kvsplit_http_requests_total\{{method="(?:GET|POST)",route="{re.escape(route)}",'
            rf'status="{status}"\}} (\S+)',
            text,
        )
        return float(m.group(1)) if m else 0.0

    with TestClient(app, raise_server_exceptions=False) as c:
        before = c.get("/metrics").text
        r = c.get("/test-only/boom")
        assert r.status_code == 500 and r.headers["content-type"] == "application/json", r.text
        assert "internal server error" in r.json()["detail"] and "a bug" not in r.text

        def broken(*a, **k):
            raise RuntimeError("a planner bug")

        monkeypatch.setattr(middleware, "handle_plan", broken)
        r = c.post("/v1/plan", json=GOOD)
        assert r.status_code == 500 and "internal server error" in r.json()["detail"], r.text
        after = c.get("/metrics").text
    assert count(after, "/test-only/boom", "500") == count(before, "/test-only/boom", "500") + 1
    assert count(after, "/v1/plan", "500") == count(before, "/v1/plan", "500") + 1
    assert 'status="0"' not in after


# --------------------------------------------------------------------------- imports


def _lists(n: int) -> object:
    """``n`` arrays nested around 1."""
    v: object = 1
    for _ in range(n):
        v = [v]
    return v


def _one_entry_doc(verification_text: str) -> bytes:
    """The shipped file's first entry alone with another score (a new row, not the shipped one reused: a draft,
    as it scores worse), its ``verification`` replaced by the given JSON text."""
    doc = json.loads(SHIPPED.read_text())
    doc["policies"] = doc["policies"][:1]
    doc["policies"][0]["score"] *= 1.25
    doc["policies"][0]["verification"] = "@@"
    return json.dumps(doc).replace('"@@"', verification_text).encode()


def _deep_text(levels: int) -> str:
    """A ``verification`` object nesting ``levels`` levels in all (itself included)."""
    return '{"passed":true,"x":' + "[" * (levels - 1) + "1" + "]" * (levels - 1) + "}"


def _admin(c: Client, raw: bytes) -> tuple[int, str, bytes]:
    return c.request("POST", "/v1/policies/import", raw, {"Authorization": f"Bearer {TOKEN}"})


def test_import_route_refuses_deep_or_large_fields_and_reads_stay_200(server):
    c = server.client
    status, _, table = c.request("GET", "/v1/policies")
    ids = [p["id"] for p in json.loads(table)["data"]]
    for levels in (MAX_JSON_DEPTH + 1, 253, 256, 1020, 1024, 5000, 100_000):
        status, ctype, data = _admin(c, _one_entry_doc(_deep_text(levels)))
        doc = assert_json_4xx(status, ctype, data, f"verification {levels} levels")
        msg = doc["detail"][0]["msg"]
        assert status == 422 and "nothing stored" in msg and "nest" in msg, msg
        if levels < 900:  # parsed, then refused by the field check, which names the field
            assert (
                f"policies[0].verification.x{'[0]' * (MAX_JSON_DEPTH - 1)}: nested deeper than "
                f"{MAX_JSON_DEPTH} levels" in msg
            ), msg
    big = json.dumps({"passed": True, "log": "x" * MAX_IMPORT_FIELD_BYTES})
    status, ctype, data = _admin(c, _one_entry_doc(big))
    msg = assert_json_4xx(status, ctype, data, "large verification")["detail"][0]["msg"]
    assert "policies[0].verification:" in msg and f"more than the {MAX_IMPORT_FIELD_BYTES}" in msg, msg
    for bad, why in (
        (json.dumps({"passed": True, "n": 2**64}), "64-bit"),
        ('{"passed":true,"n":NaN}', "finite"),
        ('{"passed":true,"s":"\\ud800', "not JSON"),
    ):
        status, ctype, data = _admin(c, _one_entry_doc(bad))
        assert why in assert_json_4xx(status, ctype, data, bad)["detail"][0]["msg"]
    # nothing was stored, and every policy still reads
    status, _, table2 = c.request("GET", "/v1/policies")
    assert [p["id"] for p in json.loads(table2)["data"]] == ids
    # at the limit: stored and served
    status, _, data = _admin(c, _one_entry_doc(_deep_text(MAX_JSON_DEPTH)))
    assert status == 200, data
    (pid,) = json.loads(data)["policy_ids"]
    status, ctype, data = c.request("GET", f"/v1/policies/{pid}")
    assert status == 200 and json.loads(data)["verification"]["x"] == _lists(MAX_JSON_DEPTH - 1)
    for i in ids[:20]:
        assert c.request("GET", f"/v1/policies/{i}")[0] == 200


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kvsplit.service.cli", *args], capture_output=True, text=True, timeout=120, cwd=ROOT
    )


def test_db_import_refuses_deep_or_large_fields_in_one_line(tmp_path):
    url = f"sqlite:///{tmp_path}/k.db"
    store.upgrade(url)
    cases = {
        "deep33": _deep_text(MAX_JSON_DEPTH + 1),
        "deep100000": _deep_text(100_000),
        "large": json.dumps({"passed": True, "log": "y" * MAX_IMPORT_FIELD_BYTES}),
    }
    for name, text in cases.items():
        f = tmp_path / f"{name}.json"
        f.write_bytes(_one_entry_doc(text))
        r = _cli("db", "import", str(f), "--database-url", url)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, (name, r.stderr[-2000:])
        assert "import rejected, nothing stored" in lines[0], lines
        if name == "large":
            assert f"more than the {MAX_IMPORT_FIELD_BYTES}" in lines[0], lines
        elif name == "deep100000":
            assert "too deeply to read" in lines[0], lines
        else:
            assert f"nested deeper than {MAX_JSON_DEPTH} levels" in lines[0], lines
    with store.session_scope(url) as s:
        assert store.list_policies(s) == []
    f = tmp_path / "limit.json"
    f.write_bytes(_one_entry_doc(_deep_text(MAX_JSON_DEPTH)))
    r = _cli("db", "import", str(f), "--database-url", url)
    assert r.returncode == 0, r.stderr
    with store.session_scope(url) as s:
        (p,) = store.list_policies(s)
        pid = p.id
    with LiveServer(url) as srv:
        status, ctype, data = Client(srv.port).request("GET", f"/v1/policies/{pid}")
    assert status == 200 and json.loads(data)["verification"]["x"] == _lists(MAX_JSON_DEPTH - 1)


# --------------------------------------------------------------------------- a full disk


def _can_mount_tmpfs() -> bool:
    if not shutil.which("unshare") or sys.platform != "linux":
        return False
    r = subprocess.run(
        ["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"], capture_output=True, timeout=30
    )
    return r.returncode == 0


@pytest.mark.skipif(not _can_mount_tmpfs(), reason="needs `unshare -rm` and tmpfs mounts (user namespaces)")
def test_import_on_a_full_disk_is_a_json_507_and_the_store_stays_readable(tmp_path):
    """The server runs in its own mount namespace with its store on a small tmpfs; an import larger than the
    space left answers 507 naming the cause, and the store keeps serving what it had."""
    src = tmp_path / "seed.db"
    url = f"sqlite:///{src}"
    store.upgrade(url)
    doc = json.loads(SHIPPED.read_text())
    with store.session_scope(url, write=True) as s:
        store.import_policies(s, dict(doc, policies=doc["policies"][:4]))
    store.dispose_engines()
    size_kib = src.stat().st_size // 1024 + 160
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("PROMETHEUS_MULTIPROC_DIR", "KVSPLIT_ADMIN_TOKEN")}
    env.update(KVSPLIT_ADMIN_TOKEN=TOKEN, KVSPLIT_RELOAD_INTERVAL_S="0")
    script = (
        f"mount -t tmpfs -o size={size_kib}k tmpfs {mnt} && cp {src} {mnt}/k.db && exec {sys.executable} "
        f"-m kvsplit.service.cli serve --database-url sqlite:///{mnt}/k.db --host 127.0.0.1 --port {port} "
        f"--log-level warning"
    )
    proc = subprocess.Popen(
        ["unshare", "-rm", "sh", "-c", script], env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        c = Client(port)
        t0 = time.monotonic()
        while True:
            assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
            try:
                if c.request("GET", "/healthz")[0] == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() - t0 < 60
            time.sleep(0.1)
        status, _, table = c.request("GET", "/v1/policies")
        before = json.loads(table)["data"]
        assert len(before) == 4
        big = dict(doc, policies=doc["policies"][4:64])
        for p in big["policies"]:
            p["verification"] = dict(p["verification"], log="z" * 20_000)
        raw = json.dumps(big).encode()
        assert 4 * size_kib * 1024 < len(raw) < 2 << 20  # far more than the space left, within the body limit
        status, ctype, data = _admin(c, raw)
        assert status == 507 and ctype == "application/json", (status, data[:500])
        assert "database or disk is full" in json.loads(data)["detail"], data
        status, _, table = c.request("GET", "/v1/policies")
        assert status == 200 and json.loads(table)["data"] == before
        for p in before:
            assert c.request("GET", f"/v1/policies/{p['id']}")[0] == 200
        status, _, text = c.request("GET", "/metrics")
        assert 'route="/v1/policies/import",status="507"} 1.0' in text.decode()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_deep_row_stored_before_the_check_still_reads_200(tmp_path):
    """A store written before imports checked JSON fields (the row is set by SQL, past every check): the
    policy still reads, with the unservable field named and the rest intact."""
    from fastapi.testclient import TestClient
    from sqlalchemy import update

    from kvsplit.db.models import Policy
    from kvsplit.service.app import create_app
    from kvsplit.service.settings import Settings

    url = f"sqlite:///{tmp_path}/k.db"
    store.upgrade(url)
    doc = json.loads(SHIPPED.read_text())
    with store.session_scope(url, write=True) as s:
        (pid,) = store.import_policies(s, dict(doc, policies=doc["policies"][:1]))
        s.execute(update(Policy).where(Policy.id == pid).values(verification={"passed": True, "x": _lists(300)}))
    with TestClient(create_app(Settings(database_url=url))) as c:
        r = c.get(f"/v1/policies/{pid}")
    assert r.status_code == 200, r.text
    d = r.json()
    assert d["id"] == pid and d["params"] == doc["policies"][0]["params"]
    assert (
        "verification.x[0]" in d["verification"]["unservable"]
        and "nested deeper than 32" in d["verification"]["unservable"]
    )
