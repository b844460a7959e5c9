"""Compiled scan of the ``kv_lens`` list of a ``POST /v1/plan`` body (the service's hot path).

orjson builds one Python int per length and the list then has to be converted
to NumPy and range-checked: about 10 µs of a B = 256 request. This module reads
the list straight from the body bytes into an int64 array in one numba pass
that accepts only the strict JSON form of non-negative integers up to a limit::

    "kv_lens" ws* ':' ws* '[' ws* int (ws* ',' ws* int)* ws* ']'
    int = '0' | [1-9][0-9]*            ws = space, tab, CR, LF

A value followed by its separator within the next 8 bytes is read with one
8-byte load (a byte test finds the first non-digit, three multiplies give the
value): about 2.5 µs for the 256 values of a B = 256 body. The scan also says
whether the list was *plain* (no whitespace inside), i.e. exactly orjson's text
of the values, which the answer writer then copies (:mod:`kvsplit.service.fastjson`).

Anything else (an empty list, a sign, a leading zero, a fraction or exponent,
``true``, ``null``, a value over the limit, more than ``max_n`` entries, a
malformed list) makes :func:`scan_kv_lens` answer "not handled" and the caller
runs the ordinary orjson path, which produces the error message. The rest of
the body is still parsed by orjson (:func:`kvsplit.service.validation.scan_request`
replaces the list by ``0`` and checks that exactly that ``0`` arrives as the
top-level ``kv_lens``, once per distinct header text), so JSON validity and every
other field are checked as before.

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
    from llvmlite import ir
    from numba.core import types
    from numba.cpython.unsafe.numbers import trailing_zeros
    from numba.extending import intrinsic

    def jit(fn):
        return numba.njit(cache=True, nogil=True)(fn)

    def jit_inline(fn):
        return numba.njit(cache=True, nogil=True, inline="always")(fn)

    @intrinsic
    def _load8(typingctx, arr, idx):  # pragma: no cover - compiled
        """``arr[idx:idx+8]`` (uint8) as a little-endian uint64, one unaligned load, no bounds check."""
        sig = types.uint64(arr, types.int64)

        def codegen(context, builder, signature, args):
            ary = context.make_array(signature.args[0])(context, builder, args[0])
            ptr = builder.bitcast(builder.gep(ary.data, [args[1]]), ir.IntType(64).as_pointer())
            ld = builder.load(ptr)
            ld.align = 1
            return ld

        return sig, codegen

    ENABLED = True
except ImportError:  # pragma: no cover - exercised where numba is missing
    ENABLED = False

    def jit(fn):
        return fn

    jit_inline = jit


_ASCII_0 = np.uint64(0x3030303030303030)
_ADD_118 = np.uint64(0x7676767676767676)
_HIGH = np.uint64(0x8080808080808080)
_LOW_NIBBLES = np.uint64(0x0F0F0F0F0F0F0F0F)
_LOW_BYTES = np.uint64(0x00FF00FF00FF00FF)
_LOW_HALVES = np.uint64(0x0000FFFF0000FFFF)
_U2561 = np.uint64(2561)
_U6553601 = np.uint64(6553601)
_U42949672960001 = np.uint64(42949672960001)
_BYTE = np.uint64(255)
_NO_VALUE = np.int64(-1)


@jit_inline
def _skip_ws(buf, pos, n_buf):  # pragma: no cover - compiled
    """The first position from ``pos`` on that is not JSON whitespace (space, tab, LF, CR), or ``n_buf``."""
    while pos < n_buf and (buf[pos] == 32 or buf[pos] == 9 or buf[pos] == 10 or buf[pos] == 13):
        pos += 1
    return pos


@jit
def _scan(buf, pos, limit, max_n):  # pragma: no cover - compiled (the tests compare it with orjson)
    """(values, start, end, plain, total) of the list after ``"kv_lens"`` at ``buf[pos:]``; end -1: not handled.

    ``buf`` is the body (bytes). A value with at least 8 bytes of the body from
    its first digit on is read eight bytes at a time, with no branch on its
    digit count: the digit bytes before the first non-digit are found with a
    byte test that carries only into later bytes, converted with three
    multiplies, and the byte after them is the separator. Anything else
    (whitespace, 8 or more digits, the last bytes of the body) takes the byte
    loop. ``plain``: no whitespace inside the list.
    """
    n_buf = len(buf)
    pos = _skip_ws(buf, pos, n_buf)
    if pos >= n_buf or buf[pos] != 58:  # ':'
        return np.empty(0, np.int64), -1, -1, False, 0
    pos += 1
    pos = _skip_ws(buf, pos, n_buf)
    if pos >= n_buf or buf[pos] != 91:  # '['
        return np.empty(0, np.int64), -1, -1, False, 0
    start = pos
    pos += 1
    cap = min((n_buf - pos) // 2 + 1, max_n)  # a list of n ints takes at least 2n - 1 bytes
    out = np.empty(cap, np.int64)
    n = 0
    total = np.int64(0)  # sum(values): the traffic statistics' total tokens, free here (<= 65,536 values < 2^31)
    plain = True
    while True:
        if pos + 8 <= n_buf:
            x = _load8(buf, pos)
            t = x ^ _ASCII_0  # digit bytes are now 0..9, every other byte is >= 10
            m = ((t + _ADD_118) | t) & _HIGH  # bit 7 of each byte >= 10; a carry only reaches later bytes
            nd = np.int64(trailing_zeros(m)) >> 3 if m != 0 else 8  # digits before the first non-digit
            if nd > 0 and nd < 8:
                if nd > 1 and (t & _BYTE) == 0:  # leading zero: not JSON
                    return np.empty(0, np.int64), -1, -1, False, 0
                d = t << np.uint64(64 - 8 * nd)  # the digits in the top bytes, zeros (leading zeros) below
                d = ((d & _LOW_NIBBLES) * _U2561) >> np.uint64(8)
                d = ((d & _LOW_BYTES) * _U6553601) >> np.uint64(16)
                v = np.int64(((d & _LOW_HALVES) * _U42949672960001) >> np.uint64(32))
                if v > limit or n >= cap:
                    return np.empty(0, np.int64), -1, -1, False, 0
                out[n] = v
                total += v
                n += 1
                c = (x >> np.uint64(8 * nd)) & _BYTE  # the byte after the digits
                if c == 44:  # ','
                    pos += nd + 1
                    continue
                if c == 93:  # ']'
                    return out[:n], start, pos + nd + 1, plain, total
                pos += nd  # whitespace or an error: the byte loop's separator part
            else:
                v = _NO_VALUE
        else:
            v = _NO_VALUE
        if v == _NO_VALUE:  # the byte loop
            q = _skip_ws(buf, pos, n_buf)
            plain = plain and q == pos
            pos = q
            if pos >= n_buf:
                return np.empty(0, np.int64), -1, -1, False, 0
            c = buf[pos]
            if c < 48 or c > 57:  # not a digit: ']' of an empty list, '-', a trailing comma, anything else
                return np.empty(0, np.int64), -1, -1, False, 0
            v = np.int64(c - 48)
            pos += 1
            if v == 0:
                if pos < n_buf and buf[pos] >= 48 and buf[pos] <= 57:  # leading zero: not JSON
                    return np.empty(0, np.int64), -1, -1, False, 0
            else:
                while pos < n_buf and buf[pos] >= 48 and buf[pos] <= 57:
                    v = v * 10 + (buf[pos] - 48)
                    if v > limit:  # also keeps v far from int64 overflow
                        return np.empty(0, np.int64), -1, -1, False, 0
                    pos += 1
            if v > limit or n >= cap:
                return np.empty(0, np.int64), -1, -1, False, 0
            out[n] = v
            total += v
            n += 1
        q = _skip_ws(buf, pos, n_buf)
        plain = plain and q == pos
        pos = q
        if pos >= n_buf:
            return np.empty(0, np.int64), -1, -1, False, 0
        c = buf[pos]
        pos += 1
        if c == 44:  # ','
            continue
        if c == 93:  # ']'
            return out[:n], start, pos, plain, total
        return np.empty(0, np.int64), -1, -1, False, 0  # '.', 'e', another token


def scan_kv_lens(body: bytes, limit: int, max_n: int) -> tuple[np.ndarray, int, int, bool, int] | None:
    """The first ``"kv_lens"`` member's list of ``body`` as int64, where the list starts and ends, and whether
    it is plain.

    Returns ``(kv_lens, start, end, plain, total)`` (``body[start:end]`` is the ``[...]``; ``plain``: it has no
    whitespace, so it is the canonical JSON text of ``kv_lens``, as orjson writes it; ``total``: ``sum(kv_lens)``,
    the traffic statistics' total tokens, added up by the scan), or None when the
    list is not the strict form of the module doc with 1..``max_n`` values in ``[0, limit]``
    (``limit`` <= 2^31 - 1), when ``"kv_lens"`` occurs again after it (a duplicate key: JSON's last one
    would win) or is absent.
    """
    i = body.find(KEY)
    if i < 0:
        return None
    kv, start, end, plain, total = _scan(body, i + len(KEY), limit, max_n)
    if end < 0 or body.find(KEY, end) >= 0:
        return None
    return kv, start, end, plain, int(total)


def warmup() -> None:
    """Compile (or load from the on-disk cache) the scanner now rather than on the first request."""
    if ENABLED:
        scan_kv_lens(b'{"kv_lens": [1, 22, 333,4444]}', 10000, 8)
