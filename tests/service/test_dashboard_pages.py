"""The dashboard's pages through the real app on a real SQLite store (in-process ASGI client), and its parts:
the peer-timing import, the policy-table query validation, the plan viewer's input parsing, the coverage map's
traffic layer and the Gantt chart's data. The same pages in a browser: test_dashboard_browser.py."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from kvsplit.kernels.plan import make_plan
from kvsplit.service.app import create_app
from kvsplit.service.dashboard.coverage import coverage_svg, gain_colour
from kvsplit.service.dashboard.evidence import import_peer_csvs, shape_evidence
from kvsplit.service.dashboard.gantt import gantt_svg
from kvsplit.service.dashboard.pages import QueryError, table_query
from kvsplit.service.dashboard.viewer import MAX_REQUESTS, ViewerError, parse_kv_lens
from kvsplit.service.settings import Settings
from kvsplit.tuner.simulate import predict, timeline
from kvsplit.tuner.workloads import family_kv_lens
from tests.service_support import BATCH_SIZES, FAMILIES, GPU, SHAPE, fill_store, write_peer_csv

ROOT = Path(__file__).resolve().parents[2]
SLUG = "nvidia-h200.kv4.d128.bf16.p16"


@pytest.fixture(scope="module")
def client(tmp_path_factory):

    tmp = tmp_path_factory.mktemp("pages")
    info = fill_store(f"sqlite:///{tmp}/store.db")
    app = create_app(Settings(database_url=info.url, admin_token=None, reload_interval_s=0))
    with TestClient(app) as c:
        yield info, c


def test_summary_without_peer_timings_says_not_measured(client):
    info, c = client
    r = c.get("/")
    assert r.status_code == 200
    html = r.text
    # fill_store's shapes are the H200's; the shipped peer timings are of H_kv 4 / head_dim 128 / bf16 / page 16
    assert f'data-slug="{SLUG}"' in html and "On 98 held-out reference batches" in html
    # but fill_store's policies are not the shipped table's, which those timings are of: the page says so
    kv4 = html[html.index(f'data-slug="{SLUG}"') :]
    kv4 = kv4[: kv4.index("</section>")]
    assert 'class="error served-differs"' in kv4 and "the timings are not of this server" in kv4
    # the H_kv 8 shape has only a draft: no headline figure, "not measured"
    kv8 = html[html.index('data-slug="nvidia-h200.kv8.d128.bf16.p16"') :]
    assert "not measured" in kv8[: kv8.index("</section>")]


def test_shape_page_cells_of_fill_store(client):
    info, c = client
    r = c.get(f"/shapes/{SLUG}?per_page=200")
    assert r.status_code == 200
    html = r.text
    n = len(FAMILIES) * len(BATCH_SIZES) + 1
    assert f"{n} rows · page 1 of 1" in html
    # a published GPU-tuned bucket: its tuned time / floor is the geomean of its held-out ratios (about 1.12)
    key = next(iter(info.published))
    row = html[html.index(f'data-key="{key}"') :]
    row = row[: row.index("</tr>")]
    m = [float(x) for x in __import__("re").findall(r'tuned-ratio">([0-9.]+)', row)]
    assert len(m) == 1 and 1.08 < m[0] < 1.16
    assert "4 held-out" in row and "#" + str(info.published[key]) in row
    # a published policy of the balanced rule is named as the tuned pick it is, never like the fallback
    assert '<span class="won-balanced"' in row and "balanced, tuned pick" in row and " balanced v" not in row
    # the simulated-only bucket has no verification: "not measured", never a dash
    sim = html[html.index(f'data-key="{info.sim_key}"') :]
    sim = sim[: sim.index("</tr>")]
    assert "simulated" in sim and "not measured" in sim and "–" not in sim


def test_shape_page_bad_parameters_name_the_argument(client):
    _, c = client
    for q, arg in (
        ("page=0", "page"),
        ("per_page=1000", "per_page"),
        ("sort=1;drop", "sort"),
        ("q=" + "x" * 101, "q"),
        ("family=foo", "family"),
    ):
        r = c.get(f"/shapes/{SLUG}?{q}")
        assert r.status_code == 400 and f"{arg}: " in r.text, q
    # a length family the shape has no bucket of is a valid filter: no row
    r = c.get(f"/shapes/{SLUG}?family=trace")
    assert r.status_code == 200 and "0 rows" in r.text
    assert c.get("/shapes/unknown").status_code == 404


def test_plan_viewer_form_post_and_errors(client):
    _, c = client
    lens = family_kv_lens("skewed80", 64, 262_144)
    body = "shape=" + SLUG + "&kv_lens=" + "%2C".join(map(str, lens))
    r = c.post("/plan", content=body, headers={"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 200 and r.text.count('<svg class="gantt"') == 3
    # balanced's chart carries predict() of the balanced plan under the simulator's defaults scaled to the store's
    # measured read bandwidth (fill_store: 4,500 GB/s; no calibration stored)
    from kvsplit.tuner.backends import SimBackend

    p = make_plan(lens, policy="balanced", device="NVIDIA H200", num_kv_heads=4)
    sim = SimBackend("NVIDIA H200", num_kv_heads=4, head_dim=128, dtype="bfloat16", read_bandwidth_gbps=4500.0)
    assert "defaults scaled to the measured read bandwidth 4,500 GB/s" in r.text
    got = r.text[r.text.index('data-kind="balanced"><svg') :]
    us = float(got[got.index('data-total-us="') + 15 :].split('"')[0])
    assert us == pytest.approx(predict(p, calibration=sim.calibration_for(p)) * 1e6, abs=1e-3)
    for body, msg in (
        ("kv_lens=1%2C-2", "kv_lens[1] = -2: Input should be greater than or equal to 0"),
        ("kv_lens=abc", "kv_lens[0] = abc: Input should be a valid integer"),
        ("kv_lens=5&bogus=1", "bogus: unknown field"),
        ("kv_lens=5&shape=nope", "shape: &#39;nope&#39; is none of"),
    ):
        r = c.post("/plan", content=body, headers={"content-type": "application/x-www-form-urlencoded"})
        assert r.status_code == 400 and msg in r.text, body
    r = c.post("/plan", content=b"\xff\xfe", headers={"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 400 and "body: " in r.text


def test_parse_kv_lens():
    assert parse_kv_lens("[1, 2,3]\n4;5", max_kv_len=10) == [1, 2, 3, 4, 5]
    assert parse_kv_lens("0, 7, 0", max_kv_len=10) == [0, 7, 0]  # 0: an empty slot, as /v1/plan takes it
    with pytest.raises(ViewerError, match=r"kv_lens\[2\] = 11: Input should be less than or equal to 10"):
        parse_kv_lens("1 2 11", max_kv_len=10)
    with pytest.raises(ViewerError, match=r"kv_lens\[0\] = 0x10: Input should be a valid integer"):
        parse_kv_lens("0x10", max_kv_len=10)
    with pytest.raises(ViewerError, match=r"kv_lens\[1\] = true: Input should be a valid integer, got boolean"):
        parse_kv_lens("3 true", max_kv_len=10)
    with pytest.raises(ViewerError, match=r"kv_lens: List should have at least 1 item"):
        parse_kv_lens(" ;, ", max_kv_len=10)
    with pytest.raises(ViewerError, match=r"at most 4,096"):
        parse_kv_lens(" ".join(["1"] * (MAX_REQUESTS + 1)), max_kv_len=10)
    with pytest.raises(ViewerError, match=r"characters; at most"):
        parse_kv_lens("1," * 200_000, max_kv_len=10)


def _viewer_post(c, lens_text):
    body = "shape=" + SLUG + "&kv_lens=" + lens_text.replace(",", "%2C").replace(" ", "+")
    return c.post("/plan", content=body, headers={"content-type": "application/x-www-form-urlencoded"})


def _row_splits(html, kind):
    row = html[html.index(f'<tr class="plan-row" data-kind="{kind}"') :]
    return [int(x) for x in row[row.index('data-num-splits="') + 17 :].split('"')[0].split(",")]


def test_plan_viewer_and_v1_plan_take_the_same_kv_lens(client):
    """A batch with empty slots (kv_len 0) is planned by the viewer and by POST /v1/plan alike, each request's
    num_splits that of the planner called directly; a negative or non-integer value is refused by both, the
    viewer's message naming kv_lens[i] and carrying /v1/plan's own message for it."""
    _, c = client
    lens = family_kv_lens("skewed80", 16, 262_144).tolist()
    lens[3] = lens[9] = 0
    lens.append(0)
    r = _viewer_post(c, ", ".join(map(str, lens)))
    assert r.status_code == 200 and r.text.count('<svg class="gantt"') == 3, r.text[-2000:]
    api = c.post("/v1/plan", json=dict(SHAPE, kv_lens=lens))
    assert api.status_code == 200, api.text
    table = c.app.state.holder.current.table
    want, _, info = table.plan(
        lens, gpu=GPU, num_qo_heads=32, num_kv_heads=4, head_dim=128, dtype="bfloat16", page_size=16
    )
    assert info["source"] == api.json()["policy"]["source"]
    assert want.num_splits.tolist() == api.json()["num_splits"] == _row_splits(r.text, "served")
    assert [want.num_splits[i] for i in (3, 9, len(lens) - 1)] == [1, 1, 1]
    shape = dict(device=GPU, num_kv_heads=4, head_dim=128, dtype="bfloat16", page_size=16)
    for kind, policy in (("balanced", "balanced"), ("flashinfer", "flashinfer")):
        assert make_plan(lens, policy=policy, **shape).num_splits.tolist() == _row_splits(r.text, kind)
    # a batch of empty slots only: planned, drawn, and no ratio to a floor of 0 bytes
    r = _viewer_post(c, "0, 0")
    assert r.status_code == 200 and r.text.count('<svg class="gantt"') == 3 and "no floor (0 tokens)" in r.text
    assert _row_splits(r.text, "served") == c.post("/v1/plan", json=dict(SHAPE, kv_lens=[0, 0])).json()["num_splits"]
    # bad values: both refuse, naming the field, with one message
    for bad, text, i in (([5, -3], "5, -3", 1), ([7, 1.5], "7, 1.5", 1), (["x"], "x", 0)):
        api = c.post("/v1/plan", json=dict(SHAPE, kv_lens=bad))
        assert api.status_code == 422, bad
        (err,) = api.json()["detail"]
        assert err["loc"] == ["body", "kv_lens", i]
        r = _viewer_post(c, text)
        assert r.status_code == 400 and '<svg class="gantt"' not in r.text, text
        shown = r.text[r.text.index('id="viewer-error">') + 18 :].split("</p>")[0]
        assert shown.startswith(f"kv_lens[{i}] = "), shown
        if bad != ["x"]:  # a JSON string body is refused for its type; the viewer's "x" is not JSON at all
            assert shown.endswith(": " + err["msg"]), (shown, err["msg"])


def test_table_query_validation():
    assert table_query({}) == table_query({"page": "", "sort": ""})
    q = table_query({"page": "3", "per_page": "10", "sort": "gain", "order": "desc", "source": "none"})
    assert (q.page, q.per_page, q.sort, q.order, q.source) == (3, 10, "gain", "desc", "none")
    for params, arg in (
        ({"page": "x"}, "page"),
        ({"per_page": "9"}, "per_page"),
        ({"order": "sideways"}, "order"),
        ({"family": "f" * 101}, "family"),
        ({"zzz": "1"}, "zzz"),
    ):
        with pytest.raises(QueryError) as e:
            table_query(params)
        assert e.value.argument == arg and str(e.value).startswith(arg + ": ")


def test_peer_import_and_evidence(tmp_path):
    shape = {"num_qo_heads": 8, "num_kv_heads": 1, "head_dim": 64, "dtype": "float16", "page_size": 16}
    meta = {"gpu": "NVIDIA H100 80GB HBM3", "torch": "2.11", "cases": "reference"}
    write_peer_csv(
        tmp_path / "a.csv",
        "kvsplit",
        [["T8", "uniform", 1, 8, 10.0, 1.1], ["T8", "uniform", 2, 8, 20.0, 1.2]],
        {**meta, "shape": shape},
    )
    write_peer_csv(
        tmp_path / "b.csv", "fa3", [["T8", "uniform", 1, 8, 15.0, 1.6], ["T8", "uniform", 2, 8, 10.0, 0.6]], meta
    )
    doc = import_peer_csvs([tmp_path / "a.csv", tmp_path / "b.csv"], measured="2026-12-04")
    assert doc["sets"][1]["shape"] == shape  # taken from the other file of the import
    ev = shape_evidence("h100", num_kv_heads=1, head_dim=64, dtype="float16", page_size=16, entries=doc["sets"])
    (st,) = ev["sets"]
    fa3 = next(r for r in st["rows"] if r["implementation"] == "fa3")
    assert fa3["speedup_geomean"] == pytest.approx(math.sqrt(1.5 * 0.5)) and fa3["speedup_min"] == pytest.approx(0.5)
    assert fa3["geomean"] == pytest.approx(math.sqrt(1.6 * 0.6)) and fa3["worst"] == 1.6
    bal = next(r for r in st["rows"] if r["implementation"] == "kvsplit_balanced")
    assert bal["n"] == 0  # not measured: no figure
    assert (
        shape_evidence("NVIDIA H200", num_kv_heads=1, head_dim=64, dtype="float16", page_size=16, entries=doc["sets"])
        is None
    )
    with pytest.raises(ValueError, match="measured: expected an ISO date"):
        import_peer_csvs([tmp_path / "a.csv"], measured="yesterday")
    (tmp_path / "c.csv").write_text("implementation,set\nx,y\n")
    Path(str(tmp_path / "c.csv") + ".json").write_text("{}")
    with pytest.raises(ValueError, match="missing columns"):
        import_peer_csvs([tmp_path / "c.csv"], measured="2026-12-04")
    write_peer_csv(tmp_path / "d.csv", "fa3", [["T8", "uniform", 1, 8, -1.0, 1.0]], meta)
    with pytest.raises(ValueError, match="must be > 0"):
        import_peer_csvs([tmp_path / "d.csv"], measured="2026-12-04")


def test_shipped_peer_timings_match_the_result_csvs():
    """service/data/peer_timings.json holds exactly the rows of docs/results/h200 (the documented import)."""
    ev = shape_evidence("NVIDIA H200", num_kv_heads=4, head_dim=128, dtype="bfloat16", page_size=16)
    ref = next(s for s in ev["sets"] if s["cases"] == "reference")
    fa3 = next(r for r in ref["rows"] if r["implementation"] == "fa3")
    with open(ROOT / "docs/results/h200/fa3_reference.csv") as f:
        ratios = [float(r["ratio_to_read_floor"]) for r in csv.DictReader(f)]
    assert fa3["n"] == len(ratios) == 98 and fa3["worst"] == max(ratios)
    assert fa3["geomean"] == pytest.approx(math.exp(sum(map(math.log, ratios)) / 98), rel=1e-12)


def test_coverage_traffic_layer_and_colours():
    buckets = [
        {
            "family": "uniform",
            "b_class": 3,
            "t_class": 12,
            "policy": {"id": 1},
            "speedups": {"balanced": 1.3},
            "evidence": "held-out",
        },
    ]
    traffic = [
        {
            "key": "k1",
            "family": "uniform",
            "requests": 120,
            "b_min": 6,
            "b_max": 10,
            "tokens_min": 3000,
            "tokens_max": 5000,
            "by_source": {"fallback": 20, "tuned": 100},
            "max_distance": 3.0,
            "mean_distance": 1.0,
        },
        {
            "key": "k2",
            "family": "uniform",
            "requests": 5,
            "b_min": 1 << 20,
            "b_max": 1 << 20,
            "tokens_min": 1,
            "tokens_max": 1,
            "by_source": {},
        },  # outside the map: not drawn
    ]
    svg = coverage_svg(buckets, "uniform", lookup=None, b_range=range(2, 5), t_range=range(11, 14), traffic=traffic)
    assert svg.count('class="cov"') == 1 and 'data-gain="1.3000"' in svg and gain_colour(1.3) in svg
    assert svg.count("<circle") == 1 and 'data-requests="120" data-fallback="20"' in svg
    assert 'class="traffic fallback"' in svg
    # a lookup that falls back marks a hole; one that serves a tuned policy a neighbour cell
    svg = coverage_svg(
        buckets,
        "uniform",
        lookup=lambda lens: ("fallback", None) if len(lens) > 8 else ("tuned", 1.0),
        b_range=range(2, 5),
        t_range=range(11, 13),
    )
    assert svg.count('data-kind="hole"') == 2 and svg.count('data-kind="near"') == 3
    assert gain_colour(0.5) == "#d73027" and gain_colour(5.0) == "#00552a"


def test_gantt_draws_every_tile_with_predicts_total():
    lens = np.array([50_000, 3_000, 3_000, 700, 20_000])
    p = make_plan(lens, policy="balanced", device="NVIDIA H200", num_kv_heads=4)
    tl = timeline(p)
    svg = gantt_svg(tl, p, title="t")
    assert f'data-total-us="{predict(p) * 1e6:.3f}"' in svg
    import re

    assert sum(int(x) for x in re.findall(r'class="tile" data-sm="\d+" data-tiles="(\d+)"', svg)) == tl.sm.shape[0]
    # every request's tiles are drawn in its colour class (data-request)
    reqs = {int(x) for x in re.findall(r'data-request="(-?\d+)"', svg)}
    assert reqs <= set(range(len(lens))) | {-1} and reqs & set(range(len(lens)))


def test_pages_of_a_gpu_the_planner_does_not_know(tmp_path):
    """A store bucket of a GPU without a DeviceSpec (tuned elsewhere, imported here): every page answers, the
    viewer says why it cannot plan, never a 5xx."""
    from kvsplit.db import store

    url = f"sqlite:///{tmp_path}/s.db"
    store.upgrade(url)
    with store.session_scope(url, write=True) as s:
        store.get_or_create_bucket(
            s,
            key="acme-x9.kv4.d128.bf16.p16.b3.t12.w23x16",
            gpu="ACME X9",
            num_kv_heads=4,
            head_dim=128,
            dtype="bfloat16",
            page_size=16,
            source="imported",
        )
    app = create_app(Settings(database_url=url, admin_token=None, reload_interval_s=0))
    with TestClient(app) as c:
        assert c.get("/").status_code == 200
        assert c.get("/shapes/acme-x9.kv4.d128.bf16.p16").status_code == 200
        r = c.get("/plan?shape=acme-x9.kv4.d128.bf16.p16&kv_lens=5,6")
        assert r.status_code == 400 and "ACME X9" in r.text and 'id="viewer-error"' in r.text


def test_coverage_map_tick_labels_are_whole_numbers():
    """Token-class labels below 1k are whole numbers of tokens (2^6 = 64 was drawn as "0.0625k", clipped by the
    axis); 2^10 and up are k and M."""
    import re

    from kvsplit.service.dashboard.coverage import coverage_svg

    svg = coverage_svg([], "traffic without a bucket", lookup=None, b_range=range(0, 11), t_range=range(6, 22))
    ticks = re.findall(r'<text class="tick"[^>]*>([^<]*)</text>', svg)
    # B classes 0..10 (every other one labelled), then token classes 6..21 (every other one)
    assert ticks == ["1", "4", "16", "64", "256", "1k"] + ["64", "256", "1k", "4k", "16k", "64k", "256k", "1M"]


@pytest.fixture(params=["sqlite", "postgres"])
def draft_store(request, tmp_path):
    """A store whose only policies are drafts, verified by :func:`kvsplit.tuner.verify.verify_and_store` on the
    simulator: ``failed`` (verified outside a tuning run, as a campaign does; slower than the best baseline) and
    ``kept`` (a tuning run's draft that passed but was not published, beside an older run's failed draft of the
    same bucket). On SQLite and on the PostgreSQL of ``KVSPLIT_TEST_POSTGRES_URL``."""
    from kvsplit.db import store
    from kvsplit.tuner import search, verify
    from kvsplit.tuner.backends import SimBackend

    url = f"sqlite:///{tmp_path}/drafts.db" if request.param == "sqlite" else request.getfixturevalue("pg_url")
    store.upgrade(url)
    shape = dict(gpu=GPU, num_qo_heads=32, num_kv_heads=4, head_dim=128, dtype="bfloat16", page_size=16)
    be = SimBackend(GPU, num_kv_heads=4, head_dim=128, dtype="bfloat16")
    out = {}
    for name, fam, B, n_heldout in (("failed", "skewed80", 16, 1), ("kept", "uniform", 64, 2)):
        t = search.family_task(fam, B, 262_144, num_train=1, num_heldout=n_heldout, **shape)
        with store.session_scope(url, write=True) as s:
            bid = store.get_or_create_bucket(
                s, key=t.key, gpu=GPU, num_kv_heads=4, head_dim=128, dtype="bfloat16", page_size=16, source=t.source
            ).id
        bal = search.baseline_equivalents(t)["balanced"]
        worse = {**bal, "max_splits": 1}  # no split: slower than balanced on these batches
        if name == "failed":
            res = verify.verify_and_store(t, worse, be, database_url=url, bucket_id=bid, run_id=None, device_id=None)
            assert not res.summary["passed"] and not res.published
        else:
            for params, tol in ((worse, 0.0), (bal, 0.1)):  # an older failed run, then a passing one kept as draft
                with store.session_scope(url, write=True) as s:
                    run = store.start_run(s, bucket_id=bid, study_name=f"kvsplit/{t.key}", backend="sim", n_trials=1)
                    run_id = run.id
                res = verify.verify_and_store(
                    t,
                    params,
                    be,
                    database_url=url,
                    bucket_id=bid,
                    run_id=run_id,
                    device_id=None,
                    publish=False,
                    tolerance=tol,
                )
            assert res.summary["passed"] and not res.published
        with store.session_scope(url) as s:
            pol = store.get_policy(s, res.policy_id)
            assert pol.status == "draft"
            out[name] = (t.key, pol.id, dict(pol.verification))
    return url, out


def test_shape_page_shows_a_drafts_own_verification(draft_store):
    """A bucket whose newest policy is a draft shows that draft's held-out figures (time / floor, gain over each
    baseline) as a draft's, equal to its stored verification summary, with why it was not published; the number of
    held-out batches it claims is the verification's. An older draft of the bucket lends it nothing."""
    import re

    from kvsplit.service.queries import dashboard_data

    url, drafts = draft_store
    rows = {b["key"]: b for sh in dashboard_data(url)["shapes"] for b in sh["buckets"]}
    app = create_app(Settings(database_url=url, admin_token=None, reload_interval_s=0))
    with TestClient(app) as c:
        r = c.get(f"/shapes/{SLUG}")
    assert r.status_code == 200
    for name, (key, pid, ver) in drafts.items():
        b = rows[key]
        assert b["policy"] is None and b["draft"]["id"] == pid and b["evidence"] == "held-out"
        assert b["n_heldout"] == ver["heldout_batches"] and b["measured_on"] == ["sim"]
        assert b["ratios"]["tuned"] == pytest.approx(ver["tuned_geomean_ratio"], rel=1e-9)
        assert set(b["speedups"]) == set(ver["speedup_vs"])
        for base, x in ver["speedup_vs"].items():
            assert b["speedups"][base] == pytest.approx(x, rel=1e-9), (name, base)
        row = r.text[r.text.index(f'data-key="{key}"') :]
        row = row[: row.index("</tr>")]
        assert f"#{pid}</a>" in row and '<span class="pill draft"' in row
        got = re.search(r'tuned-ratio draft"[^>]*>([0-9.]+)', row)
        assert got and got.group(1) == f"{ver['tuned_geomean_ratio']:.3f}", row
        gains = dict(re.findall(r'data-base="(\w+)"[^>]*>([0-9.]+)×', row))
        assert gains == {base: f"{x:.3f}" for base, x in ver["speedup_vs"].items()}, row
        assert f"{ver['heldout_batches']} held-out" in row and "not measured" not in row
        t, bb, bbr = ver["tuned_geomean_ratio"], ver["best_baseline"], ver["best_baseline_geomean_ratio"]
        want = f"tuned {t:.3f}× floor vs best baseline {bb} {bbr:.3f}×: " + (
            "not published" if name == "failed" else "passed verification, not published"
        )
        assert want in row, row
