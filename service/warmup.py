"""Compile kvsplit's numba functions into numba's on-disk cache, saying what it does.

The host planner (:mod:`kvsplit.kernels.fastplan`), the plan service's request scan
(:mod:`kvsplit.service.fastparse`) and its answer writer (:mod:`kvsplit.service.fastjson`) are numba
``@njit(cache=True)`` functions: a fresh install compiles them on first use (minutes on a loaded 2-core
machine, about 80 s on the H200 host), later processes load the machine code from the cache (next to the
sources, or under ``NUMBA_CACHE_DIR``) in seconds. ``make`` runs this module once after installing, so
``make run`` / ``kvsplit run`` and an engine's first ``plan()`` find the cache warm::

    python -m kvsplit.service.warmup

Each part is announced before it starts and timed when done; while one runs, a line every ``every``
seconds (default 4) says it is still compiling, so no step is silent for 5 s.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import contextmanager

__all__ = ["heartbeat", "warmup", "main"]


def _parts() -> list[tuple[str, Callable[[], None]]]:
    from ..kernels import fastplan
    from . import fastjson, fastparse

    return [
        ("the host planner (kvsplit.kernels.fastplan)", fastplan.warmup),
        ("the plan request scan (kvsplit.service.fastparse)", fastparse.warmup),
        ("the plan answer writer (kvsplit.service.fastjson)", fastjson.warmup),
    ]


@contextmanager
def heartbeat(say: Callable[[str], None], doing: str, every: float = 4.0):
    """Say ``... still <doing> (N s)`` every ``every`` seconds until the ``with`` block ends (a daemon thread)."""
    done = threading.Event()
    t0 = time.monotonic()

    def beat():
        while not done.wait(every):
            say(f"  ... still {doing} ({time.monotonic() - t0:.0f} s)")

    th = threading.Thread(target=beat, name="kvsplit-warmup-heartbeat", daemon=True)
    th.start()
    try:
        yield
    finally:
        done.set()
        th.join()


def warmup(say: Callable[[str], None] = print, *, every: float = 4.0) -> float:
    """Compile (or load from numba's disk cache) every numba function of kvsplit, with progress lines.

    Parameters
    ----------
    say : callable(str)
        Where progress lines go (default ``print``).
    every : float
        Seconds between "still compiling" lines while one part runs (> 0; default 4, so that a line comes
        within 5 s even when compiling threads delay it).

    Returns
    -------
    float
        Seconds spent, all parts together.

    Raises
    ------
    ValueError
        ``every`` is not a number > 0.
    """
    if isinstance(every, bool) or not isinstance(every, (int, float)) or not every > 0:
        raise ValueError(f"every: expected a number of seconds > 0, got {every!r}")
    total = time.monotonic()
    for what, fn in _parts():
        say(f"compiling {what} with numba (read from its disk cache if compiled before)")
        t0 = time.monotonic()
        with heartbeat(say, f"compiling {what}", every):
            fn()
        say(f"  {what}: ready in {time.monotonic() - t0:.1f} s")
    return time.monotonic() - total


def main() -> None:
    """``python -m kvsplit.service.warmup``: warm the cache, print each step."""

    def say(msg: str) -> None:
        print(f"[kvsplit warmup] {msg}", flush=True)

    spent = warmup(say)
    say(f"numba cache warm ({spent:.1f} s)")


if __name__ == "__main__":  # pragma: no cover
    main()
