"""The ``kvsplit`` command line's handling of bad input and edge cases.

One ``error:`` line (never a traceback) for a bad store URL or folder; read-only
commands create no empty store; a busy port is named; unknown GPUs and
fallbacks are explained; long batches come from a file or stdin; a second
``tune`` into a bucket with other batch flags is refused; help shows no
``<bool>``/``<str>`` placeholders; ``plan`` output form; dtype aliases.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from kvsplit.db import store
from kvsplit.service.cli import app
from kvsplit.tuner.workloads import family_kv_lens
from tests.service_support import SHAPE_ARGS, TOTAL, fill_store


def _invoke(*args: str, input: str | None = None):
    return CliRunner().invoke(app, list(args), input=input)


def _one_error_line(res) -> str:
    lines = [x for x in res.output.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.output
    assert "Traceback" not in res.output
    return lines[0]


@pytest.fixture(scope="module")
def filled(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('cli') / 'store.db'}"
    info = fill_store(url)
    yield info
    store.dispose_engines()


# --------------------------------------------------------------------------- store URLs and folders


@pytest.mark.parametrize("cmd", [["db", "export"], ["db", "upgrade"], ["db", "import", "FILE"]])
def test_bad_url_is_one_error_line(cmd, tmp_path):
    f = tmp_path / "in.json"
    f.write_text(json.dumps({"format": "kvsplit.policies", "format_version": 1, "policies": []}))
    args = [str(f) if a == "FILE" else a for a in cmd]
    res = _invoke(*args, "--database-url", "postgresql://host:notaport/db")
    line = _one_error_line(res)
    assert res.exit_code == 2 and line.startswith("error: --database-url: ") and "notaport" in line


@pytest.mark.parametrize("cmd", [["db", "export"], ["db", "upgrade"], ["db", "import", "FILE"]])
def test_missing_folder_is_one_error_line(cmd, tmp_path):
    f = tmp_path / "in.json"
    f.write_text(json.dumps({"format": "kvsplit.policies", "format_version": 1, "policies": []}))
    args = [str(f) if a == "FILE" else a for a in cmd]
    res = _invoke(*args, "--database-url", str(tmp_path / "nowhere" / "x.db"))
    line = _one_error_line(res)
    assert res.exit_code in (1, 2) and "nowhere" in line
    assert not (tmp_path / "nowhere").exists()


def test_import_of_a_file_that_cannot_be_read_is_one_error_line(filled, tmp_path):
    for path, why in ((tmp_path / "missing.json", "No such file or directory"), (tmp_path, "Is a directory")):
        res = _invoke("db", "import", str(path), "--database-url", filled.url)
        assert res.exit_code == 2
        assert _one_error_line(res) == f"error: FILE: cannot read {str(path)!r}: {why}"


def test_export_to_missing_folder(filled, tmp_path):
    res = _invoke("db", "export", "--database-url", filled.url, "--output", str(tmp_path / "no" / "out.json"))
    assert res.exit_code == 2
    assert _one_error_line(res) == f"error: --output: folder {str(tmp_path / 'no')!r} does not exist"


def test_read_only_commands_create_no_store(tmp_path):
    path = tmp_path / "missing.db"
    for args in (
        ["db", "export"],
        ["plan", *SHAPE_ARGS, "--kv-lens", "100,200"],
        ["serve", "--port", "0"],
        ["bench", "--trace", "arxiv", "--batch-sizes", "8", "--batches", "1"],
    ):
        res = _invoke(*args, "--database-url", str(path))
        assert res.exit_code == 1, res.output
        line = _one_error_line(res)
        assert line.startswith(f"error: no kvsplit store at sqlite:///{path} (the file {path} does not exist)")
        assert "kvsplit db upgrade" in line and "kvsplit run --no-tune" in line
        assert not path.exists()


def test_gpu_tuning_without_cuda_is_one_error_line_and_stores_nothing(tmp_path):
    # several workers used to print one traceback each and leave failed runs and a journal behind
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")  # CI has none (the refusal is what is tested)
    db, journal = tmp_path / "t.db", tmp_path / "j.log"
    res = _invoke(
        "tune",
        "--backend",
        "gpu",
        "--workers",
        "2",
        "--journal",
        str(journal),
        "--database-url",
        str(db),
        *SHAPE_ARGS,
        "--family",
        "skewed80",
        "--batch-size",
        "64",
        "--trials",
        "2",
    )
    assert res.exit_code == 2, res.output
    assert _one_error_line(res) == (
        "error: --backend: 'gpu' needs a CUDA GPU and torch with CUDA, none here; use --backend sim"
    )
    assert not db.exists() and not journal.exists()


# --------------------------------------------------------------------------- ports


def test_serve_names_a_busy_port(filled):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        res = _invoke("serve", "--database-url", filled.url, "--port", str(port))
    assert res.exit_code == 2
    assert _one_error_line(res) == (
        f"error: --port: 127.0.0.1:{port} is already in use (another kvsplit serve?); choose another --port"
    )


@pytest.mark.slow
def test_run_says_which_port_it_uses_when_busy(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVSPLIT_")}
    env.update(PYTHONUNBUFFERED="1", KVSPLIT_DATABASE_URL=str(tmp_path / "k.db"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        p = subprocess.Popen(
            [sys.executable, "-m", "kvsplit.service.cli", "run", "--no-tune", "--port", str(busy)],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        lines = []
        try:
            deadline = time.time() + 120
            while time.time() < deadline:
                line = p.stdout.readline()
                if not line:
                    break
                lines.append(line)
                if "serving until Ctrl-C" in line:
                    break
        finally:
            p.send_signal(signal.SIGINT)
            p.communicate(timeout=30)
    out = "".join(lines)
    moved = [x for x in lines if "is busy" in x]
    assert len(moved) == 1, out
    new_port = int(moved[0].rsplit("serving on port ", 1)[1].split()[0])
    assert new_port != busy and f"port {busy} is busy on 127.0.0.1" in moved[0]
    assert f"dashboard:  http://127.0.0.1:{new_port}/" in out


# --------------------------------------------------------------------------- plan


def test_plan_unknown_gpu_lists_known_ones(filled):
    res = _invoke(
        "plan", *SHAPE_ARGS[:1], "NVIDIA Z9000", *SHAPE_ARGS[2:], "--kv-lens", "100", "--database-url", filled.url
    )
    assert res.exit_code == 2
    line = _one_error_line(res)
    assert line.startswith("error: --gpu: unknown GPU 'NVIDIA Z9000'; known GPUs: ")
    assert "'NVIDIA H200'" in line and "aliases: " in line and "h200" in line
    assert "Value error" not in line and "device" not in line


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--head-dim", "100"], "--head-dim: expected one of (64, 128, 256), got 100"),
        (["--q-len", "9"], "--q-len: expected an integer in [1, 8], got 9"),
        (["--num-qo-heads", "6"], "--num-qo-heads: expected a multiple of num_kv_heads (4), got 6"),
        (["--kv-dtype", "int4"], "--kv-dtype: expected 'bfloat16' (q's dtype, the default) or 'float8_e4m3fn'"),
    ],
)
def test_plan_tune_and_campaign_refuse_a_bad_shape_in_the_same_words(tmp_path, args, line):
    """One rule, one wording: the kernels' shape check (kvsplit.kernels.shape.Shape) names the flag and the value
    in kvsplit plan, kvsplit tune and kvsplit tune --campaign alike; nothing is stored."""
    url = f"sqlite:///{tmp_path}/k.db"
    shape = ["--gpu", "h200", "--num-qo-heads", "32", "--num-kv-heads", "4", "--head-dim", "128", "--dtype", "bf16"]
    cmds = {
        "plan": ["plan", *shape, "--kv-lens", "100,200", *args],
        "tune": ["tune", "--family", "uniform", "--batch-size", "8", "--backend", "sim", *shape, *args],
        "campaign": ["tune", "--campaign", "--backend", "sim", *shape, *args],
    }
    for name, cmd in cmds.items():
        res = _invoke(*cmd, "--database-url", url)
        assert res.exit_code == 2, (name, res.output)
        got = _one_error_line(res)
        # the campaign's head counts and head_dim may come from its --model-shape preset: it names both
        from_preset = name == "campaign" and args[0] in ("--num-qo-heads", "--num-kv-heads", "--head-dim")
        assert got.startswith(f"error: {'--model-shape or ' if from_preset else ''}{line}"), (name, got)
    assert not (tmp_path / "k.db").exists()


def test_plan_refuses_a_kv_len_below_q_len(filled):
    res = _invoke("plan", *SHAPE_ARGS, "--q-len", "4", "--kv-lens", "4096,3,9000", "--database-url", filled.url)
    assert res.exit_code == 2
    assert _one_error_line(res).startswith("error: --kv-lens[1]: 3 tokens, fewer than q_len=4"), res.output


def test_plan_says_why_it_falls_back(filled):
    # a shape with no published policy at all
    res = _invoke(
        "plan",
        "--gpu",
        "h100",
        "--num-qo-heads",
        "8",
        "--num-kv-heads",
        "1",
        "--head-dim",
        "64",
        "--dtype",
        "float16",
        "--kv-lens",
        "100,200",
        "--database-url",
        filled.url,
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["policy"]["source"] == "fallback"
    assert (
        "note: planned with the fallback policy 'balanced': no published policy for this shape "
        "(gpu, num_kv_heads, head_dim, dtype, page_size, kv_dtype, q_len)"
    ) in res.stderr
    # the tuned shape over an fp8 cache: its own family, no policy: the fp8 decode fallback, named so
    res = _invoke("plan", *SHAPE_ARGS, "--kv-dtype", "fp8", "--kv-lens", "100,200", "--database-url", filled.url)
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["policy"]["name"] == "stream_k"
    assert (
        "note: planned with the fallback policy 'stream_k' (the fallback of an fp8 decode family, "
        "kvsplit.kernels.policy_table.FP8_FALLBACK): no published policy for this shape"
    ) in res.stderr
    # an all-empty batch: no signature to match, said so (not "nearest ... at distance inf")
    res = _invoke("plan", *SHAPE_ARGS, "--kv-lens", "0,0", "--database-url", filled.url)
    assert res.exit_code == 0 and json.loads(res.stdout)["policy"]["source"] == "fallback", res.output
    assert "an all-empty batch (every kv_len 0) has no length signature" in res.stderr and "inf" not in res.stderr
    # the tuned shape, but a batch far from every tuned bucket
    res = _invoke("plan", *SHAPE_ARGS, "--kv-lens", "1", "--database-url", filled.url)
    assert res.exit_code == 0, res.output
    answer = json.loads(res.stdout)
    assert answer["policy"]["source"] == "fallback"
    # the served limit is kernels.policy_table.SERVE_DISTANCE_LIMIT = 2.5 (not buckets.DISTANCE_LIMIT = 1.0),
    # printed with :g -> "2.5"; the nearest tuned bucket (b12.t12, same w0x16 histogram) is at
    # CLASS_WEIGHT * (|0-12| + |0-12|) = 0.5 * 24 = 12 > 2.5
    assert (
        f"no published policy within the distance limit 2.5 of bucket {answer['bucket']['key']} (nearest: "
        in res.stderr
    )
    # a tuned batch says nothing
    lens = family_kv_lens("2x40", 16, TOTAL).tolist()
    res = _invoke("plan", *SHAPE_ARGS, "--kv-lens", ",".join(map(str, lens)), "--database-url", filled.url)
    assert res.exit_code == 0 and json.loads(res.stdout)["policy"]["source"] != "fallback" and not res.stderr


def test_plan_kv_lens_file_and_stdin(filled, tmp_path):
    lens = [(i * 7919) % 5000 + 1 for i in range(30_000)]  # too long for a command line
    f = tmp_path / "lens.txt"
    f.write_text("\n".join(map(str, lens)) + "\n")
    res = _invoke("plan", *SHAPE_ARGS, "--kv-lens-file", str(f), "--database-url", filled.url)
    assert res.exit_code == 0, res.output
    a = json.loads(res.stdout)
    assert a["kv_lens"] == lens and len(a["num_splits"]) == 30_000
    res = _invoke("plan", *SHAPE_ARGS, "--kv-lens-file", "-", "--database-url", filled.url, input=json.dumps(lens))
    assert res.exit_code == 0 and json.loads(res.stdout) == a
    f.write_text("10, 20\n30 x 40")
    res = _invoke("plan", *SHAPE_ARGS, "--kv-lens-file", str(f), "--database-url", filled.url)
    assert res.exit_code == 2
    assert _one_error_line(res) == f"error: --kv-lens-file {f}: kv_lens[3]: expected an integer, got 'x'"
    res = _invoke("plan", *SHAPE_ARGS, "--kv-lens", "1", "--kv-lens-file", str(f), "--database-url", filled.url)
    assert res.exit_code == 2 and _one_error_line(res) == "error: give exactly one of --kv-lens and --kv-lens-file"
    res = _invoke("plan", *SHAPE_ARGS, "--kv-lens", "1,-5", "--database-url", filled.url)
    assert res.exit_code == 2 and _one_error_line(res).startswith("error: --kv-lens[1]: ")


def test_plan_output_forms_and_dtype_alias(filled):
    base = ["plan", *SHAPE_ARGS, "--kv-lens", "4096,17,9000", "--database-url", filled.url]
    compact = _invoke(*base)
    assert compact.exit_code == 0 and compact.stdout.count("\n") == 1  # not a terminal: one line
    indented = _invoke(*base, "--indent")
    assert indented.stdout.count("\n") > 20 and json.loads(indented.stdout) == json.loads(compact.stdout)
    assert _invoke(*base, "--compact").stdout == compact.stdout
    bf16 = _invoke(*[("bf16" if a == "bfloat16" else a) for a in base])
    assert bf16.exit_code == 0, bf16.output
    assert json.loads(bf16.stdout) == json.loads(compact.stdout)
    assert json.loads(bf16.stdout)["made_for"]["dtype"] == "bfloat16"
    bad = _invoke(*[("bf17" if a == "bfloat16" else a) for a in base])
    assert bad.exit_code == 2 and _one_error_line(bad).startswith("error: --dtype: expected one of ")


@pytest.mark.parametrize("cmd", [["plan"], ["tune"], ["bench"], ["serve"], ["calibrate"], ["run"], ["db", "export"]])
def test_help_has_no_type_placeholders(cmd):
    res = CliRunner().invoke(app, [*cmd, "--help"], terminal_width=200)
    assert res.exit_code == 0
    ours = [x for x in res.output.splitlines() if "--" in x and "--help" not in x]
    assert ours and not [x for x in ours if "<bool>" in x or "<str>" in x or "<int>" in x], res.output


# --------------------------------------------------------------------------- tune


@pytest.mark.slow
def test_second_tune_with_other_batch_flags_is_refused(tmp_path):
    url = f"sqlite:///{tmp_path / 't.db'}"
    args = [
        "tune",
        "--family",
        "uniform",
        "--batch-size",
        "8",
        "--trials",
        "2",
        "--num-train",
        "1",
        "--num-heldout",
        "1",
        "--no-progress",
        "--database-url",
        url,
    ]
    first = _invoke(*args)
    assert first.exit_code == 0, first.output
    again = _invoke(*args)  # same flags: resumes
    assert again.exit_code == 0, again.output
    for extra in (["--seed", "1"], ["--total-tokens", "270000"]):
        res = _invoke(*args, *extra)
        assert res.exit_code == 2
        line = _one_error_line(res)
        assert line.startswith("error: bucket nvidia-h200.kv4.d128.bf16.p16.b3.")
        assert "keeps the batches of its first tune (family:uniform:B8:T262144); this run " in line
        assert "use the first run's --seed, --total-tokens, --num-train" in line
    store.dispose_engines()


@pytest.mark.parametrize(
    "cmd",
    [
        ["db", "export"],
        ["db", "upgrade"],
        ["plan", *SHAPE_ARGS, "--kv-lens", "1"],
        ["tune", "--family", "uniform", "--batch-size", "8", "--no-progress"],
    ],
)
def test_unreachable_server_is_one_error_line(cmd):
    res = _invoke(*cmd, "--database-url", "postgresql+psycopg://nobody:secret@127.0.0.1:1/none")
    assert res.exit_code == 1
    line = _one_error_line(res)
    assert line.startswith(
        "error: cannot reach the database server of postgresql+psycopg://nobody:***@127.0.0.1:1/none: "
    )
    assert "Connection refused" in line
    assert "secret" not in line


def test_plan_shape_error_has_no_pydantic_prefix(filled):
    args = [a if a != "32" else "30" for a in SHAPE_ARGS]  # H_q 30 with H_kv 4
    res = _invoke("plan", *args, "--kv-lens", "100,200", "--database-url", filled)
    assert res.exit_code == 2, res.output
    assert _one_error_line(res) == "error: --num-qo-heads: expected a multiple of num_kv_heads (4), got 30"
