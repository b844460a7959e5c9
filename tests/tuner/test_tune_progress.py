"""What ``kvsplit tune`` prints while it works when stderr is not a terminal (a log, a pipe): plain progress lines,
not a hidden progress bar; and what a campaign says when its pool step alone spends the budget."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from kvsplit.tuner.campaign import _LineBar

CLI = [sys.executable, "-m", "kvsplit.service.cli"]


def _run(args, timeout=300):
    env = {k: v for k, v in os.environ.items() if k != "KVSPLIT_DATABASE_URL"}
    return subprocess.run(CLI + args, capture_output=True, text=True, timeout=timeout, env=env)


def test_line_bar_prints_each_step_start_then_at_most_one_line_per_interval():
    now = [100.0]
    said = []
    bar = _LineBar("sim campaign", said.append, interval_s=10.0, clock=lambda: now[0])
    bar.start_overall(300.0, 12.0)
    bar.phase("pool", 118, 40)
    assert said == ["sim campaign: pool 40/118; GPU budget 12/300 s"]
    for _ in range(5):  # within the interval: silent
        now[0] += 1.0
        bar.step()
        bar.advance_overall(2.5)
    assert len(said) == 1
    now[0] += 5.0
    bar.step()  # 10 s after the last line
    assert said[-1] == "sim campaign: pool 46/118; GPU budget 24/300 s"
    bar.phase("search", 118, 0)  # a new step prints at once
    now[0] += 10.0
    bar.bucket("family:uniform:B8:T262144", 15, 9)
    assert said[-2:] == [
        "sim campaign: search 0/118; GPU budget 24/300 s",
        "sim campaign: search 0/118; GPU budget 24/300 s; family:uniform:B8:T262144 trials 9/15",
    ]
    # once the campaign projects to end below its budget, the lines say so beside the budget
    bar.retotal(180.4)
    bar.phase("verify", 118, 3)
    assert said[-1] == "sim campaign: verify 3/118; GPU time 24 s of about 180 s (budget 300 s)"
    bar.retotal(300.0)
    bar.phase("verify", 118, 4)
    assert said[-1] == "sim campaign: verify 4/118; GPU budget 24/300 s"
    bar.advance_overall(290.0)  # past the budget (a pool step that needs more than it): said as such
    bar.phase("verify", 118, 5)
    assert said[-1] == "sim campaign: verify 5/118; GPU time 314 s, over the 300 s budget"
    bar.close()


@pytest.mark.slow
def test_piped_campaign_prints_plain_progress_and_says_when_the_pool_step_spends_the_budget(tmp_path):
    # ten buckets x 19 pool plans x 60 ms of modelled GPU time = 11.4 s: a 6 s budget is spent by the pool step
    url = f"sqlite:///{tmp_path}/c.db"
    r = _run(
        ["tune", "--campaign", "--backend", "sim", "--gpu", "h100", "--model-shape", "qwen3-30b-a3b"]
        + ["--budget-minutes", "0.1", "--batch-sizes", "4,64", "--totals", "262144", "--traces", "none"]
        + ["--trials", "3", "--seed", "3", "--database-url", url]
    )
    assert r.returncode == 0, r.stderr
    err = r.stderr.splitlines()
    steps = [x for x in err if x.startswith("sim campaign: ")]
    starts = [s.split()[2] for s in steps if s.split()[3].startswith("0/")]  # each step's first line
    assert starts == ["pool", "search", "whole-wave", "verify"], r.stderr
    assert all(
        re.fullmatch(
            r"sim campaign: [a-z-]+ \d+/\d+; (GPU budget \d+/6 s|GPU time \d+ s, over the 6 s budget)(; .* trials \d+/\d+)?",
            s,
        )
        for s in steps
    )
    assert any(s.endswith("GPU time 11 s, over the 6 s budget") for s in steps), r.stderr  # the pool step's 11.4 s
    assert any("the pool step alone needs about 0.2 of the 0.1 budget minutes" in x for x in err), r.stderr
    alloc = [x for x in err if x.startswith("pool picks for")]
    assert alloc and "no budget left for new trials: each bucket's study holds the pool step's timings" in alloc[0], (
        r.stderr
    )
    assert not re.search(r"-\d+(\.\d+)? min", r.stderr), r.stderr


@pytest.mark.slow
def test_piped_tune_prints_a_line_per_bucket(tmp_path):
    url = f"sqlite:///{tmp_path}/t.db"
    args = ["tune", "--backend", "sim", "--gpu", "h200", "--num-qo-heads", "32", "--num-kv-heads", "4"]
    args += ["--head-dim", "128", "--dtype", "bf16", "--family", "uniform", "--batch-size", "8"]
    args += ["--total-tokens", "8192", "--trials", "3", "--num-train", "2", "--num-heldout", "2"]
    r = _run(args + ["--database-url", url])
    assert r.returncode == 0, r.stderr
    lines = [x for x in r.stderr.splitlines() if x.startswith("[")]
    assert len(lines) == 1 and re.match(r"\[1/1\] \S+: finished, 3 trials; (not )?published$", lines[0]), r.stderr
    # the summary on stdout gives the same bucket's figures; the progress line does not repeat them
    key = lines[0][len("[1/1] ") :].split(":")[0]
    assert r.stdout.strip().startswith(f"{key}: finished, 3 trials; tuned ") and "floor" not in lines[0], r.stdout
    quiet = _run(args + ["--database-url", f"sqlite:///{tmp_path}/q.db", "--no-progress"])
    assert quiet.returncode == 0 and not [x for x in quiet.stderr.splitlines() if x.startswith("[")], quiet.stderr


@pytest.mark.slow
def test_piped_campaign_projects_its_end_below_the_budget(tmp_path):
    # a budget far above what 3 trials per bucket need: once the search is allocated the lines give the campaign's
    # projected GPU time beside the budget, and the campaign ends near it (modelled GPU time of the simulator)
    url = f"sqlite:///{tmp_path}/p.db"
    r = _run(
        ["tune", "--campaign", "--backend", "sim", "--model-shape", "qwen3-30b-a3b", "--budget-minutes", "5"]
        + ["--batch-sizes", "4,64", "--totals", "262144", "--traces", "none", "--trials", "3", "--seed", "3"]
        + ["--database-url", url, "--json"]
    )
    assert r.returncode == 0, r.stderr
    import json

    spent = json.loads(r.stdout)["spent_s"]
    about = [float(m.group(1)) for m in re.finditer(r"GPU time \d+ s of about (\d+) s \(budget 300 s\)", r.stderr)]
    assert about, r.stderr
    assert 0.5 * about[-1] <= spent <= 1.1 * about[-1] and about[-1] < 300, (spent, about)
    assert "sim campaign: pool 0/10; GPU budget 0/300 s" in r.stderr  # before the search is allocated: the budget


@pytest.mark.parametrize(
    "content,why",
    [(None, "cannot read"), ("{not json", "cannot read"), ('{"cases": []}', "is not a kvsplit.policies export")],
)
def test_campaign_refuses_a_previous_table_that_is_not_an_export_in_one_line(tmp_path, content, why):
    prev = tmp_path / "prev.json"
    if content is not None:
        prev.write_text(content)
    url = f"sqlite:///{tmp_path}/c.db"
    r = _run(
        ["tune", "--campaign", "--backend", "sim", "--gpu", "h100", "--model-shape", "qwen3-30b-a3b"]
        + ["--previous", str(prev), "--budget-minutes", "0.1", "--database-url", url]
    )
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "--previous" in r.stderr and why in r.stderr and str(prev) in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "c.db").exists()  # refused before the store is made


@pytest.mark.slow
def test_a_resumed_campaign_says_what_is_left_of_the_pool_step_and_that_it_is_over_its_budget(tmp_path):
    """A slice that resumes a pool step past the budget says what is left of the step and what was spent, and the
    resume line says the budget is passed (it said "10 of 6 s of the GPU budget spent")."""
    url = f"sqlite:///{tmp_path}/c.db"
    args = ["tune", "--campaign", "--backend", "sim", "--gpu", "h100", "--model-shape", "qwen3-30b-a3b"]
    args += ["--budget-minutes", "0.05", "--batch-sizes", "1,2,4,8,16,32,64,128,256,512", "--totals", "262144"]
    args += ["--traces", "none", "--trials", "3", "--seed", "3", "--database-url", url]
    # slices until one starts within the pool step; a slice that timed nothing gets a longer successor
    minutes, first = 0.015, None
    for _ in range(12):
        r = _run([*args, "--max-minutes", f"{minutes:g}"])
        assert r.returncode in (0, 75), r.stderr
        pool = [tuple(map(int, m.groups())) for m in re.finditer(r"^sim campaign: pool (\d+)/(\d+);", r.stderr, re.M)]
        if pool and 0 < pool[0][0] < pool[0][1]:
            first = pool[0]
            break
        if not pool or pool[-1][0] == 0:
            minutes += 0.01
    assert first is not None, "no slice started within the pool step"
    spent = re.search(r"resuming kvsplit-campaign-sim-\w+: (.*?); finished steps", r.stderr)
    assert spent, r.stderr
    s = int(re.search(r"(\d+)", spent.group(1)).group(1))  # simulated GPU seconds, 60 ms per timed plan
    want = f"GPU time {s} s spent, over the 3 s budget" if s > 3 else f"{s} of 3 s of the GPU budget spent"
    assert spent.group(1) == want, r.stderr
    left = first[1] - first[0]
    assert re.search(
        rf"the pool step's remaining batches need about [\d.]+ more GPU-minutes, after [\d.]+ of the 0.05 "
        rf"budget minutes spent \({left} batches x 19 plans\): the campaign will overrun its budget",
        r.stderr,
    ), r.stderr
    assert "the pool step alone" not in r.stderr
