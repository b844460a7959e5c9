"""Compiled scan of the ``kv_lens`` list of a ``POST /v1/plan`` body (the service's hot path).

orjson builds one Python int per length and the list then has to be converted
to NumPy and range-checked: about 10 µs of a B = 256 request. This module reads
the list straight from the body bytes into an int64 array in one numba pass
that accepts only the strict JSON form of non-negative integers up to a limit::

    "kv_lens" ws* ':' ws* '[' ws* int (ws* ',' ws* int)* ws* ']'
    int = '0' | [1-9][0-9]*            ws = space, tab, CR, LF

Anything else (an empty list, a sign, a leading zero, a fraction or exponent,
``true``, ``null``, a value over the limit, more than ``max_n`` entries, a
malformed list) makes :func:`scan_kv_lens` answer "not handled" and the caller
runs the ordinary orjson path, which produces the error message. The rest of
the body is still parsed by orjson (:func:`kvsplit.service.validation.parse_plan_request`
replaces the list by ``0`` and checks that exactly that ``0`` arrives as the
top-level ``kv_lens``), so JSON validity and every other field are checked as before.

Without numba, or with ``KVSPLIT_NUMBA=0`` (the planner's switch), :data:`ENABLED`
is false and the service uses orjson alone.
"""

from __future__ import annotations

import os

import numpy as np

__all__ = ["ENABLED", "scan_kv_lens", "KEY", "warmup"]

KEY = b'"kv_lens"'

try:  # pragma: no branch
    if os.environ.get("KVSPLIT_NUMBA", "1") == "0":
        raise ImportError("disabled by KVSPLIT_NUMBA=0")
    import numba

    def _jit(fn):
        return numba.njit(cache=True, nogil=True)(fn)

    ENABLED = True
except ImportError:  # pragma: no cover - exercised where numba is missing
    ENABLED = False

    def _jit(fn):
        return fn


@_jit
def _scan(buf, pos, limit, max_n):  # pragma: no cover - compiled (the tests compare it with orjson)
    n_buf = buf.shape[0]
    empty = np.empty(0, np.int64)
    while pos < n_buf and (buf[pos] == 32 or buf[pos] == 9 or buf[pos] == 10 or buf[pos] == 13):
        pos += 1
    if pos >= n_buf or buf[pos] != 58:  # ':'
        return empty, -1, -1
    pos += 1
    while pos < n_buf and (buf[pos] == 32 or buf[pos] == 9 or buf[pos] == 10 or buf[pos] == 13):
        pos += 1
    if pos >= n_buf or buf[pos] != 91:  # '['
        return empty, -1, -1
    start = pos
    pos += 1
    cap = min((n_buf - pos) // 2 + 1, max_n)  # a list of n ints takes at least 2n - 1 bytes
    out = np.empty(cap, np.int64)
    n = 0
    while True:
        while pos < n_buf and (buf[pos] == 32 or buf[pos] == 9 or buf[pos] == 10 or buf[pos] == 13):
            pos += 1
        if pos >= n_buf:
            return empty, -1, -1
        c = buf[pos]
        if c < 48 or c > 57:  # not a digit: ']' of an empty list, '-', a trailing comma, anything else
            return empty, -1, -1
        v = np.int64(c - 48)
        pos += 1
        if v == 0:
            if pos < n_buf and buf[pos] >= 48 and buf[pos] <= 57:  # leading zero: not JSON
                return empty, -1, -1
        else:
            while pos < n_buf and buf[pos] >= 48 and buf[pos] <= 57:
                v = v * 10 + (buf[pos] - 48)
                if v > limit:  # also keeps v far from int64 overflow
                    return empty, -1, -1
                pos += 1
        if v > limit or n >= cap:
            return empty, -1, -1
        out[n] = v
        n += 1
        while pos < n_buf and (buf[pos] == 32 or buf[pos] == 9 or buf[pos] == 10 or buf[pos] == 13):
            pos += 1
        if pos >= n_buf:
            return empty, -1, -1
        c = buf[pos]
        pos += 1
        if c == 44:  # ','
            continue
        if c == 93:  # ']'
            return out[:n], start, pos
        return empty, -1, -1  # '.', 'e', another token


def scan_kv_lens(body: bytes, limit: int, max_n: int) -> tuple[np.ndarray, int, int] | None:
    """The first ``"kv_lens"`` member's list of ``body`` as int64, and where the list starts and ends.

    Returns ``(kv_lens, start, end)`` (``body[start:end]`` is the ``[...]``), or
    None when the list is not the strict form of the module doc with 1..``max_n``
    values in ``[0, limit]`` (``limit`` <= 2^31 - 1), when ``"kv_lens"`` occurs
    again after it (a duplicate key: JSON's last one would win) or is absent.
    """
    i = body.find(KEY)
    if i < 0:
        return None
    kv, start, end = _scan(np.frombuffer(body, np.uint8), i + len(KEY), limit, max_n)
    if end < 0 or body.find(KEY, end) >= 0:
        return None
    return kv, start, end


def warmup() -> None:
    """Compile (or load from the on-disk cache) the scanner now rather than on the first request."""
    if ENABLED:
        scan_kv_lens(b'{"kv_lens": [1, 22]}', 100, 8)
