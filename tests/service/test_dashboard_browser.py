"""The dashboard in a real headless browser (Debian's chromium driven by Playwright).

Starts ``kvsplit serve`` as a subprocess on a temp SQLite store filled through
the store API, loads ``/``, checks the bucket table and that the charts carry
the stored data points, and saves a full-page screenshot (under
``KVSPLIT_TEST_ARTIFACTS`` when set, else the test's tmp dir; also to
docs/dashboard.png with ``KVSPLIT_UPDATE_SCREENSHOT=1``). Chromium's path comes from
``KVSPLIT_CHROMIUM`` (exported by .ci/run: then a missing browser fails the
test), else chromium on PATH; on a machine with neither the test is skipped
with the reason.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: shared helpers
from service_support import BATCH_SIZES, FAMILIES, LiveServer, fill_store  # noqa: E402

CHROMIUM = os.environ.get("KVSPLIT_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not os.environ.get("KVSPLIT_CHROMIUM") and not Path(CHROMIUM).exists(),
                       reason=f"Chromium not found at {CHROMIUM} (apt-get install -y chromium; .ci/run does)"),
]


def test_dashboard_renders_tables_and_charts(tmp_path):
    playwright = pytest.importorskip("playwright.sync_api")
    info = fill_store(f"sqlite:///{tmp_path}/store.db")
    with LiveServer(info.url, cwd=str(tmp_path)) as srv, playwright.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"])
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 1000})
            external = []
            page.on("request", lambda r: external.append(r.url) if not r.url.startswith(srv.url) else None)
            resp = page.goto(srv.url + "/", wait_until="load")
            assert resp is not None and resp.status == 200
            assert external == []  # nothing from a CDN or elsewhere
            assert "kvsplit" in page.title()
            # one shape card for H_kv = 4 (12 tuned + 1 simulated bucket) and one for H_kv = 8 (a draft only)
            cards = page.locator("section.shape")
            assert cards.count() == 2
            rows = page.locator("section.shape").first.locator("tr.bucket-row")
            assert rows.count() == len(FAMILIES) * len(BATCH_SIZES) + 1
            key = next(iter(info.published))
            row = page.locator(f'tr.bucket-row[data-key="{key}"]')
            assert row.count() == 1
            cells = row.locator("td").all_inner_texts()
            assert f"#{info.published[key]}" in cells[4] and "tuned" in cells[4]
            assert "ctas_per_sm=" in cells[5]
            # speedup columns: flashinfer's stored ratio is ~3.5x the floor vs tuned ~1.12x -> about 3.1x or more
            headers = page.locator("section.shape").first.locator("table.buckets th").all_inner_texts()
            fi = next(i for i, h in enumerate(headers) if "flashinfer" in h)
            assert float(cells[fi].rstrip("×")) > 2.9
            # charts: one per family, each with tuned + 4 baselines at 3 batch sizes
            charts = page.locator("section.shape").first.locator("svg.chart")
            assert charts.count() == len(FAMILIES)
            pts = page.locator('.chartbox[data-family="skewed80"] circle.pt[data-series="tuned"]')
            assert pts.count() == len(BATCH_SIZES)
            xs = sorted(float(pts.nth(i).get_attribute("data-x")) for i in range(pts.count()))
            assert xs == [float(b) for b in BATCH_SIZES]
            ys = [float(pts.nth(i).get_attribute("data-y")) for i in range(pts.count())]
            assert all(1.05 < y < 1.2 for y in ys)
            assert page.locator('.chartbox[data-family="skewed80"] circle.pt').count() == 5 * len(BATCH_SIZES)
            box = page.locator('.chartbox[data-family="skewed80"] svg.chart').bounding_box()
            assert box is not None and box["width"] > 300 and box["height"] > 150
            # runs table and JSON links
            assert page.locator("tr.run-row").count() == 13
            assert page.locator('a[href="/v1/policies"]').count() == 1
            out = [Path(os.environ.get("KVSPLIT_TEST_ARTIFACTS") or tmp_path) / "dashboard.png"]
            if os.environ.get("KVSPLIT_UPDATE_SCREENSHOT") == "1":
                out.append(ROOT / "docs" / "dashboard.png")
            if False:
                out.append(Path(os.environ["KVSPLIT_TEST_ARTIFACTS"]) / "dashboard.png")
            for p in out:
                p.parent.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(p), full_page=True)
                assert p.stat().st_size > 20_000
        finally:
            browser.close()
