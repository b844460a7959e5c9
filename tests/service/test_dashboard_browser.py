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
from pathlib import Path

import pytest

from kvsplit.db import store
from kvsplit.tuner.workloads import family_kv_lens
from tests.service_support import BATCH_SIZES, FAMILIES, GPU, TOTAL, LiveServer, fill_store, key_of

CHROMIUM = os.environ.get("KVSPLIT_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not os.environ.get("KVSPLIT_CHROMIUM") and not Path(CHROMIUM).exists(),
        reason=f"Chromium not found at {CHROMIUM} (apt-get install -y chromium; .ci/run does)",
    ),
]


def _add_verified_bucket(url, fam, B, *, backend, ratios, publish):
    """A bucket of ``fam`` at batch size ``B`` with held-out measurements (2 batches) of ``ratios``
    (policy -> time / floor), verified on ``backend``; its tuned policy published or left a draft."""
    lens = family_kv_lens(fam, B, TOTAL)
    key = key_of(lens)
    with store.session_scope(url, write=True) as s:
        b = store.get_or_create_bucket(
            s,
            key=key,
            gpu=GPU,
            num_kv_heads=4,
            head_dim=128,
            dtype="bfloat16",
            page_size=16,
            source=f"family:{fam} B={B} T={TOTAL}",
            signature={"family": fam},
        )
        run = store.start_run(s, bucket_id=b.id, study_name=f"kvsplit-{backend}-{key}", backend=backend, n_trials=5)
        store.finish_run(s, run.id, status="finished", n_finished=5, best_value=1e-4, best_params={"ctas_per_sm": 2.0})
        pol = store.create_policy(
            s,
            bucket_id=b.id,
            params={"ctas_per_sm": 2.0},
            backend=backend,
            score=1.0,
            verification={"passed": publish},
            tuning_run_id=run.id,
            name="balanced",
        )
        if publish:
            store.publish(s, pol.id)
        floor = TOTAL * 4 * 128 * 2 * 2 / 4.5e12
        for i in range(2):
            for name, r in ratios.items():
                store.record_measurement(
                    s,
                    bucket_id=b.id,
                    policy_name=name,
                    kv_lens=lens.tolist(),
                    time_s=floor * r[i],
                    floor_s=floor,
                    role="heldout",
                    batch_index=i,
                    stage="verify",
                    tuning_run_id=run.id,
                    backend=backend,
                    policy_id=pol.id if name == "tuned" else None,
                )
    return key


def test_dashboard_renders_tables_and_charts(tmp_path):
    playwright = pytest.importorskip("playwright.sync_api")
    info = fill_store(f"sqlite:///{tmp_path}/store.db")
    # a simulator-tuned, published skewed80 bucket at B = 128 (between the GPU-measured 64 and 256)
    sim_ratios = {
        "tuned": (1.21, 1.25),
        "balanced": (1.4, 1.44),
        "fa3": (2.0, 2.1),
        "flashinfer": (3.0, 3.1),
        "no_split": (8.0, 8.2),
    }
    sim_key = _add_verified_bucket(info.url, "skewed80", 128, backend="sim", ratios=sim_ratios, publish=True)
    # a GPU tuning of a uniform bucket at B = 32 that lost to the baselines and was not published
    lost_key = _add_verified_bucket(
        info.url,
        "uniform",
        32,
        backend="gpu",
        publish=False,
        ratios={
            "tuned": (3.0, 3.2),
            "balanced": (1.3, 1.3),
            "fa3": (2.4, 2.4),
            "flashinfer": (3.5, 3.5),
            "no_split": (9.0, 9.0),
        },
    )
    with LiveServer(info.url, cwd=str(tmp_path)) as srv, playwright.sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
                "--disable-dev-shm-usage",
            ],
        )
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
            assert rows.count() == len(FAMILIES) * len(BATCH_SIZES) + 1 + 2
            # cards are titled with the model shape, and explain the bucket key
            titles = cards.locator("h2").all_inner_texts()
            assert titles == ["Qwen3-30B-A3B (H_q 32) · NVIDIA H200", "Llama-3.1-8B (H_q 32) · NVIDIA H200"]
            help_text = cards.first.locator("details.keyhelp").inner_text()
            assert "Reading a bucket key" in help_text
            cards.first.locator("details.keyhelp summary").click()
            help_text = cards.first.locator("details.keyhelp").inner_text()
            assert "batch-size class round(log2 B)" in help_text and "total-token class" in help_text
            assert "bin k" in help_text and "summing to 16" in help_text
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
            # the simulated bucket: its own series (hollow, dashed) beside the GPU measurements, in the legend
            sk = page.locator('.chartbox[data-family="skewed80"]')
            assert sk.locator("circle.pt:not(.simulated)").count() == 5 * len(BATCH_SIZES)
            sim_pts = sk.locator('circle.pt.simulated[data-series="tuned (simulated)"]')
            assert sim_pts.count() == 1 and float(sim_pts.get_attribute("data-x")) == 128
            assert float(sim_pts.get_attribute("data-y")) == pytest.approx((1.21 * 1.25) ** 0.5, rel=1e-5)
            assert sim_pts.evaluate("e => getComputedStyle(e).fill") == "rgb(255, 255, 255)"  # hollow
            assert float(sk.locator('circle.pt[data-series="tuned"]').first.get_attribute("data-x")) != 128
            assert sk.locator("circle.pt.simulated").count() == 5  # tuned + 4 baselines at B = 128
            legend = sk.locator("g.legend text").all_text_contents()
            assert "tuned" in legend and "tuned (simulated)" in legend and "balanced (simulated)" in legend
            assert sk.locator('g.legend[data-kind="simulated"] line').first.get_attribute("stroke-dasharray")
            sim_row = page.locator(f'tr.bucket-row[data-key="{sim_key}"]').locator("td").all_inner_texts()
            assert "simulated" in sim_row[4] and "sim" in sim_row[6]
            # the unpublished bucket: no tuned time, no red speedups, no tuned point in the chart
            lost = page.locator(f'tr.bucket-row[data-key="{lost_key}"]')
            assert "not published" in lost.locator("td.tuned-ratio").inner_text()
            assert lost.locator("td.loss").count() == 0 and "3.1" not in " ".join(lost.locator("td").all_inner_texts())
            uni = page.locator('.chartbox[data-family="uniform"]')
            assert sorted(
                float(x)
                for x in uni.locator('circle.pt[data-series="tuned"]').evaluate_all("es => es.map(e => e.dataset.x)")
            ) == [float(b) for b in BATCH_SIZES]
            assert uni.locator('circle.pt[data-series="balanced"][data-x="32"]').count() == 1
            box = page.locator('.chartbox[data-family="skewed80"] svg.chart').bounding_box()
            assert box is not None and box["width"] > 300 and box["height"] > 150
            # runs table and JSON links
            assert page.locator("tr.run-row").count() == 13 + 2
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
