"""bench/peers.py on the CPU: its case sets, the CSV it writes and the comparison ``--summary`` prints."""

from __future__ import annotations

import importlib.util
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench import peers
from kvsplit.tuner import workloads as w

ROOT = Path(__file__).resolve().parents[2]


def test_reference_cases_are_the_98_of_the_peer_grid():
    cases = peers.build_cases("reference")
    assert len(cases) == 98
    for T in w.REFERENCE_TOTALS:
        mine = [c for c in cases if c["set"] == f"T{T}"]
        assert [(c["family"], c["B"]) for c in mine] == w.peer_reference_cases(T)
        for c in mine:
            assert c["total_tokens"] == T and int(c["kv_lens"].sum()) == T and len(c["kv_lens"]) == c["B"]
    # heavy requests first: skewed80's first request holds 80 % of T
    c = next(c for c in cases if c["set"] == "T262144" and c["family"] == "skewed80" and c["B"] == 64)
    assert c["kv_lens"][0] == (8 * 262_144) // 10


def test_trace_cases_and_bad_kind():
    cases = peers.build_cases("traces")
    ref = w.trace_cases()
    assert [(c["family"], c["B"], c["total_tokens"]) for c in cases] == [(c["family"], c["B"], c["T"]) for c in ref]
    assert all(np.array_equal(a["kv_lens"], b["kv_lens"]) for a, b in zip(cases, ref, strict=True))
    with pytest.raises(ValueError, match="--cases"):
        peers.build_cases("ref")


def _rows(impl, times, ratio_per_us=0.01):
    """Rows of one implementation: times[(family, B)] in us at T = 1000 (set T1000)."""
    return [
        {
            "implementation": impl,
            "set": "T1000",
            "family": f,
            "B": B,
            "total_tokens": 1000,
            "time_us": t,
            "ratio_to_read_floor": t * ratio_per_us,
        }
        for (f, B), t in times.items()
    ]


def test_csv_round_trip_and_summary_by_hand(tmp_path):
    base = {
        ("uniform", 4): 100.0,
        ("skewed80", 4): 110.0,
        ("2x40", 4): 105.0,
        ("uniform", 8): 120.0,
        ("skewed80", 8): 120.0,
    }
    peer = {
        ("uniform", 4): 150.0,
        ("skewed80", 4): 440.0,
        ("2x40", 4): 105.0,
        ("uniform", 8): 60.0,
        ("skewed80", 8): 600.0,
        ("uniform", 16): 10.0,
    }  # uniform B=16: no baseline figure
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    peers.write_csv(a, _rows("kvsplit", base))
    peers.write_csv(b, _rows("peer", peer))
    assert a.read_text().splitlines()[0] == ",".join(peers.COLUMNS)
    rows = peers.read_csvs([a, b])
    assert len(rows) == 11 and rows[0] == {
        "implementation": "kvsplit",
        "set": "T1000",
        "family": "uniform",
        "B": 4,
        "total_tokens": 1000,
        "time_us": 100.0,
        "ratio_to_read_floor": 1.0,
    }
    s = peers.summary(rows)
    assert s["baseline"] == "kvsplit"
    worst, gm, n = s["per_set"]["kvsplit"]["T1000"]
    assert (worst, n) == (1.2, 5) and gm == pytest.approx((1.0 * 1.1 * 1.05 * 1.2 * 1.2) ** 0.2)
    assert s["per_set"]["peer"]["T1000"][0] == 6.0 and s["per_set"]["peer"]["T1000"][2] == 6
    # cliff: max over B of (skewed80 | 2x40) / uniform at the same B
    assert s["cliff"]["kvsplit"]["T1000"] == pytest.approx(1.1)
    assert s["cliff"]["peer"]["T1000"] == pytest.approx(10.0)  # 600 / 60 at B = 8
    # per case peer / kvsplit over the 5 shared cases
    want = [1.5, 4.0, 1.0, 0.5, 5.0]
    lo, g, hi, n = s["vs_baseline"]["peer"]["T1000"]
    assert (lo, hi, n) == (0.5, 5.0, 5) and g == pytest.approx(math.prod(want) ** 0.2)
    assert s["per_case"][("T1000", "skewed80", 4, 1000)] == {"peer": 4.0}
    assert ("T1000", "uniform", 16, 1000) not in s["per_case"]
    text = peers.format_summary(s)
    assert "| kvsplit | 1.200 / " in text and "| T1000 | skewed80 | 8 | 5.000 |" in text
    # another baseline, and a baseline that is not there
    assert peers.summary(rows, "peer")["vs_baseline"]["kvsplit"]["T1000"][2] == 2.0  # 120 / 60
    with pytest.raises(ValueError, match="--baseline"):
        peers.summary(rows, "fa3")


