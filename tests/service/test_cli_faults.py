"""Every ``kvsplit`` command against every store fault and bad setting: one line on stderr naming the cause.

A table of commands (``tune``, ``run``, ``serve``, ``plan``, ``db upgrade | export
| import``, ``calibrate``) by faults: a store on a read-only file system, in a
missing folder, on a PostgreSQL port nobody listens on, a malformed URL, a full
disk, and bad ``KVSPLIT_*`` values. Each command runs as a real process; the
test asserts a non-zero exit, exactly one ``error:`` line on stderr naming the
cause, no traceback, and that the store is intact (SQLite ``integrity_check``
and the same published policies as before).

The read-only and full file systems are real: small tmpfs mounts (the
read-only one remounted ``ro``), which needs root (CI runs as root); without it
those cases skip with that reason.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "kernels" / "data" / "h200_policies.json"
KVSPLIT = [sys.executable, "-m", "kvsplit.service.cli"]
SHAPE = ["--gpu", "h200", "--num-qo-heads", "32", "--num-kv-heads", "4", "--head-dim", "128", "--dtype", "bf16"]

try:
    import torch

    HAS_CUDA = torch.cuda.is_available()
except ImportError:  # pragma: no cover
    HAS_CUDA = False

# every command that opens the store; {url} is the store, {file} a policies file to import
COMMANDS = {
    "tune": [
        "tune",
        "--family",
        "uniform",
        "--batch-size",
        "8",
        "--total-tokens",
        "8192",
        "--trials",
        "3",
        "--num-train",
        "2",
        "--num-heldout",
        "2",
        "--no-progress",
        "--database-url",
        "{url}",
    ],
    "run": ["run", "--no-tune", "--database-url", "{url}"],
    "serve": ["serve", "--database-url", "{url}"],
    "plan": ["plan", *SHAPE, "--kv-lens", "4096,17,9000", "--database-url", "{url}"],
    "db upgrade": ["db", "upgrade", "--database-url", "{url}"],
    "db export": ["db", "export", "--database-url", "{url}"],
    "db import": ["db", "import", "{file}", "--database-url", "{url}"],
    "calibrate": ["calibrate", "--database-url", "{url}"],
}
READS = ("plan", "db export")  # commands that only read: they work on a full disk


def _kvsplit(args: list[str], url: str, *, env: dict[str, str] | None = None, cwd: Path | None = None):
    argv = [a.replace("{url}", url).replace("{file}", str(SHIPPED)) for a in args]
    e = {k: v for k, v in os.environ.items() if not k.startswith("KVSPLIT_")}
    e.update(env or {})
    return subprocess.run([*KVSPLIT, *argv], capture_output=True, text=True, env=e, cwd=cwd, timeout=180)


def _assert_one_line(r, cmd: str, *causes: str) -> str:
    # progress and notes (which calibration the simulator uses) are not errors
    err = [
        x for x in r.stderr.splitlines() if x.strip() and not x.startswith(("created the kvsplit", "tuning ", "note: "))
    ]
    assert r.returncode != 0, f"{cmd}: exit 0\n{r.stdout}\n{r.stderr}"
    assert "Traceback" not in r.stderr + r.stdout, f"{cmd}:\n{r.stderr}"
    assert len(err) == 1 and err[0].startswith("error: "), f"{cmd}: expected one error line, got\n{r.stderr}"
    if cmd == "calibrate" and not HAS_CUDA and not any(c.startswith("KVSPLIT_") for c in causes):
        assert "needs a CUDA GPU" in err[0], err[0]
    else:
        assert any(c in err[0] for c in causes), f"{cmd}: {err[0]!r} names none of {causes}"
    return err[0]


def _snapshot(db: Path) -> tuple[str, list]:
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as c:
        ok = c.execute("PRAGMA integrity_check").fetchone()[0]
        pol = c.execute("SELECT bucket_key, params, status FROM policies ORDER BY id").fetchall()
    return ok, pol


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _tmpfs(path: Path, size: str):
    if os.geteuid() != 0:
        pytest.skip("a real read-only or full file system is a tmpfs mount, which needs root (CI runs as root)")
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def _seed_store(url: str) -> None:
    """A store holding the shipped policies (so that "intact" has something to lose)."""
    r = _kvsplit(["db", "upgrade", "--database-url", url], url)
    assert r.returncode == 0, r.stderr
    r = _kvsplit(["db", "import", str(SHIPPED), "--database-url", url], url)
    assert r.returncode == 0, r.stderr


@pytest.fixture(scope="module")
def seeded(tmp_path_factory) -> Path:
    """A store with the shipped policies (and ``empty.db`` beside it, at the current schema), copied into each
    fault's file system."""
    d = tmp_path_factory.mktemp("seed")
    _seed_store(f"sqlite:///{d / 'k.db'}")
    r = _kvsplit(["db", "upgrade", "--database-url", "{url}"], f"sqlite:///{d / 'empty.db'}")
    assert r.returncode == 0, r.stderr
    for name in ("k.db", "empty.db"):
        with contextlib.closing(sqlite3.connect(d / name)) as c:  # one file, no WAL beside it
            c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            c.execute("PRAGMA journal_mode=DELETE")
    return d / "k.db"


