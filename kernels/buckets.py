"""Bucket keys: which tuned policy a decode batch should use (docs/concepts/design.md §5).

A bucket is the *family* ``(gpu, H_kv, head_dim, dtype, page_size, kv_dtype, q_len)`` plus a
signature of the batch's length distribution:

- **batch-size class** ``round(log2(B))``;
- **total-token class** ``round(log2(sum(kv_len)))`` (-1 for an all-empty batch).
  Rounded, not floored, so the powers of two that workloads favour (B = 512,
  T = 262,144) sit in the middle of their class rather than on its edge;
- **token-weighted histogram of log2(kv_len)**: half-octave bins
  (``bin = floor(2 * log2(kv_len))`` for kv_len >= 1, so bin ``k`` holds lengths in
  ``[2^(k/2), 2^((k+1)/2))``, bins 0..61 for kv_len <= 2^31-1), each request
  weighted by its kv_len (a request's cost is proportional to its length, so a
  bin's weight is its share of the KV bytes); the weights are quantized to
  :data:`HIST_UNITS` = 16 integer units that sum to 16 (largest-remainder
  rounding, ties to the lower bin); bins with 0 units are dropped. Empty
  requests weigh nothing.

:func:`distance` between keys of the same family is the 1-D Wasserstein (earth
mover's) distance between the two quantized histograms in log2-length units —
the L1 distance of their cumulative distributions times the bin width 0.5 —
plus :data:`CLASS_WEIGHT` = 0.5 per step of batch-size class and per step of
total-token class. Keys of different families are infinitely far apart.
:data:`DISTANCE_LIMIT` = 1.0 is "near enough": all mass one half-octave away plus
one class step, or half the mass one octave away. Batches of one reference
family at sizes within ±10 % (lengths jittered by ±10 %) stay within it; the
five reference families get different keys at every B >= 8, and
:func:`nearest` picks a batch's own family when its key is among the
candidates. Families can still be within the limit of each other (skewed80 and
2x40 differ by moving 80 % of the tokens one octave: 0.8125), so a batch whose
own bucket is not tuned falls back to the closest related one before the
``balanced`` baseline.

String form (URL- and db-safe, parsed back by :meth:`BucketKey.parse`)::

    nvidia-h200.kv4.d128.bf16.p16.b6.t18.w28x10-33x6

``gpu`` is the device name lower-cased with runs of other characters turned into
``-``; ``w`` lists ``bin x units`` pairs in increasing bin order. A KV cache of
another dtype than q's and q_len > 1 add parts after the page size, only when
they differ from the defaults (so every key of a q_len-1 batch with K/V in q's
dtype keeps its string)::

    nvidia-h200.kv4.d128.bf16.p16.kvfp8.q4.b6.t18.w28x10-33x6

(``.kvfp8``: K/V in ``float8_e4m3fn``; ``.q4``: 4 query tokens per request.)
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import fastplan
from .device import DeviceSpec, resolve_device
from .limits import (
    BINS_PER_OCTAVE,
    CLASS_WEIGHT,
    HIST_UNITS,
    KV_DTYPE_SHORT,
    MAX_Q_LEN,
    NUM_BINS,
    check_int,
    check_kv_dtype,
    check_q_len,
    check_shape,
)
from .rulespec import PlanContext
from .shape import gpu_slug, shape_family

SCALE = HIST_UNITS * BINS_PER_OCTAVE
"""``distance * SCALE`` is an integer: ``sum |cum_a - cum_b| + SCALED_CLASS_UNITS * class steps``."""
SCALED_CLASS_UNITS = int(SCALE * CLASS_WEIGHT)
assert SCALED_CLASS_UNITS == SCALE * CLASS_WEIGHT, "bucket distance constants no longer give integer scaled distances"

__all__ = [
    "BucketKey",
    "bucket_key",
    "key_of",
    "distance",
    "distances",
    "nearest",
    "gpu_slug",
    "DISTANCE_LIMIT",
    "CLASS_WEIGHT",
    "HIST_UNITS",
    "BINS_PER_OCTAVE",
    "NUM_BINS",
]

DISTANCE_LIMIT = 1.0
"""Largest :func:`distance` at which a tuned bucket is used for a batch."""

_DTYPE_SHORT = {"float16": "f16", "bfloat16": "bf16", "float32": "f32"}
_DTYPE_LONG = {v: k for k, v in _DTYPE_SHORT.items()}
_KV_LONG = {v: k for k, v in KV_DTYPE_SHORT.items()}
_KEY_RE = re.compile(
    r"^(?P<gpu>[a-z0-9]+(?:-[a-z0-9]+)*)\.kv(?P<kv>\d+)\.d(?P<d>\d+)\.(?P<dtype>f16|bf16|f32)\.p(?P<p>\d+)"
    r"(?:\.kv(?P<kvd>" + "|".join(_KV_LONG) + r"))?(?:\.q(?P<q>\d+))?"
    r"\.b(?P<b>\d+)\.t(?P<t>-1|\d+)\.w(?P<w>(?:\d+x\d+(?:-\d+x\d+)*)?)$"
)


@dataclass(frozen=True)
class BucketKey:
    """A batch's bucket (frozen, hashable; ``str(key)`` is its stable string form).

    Attributes
    ----------
    gpu : str
        :func:`gpu_slug` of the device name.
    num_kv_heads, head_dim, page_size : int
    dtype : str
        ``"float16"``, ``"bfloat16"`` or ``"float32"``.
    batch_class : int
        ``round(log2(B))``.
    tokens_class : int
        ``round(log2(sum(kv_len)))``, -1 when every kv_len is 0.
    hist : tuple of (bin, units)
        Quantized token-weighted histogram of ``floor(2 * log2(kv_len))``,
        increasing bins, units summing to :data:`HIST_UNITS` (empty when every
        kv_len is 0).
    kv_dtype : str or None
        The KV cache's dtype when it differs from ``dtype`` (``"float8_e4m3fn"``); None (the canonical form of
        ``dtype`` itself) otherwise.
    q_len : int
        Query tokens per request, 1..8.
    """

    gpu: str
    num_kv_heads: int
    head_dim: int
    dtype: str
    page_size: int
    batch_class: int
    tokens_class: int
    hist: tuple[tuple[int, int], ...]
    kv_dtype: str | None = None
    q_len: int = 1

    def __post_init__(self) -> None:
        if gpu_slug(self.gpu) != self.gpu:
            raise ValueError(f"BucketKey.gpu: expected a slug like {gpu_slug(self.gpu)!r}, got {self.gpu!r}")
        if self.dtype not in _DTYPE_SHORT:
            raise ValueError(f"BucketKey.dtype: expected one of {sorted(_DTYPE_SHORT)}, got {self.dtype!r}")
        for name in ("num_kv_heads", "head_dim", "page_size"):
            check_int(f"BucketKey.{name}", getattr(self, name), 1)
        check_int("BucketKey.batch_class", self.batch_class, 0, 16)
        check_int("BucketKey.tokens_class", self.tokens_class, -1, 62)
        hist = tuple((int(b), int(u)) for b, u in self.hist)
        object.__setattr__(self, "hist", hist)
        bins = [b for b, _ in hist]
        if bins != sorted(set(bins)) or any(not (0 <= b < NUM_BINS) or u < 1 for b, u in hist):
            raise ValueError(f"BucketKey.hist: expected increasing bins in [0, {NUM_BINS}) with units >= 1")
        total = sum(u for _, u in hist)
        if hist and total != HIST_UNITS:
            raise ValueError(f"BucketKey.hist: units must sum to {HIST_UNITS}, got {total}")
        if (not hist) != (self.tokens_class == -1):
            raise ValueError("BucketKey.hist: empty exactly when tokens_class is -1")
        try:
            kd = check_kv_dtype(self.kv_dtype, self.dtype)
        except ValueError as exc:
            raise ValueError(f"BucketKey.{exc}") from None
        object.__setattr__(self, "kv_dtype", None if kd == self.dtype else kd)
        check_int("BucketKey.q_len", self.q_len, 1, MAX_Q_LEN)

    @property
    def family(self) -> tuple[str, int, int, str, int, str, int]:
        """``(gpu, num_kv_heads, head_dim, dtype, page_size, kv_dtype, q_len)`` (kv_dtype ``dtype`` when the same):
        keys of different families never match."""
        return shape_family(
            self.gpu, self.num_kv_heads, self.head_dim, self.dtype, self.page_size, self.kv_dtype, self.q_len
        )

    @classmethod
    def from_trusted(
        cls,
        gpu: str,
        num_kv_heads: int,
        head_dim: int,
        dtype: str,
        page_size: int,
        batch_class: int,
        tokens_class: int,
        hist: tuple[tuple[int, int], ...],
        kv_dtype: str | None = None,
        q_len: int = 1,
    ) -> BucketKey:
        """A key from fields the planner computed itself (valid by construction:
        ``gpu`` a slug, ``hist`` a tuple of ``(int, int)`` pairs as the module doc
        says, ``kv_dtype`` None or a dtype other than ``dtype``), skipping ``__post_init__``'s checks. Equal (``==``, ``hash``,
        ``str``) to the checked key of the same fields; tests compare them."""
        key = object.__new__(cls)
        key.__dict__.update(
            gpu=gpu,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            dtype=dtype,
            page_size=page_size,
            batch_class=batch_class,
            tokens_class=tokens_class,
            hist=hist,
            kv_dtype=kv_dtype,
            q_len=q_len,
        )
        return key

    def __str__(self) -> str:
        w = "-".join(f"{b}x{u}" for b, u in self.hist)
        return f"{key_prefix(*self.family)}.b{self.batch_class}.t{self.tokens_class}.w{w}"

    def to_str(self) -> str:
        """The string form (same as ``str(key)``)."""
        return str(self)

    @staticmethod
    def parse(s: str) -> BucketKey:
        """Inverse of ``str(key)``.

        Raises
        ------
        ValueError
            If ``s`` is not a bucket key string.
        """
        if not isinstance(s, str):
            raise ValueError(f"bucket: expected a string, got {type(s).__name__}")
        m = _KEY_RE.match(s)
        if m is None:
            raise ValueError(f"bucket: not a bucket key: {s!r}")
        w = m["w"]
        hist = tuple(tuple(int(x) for x in part.split("x")) for part in w.split("-")) if w else ()
        key = BucketKey(
            gpu=m["gpu"],
            num_kv_heads=int(m["kv"]),
            head_dim=int(m["d"]),
            dtype=_DTYPE_LONG[m["dtype"]],
            page_size=int(m["p"]),
            batch_class=int(m["b"]),
            tokens_class=int(m["t"]),
            hist=hist,  # type: ignore[arg-type]
            kv_dtype=_KV_LONG[m["kvd"]] if m["kvd"] else None,
            q_len=int(m["q"]) if m["q"] else 1,
        )
        if str(key) != s:  # e.g. leading zeros
            raise ValueError(f"bucket: not in canonical form: {s!r} (expected {str(key)!r})")
        return key


def key_prefix(
    gpu: str,
    num_kv_heads: int,
    head_dim: int,
    dtype: str,
    page_size: int,
    kv_dtype: str | None = None,
    q_len: int = 1,
) -> str:
    """The family part of a key's string form, ``"nvidia-h200.kv4.d128.bf16.p16"``
    (``gpu`` already a slug; the rest of the string is ``.b{batch_class}.t{tokens_class}.w{hist}``), with
    ``.kv{fp8}`` when ``kv_dtype`` is given and differs from ``dtype`` and ``.q{q_len}`` when ``q_len > 1``
    (``"nvidia-h200.kv4.d128.bf16.p16.kvfp8.q4"``)."""
    out = f"{gpu}.kv{num_kv_heads}.d{head_dim}.{_DTYPE_SHORT[dtype]}.p{page_size}"
    if kv_dtype is not None and kv_dtype != dtype:
        out += f".kv{KV_DTYPE_SHORT[kv_dtype]}"
    if q_len != 1:
        out += f".q{q_len}"
    return out


def log2_class(x: int) -> int:
    """``round(log2(x))`` exactly for an integer ``1 <= x < 2^53`` (halves round up):
    ``floor(log2 x) + [x >= 2^(floor(log2 x) + 1/2)]`` (the loop-form rule of :mod:`.fastplan`)."""
    return int(fastplan.log2_class(x))


def bucket_key(
    kv_lens: Any,
    *,
    num_kv_heads: int,
    head_dim: int,
    dtype: str,
    device: DeviceSpec | str | Mapping[str, Any],
    page_size: int = 16,
    kv_dtype: str | None = None,
    q_len: int = 1,
) -> BucketKey:
    """The bucket of one decode batch (docs/concepts/design.md §5; module docstring for bins and weights).

    Parameters
    ----------
    kv_lens : array-like of int, ``[B]``
        Same rules as :func:`kvsplit.kernels.plan.make_plan`.
    num_kv_heads : int
        H_kv >= 1.
    head_dim : int
        One of 64, 128, 256.
    dtype : str
        ``"float16"``, ``"bfloat16"`` or ``"float32"``.
    device : DeviceSpec, str or mapping
        As :func:`kvsplit.kernels.device.resolve_device` accepts.
    page_size : int
        1 to 256.
    kv_dtype : str, optional
        The KV cache's dtype: None or ``dtype`` (the same), or ``"float8_e4m3fn"`` (also ``"fp8"``).
    q_len : int
        Query tokens per request, 1 to 8.

    Returns
    -------
    BucketKey

    Raises
    ------
    ValueError
        Naming the invalid argument.
    """
    if not isinstance(device, (str, DeviceSpec)):
        device = resolve_device(device)
    slug, H, D, ps = _shape(num_kv_heads, head_dim, dtype, device, page_size)
    if kv_dtype is None and q_len == 1 and type(q_len) is int:
        return _key(fastplan.as_kv_lens(kv_lens), slug, H, D, dtype, ps)
    kd = check_kv_dtype(kv_dtype, dtype)
    ql = check_q_len(q_len)
    return _key(fastplan.as_kv_lens(kv_lens), slug, H, D, dtype, ps, None if kd == dtype else kd, ql)


_SHAPES: dict[tuple, tuple] = {}


def _shape(num_kv_heads: Any, head_dim: Any, dtype: Any, device: Any, page_size: Any) -> tuple:
    """``(gpu slug, H_kv, head_dim, page_size)`` of validated shape arguments (memoized by value)."""
    key = None
    if type(num_kv_heads) is int and type(head_dim) is int and type(page_size) is int:
        key = (num_kv_heads, head_dim, dtype, device if type(device) is str else id(device), page_size)
        hit = _SHAPES.get(key)
        if hit is not None and (type(device) is str or hit[-1] is device):
            return hit[:-1]
    num_kv_heads, head_dim, page_size, dev = check_shape(num_kv_heads, head_dim, page_size, dtype, device)
    out = (gpu_slug(dev.name), num_kv_heads, head_dim, page_size, device)
    if key is not None:
        if len(_SHAPES) >= 512:
            _SHAPES.clear()
        _SHAPES[key] = out
    return out[:-1]


def _key(
    arr: np.ndarray, slug: str, H: int, D: int, dtype: str, ps: int, kv_dtype: str | None = None, q_len: int = 1
) -> BucketKey:
    bad, B, total, q = fastplan.hist_units(arr)
    if bad >= 0:
        raise fastplan.range_error(arr, bad)
    if total:
        idx = np.flatnonzero(q)
        hist = tuple(zip(idx.tolist(), q[idx].tolist()))
        tokens_class = log2_class(total)
    else:
        hist = ()
        tokens_class = -1
    # the fields are made here, valid by construction (BucketKey.__post_init__ would re-check them)
    return BucketKey.from_trusted(slug, H, D, dtype, ps, log2_class(B), tokens_class, hist, kv_dtype, q_len)


def key_of(L: np.ndarray, ctx: PlanContext) -> BucketKey:
    """The bucket key of already-validated data (what :func:`bucket_key` computes after its checks).

    ``L`` is int64 ``[B]`` as :func:`kvsplit.kernels.limits.check_batch_shape`
    returns it, ``ctx`` a validated shape (:meth:`kvsplit.kernels.shape.Shape.plan_context`).
    """
    kd = None if ctx.kv_dtype == ctx.dtype else ctx.kv_dtype
    return _key(L, gpu_slug(ctx.device.name), ctx.num_kv_heads, ctx.head_dim, ctx.dtype, ctx.page_size, kd, ctx.q_len)


def _as_key(k: BucketKey | str, name: str) -> BucketKey:
    if isinstance(k, BucketKey):
        return k
    if isinstance(k, str):
        return BucketKey.parse(k)
    raise ValueError(f"{name}: expected a BucketKey or its string form, got {type(k).__name__}")


def distance(a: BucketKey | str, b: BucketKey | str) -> float:
    """Distance between two bucket keys (module docstring); ``inf`` across families.

    Symmetric, zero only for equal signatures, and a metric within a family.
    Keys may be given as :class:`BucketKey` or strings.
    """
    return float(distances(_as_key(a, "a"), [_as_key(b, "b")])[0])


def distances(key: BucketKey | str, candidates: Iterable[BucketKey | str]) -> np.ndarray:
    """:func:`distance` from ``key`` to each of ``candidates``: float64 ``[len(candidates)]``, ``inf`` for a
    candidate of another family (the compiled planner's own distance, :func:`kvsplit.kernels.fastplan.nearest_scaled`,
    row by row).

    Raises
    ------
    ValueError
        ``key`` or an element of ``candidates`` is neither a :class:`BucketKey` nor its string form.
    """
    k = _as_key(key, "key")
    cs = [_as_key(c, "candidates[]") for c in candidates]
    out = np.full(len(cs), math.inf)
    rows = [i for i, c in enumerate(cs) if c.family == k.family]
    if not rows:
        return out
    cum = np.zeros((len(rows), NUM_BINS), np.int64)
    cls = np.zeros((len(rows), 2), np.int64)
    empty = np.zeros(len(rows), np.bool_)
    for r, i in enumerate(rows):
        for bin_, u in cs[i].hist:
            cum[r, bin_] = u
        cls[r] = cs[i].batch_class, cs[i].tokens_class
        empty[r] = not cs[i].hist
    cum = np.cumsum(cum, axis=1)
    kc = np.zeros(NUM_BINS, np.int64)
    for bin_, u in k.hist:
        kc[bin_] = u
    kc = np.cumsum(kc)
    for r, i in enumerate(rows):
        j, scaled = fastplan.nearest_scaled(
            cum[r : r + 1],
            cls[r : r + 1],
            empty[r : r + 1],
            kc,
            k.batch_class,
            k.tokens_class,
            not k.hist,
            SCALED_CLASS_UNITS,
        )
        out[i] = math.inf if j < 0 else int(scaled) / SCALE
    return out


def nearest(
    key: BucketKey | str, candidates: Iterable[BucketKey | str], *, limit: float = DISTANCE_LIMIT
) -> tuple[BucketKey | str, float] | None:
    """The candidate nearest to ``key`` within ``limit``, or ``None``.

    Ties (equal distance) go to the candidate whose string form sorts first, so
    the service and the in-process client pick the same bucket whatever the
    order of ``candidates``. The candidate is returned as given (key or string).
    """
    k = _as_key(key, "key")
    best: tuple[float, str, Any] | None = None
    for c in candidates:
        ck = _as_key(c, "candidates[]")
        d = distance(k, ck)
        if d > limit:
            continue
        s = str(ck)
        if best is None or (d, s) < (best[0], best[1]):
            best = (d, s, c)
    if best is None:
        return None
    return best[2], best[0]
