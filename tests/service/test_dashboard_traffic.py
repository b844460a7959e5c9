"""The recorded traffic on the dashboard: a real ``kvsplit serve`` on a temporary SQLite store with the
shipped H200 policies receives plan requests of an uncovered shape (Llama-3.1-8B attention, page_size 32: no bucket
in the store) and of a covered one (the shipped Qwen3 shape, page_size 16); after the flush, the summary page's
traffic table and the shape pages' coverage maps must show exactly what was sent."""

from __future__ import annotations

import re
import time
import urllib.request

import pytest

from kvsplit.db import store
from kvsplit.service import main_job

from ..service_support import LiveServer
from .test_traffic import Poster, key_of, uniform_batches

QWEN3 = {"gpu": "NVIDIA H200", "num_qo_heads": 32, "num_kv_heads": 4, "head_dim": 128, "dtype": "bfloat16"}
COVERED = dict(QWEN3, page_size=16)
UNCOVERED = {"gpu": "NVIDIA H200", "num_qo_heads": 32, "num_kv_heads": 8, "head_dim": 128, "dtype": "bfloat16"}
UNCOVERED["page_size"] = 32
COVERED_SLUG = "nvidia-h200.kv4.d128.bf16.p16"
UNCOVERED_SLUG = "nvidia-h200.kv8.d128.bf16.p32"


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _row(html: str, slug: str) -> str:
    """The summary's traffic table rows of shape ``slug`` (its figures and, where any, its tune command)."""
    rows = re.findall(rf'<tr class="traffic-[^"]*" data-family="{re.escape(slug)}".*?</tr>', html, re.S)
    assert rows, f"no traffic row of {slug}"
    return "".join(rows)


def _circles(html: str) -> list[tuple[int, int]]:
    """(data-requests, data-fallback) of every ``circle.traffic`` (with or without ``fallback``)."""
    return [
        (int(n), int(f))
        for n, f in re.findall(
            r'<circle class="traffic(?: fallback)?" data-requests="(\d+)" data-fallback="(\d+)"', html
        )
    ]


