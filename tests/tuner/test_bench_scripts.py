"""The maintained benchmarks of bench/: each answers --help, and gpu_sweep's case loading on the CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = [
    "bench_planner.py",
    "compile_sm90.py",
    "decode_loop.py",
    "engine_decode.py",
    "gpu_sweep.py",
    "peers.py",
    "pool_check.py",
    "service_bench.py",
    "table_ab.py",
]


def test_every_benchmark_is_listed_and_answers_help():
    listed = (ROOT / "bench/README.md").read_text()
    on_disk = {p.name for p in (ROOT / "bench").glob("*.py")}
    assert on_disk == set(SCRIPTS) | {"service_baseline.py", "service_inprocess.py"}
    for name in on_disk:
        assert f"`{name}`" in listed, name
    for name in SCRIPTS:
        out = subprocess.run(
            [sys.executable, str(ROOT / "bench" / name), "--help"],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=ROOT,
        )
        assert out.returncode == 0 and out.stdout.startswith("usage:"), (name, out.stderr[-2000:])
    out = subprocess.run(
        [sys.executable, "-m", "bench.service_inprocess", "--help"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert out.returncode == 0 and out.stdout.startswith("usage:"), out.stderr[-2000:]


def test_gpu_sweep_cases_carry_the_shipped_tables_plans(tmp_path):
    from bench import gpu_sweep
    from kvsplit.kernels.policy_table import PolicyTable
    from kvsplit.tuner.workloads import evaluation_cases

    raw = json.loads((ROOT / "kernels/data/h200_policies.json").read_text())
    table = PolicyTable.from_export(raw, version=raw["policies_version"])
    # an earlier run's records: the three fastest named plans of a case become its oracle_names
    run = tmp_path / "run.jsonl"
    run.write_text(
        "\n".join(
            json.dumps(r)
            for r in [
                {"kind": "bandwidth", "bytes_per_s": 4.4e12},
                {
                    "kind": "case",
                    "case": 3,
                    "times": {
                        "stream_k|c1|n64w4s3": 3e-4,
                        "balanced|c3|n128w4s2": 1e-4,
                        "stream_k|c2|n64w4s2": 2e-4,
                        "stream_k|c4|n64w4s2": 5e-4,
                        "served": 1e-5,
                        "flashinfer_kernel": 1e-6,
                    },
                },
            ]
        )
        + "\n"
    )
    cases = gpu_sweep.load_cases(
        "eval", prev_policies=str(ROOT / "kernels/data/h200_policies.json"), oracle_from=str(run)
    )
    assert [c["kv_lens"] for c in cases] == [c["kv_lens"] for c in evaluation_cases()]
    for c in cases[::17]:
        p, bucket, info = table.plan(
            np.asarray(c["kv_lens"]),
            gpu="NVIDIA H200",
            num_qo_heads=c["num_qo_heads"],
            num_kv_heads=c["num_kv_heads"],
            head_dim=128,
            dtype="bfloat16",
            page_size=16,
        )
        assert c["served"] == {
            "policy": p.policy,
            "params": p.params,
            "source": info["source"],
            "distance": bucket["distance"],
            "matched": bucket["matched"],
        }
        assert c["served_prev"] == c["served"] and "served_alt" not in c
    assert cases[3]["oracle_names"] == ["balanced|c3|n128w4s2", "stream_k|c2|n64w4s2", "stream_k|c1|n64w4s3"]
    assert "oracle_names" not in cases[4]
    with pytest.raises(FileNotFoundError):
        gpu_sweep.load_cases(str(tmp_path / "missing.json"))


def test_compile_sm90_tile_loop_mix_counts_the_innermost_mma_loop():
    """bench/compile_sm90.py's tile-loop mix on a hand-written SASS listing: two loops end in backward branches,
    the inner one (with the MMAs) is counted, the outer one's extra instructions and the loop-free prologue not."""
    from bench.compile_sm90 import tile_loop_mix

    def ins(addr, text):
        return f"        /*{addr:04x}*/                   {text} ;   /* 0x000000 */"

    sass = "\n".join(
        [
            ins(0x00, "LDS.U8 R0, [R1]"),  # prologue: outside every loop
            ins(0x10, "IMAD.MOV.U32 R2, RZ, RZ, R3"),  # outer loop starts here
            ins(0x20, "LDSM.16.M88.4 R4, [R5]"),  # inner loop starts here
            ins(0x30, "LDS.U8 R6, [R7+0x80]"),
            ins(0x40, "F2FP.F16.E4M3.UNPACK_B R8, R6"),
            ins(0x50, "HMMA.16816.F32 R10, R4, R8, R10"),
            ins(0x60, "PRMT R9, R6, 0x5410, R6"),
            ins(0x70, "LDS.64 R12, [R13]"),
            ins(0x80, "@!P0 BRA 0x20"),  # inner back edge
            ins(0x90, "LDS.U8 R14, [R15]"),
            ins(0xA0, "@P1 BRA 0x10"),  # outer back edge
            ins(0xB0, "EXIT"),
        ]
    )
    assert tile_loop_mix(sass) == {
        "instructions": 7,
        "HMMA": 1,
        "LDS.U8": 1,
        "LDS": 1,
        "LDSM": 1,
        "F2FP.E4M3": 1,
        "PRMT": 1,
        "IMAD.MOV": 0,
    }
    assert tile_loop_mix("\n".join([ins(0x00, "HMMA.16816.F32 R0, R1, R2, R0"), ins(0x10, "EXIT")])) == {}