def test_summary_of_the_recorded_h200_format(tmp_path):
    """A CSV in the recorded H200 peer format (long implementation names) reads; the baseline is the kvsplit one."""
    p = tmp_path / "h200.csv"
    p.write_text(
        "implementation,set,family,B,total_tokens,time_us,ratio_to_read_floor\n"
        '"kvsplit_served (shipped table, hot path)",T262144,uniform,1,262144,141.41,1.1677\n'
        "fa3_flash_attn_with_kvcache_num_splits0,T262144,uniform,1,262144,150.00,1.2386\n"
    )
    s = peers.summary(peers.read_csvs([p]))
    assert s["baseline"] == "kvsplit_served (shipped table, hot path)"
    assert s["vs_baseline"]["fa3_flash_attn_with_kvcache_num_splits0"]["T262144"][1] == pytest.approx(150 / 141.41)


def test_bad_csv_names_file_and_line(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_text("implementation,set,family,B,total_tokens,time_us\n")
    with pytest.raises(ValueError, match="missing columns.*ratio_to_read_floor"):
        peers.read_csvs([p])
    p.write_text(",".join(peers.COLUMNS) + "\nkvsplit,T1,uniform,four,1,1.0,1.0\n")
    with pytest.raises(ValueError, match="bad.csv, line 2"):
        peers.read_csvs([p])
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench/peers.py"), "--summary", str(p)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 2 and "bad.csv, line 2" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.skipif(importlib.util.find_spec("flash_attn_interface") is not None, reason="FA3 is installed here")
def test_missing_peer_prints_why_and_writes_nothing(tmp_path):
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench/peers.py"), "--impl", "fa3", "--out", str(tmp_path / "fa3.csv")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0 and "fa3: not importable here" in out.stdout and "no figure" in out.stdout
    assert not (tmp_path / "fa3.csv").exists()


def test_verify_step_ratio_and_option_tags(tmp_path):
    """``--q-len``/``--kv-dtype`` tag the set; ``--summary`` of a q_len = 1 and a q_len = 4 CSV of one
    implementation gives time(q_len = 4) / time(q_len = 1) per case (only where both were timed)."""
    assert peers.set_tag() == "" and peers.set_tag("fp8") == "/fp8" and peers.set_tag("fp8", 4) == "/fp8/q4"
    one = _rows("kvsplit", {("uniform", 4): 100.0, ("skewed80", 4): 200.0})
    four = [
        {**r, "set": r["set"] + "/q4"}
        for r in _rows("kvsplit", {("uniform", 4): 130.0, ("skewed80", 4): 300.0, ("uniform", 8): 9.0})
    ]
    a, b = tmp_path / "q1.csv", tmp_path / "q4.csv"
    peers.write_csv(a, one)
    peers.write_csv(b, four)
    s = peers.summary(peers.read_csvs([a, b]))
    assert s["verify"]["kvsplit"] == {
        ("T1000/q4", "uniform", 4, 1000): pytest.approx(1.3),
        ("T1000/q4", "skewed80", 4, 1000): pytest.approx(1.5),
    }
    text = peers.format_summary(s)
    assert "| kvsplit | T1000/q4 | skewed80 | 4 | 1.500 |" in text
    assert f"| kvsplit | all | geomean / max | 2 | {math.sqrt(1.3 * 1.5):.3f} / 1.500 |" in text
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench/peers.py"), "--impl", "flashinfer_decode", "--q-len", "4"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0 and "not run at --q-len 4" in out.stdout and "no figure" in out.stdout
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench/peers.py"), "--impl", "kvsplit", "--q-len", "9"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and "--q-len: expected 1 to 8" in out.stderr


def test_impls_runs_each_implementation_in_its_own_process(tmp_path):
    """``--impls`` runs ``--impl`` once per implementation in a process of its own (here, with no GPU: kvsplit says
    it needs one and fails, FA3 is not importable and records nothing), adds kvsplit at q_len 1 for a q_len > 1 run,
    names the failed runs and exits 1; ``all`` is every implementation that takes the q_len; bad lists are refused."""
    assert peers.applicable_impls(1) == [
        "kvsplit",
        "kvsplit_balanced",
        "flashinfer_decode",
        "flashinfer_batch_attention",
        "fa3",
    ]
    assert peers.applicable_impls(4) == [
        "kvsplit",
        "kvsplit_balanced",
        "flashinfer_prefill",
        "flashinfer_batch_attention",
        "fa3",
    ]
    cmd = [sys.executable, str(ROOT / "bench/peers.py"), "--impls", "kvsplit,fa3", "--q-len", "4"]
    out = subprocess.run([*cmd, "--out-dir", str(tmp_path)], capture_output=True, text=True, timeout=300)
    heads = [ln for ln in out.stdout.splitlines() if ln.startswith("== ")]
    assert heads == [
        "== kvsplit (--kv-dtype bfloat16 --q-len 4), its own process",
        "== fa3 (--kv-dtype bfloat16 --q-len 4), its own process",
        "== kvsplit (--kv-dtype bfloat16 --q-len 1), its own process",
    ], out.stdout
    if importlib.util.find_spec("flash_attn_interface") is None:
        assert "fa3: not importable here" in out.stdout
    assert out.returncode == 1 and "failed: kvsplit, kvsplit (q_len 1)" in out.stderr, out.stderr
    assert "no CSV was written" in out.stdout and not list(tmp_path.glob("*.csv"))
    # all: the implementations that do not take the q_len are named, not dropped in silence
    res = subprocess.run(
        [*cmd[:2], "--impls", "all", "--q-len", "4", "--out-dir", str(tmp_path), "--impl-timeout", "120"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert "flashinfer_decode: not run at --q-len 4 (FlashInfer's decode wrapper takes one query token" in res.stdout
    for bad, needle in (("kvsplit,nope", "--impls: expected 'all' or"), ("", "--impls: expected 'all' or")):
        res = subprocess.run(cmd[:2] + ["--impls", bad], capture_output=True, text=True, timeout=120)
        assert res.returncode == 2 and needle in res.stderr and "Traceback" not in res.stderr
    res = subprocess.run([*cmd, "--impl", "fa3"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "--impls: give --impl or --impls, not both" in res.stderr


def test_impls_sweeps_kv_dtypes_and_q_lens_in_one_command(tmp_path):
    """``--impls`` with lists of ``--kv-dtype`` and ``--q-len`` runs every setting, each implementation in its own
    process, kvsplit's q_len-1 run of each KV dtype once (it is the verify-step ratio's denominator of both q_len 1
    and 4), and names each failed run with its setting; ``--impl`` takes one value of each."""
    cmd = [sys.executable, str(ROOT / "bench/peers.py")]
    out = subprocess.run(
        [*cmd, "--impls", "kvsplit", "--kv-dtype", "bfloat16,fp8", "--q-len", "1,4", "--out-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    heads = [ln for ln in out.stdout.splitlines() if ln.startswith("== ")]
    assert heads == [
        "== kvsplit (--kv-dtype bfloat16 --q-len 1), its own process",
        "== kvsplit (--kv-dtype bfloat16 --q-len 4), its own process",
        "== kvsplit (--kv-dtype fp8 --q-len 1), its own process",
        "== kvsplit (--kv-dtype fp8 --q-len 4), its own process",
    ], out.stdout
    # no GPU here: each kvsplit process fails, and each failure names its setting
    want = "failed: kvsplit (bfloat16, q_len 1), kvsplit (bfloat16, q_len 4), kvsplit (fp8, q_len 1), kvsplit (fp8, q_len 4)"
    assert out.returncode == 1 and want in out.stderr, out.stderr
    for args, needle in (
        (["--impl", "kvsplit", "--q-len", "1,4"], "--kv-dtype, --q-len: one value each with --impl"),
        (["--impls", "kvsplit", "--q-len", "2,x"], "--q-len: expected 1 to 8 query tokens per request"),
        (["--impls", "kvsplit", "--q-len", "9"], "--q-len: expected 1 to 8 query tokens per request"),
        (["--impls", "kvsplit", "--kv-dtype", "fp8,int8"], "--kv-dtype: expected bfloat16, fp8 or float8_e4m3fn"),
    ):
        res = subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=120)
        assert res.returncode == 2 and needle in res.stderr and "Traceback" not in res.stderr, res.stderr