@pytest.mark.timeout(300)
def test_dashboard_shows_recorded_traffic_of_covered_and_uncovered_shapes(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'k.db'}"
    store.upgrade(url)
    main_job._import_shipped(url)
    monkeypatch.setenv("KVSPLIT_TRAFFIC_FLUSH_INTERVAL_S", "0.2")
    # uncovered: two keys (B 24 and 48, each batch's lengths in one half-octave bin); covered: two keys (B 64, 8)
    unc = uniform_batches(24, 2**13.25, 7, seed=1) + uniform_batches(48, 2**12.25, 4, seed=2)
    cov = uniform_batches(64, 2**12.25, 5, seed=3) + uniform_batches(8, 3000, 3, seed=4)
    unc_keys = {key_of(b, UNCOVERED) for b in unc}
    cov_keys = {key_of(b, COVERED) for b in cov}
    assert len(unc_keys) == 2 and len(cov_keys) == 2
    with store.session_scope(url) as s:  # the premise: no bucket of the uncovered shape is stored
        assert not [b for b in store.list_buckets(s) if b.key.startswith(UNCOVERED_SLUG + ".")]
        assert [b for b in store.list_buckets(s) if b.key.startswith(COVERED_SLUG + ".")]
    with LiveServer(url) as srv:
        c = Poster(srv.port)
        sources = {"unc": [], "cov": []}
        for b in unc:
            st, ans = c.post("/v1/plan", dict(UNCOVERED, kv_lens=b))
            assert st == 200
            sources["unc"].append(ans["policy"]["source"])
        for b in cov:
            st, ans = c.post("/v1/plan", dict(COVERED, kv_lens=b))
            assert st == 200
            sources["cov"].append(ans["policy"]["source"])
        assert sources["unc"] == ["fallback"] * len(unc)
        assert "fallback" not in sources["cov"]
        deadline = time.monotonic() + 30
        while True:  # the flush is asynchronous: wait until the store has every request
            st, doc = c.get("/v1/traffic?hours=1")
            if doc["requests"] >= len(unc) + len(cov) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert doc["requests"] == len(unc) + len(cov), doc
        c.close()

        st, html = _get(srv.port, "/")
        assert st == 200
        # the legend gives the distances the service matched with (kvsplit.service.traffic.FAR_DISTANCE, the serve
        # limit of kvsplit.kernels.policy_table), not a limit it does not name
        assert "from a bucket distance above 1.0 (within it two batches" in html
        assert "a neighbour's policy is served up to 2.5" in html
        row = _row(html, UNCOVERED_SLUG)
        assert re.search(rf'<td class="num requests">{len(unc)}</td>', row), row
        assert "fallback" in row and "no tuned policy" in row
        assert re.search(rf'<td class="num fallback-n">{len(unc)}</td>', row), row
        assert re.search(r'<td class="num share[^"]*">100 %</td>', row), row
        assert "kvsplit tune --from-traffic 2 --traffic-hours 24" in row and "--num-kv-heads 8" in row, row
        assert f'href="/shapes/{UNCOVERED_SLUG}"' in row
        row = _row(html, COVERED_SLUG)
        assert re.search(rf'<td class="num requests">{len(cov)}</td>', row), row
        assert '<td class="num fallback-n">0</td>' in row and '<td class="num share">0 %</td>' in row
        assert "no tuned policy" not in row and "--from-traffic" not in row
        assert f'href="/shapes/{COVERED_SLUG}"' in row

        # the covered shape's page: every request sent is drawn once, none of them fallback
        st, page = _get(srv.port, f"/shapes/{COVERED_SLUG}")
        assert st == 200
        circles = _circles(page)
        assert len(circles) == len(cov_keys) and sum(n for n, _ in circles) == len(cov), circles
        assert all(f == 0 for _, f in circles)
        # the uncovered shape's page exists (traffic, no bucket) and draws its requests as fallback
        st, page = _get(srv.port, f"/shapes/{UNCOVERED_SLUG}")
        assert st == 200, page
        circles = _circles(page)
        assert sorted(circles) == sorted([(7, 7), (4, 4)]), circles
        assert 'class="traffic fallback"' in page and "No bucket of this shape is stored" in page
        # a shape with neither buckets nor traffic still has no page
        st, _ = _get(srv.port, "/shapes/nvidia-h200.kv2.d64.bf16.p16")
        assert st == 404


def test_a_family_whose_fallback_requests_are_all_empty_batches_gets_no_tune_command(tmp_path):
    """All-empty batches (every kv_len 0) read no KV and carry no length signature: the family's row counts them as
    fallback requests, as served, but offers no `kvsplit tune --from-traffic` (which has nothing to tune there) and
    says why; a family with real fallback traffic still gets its command."""
    import numpy as np

    from kvsplit.kernels.buckets import bucket_key
    from kvsplit.service.dashboard import pages
    from kvsplit.service.traffic import current_hour

    url = f"sqlite:///{tmp_path / 'k.db'}"
    store.upgrade(url)
    hour = current_hour()

    def key(lens, h_kv):
        return str(bucket_key(np.asarray(lens), num_kv_heads=h_kv, head_dim=128, dtype="bfloat16", device="h200"))

    empty, real = key([0, 0], 4), key([5000] * 24, 8)
    cells = [
        store.TrafficCell(empty, hour, requests=6, n_fallback=6, batch_min=2, batch_max=2, tokens_min=0, tokens_max=0),
        store.TrafficCell(real, hour, requests=3, n_fallback=3, batch_min=24, batch_max=24),
    ]
    cells[1].tokens_min = cells[1].tokens_max = 120_000
    with store.session_scope(url, write=True) as s:
        store.add_traffic(s, cells)
    rows, _ = pages.traffic_rows(url)
    fams = {f["family"]: f for f in pages.traffic_families(url, rows, [])}
    e = fams[empty.rsplit(".b", 1)[0]]
    assert (e["fallback"], e["share_pct"], e["command"]) == (6, 100.0, None), e
    assert "all-empty batches (every kv_len 0)" in e["note"], e
    r = fams[real.rsplit(".b", 1)[0]]
    assert r["command"].startswith("kvsplit tune --from-traffic 1 ") and "all-empty" not in r["note"], r
