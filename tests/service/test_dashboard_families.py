"""The dashboard keeps bucket families apart: a store with the bf16 q_len-1 family of the Qwen3 H200 shape
(:func:`tests.service_support.fill_store`) and, of the same shape, an FP8-cache q_len-4 family and an FP8-cache
q_len-2 family (published simulator-tuned policies, through the store API) shows each family on its own card and
page with its own buckets, names the KV dtype and q_len in its titles, shows a batch that ``POST /v1/plan`` serves
from the FP8 family's policy as served on that family's coverage map and in the plan viewer, and the viewer's read
floor of an FP8 cache is its bytes (one per element) over the read bandwidth: half the bf16 one."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from kvsplit.db import store
from kvsplit.kernels.buckets import bucket_key
from kvsplit.service import main_job
from kvsplit.service.app import create_app
from kvsplit.service.dashboard.evidence import import_peer_csvs, shape_evidence
from kvsplit.service.dashboard.pages import _family_charts
from kvsplit.service.settings import Settings
from kvsplit.tuner.workloads import family_kv_lens
from tests.service_support import BATCH_SIZES, FAMILIES, GPU, SHAPE, fill_store, write_peer_csv

SLUG = "nvidia-h200.kv4.d128.bf16.p16"
FP8 = "float8_e4m3fn"
Q4, Q2 = SLUG + ".kvfp8.q4", SLUG + ".kvfp8.q2"
# (q_len, B, total tokens) of the FP8 families' uniform buckets: q_len 4 at (B 64, T 2^18) and (B 256, T 2^20),
# q_len 2 at (B 64, T 2^18)
FP8_BUCKETS = ((4, 64, 2**18), (4, 256, 2**20), (2, 64, 2**18))
READ_BW = 4500.0  # GB/s: fill_store's measured read bandwidth of the H200 (no calibration stored)


def _fp8_key(q_len: int, B: int, T: int) -> str:
    lens = family_kv_lens("uniform", B, T)
    return str(bucket_key(lens, num_kv_heads=4, head_dim=128, dtype="bfloat16", device=GPU, kv_dtype=FP8, q_len=q_len))


def _fp8_bucket(s, q_len: int, B: int, T: int):
    """The FP8 uniform bucket of (q_len, B, T) of the module's shape, in session ``s``."""
    return store.get_or_create_bucket(
        s,
        key=_fp8_key(q_len, B, T),
        gpu=GPU,
        num_kv_heads=4,
        head_dim=128,
        dtype="bfloat16",
        page_size=16,
        source=f"family:uniform B={B} T={T}",
        signature={"family": "uniform"},
    )


def _fill_with_fp8_families(url: str) -> dict[str, int]:
    """fill_store's bf16 q_len-1 store plus a published simulated policy on each of :data:`FP8_BUCKETS`;
    ``{bucket key: policy id}``."""
    fill_store(url)
    ids = {}
    with store.session_scope(url, write=True) as s:
        for q_len, B, T in FP8_BUCKETS:
            b = _fp8_bucket(s, q_len, B, T)
            pol = store.create_policy(
                s, bucket_id=b.id, params={"ctas_per_sm": 3.0}, backend="sim", score=1.1, name="balanced"
            )
            store.publish(s, pol.id)
            ids[b.key] = pol.id
    return ids


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('families')}/store.db"
    ids = _fill_with_fp8_families(url)
    app = create_app(Settings(database_url=url, admin_token=None, reload_interval_s=0))
    with TestClient(app) as c:
        yield url, ids, c