# ------------------------------------------------------------------------------------------- store faults


@pytest.mark.parametrize("cmd", list(COMMANDS))
def test_read_only_store(cmd, seeded, tmp_path):
    with _tmpfs(tmp_path / "ro", "8m") as d:
        shutil.copy(seeded, d / "k.db")
        before = _snapshot(d / "k.db")
        subprocess.run(["mount", "-o", "remount,ro", str(d)], check=True)
        r = _kvsplit(COMMANDS[cmd], f"sqlite:///{d / 'k.db'}")
        _assert_one_line(r, cmd, "read-only")
        assert _snapshot(d / "k.db") == before


@pytest.mark.parametrize("cmd", list(COMMANDS))
def test_missing_folder(cmd, tmp_path):
    r = _kvsplit(COMMANDS[cmd], f"sqlite:///{tmp_path / 'nowhere' / 'k.db'}")
    line = _assert_one_line(r, cmd, "does not exist")
    assert "nowhere" in line or cmd == "calibrate"
    assert not (tmp_path / "nowhere").exists()


@pytest.mark.parametrize("cmd", list(COMMANDS))
def test_unreachable_postgresql(cmd):
    port = _free_port()  # nothing listens there
    r = _kvsplit(COMMANDS[cmd], f"postgresql+psycopg://kvsplit:secret@127.0.0.1:{port}/kvsplit")
    line = _assert_one_line(r, cmd, "cannot reach the database server")
    assert "secret" not in r.stderr and (str(port) in line or cmd == "calibrate")


@pytest.mark.parametrize("cmd", list(COMMANDS))
def test_malformed_url(cmd):
    r = _kvsplit(COMMANDS[cmd], "postgresql://host:notaport/db")
    line = _assert_one_line(r, cmd, "--database-url: ")
    assert "notaport" in line or cmd == "calibrate"
    assert r.returncode == 2


