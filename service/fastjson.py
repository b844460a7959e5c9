"""Compiled JSON writer of a plan's integer arrays (the ``POST /v1/plan`` answer's bulk).

A B = 256 answer holds about 1,650 integers; orjson writes them from NumPy in
about 11 µs (its integer formatting is fast, the cost is per element). This
module writes the six arrays of :class:`~kvsplit.kernels.workplan.Plan`
(``kv_lens``, ``num_splits``, ``work_request``, ``work_kv_start``,
``work_kv_end``, ``cta_indptr``, in the order of the answer) as the opening of
the answer object in one numba pass::

    {"kv_lens":[...],"num_splits":[...],"work_request":[...],"work_kv_start":[...],"work_kv_end":[...],"cta_indptr":[...],

byte for byte what ``orjson.dumps`` writes for those members (decimal
integers, no spaces; tests/service/test_fastjson.py compares them). A value
below 10^8 (every value of a plan within the service's limits) takes no branch
on its digit count: its digits are made from a two-digit table (two entries
below 10^4, four below 10^8), the leading zeros shifted out and the word stored
with one unaligned 8-byte store (the buffer has room to spare; the next store
overwrites the excess). About 2.6 ns per value against orjson's 6-7.

The plan service leaves ``kv_lens`` out (``with_kv=False``) when the compiled
scan of :mod:`kvsplit.service.fastparse` read the request's list without
whitespace, and copies that list instead: the scan accepts only canonical JSON
integers (no sign, no leading zero, no fraction or exponent), which are exactly
orjson's text of the same values.

Without numba, or with ``KVSPLIT_NUMBA=0``, :data:`ENABLED` is false and the
service serializes with orjson.
"""

from __future__ import annotations

import numpy as np

__all__ = ["ENABLED", "plan_arrays_json", "buffers_json", "warmup", "KEYS"]

KEYS = (
    b'{"kv_lens":',
    b',"num_splits":',
    b',"work_request":',
    b',"work_kv_start":',
    b',"work_kv_end":',
    b',"cta_indptr":',
)
"""The members the writer opens the answer with, in order (the answer's order)."""

from .fastparse import ENABLED, jit  # noqa: E402 (after the constants it documents) one numba switch (KVSPLIT_NUMBA) for the scan and the writer

if ENABLED:  # pragma: no branch
    import numba
    from llvmlite import ir
    from numba.core import types
    from numba.extending import intrinsic

    def _inline(fn):
        return numba.njit(cache=True, nogil=True, inline="always")(fn)

    @intrinsic
    def _store8(typingctx, arr, idx, val):  # pragma: no cover - compiled
        """``arr[idx:idx+8] = val`` (uint64, little-endian), one unaligned store, no bounds check."""
        sig = types.void(arr, types.int64, types.uint64)

        def codegen(context, builder, signature, args):
            ary = context.make_array(signature.args[0])(context, builder, args[0])
            ptr = builder.bitcast(builder.gep(ary.data, [args[1]]), ir.IntType(64).as_pointer())
            builder.store(args[2], ptr).align = 1
            return context.get_dummy_value()

        return sig, codegen
else:  # pragma: no cover - exercised where numba is missing
    _inline = jit