def _cards(html: str) -> dict[str, tuple[str, str]]:
    """Summary cards by slug: (title, meta line) with tags and runs of spaces removed."""
    out = {}
    for m in re.finditer(
        r'<section class="card shape" data-slug="([^"]+)">\s*<h2>(.*?)</h2>\s*<div class="meta">(.*?)</div>', html, re.S
    ):
        out[m.group(1)] = tuple(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", g)).strip() for g in m.group(2, 3))
    return out


def _section(html: str, slug: str) -> str:
    i = html.index(f'data-slug="{slug}"')
    return html[i : html.index("</section>", i)]


def test_each_family_has_its_own_card_and_page(families):
    url, ids, c = families
    # the buckets of each family: fill_store's (a bf16 q_len-1 key has its classes right after the page size) and
    # the FP8 ones this module stored
    with store.session_scope(url) as s:
        keys = [b.key for b in store.list_buckets(s)]
    want = {
        SLUG: [k for k in keys if k.startswith(SLUG + ".b")],
        Q4: [_fp8_key(*b) for b in FP8_BUCKETS if b[0] == 4],
        Q2: [_fp8_key(*b) for b in FP8_BUCKETS if b[0] == 2],
    }
    assert len(want[SLUG]) == len(FAMILIES) * len(BATCH_SIZES) + 1  # its simulated-only bucket included
    assert set(want[Q4] + want[Q2]) == set(ids) and set(ids) <= set(keys)

    html = c.get("/").text
    cards = _cards(html)
    assert set(want) <= set(cards)
    for slug, ks in want.items():
        title, meta = cards[slug]
        # every bucket of these three families has a published policy
        assert f"{len(ks)} published of {len(ks)} buckets" in meta, (slug, meta)
    # titles name the KV dtype and q_len when not the defaults, and only then
    assert cards[Q4][0] == "Qwen3-30B-A3B (H_q 32) · NVIDIA H200 · KV fp8 · q_len 4"
    assert cards[Q2][0] == "Qwen3-30B-A3B (H_q 32) · NVIDIA H200 · KV fp8 · q_len 2"
    assert cards[SLUG][0] == "Qwen3-30B-A3B (H_q 32) · NVIDIA H200"
    assert "bfloat16 · page 16 · KV fp8 · q_len 4 ·" in cards[Q4][1] and "KV" not in cards[SLUG][1]
    # the shipped peer timings are of the bf16 q_len-1 family: its headline only, never under an fp8 card
    assert "On 98 held-out reference batches" in _section(html, SLUG)
    for slug in (Q4, Q2):
        sec = _section(html, slug)
        assert "held-out reference batches" not in sec and "not measured" in sec, slug

    for slug, ks in want.items():
        r = c.get(f"/shapes/{slug}?per_page=200")
        assert r.status_code == 200, slug
        assert sorted(re.findall(r'<tr class="bucket-row" data-key="([^"]+)"', r.text)) == sorted(ks), slug
        assert f"· {len(ks)} buckets ·" in re.sub(r"\s+", " ", r.text), slug
        title = re.search(r"<title>(.*?)</title>", r.text).group(1)
        assert title.startswith(cards[slug][0]), (title, cards[slug][0])


def _served(c, lens, **family):
    api = c.post("/v1/plan", json=dict(SHAPE, kv_lens=list(map(int, lens)), **family))
    assert api.status_code == 200, api.text
    return api.json()


def _viewer(c, slug, lens):
    body = "shape=" + slug + "&kv_lens=" + "%2C".join(map(str, lens))
    r = c.post("/plan", content=body, headers={"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 200 and r.text.count('<svg class="gantt"') == 3, r.text[-2000:]
    return r.text


def test_fp8_batch_served_by_its_family_shown_served_on_the_map_and_in_the_viewer(families):
    _, ids, c = families
    # uniform, B 128, T 2^19: no bucket of its own; the q_len-4 FP8 family's buckets are one class step away in B and
    # in tokens, with the same lengths (4,096): POST /v1/plan serves it one of their policies
    lens = family_kv_lens("uniform", 128, 2**19)
    api = _served(c, lens, kv_dtype=FP8, q_len=4)
    assert api["policy"]["source"] == "simulated" and api["policy"]["id"] in ids.values()
    dist = api["bucket"]["distance"]
    assert api["bucket"]["matched"].startswith(Q4 + ".")
    # the same batch of 16-bit K/V, or at q_len 2: another family, which has no bucket near it
    assert _served(c, lens)["policy"]["source"] != "simulated"
    page = c.get(f"/shapes/{Q4}").text
    box = page[page.index('<div class="covbox" data-family="uniform">') :]
    box = box[: box.index("</svg>")]
    cell = re.search(r'<rect class="cov" data-kind="(\w+)" data-b="7" data-t="19"[^>]*><title>([^<]*)</title>', box)
    assert cell is not None and cell.group(1) == "near", box
    assert f"served simulated by a neighbour at distance {dist:.2f}" in cell.group(2)
    # the viewer: the served plan is the policy /v1/plan answers with (the model's H_q 32, as that request), its
    # splits the same
    html = _viewer(c, Q4, lens)
    row = html[html.index('<tr class="plan-row" data-kind="served"') :]
    row = row[: row.index("</tr>")]
    assert f"policy #{api['policy']['id']} (balanced, simulated), bucket distance {dist:.2f}" in row, row
    got = [int(x) for x in row[row.index('data-num-splits="') + 17 :].split('"')[0].split(",")]
    assert got == api["num_splits"]
    # the viewer's shape list names the family
    assert re.search(rf'<option value="{re.escape(Q4)}" selected>[^<]*· KV fp8 · q_len 4 \({re.escape(Q4)}\)', html)
    # the family page links the viewer with its family chosen
    link = re.search(r'<a class="viewer-link" href="([^"]+)"', page).group(1)
    assert link == f"/plan?shape={Q4}"
    html = c.get(link).text
    assert re.search(rf'<option value="{re.escape(Q4)}" selected>', html)
    assert f'<input type="hidden" name="shape" value="{Q4}">' in html  # the trace form keeps it


def test_viewer_read_floor_counts_fp8_bytes(families):
    _, _, c = families
    lens = family_kv_lens("skewed80", 64, 2**18)
    floors = {}
    for slug in (SLUG, Q4):
        html = _viewer(c, slug, lens)
        floors[slug] = float(re.search(r'data-floor-us="([0-9.]+)"', html).group(1))
    # sum(kv_len) * H_kv * head_dim * (K and V) * bytes per element / read bandwidth (fill_store: 4,500 GB/s measured,
    # no calibration stored)
    tokens = int(lens.sum())
    for slug, elt in ((SLUG, 2), (Q4, 1)):
        assert floors[slug] == pytest.approx(tokens * 4 * 128 * 2 * elt / (READ_BW * 1e9) * 1e6, rel=1e-6), slug
    assert floors[Q4] == pytest.approx(floors[SLUG] / 2, rel=1e-6)


def test_traffic_table_counts_each_family_apart(families):
    _, _, c = families
    traffic = c.app.state.traffic
    traffic.flush()

    def rows():
        html = c.get("/").text
        out = {}
        for m in re.finditer(r'<tr class="traffic-row[^"]*" data-family="([^"]+)">(.*?)</tr>', html, re.S):
            req = int(re.search(r'class="num requests">([0-9,]+)<', m.group(2)).group(1).replace(",", ""))
            pub = re.search(r"(\d+) published", m.group(2))
            out[m.group(1)] = (req, int(pub.group(1)) if pub else 0, re.sub(r"<[^>]+>", "", m.group(2)))
        return out

    before = rows()
    lens = family_kv_lens("uniform", 64, 2**18)
    sent = {SLUG: 1, Q4: 3, Q2: 2}
    for _ in range(sent[Q4]):
        _served(c, lens, kv_dtype=FP8, q_len=4)
    for _ in range(sent[Q2]):
        _served(c, lens, kv_dtype="fp8", q_len=2)
    _served(c, lens)
    traffic.flush()
    after = rows()
    published = {SLUG: len(FAMILIES) * len(BATCH_SIZES) + 1, Q4: 2, Q2: 1}
    for slug, n in sent.items():
        assert after[slug][0] - before.get(slug, (0,))[0] == n, slug
        assert after[slug][1] == published[slug], slug
    assert (
        "· KV fp8 · q_len 4" in after[Q4][2] and "· KV fp8 · q_len 2" in after[Q2][2] and "KV fp8" not in after[SLUG][2]
    )


def test_peer_evidence_is_of_its_family(tmp_path):
    """A bench/peers.py CSV timed with an FP8 cache at q_len 4 (its JSON says so, as peers.py writes it) is evidence
    of that family only; the shipped timings (JSONs without the fields: bf16 K/V at q_len 1) of the bf16 one only."""
    shape = {"num_qo_heads": 32, "num_kv_heads": 4, "head_dim": 128, "dtype": "bfloat16", "page_size": 16}
    meta = {"gpu": GPU, "cases": "reference", "shape": shape, "kv_dtype": "torch.float8_e4m3fn", "q_len": 4}
    write_peer_csv(tmp_path / "a.csv", "kvsplit", [["T262144/fp8/q4", "uniform", 1, 262_144, 10.0, 1.1]], meta)
    doc = import_peer_csvs([tmp_path / "a.csv"], measured="2026-12-05")
    (e,) = doc["sets"]
    assert (e["kv_dtype"], e["q_len"]) == (FP8, 4)
    kw = dict(num_kv_heads=4, head_dim=128, dtype="bfloat16", page_size=16, entries=doc["sets"])
    ev = shape_evidence(GPU, kv_dtype=FP8, q_len=4, **kw)
    assert ev is not None and ev["entries"] == [e]
    # the shape page charts it like the bf16 sets (bench/peers.py tags an FP8 / q_len > 1 set's name)
    (chart,) = _family_charts({"families": {}}, ev)
    assert (chart["family"], chart["kind"]) == ("uniform", "held-out") and "uniform, T = 262,144" in chart["svg"]
    assert shape_evidence(GPU, **kw) is None and shape_evidence(GPU, kv_dtype=FP8, q_len=2, **kw) is None
    shipped = dict(num_kv_heads=4, head_dim=128, dtype="bfloat16", page_size=16)
    assert shape_evidence(GPU, **shipped) is not None
    assert shape_evidence(GPU, **shipped, kv_dtype="bfloat16") is not None
    assert shape_evidence(GPU, **shipped, kv_dtype=FP8, q_len=4) is None


def test_shipped_bf16_card_keeps_its_headline_beside_an_fp8_family(tmp_path):
    """The store ``make run`` imports (the shipped H200 policies, bf16 q_len 1) plus a published FP8 q_len-4 policy of
    the same shape: the bf16 card keeps the shipped table's measured headline, its policies still are the shipped
    ones, and the FP8 bucket is on its own card, without that headline."""
    url = f"sqlite:///{tmp_path / 'k.db'}"
    store.upgrade(url)
    main_job._import_shipped(url)
    key = _fp8_key(4, 64, 2**18)
    with store.session_scope(url, write=True) as s:
        n_shipped = sum(1 for b in store.list_buckets(s) if b.key.startswith(SLUG + ".b"))
        b = store.get_or_create_bucket(
            s, key=key, gpu=GPU, num_kv_heads=4, head_dim=128, dtype="bfloat16", page_size=16, source="campaign"
        )
        pol = store.create_policy(s, bucket_id=b.id, params={"ctas_per_sm": 3.0}, backend="sim", score=1.1)
        store.publish(s, pol.id)
    app = create_app(Settings(database_url=url, admin_token=None, reload_interval_s=0))
    with TestClient(app) as c:
        html = c.get("/").text
    cards = _cards(html)
    main = _section(html, SLUG)
    assert "On 98 held-out reference batches" in main and "served-differs" not in main
    assert f"{n_shipped} published of {n_shipped} buckets" in cards[SLUG][1] and key not in main
    fp8 = _section(html, Q4)
    assert "1 published of 1 buckets" in cards[Q4][1] and "held-out reference batches" not in fp8


def test_viewer_of_a_verify_step_family_refuses_short_kv_lens_and_raises_trace_batches(families):
    """At q_len 4 the viewer, as /v1/plan, refuses a kv_len below 4 naming the entry (a 400 with the planner's
    message, no trace); a trace batch's shorter requests are raised to q_len 4 (as the tuner's batches are)."""
    from kvsplit.service.dashboard.viewer import trace_batch, trace_choices

    _, _, c = families
    body = "shape=" + Q4 + "&kv_lens=4096%2C3%2C9000"
    r = c.post("/plan", content=body, headers={"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 400 and "kv_lens[1]: 3 tokens, fewer than q_len=4" in r.text
    assert "Traceback" not in r.text
    name, B = next((n, b) for n, b in trace_choices() if min(trace_batch(n, b)) < 4)
    r = c.post(
        "/plan",
        content=f"shape={Q4}&trace={name}%3A{B}",
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    assert r.status_code == 200 and r.text.count('<svg class="gantt"') == 3, r.text[-2000:]
    want = [max(n, 4) for n in trace_batch(name, B)]
    assert f"{', '.join(map(str, want))}" in r.text


def test_policy_table_entries_name_their_family_and_filter_by_it(families):
    """GET /v1/policies: each entry carries its bucket family's kv_dtype and q_len (read from its key), the list
    filters by them (fp8 or its name), and a bad filter value is a 422 naming it."""
    from kvsplit.kernels.buckets import BucketKey

    _, ids, c = families
    everything = c.get("/v1/policies").json()["data"]
    for e in everything:
        fam = BucketKey.parse(e["bucket"]).family
        assert (e["kv_dtype"], e["q_len"]) == (fam[5], fam[6])
    fp8_q4 = [e for e in everything if e["bucket"].startswith(Q4 + ".")]
    assert fp8_q4 and all(e["kv_dtype"] == FP8 and e["q_len"] == 4 for e in fp8_q4)
    for kd in ("fp8", FP8):
        got = c.get("/v1/policies", params={"kv_dtype": kd, "q_len": 4}).json()
        assert [e["id"] for e in got["data"]] == [e["id"] for e in fp8_q4] and got["count"] == len(fp8_q4)
    plain = c.get("/v1/policies", params={"kv_dtype": "bfloat16", "q_len": 1}).json()["data"]
    assert plain and all(".kvfp8" not in e["bucket"] and ".q" not in e["bucket"].split(".p16")[1] for e in plain)
    assert len(plain) + len(fp8_q4) + len(c.get("/v1/policies", params={"q_len": 2}).json()["data"]) == len(everything)
    # the aliases POST /v1/plan takes filter alike
    alias = c.get("/v1/policies", params={"dtype": "bf16", "kv_dtype": "bf16", "q_len": 1}).json()["data"]
    assert [e["id"] for e in alias] == [e["id"] for e in plain]
    for q, field in (({"q_len": 99}, "q_len"), ({"kv_dtype": "int4"}, "kv_dtype"), ({"dtype": "fp8"}, "dtype")):
        r = c.get("/v1/policies", params=q)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", field]


def test_bucket_list_names_each_bucket_family_and_filters_by_it(families):
    """GET /v1/buckets: each bucket carries its family's kv_dtype and q_len and the list filters by them."""
    _, _, c = families
    allb = c.get("/v1/buckets").json()["data"]
    q4 = c.get("/v1/buckets", params={"kv_dtype": "fp8", "q_len": 4}).json()["data"]
    assert q4 and {b["key"] for b in q4} == {b["key"] for b in allb if b["key"].startswith(Q4 + ".")}
    assert all((b["kv_dtype"], b["q_len"]) == (FP8, 4) for b in q4)
    plain = c.get("/v1/buckets", params={"q_len": 1}).json()["data"]
    assert plain and all((b["kv_dtype"], b["q_len"]) == ("bfloat16", 1) and ".kvfp8" not in b["key"] for b in plain)
    assert c.get("/v1/buckets", params={"q_len": 0}).status_code == 422


def test_a_cell_of_draft_buckets_shows_what_is_served_there(tmp_path):
    """A coverage cell whose only buckets are drafts (no published policy) is drawn as what POST /v1/plan serves
    its batch: a neighbour or a fallback hole, the tooltip naming the drafts; so the summary's tuned + neighbour +
    fallback cells add up to all cells."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    _fill_with_fp8_families(url)
    drafts = {(11, 21): 2**11, (7, 19): 2**7}  # far from every published bucket / next to the fp8 ones
    with store.session_scope(url, write=True) as s:
        for (_bc, tc), B in drafts.items():
            b = _fp8_bucket(s, 4, B, 2**tc)
            store.create_policy(s, bucket_id=b.id, params={"ctas_per_sm": 2.0}, backend="sim", name="balanced")
    app = create_app(Settings(database_url=url, admin_token=None, reload_interval_s=0))
    with TestClient(app) as c:
        page = c.get(f"/shapes/{Q4}").text
        box = page[page.index('<div class="covbox" data-family="uniform">') :]
        box = box[: box.index("</svg>")]
        kinds = set()
        for (bc, tc), B in drafts.items():
            cell = re.search(
                rf'<rect class="cov" data-kind="(\w+)" data-b="{bc}" data-t="{tc}"[^>]*><title>([^<]*)</title>', box
            )
            assert cell is not None, (bc, tc)
            api = _served(c, family_kv_lens("uniform", B, 2**tc), kv_dtype=FP8, q_len=4)
            want = "hole" if api["policy"]["source"] == "fallback" else "near"
            assert cell.group(1) == want and "1 draft bucket(s) here, not served" in cell.group(2), cell.group(0)
            kinds.add(want)
        assert kinds == {"hole", "near"}
        summary = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", c.get("/").text))
        sentences = re.findall(
            r"(\d+) of (\d+) cells have a tuned bucket, (\d+) are served by a neighbouring "
            r"bucket, and (\d+) \(",
            summary,
        )
        assert sentences and all(int(t) + int(n) + int(h) == int(a) for t, a, n, h in sentences), sentences
