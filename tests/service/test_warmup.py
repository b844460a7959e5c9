"""python -m kvsplit.service.warmup: every numba part announced, timed, and a line while one runs."""

import subprocess
import sys
import time

import pytest

from kvsplit.service import warmup as wu


def test_warmup_says_each_part():
    lines = []
    spent = wu.warmup(lines.append)
    starts = [s for s in lines if s.startswith("compiling ")]
    ready = [s for s in lines if ": ready in " in s]
    assert [s.split(" with numba")[0] for s in starts] == [f"compiling {what}" for what, _ in wu._parts()]
    assert len(ready) == 3 and spent >= 0


def test_heartbeat_every_interval():
    lines = []
    with wu.heartbeat(lines.append, "doing a slow thing", every=0.05):
        time.sleep(0.32)
    assert 3 <= len(lines) <= 7
    assert all(s.startswith("  ... still doing a slow thing (") and s.endswith(" s)") for s in lines)
    n = len(lines)
    time.sleep(0.15)
    assert len(lines) == n  # stopped with the block


@pytest.mark.parametrize("every", [0, -1, True, "5"])
def test_bad_every(every):
    with pytest.raises(ValueError, match="every"):
        wu.warmup(lambda s: None, every=every)


def test_module_entry_point():
    out = subprocess.run(
        [sys.executable, "-m", "kvsplit.service.warmup"], capture_output=True, text=True, timeout=600, check=True
    ).stdout
    assert out.count("[kvsplit warmup] compiling ") == 3
    assert "[kvsplit warmup] numba cache warm (" in out