# two ASCII digits of 0..99 as a little-endian uint16 (tens digit first)
_PAIRS = np.array([(48 + i // 10) | ((48 + i % 10) << 8) for i in range(100)], dtype=np.uint64)
_E8 = np.uint64(100_000_000)
_K = [np.frombuffer(k, np.uint8).copy() for k in KEYS]
_K0, _K1, _K2, _K3, _K4, _K5 = _K
_KEY_BYTES = sum(len(k) for k in KEYS)


@_inline
def _word8(u):  # pragma: no cover - compiled
    """The eight ASCII digits of ``u < 10^8``, zero-padded, as a uint64 (first digit in the low byte)."""
    hi = u // np.uint64(10000)
    lo = u - hi * np.uint64(10000)
    h1 = hi // np.uint64(100)
    h2 = hi - h1 * np.uint64(100)
    l1 = lo // np.uint64(100)
    l2 = lo - l1 * np.uint64(100)
    return _PAIRS[h1] | (_PAIRS[h2] << np.uint64(16)) | (_PAIRS[l1] << np.uint64(32)) | (_PAIRS[l2] << np.uint64(48))


@_inline
def _put8(out, n, u):  # pragma: no cover - compiled
    """``u < 10^8`` in decimal at ``out[n:]`` (8 bytes stored); returns the end of its digits."""
    nd = (
        1
        + np.int64(u >= np.uint64(10))
        + np.int64(u >= np.uint64(100))
        + np.int64(u >= np.uint64(1000))
        + np.int64(u >= np.uint64(10000))
        + np.int64(u >= np.uint64(100000))
        + np.int64(u >= np.uint64(1000000))
        + np.int64(u >= np.uint64(10000000))
    )
    _store8(out, n, _word8(u) >> np.uint64(8 * (8 - nd)))
    return n + nd


@_inline
def _put_int(out, n, v):  # pragma: no cover - compiled
    """int64 ``v`` in decimal at ``out[n:]`` (up to 8 bytes past its end are overwritten); the new end."""
    if v < 0:
        out[n] = 45  # '-'
        n += 1
        u = np.uint64(0) - np.uint64(v)  # |v|, int64 min included
    else:
        u = np.uint64(v)
        if u < np.uint64(10000):  # most values of a plan: two table entries, three compares
            a = u // np.uint64(100)
            nd = 1 + np.int64(u >= np.uint64(10)) + np.int64(u >= np.uint64(100)) + np.int64(u >= np.uint64(1000))
            _store8(out, n, (_PAIRS[a] | (_PAIRS[u - a * np.uint64(100)] << np.uint64(16))) >> np.uint64(8 * (4 - nd)))
            return n + nd
    if u < _E8:
        return _put8(out, n, u)
    hi = u // _E8
    lo = u - hi * _E8
    if hi < _E8:
        n = _put8(out, n, hi)
    else:
        top = hi // _E8
        n = _put8(out, n, top)
        _store8(out, n, _word8(hi - top * _E8))
        n += 8
    _store8(out, n, _word8(lo))
    return n + 8


@_inline
def _put_key(out, n, key):  # pragma: no cover - compiled
    for i in range(key.shape[0]):
        out[n + i] = key[i]
    return n + key.shape[0]


@_inline
def _put_array(out, n, a):  # pragma: no cover - compiled
    """``[a0,a1,...]`` at ``out[n:]``; the new end."""
    out[n] = 91  # '['
    n += 1
    m = a.shape[0]
    for i in range(m):
        n = _put_int(out, n, np.int64(a[i]))
        _store8(out, n, np.uint64(44))  # ',' (the zero bytes after it are overwritten or past the end)
        n += 1
    if m:
        n -= 1
    out[n] = 93  # ']'
    return n + 1


@_inline
def _write6(kv, a1, a2, a3, a4, a5, with_kv):  # pragma: no cover - compiled
    count = a1.shape[0] + a2.shape[0] + a3.shape[0] + a4.shape[0] + a5.shape[0] + (kv.shape[0] if with_kv else 0)
    # at most 20 characters and a comma per value, 2 brackets per array, 8 bytes of slack for the last store
    out = np.empty(21 * count + _KEY_BYTES + 12 + 16, np.uint8)
    n = 0
    if with_kv:
        n = _put_array(out, _put_key(out, n, _K0), kv)
    n = _put_array(out, _put_key(out, n, _K1), a1)
    n = _put_array(out, _put_key(out, n, _K2), a2)
    n = _put_array(out, _put_key(out, n, _K3), a3)
    n = _put_array(out, _put_key(out, n, _K4), a4)
    n = _put_array(out, _put_key(out, n, _K5), a5)
    out[n] = 44  # ','
    return out[: n + 1]


@jit
def _plan_arrays(kv, num_splits, work_request, work_kv_start, work_kv_end, cta_indptr):  # pragma: no cover
    return _write6(kv, num_splits, work_request, work_kv_start, work_kv_end, cta_indptr, True)


@jit
def _buffers(b64, b32, B, W, nc, with_kv):  # pragma: no cover - compiled
    return _write6(
        b64[:B], b32[:B], b32[B : B + W], b64[B : B + W], b64[B + W : B + 2 * W], b32[B + W : B + W + nc], with_kv
    )


def plan_arrays_json(plan) -> np.ndarray:
    """The answer's opening (module doc) for a :class:`~kvsplit.kernels.workplan.Plan`, as uint8 (a bytes-like
    object: ``b"".join`` takes it). The arrays must be 1-D integer arrays (a Plan's are)."""
    return _plan_arrays(
        plan.kv_lens, plan.num_splits, plan.work_request, plan.work_kv_start, plan.work_kv_end, plan.cta_indptr
    )


def buffers_json(b64: np.ndarray, b32: np.ndarray, B: int, W: int, nc: int, with_kv: bool = True) -> np.ndarray:
    """The answer's opening from the compiled planner's two buffers (``b64 = [kv_lens (B) | work_kv_start (W) |
    work_kv_end (W)]``, ``b32 = [num_splits (B) | work_request (W) | cta_indptr (nc) | ...]``, see
    :func:`kvsplit.kernels.fastplan.run_spec`). ``with_kv=False`` leaves out ``{"kv_lens":[...]``: the text
    starts at ``,"num_splits":`` (the caller puts the request's own list before it, module doc)."""
    return _buffers(b64, b32, B, W, nc, with_kv)


def warmup() -> None:
    """Compile (or load from the on-disk cache) the writers for the planner's array types."""
    if not ENABLED:
        return
    i64, i32 = np.array([5, 0], np.int64), np.array([1, 1], np.int32)
    b64 = np.array([5, 0, 0, 0, 5, 0], np.int64)
    b32 = np.array([1, 1, 0, 1, 0, 1, 2, 0], np.int32)
    for writable in (True, False):
        for a in (i64, i32, b64, b32):
            a.setflags(write=writable)
        _plan_arrays(i64, i32, i32, i64, i64, i32)
        for with_kv in (True, False):
            buffers_json(b64, b32, 2, 2, 3, with_kv)