@pytest.mark.parametrize("cmd", [c for c in COMMANDS if c not in ("serve", "calibrate")])
def test_full_disk(cmd, seeded, tmp_path):
    """The store's file system has 120 KiB left: writers fail naming the full disk, readers still work.

    Readers read the store holding the shipped policies; ``run`` and ``db import`` import them into an
    empty store (which does not fit); ``db upgrade`` creates a new store. (``serve`` only reads and keeps
    running; ``calibrate`` times the GPU for minutes before it writes.)
    """
    with _tmpfs(tmp_path / "full", "3m") as d:
        shutil.copy(seeded, d / "k.db")
        url = f"sqlite:///{d / 'k.db'}"
        if cmd == "db upgrade":  # an up-to-date store has nothing to write: an empty one must be created
            url = f"sqlite:///{d / 'new.db'}"
        elif cmd not in READS:
            shutil.copy(seeded.with_name("empty.db"), d / "empty.db")
            url = f"sqlite:///{d / 'empty.db'}"
        before = _snapshot(d / "k.db")
        before_target = _snapshot(d / "empty.db") if (d / "empty.db").exists() else None
        st = os.statvfs(d)
        with open(d / "filler", "wb") as f:
            f.write(b"\0" * (st.f_bavail * st.f_frsize - 120 * 1024))
        r = _kvsplit(COMMANDS[cmd], url)
        if cmd in READS:
            assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
        else:
            _assert_one_line(r, cmd, "the disk is full")
            assert "savepoint" not in r.stderr
        assert _snapshot(d / "k.db") == before
        if before_target is not None:  # nothing half-imported: integrity ok, still no policy
            assert _snapshot(d / "empty.db") == before_target


# ------------------------------------------------------------------------------------------- bad settings


@pytest.mark.parametrize("cmd", list(COMMANDS))
@pytest.mark.parametrize("var,value", [("KVSPLIT_DB_BUSY_TIMEOUT_MS", "-5"), ("KVSPLIT_DB_BUSY_TIMEOUT_MS", "soon")])
def test_bad_store_setting(cmd, var, value, seeded, tmp_path):
    shutil.copy(seeded, tmp_path / "k.db")
    before = _snapshot(tmp_path / "k.db")
    r = _kvsplit(COMMANDS[cmd], f"sqlite:///{tmp_path / 'k.db'}", env={var: value})
    line = _assert_one_line(r, cmd, f"{var}={value!r}")
    assert r.returncode == 2, line
    assert _snapshot(tmp_path / "k.db") == before
    r = _kvsplit(COMMANDS[cmd], f"sqlite:///{tmp_path / 'nowhere.db'}", env={var: value})
    _assert_one_line(r, cmd, f"{var}={value!r}")  # named before the missing store
    assert not (tmp_path / "nowhere.db").exists()


@pytest.mark.parametrize("cmd", ["run", "serve"])
@pytest.mark.parametrize(
    "value,rule",
    [("abc", "valid integer"), ("70000", "less than or equal to 65535"), ("-1", "greater than or equal to 0")],
)
def test_bad_port_setting(cmd, value, rule, seeded, tmp_path):
    shutil.copy(seeded, tmp_path / "k.db")
    r = _kvsplit(COMMANDS[cmd], f"sqlite:///{tmp_path / 'k.db'}", env={"KVSPLIT_PORT": value})
    line = _assert_one_line(r, cmd, f"KVSPLIT_PORT={value!r}")
    assert rule in line and r.returncode == 2


def test_bad_setting_in_dotenv(seeded, tmp_path):
    """./.env is read like the environment, and named the same way."""
    shutil.copy(seeded, tmp_path / "k.db")
    (tmp_path / ".env").write_text(f"KVSPLIT_PORT=eighty\nKVSPLIT_DATABASE_URL=sqlite:///{tmp_path / 'k.db'}\n")
    r = subprocess.run(
        [*KVSPLIT, "run", "--no-tune"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        env={k: v for k, v in os.environ.items() if not k.startswith("KVSPLIT_")},
    )
    line = _assert_one_line(r, "run", "KVSPLIT_PORT='eighty'")
    assert r.returncode == 2, line


def test_unknown_cause_keeps_the_first_line(tmp_path):
    """A store failure the classifier does not know is still one line: the error's own first line."""
    from kvsplit.db import store

    assert (
        store.describe_error(RuntimeError("first\nsecond"), f"sqlite:///{tmp_path / 'k.db'}")
        == f"cannot use the policy store at sqlite:///{tmp_path / 'k.db'}: first"
    )
