"""The published-policy table: bucket lookup + plan, identical in the service and in clients.

``GET /v1/policies`` returns a JSON document (format ``kvsplit.policy_table/2``)
with every published policy, its bucket key, the distance limit and the
fallback policy. :class:`PolicyTable` is built from that document, by the plan
service (from the store) and by :class:`kvsplit.service.client.PlanClient`
(over HTTP), and :meth:`PolicyTable.plan` is the one function both call, so the
HTTP answer and an in-process plan are equal by construction.

Lookup rule (docs/concepts/design.md §5, §7): compute the batch's bucket key
(:func:`kvsplit.kernels.buckets.bucket_key`); among published policies of the
same key family (gpu, H_kv, head_dim, dtype, page_size, kv_dtype, q_len) take the nearest
GPU-tuned one (backend ``gpu``, source ``tuned``) within the distance limit; if
there is none, the nearest simulator-tuned one (backend ``sim``, source
``simulated``); else plan with the fallback policy (``balanced``; an FP8 family's is :data:`FP8_FALLBACK`; source
``fallback``). Distances are :func:`kvsplit.kernels.buckets.distance`, computed
by the loop-form core over a family's candidates as integers scaled by a power of two
(bit-identical after the one division); ties go to the smaller bucket key string, then
the smaller policy id, as :func:`kvsplit.kernels.buckets.nearest` breaks them.

:meth:`PolicyTable.plan` on the compiled core (:mod:`.fastplan`): the call's
shape is validated once and kept per table (with the family's candidates as
contiguous arrays, the key's string prefix and each entry's parsed policy: a
cache of argument checks, never of a batch's key, match or plan), the lengths
are converted once, and one compiled call computes the key, the nearest
candidate (the same integer distances and tie rule) and the plan
(:func:`kvsplit.kernels.fastplan.key_plan`). :meth:`PolicyTable.plan_buffers`
is the same call without the Plan object (the plan service writes its answer
from the planner's buffers).

Pure NumPy: no torch, FastAPI or SQLAlchemy import.

Document fields::

    {"format": "kvsplit.policy_table/2", "version": int, "distance_limit": float,
     "fallback": {"name": "balanced", "params": {}}, "count": int,
     "data": [{"id": int, "version": int, "bucket": str, "gpu": str,
                   "num_kv_heads": int, "head_dim": int, "dtype": str, "page_size": int,
                   "kv_dtype": str (optional, default dtype), "q_len": int (optional, default 1),
                   "name": str, "params": {...}, "backend": "gpu" | "sim",
                   "source": "tuned" | "simulated", ...}, ...]}

``count`` and ``data`` are the list envelope of the service's other lists
(``GET /v1/runs``, ``/v1/buckets``, ``/v1/measurements``). :meth:`PolicyTable.from_json`
also reads format ``kvsplit.policy_table/1`` (an older server), whose list is ``policies``.

The bucket key string carries the KV dtype and q_len (``.kvfp8``, ``.q4``) when they differ from the defaults; an
entry's ``kv_dtype``/``q_len``, where given, must agree with it. A batch of an FP8 cache or of q_len > 1 is only
ever served a policy tuned for its own family; without one it gets the fallback (source ``fallback``).

Extra keys in a policy entry (publication time, tuning run, verification
summary) are carried for display and ignored by the lookup.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from . import fastplan as _fastplan
from .buckets import NUM_BINS, SCALE, SCALED_CLASS_UNITS, BucketKey, key_prefix
from .device import DeviceSpec
from .limits import KV_DTYPES, check_covers_q_len
from .rulespec import POLICIES, fit_heads_per_tile, resolve
from .shape import Shape, gpu_slug, shape_family
from .workplan import Plan

__all__ = [
    "PolicyTable",
    "PolicyEntry",
    "load_shipped_table",
    "shipped_policies",
    "SHIPPED_TABLES",
    "TABLE_FORMAT",
    "SERVE_DISTANCE_LIMIT",
    "FALLBACK_POLICY",
    "FP8_FALLBACK",
    "default_fallback",
    "SOURCE_OF_BACKEND",
    "check_policy_entry",
    "read_export",
    "EXPORT_FORMAT",
]

TABLE_FORMAT = "kvsplit.policy_table/2"
_LIST_KEY = {TABLE_FORMAT: "data", "kvsplit.policy_table/1": "policies"}
SERVE_DISTANCE_LIMIT = 2.5
"""Distance within which the served table uses a tuned bucket's policy (the table's ``distance_limit``).

Wider than :data:`kvsplit.kernels.buckets.DISTANCE_LIMIT` (1.0, "the same bucket, jittered"): tuned
parameters generalize to neighbouring buckets. Measured on the H200 (docs/results.md): with the shipped
192-bucket grid (B 1..1024, T 2^18 and 2^20, traces), every held-out batch of the evaluation sets lies
within 2.1 of a tuned bucket, and the nearest bucket's policy is within a few percent of that batch's
best plan, while the ``balanced`` fallback is 1.05-1.4x slower there. ``bucket.distance`` of a plan
answer says how far the answer reached."""
FALLBACK_POLICY = "balanced"
FP8_FALLBACK: tuple[str, dict[str, Any]] = (
    "stream_k",
    {"ctas_per_sm": 3.0, "block_n": 32, "num_warps": 4, "num_stages": 3, "prefetch": True, "heads_per_tile": 2},
)
"""The fallback of an FP8 family (``kv_dtype`` float8_e4m3fn) of q_len 1 in a table whose fallback is the default one
(:data:`FALLBACK_POLICY`, no params): stream-K at 3 tiles per SM on (32, 4, 3) with the page-id prefetch and two KV
heads per work tile (fewer where they do not fit the shape: :func:`~kvsplit.kernels.rulespec.fit_heads_per_tile`).
With an FP8 cache's half bytes, a one-head tile of G = 8 query rows (padded to 16) spends twice the softmax work per
byte of a two-head one: measured on an H100 with the float16-dot kernel (docs/decisions/fp8-dot-dtype.md), this
plan was within 1.4 % of the best of the 19 pool plans on each of 12 reference batches, where ``balanced``'s
default tile was 1.13-1.47x slower than the best."""


def default_fallback(kv_dtype: str | None = None, q_len: int = 1) -> tuple[str, dict[str, Any]]:
    """``(policy name, params)`` of the default fallback for a family: :data:`FP8_FALLBACK` for an FP8 cache
    (``kv_dtype`` ``"float8_e4m3fn"``) at q_len 1 (where it was measured), else :data:`FALLBACK_POLICY` with no
    params. ``kv_dtype``: the family's canonical KV dtype name (None or a 16-bit name: a cache of q's dtype). The
    rule of a table with the default fallback (:meth:`PolicyTable.fallback_for`) and of ``DecodeWrapper``'s eager
    ``policy="auto"``."""
    if kv_dtype in KV_DTYPES and q_len == 1:
        return FP8_FALLBACK[0], dict(FP8_FALLBACK[1])
    return FALLBACK_POLICY, {}


SOURCE_OF_BACKEND = {"gpu": "tuned", "sim": "simulated"}
_SHAPE_FIELDS = ("gpu", "num_kv_heads", "head_dim", "dtype", "page_size")
_FAMILY_EXTRA = ("kv_dtype", "q_len")
"""Shape fields of an entry beyond :data:`_SHAPE_FIELDS`, optional (defaults: dtype, 1)."""


@dataclass(frozen=True)
class PolicyEntry:
    """One published policy of the table (immutable).

    ``key`` is the parsed bucket key; ``shape`` its family (gpu slug,
    num_kv_heads, head_dim, dtype, page_size, kv_dtype, q_len); ``doc`` the entry's JSON object
    as received.
    """

    id: int
    version: int
    bucket: str
    key: BucketKey
    shape: tuple
    name: str
    params: Mapping[str, Any]
    backend: str
    source: str
    doc: Mapping[str, Any]

    def info(self) -> dict[str, Any]:
        """The ``policy`` object of a plan answer."""
        return {
            "id": self.id,
            "version": self.version,
            "name": self.name,
            "params": dict(self.params),
            "source": self.source,
        }


def _field(d: Mapping[str, Any], name: str, types: type | tuple, where: str) -> Any:
    if name not in d:
        raise ValueError(f"{where}.{name}: missing")
    v = d[name]
    if isinstance(v, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise ValueError(f"{where}.{name}: expected {types}, got {v!r}")
    if not isinstance(v, types):
        raise ValueError(f"{where}.{name}: expected {getattr(types, '__name__', types)}, got {type(v).__name__}")
    return v


class PolicyTable:
    """Published policies indexed by shape, with the lookup-and-plan rule (module doc).

    Build it with :meth:`from_json`; instances are immutable in use, so a server
    swaps a whole table on reload and in-flight requests keep the old one.
    """

    def __init__(
        self,
        entries: Sequence[PolicyEntry],
        *,
        version: int = 0,
        distance_limit: float = SERVE_DISTANCE_LIMIT,
        fallback_name: str = FALLBACK_POLICY,
        fallback_params: Mapping[str, Any] | None = None,
        doc: Mapping[str, Any] | None = None,
    ) -> None:
        if fallback_name not in POLICIES:
            raise ValueError(f"fallback.name: unknown policy {fallback_name!r}; known: {sorted(POLICIES)}")
        if not (
            isinstance(distance_limit, (int, float))
            and not isinstance(distance_limit, bool)
            and distance_limit >= 0
            and not math.isnan(distance_limit)
        ):
            raise ValueError(f"distance_limit: expected a number >= 0, got {distance_limit!r}")
        self.entries = tuple(entries)
        self.version = int(version)
        self.distance_limit = float(distance_limit)
        self.fallback_name = fallback_name
        self.fallback_params = dict(fallback_params or {})
        self.doc = doc
        groups: dict[tuple, dict[str, list[PolicyEntry]]] = {}
        for e in sorted(self.entries, key=lambda e: (e.bucket, e.id)):
            groups.setdefault(e.shape, {"tuned": [], "simulated": []})[e.source].append(e)
        # per family, every candidate as one contiguous array set, tuned rows first (the compiled lookup)
        self._rows: dict[tuple, _Rows] = {
            shape: _Rows(g.get("tuned", ()), g.get("simulated", ())) for shape, g in groups.items()
        }
        # validated shapes and what a plan needs besides the lengths, by the call's shape fields
        # (a cache of argument checks, never of a batch's key, lookup or plan)
        self._shapes: dict[tuple, _ShapeCtx] = {}

    # -- construction ----------------------------------------------------------
    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> PolicyTable:
        """Build a table from a ``GET /v1/policies`` document (module doc).

        Raises
        ------
        ValueError
            On a wrong format tag or a missing / malformed field, naming it
            (``policies[3].params`` ...), or an unknown policy name.
        """
        if not isinstance(doc, Mapping):
            raise ValueError(f"policy table: expected an object, got {type(doc).__name__}")
        fmt = doc.get("format")
        if fmt not in _LIST_KEY:
            raise ValueError(f"policy table.format: expected {TABLE_FORMAT!r}, got {fmt!r}")
        list_key = _LIST_KEY[fmt]
        version = _field(doc, "version", int, "policy table")
        limit = _field(doc, "distance_limit", (int, float), "policy table")
        fb = _field(doc, "fallback", Mapping, "policy table")
        fb_name = _field(fb, "name", str, "policy table.fallback")
        fb_params = _field(fb, "params", Mapping, "policy table.fallback")
        raw = _field(doc, list_key, list, "policy table")
        if "count" in doc and doc["count"] != len(raw):
            raise ValueError(f"policy table.count: {doc['count']!r} but {list_key} has {len(raw)} entries")
        entries = []
        seen: set[int] = set()
        for i, p in enumerate(raw):
            where = f"{list_key}[{i}]"
            if not isinstance(p, Mapping):
                raise ValueError(f"{where}: expected an object")
            pid = _field(p, "id", int, where)
            if pid in seen:
                raise ValueError(f"{where}.id: duplicate id {pid}")
            seen.add(pid)
            name = _field(p, "name", str, where)
            if name not in POLICIES:
                raise ValueError(f"{where}.name: unknown policy {name!r}; known: {sorted(POLICIES)}")
            backend = _field(p, "backend", str, where)
            if backend not in SOURCE_OF_BACKEND:
                raise ValueError(f"{where}.backend: expected 'gpu' or 'sim', got {backend!r}")
            bucket = _field(p, "bucket", str, where)
            try:
                key = BucketKey.parse(bucket)
            except ValueError as exc:
                raise ValueError(f"{where}.bucket: {exc}") from None
            declared = (
                _field(p, "gpu", str, where),
                _field(p, "num_kv_heads", int, where),
                _field(p, "head_dim", int, where),
                _field(p, "dtype", str, where),
                _field(p, "page_size", int, where),
                # optional: the key string carries them (a store's rows keep only the key); given, they must agree
                _field(p, "kv_dtype", str, where) if p.get("kv_dtype") is not None else key.family[5],
                _field(p, "q_len", int, where) if "q_len" in p else key.q_len,
            )
            shape = key.family
            if shape_family(*declared) != shape:
                raise ValueError(
                    f"{where}: gpu/num_kv_heads/head_dim/dtype/page_size/kv_dtype/q_len {declared} do not match "
                    f"bucket {bucket!r}"
                )
            entries.append(
                PolicyEntry(
                    id=pid,
                    version=_field(p, "version", int, where),
                    bucket=bucket,
                    key=key,
                    shape=shape,
                    name=name,
                    params=dict(_field(p, "params", Mapping, where)),
                    backend=backend,
                    source=SOURCE_OF_BACKEND[backend],
                    doc=p,
                )
            )
        return cls(
            entries,
            version=version,
            distance_limit=float(limit),
            fallback_name=fb_name,
            fallback_params=fb_params,
            doc=doc,
        )

    @classmethod
    def from_export(cls, export: Mapping[str, Any], *, version: int = 1) -> PolicyTable:
        """The table a store filled from a ``kvsplit db export`` document would serve (format
        ``kvsplit.policies``: ``{"policies": [{"id", "bucket": {"key", "gpu", ...}, "name", "params",
        "backend", ...}]}``, e.g. ``kernels/data/h200_policies.json``, :func:`load_shipped_table`), without a store: every entry is
        published, ``version`` defaults to 1 and ``backend`` to ``"gpu"``.

        Raises
        ------
        ValueError
            As :meth:`from_json`, on a malformed entry.
        """
        pols = [
            {
                "id": p["id"],
                "version": p.get("version", 1),
                "bucket": p["bucket"]["key"],
                **{k: p["bucket"][k] for k in _SHAPE_FIELDS + _FAMILY_EXTRA if k in p["bucket"]},
                "name": p["name"],
                "params": p["params"],
                "backend": p.get("backend", "gpu"),
            }
            for p in export["policies"]
        ]
        return cls.from_json(cls.document(pols, version=version))

    @staticmethod
    def document(
        policies: Sequence[Mapping[str, Any]], *, version: int, distance_limit: float = SERVE_DISTANCE_LIMIT
    ) -> dict[str, Any]:
        """The canonical table document for ``policies`` (entries as in the module doc)."""
        return {
            "format": TABLE_FORMAT,
            "version": int(version),
            "distance_limit": float(distance_limit),
            "fallback": {"name": FALLBACK_POLICY, "params": {}},
            "count": len(policies),
            "data": [dict(p) for p in sorted(policies, key=lambda p: p["id"])],
        }

    # -- queries -----------------------------------------------------------------
    def fallback_for(self, kv_dtype: str | None, q_len: int = 1) -> tuple[str, dict[str, Any]]:
        """``(policy name, params)`` a batch of a family without a near bucket is planned with: the table's
        fallback; where that is the default one (:data:`FALLBACK_POLICY`, no params), :func:`default_fallback` of
        the family (:data:`FP8_FALLBACK` for an FP8 family of q_len 1)."""
        if self.fallback_name == FALLBACK_POLICY and not self.fallback_params:
            return default_fallback(kv_dtype, q_len)
        return self.fallback_name, dict(self.fallback_params)

    def __len__(self) -> int:
        return len(self.entries)

    def counts(self) -> dict[str, int]:
        """Published policies by source (``tuned``, ``simulated``)."""
        out = {"tuned": 0, "simulated": 0}
        for e in self.entries:
            out[e.source] += 1
        return out

    def lookup(self, key: BucketKey) -> tuple[PolicyEntry | None, float | None]:
        """Nearest usable policy for ``key`` and its distance (module doc rule), or (None, None)."""
        r = self._rows.get(key.family)
        if r is None:
            return None, None
        kc = _cum_hist(key)
        for lo, hi in ((0, r.n_tuned), (r.n_tuned, len(r.entries))):
            if lo == hi:
                continue
            i, scaled = _fastplan.nearest_scaled(
                r.cum[lo:hi],
                r.cls[lo:hi],
                r.empty[lo:hi],
                kc,
                key.batch_class,
                key.tokens_class,
                not key.hist,
                _CLASS_UNITS,
            )
            if i >= 0 and int(scaled) / _SCALE <= self.distance_limit:
                return r.entries[lo + i], int(scaled) / _SCALE
        return None, None

    def plan(
        self,
        kv_lens: Any,
        shape: Shape | None = None,
        *,
        gpu: str | None = None,
        num_qo_heads: int | None = None,
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        dtype: str | None = None,
        page_size: int = 16,
        device: DeviceSpec | None = None,
        kv_dtype: str | None = None,
        q_len: int = 1,
    ) -> tuple[Plan, dict[str, Any], dict[str, Any]]:
        """Pick the policy of a batch's bucket and plan the batch with it.

        Parameters
        ----------
        kv_lens : array-like of int, ``[B]``
            Tokens in each request's KV cache (as :func:`kvsplit.kernels.plan.make_plan`).
        shape : Shape, optional
            The batch's validated shape (:class:`kvsplit.kernels.shape.Shape`);
            or give its fields as keywords:
        gpu : str
            GPU name or alias (``"NVIDIA H200"``, ``"h200"``); with ``device``
            given, the name of that description.
        num_qo_heads, num_kv_heads : int
            H_q and H_kv; H_q must be a multiple of H_kv.
        head_dim : int
            64, 128 or 256.
        dtype : str
            ``"float16"``, ``"bfloat16"`` or ``"float32"``.
        page_size : int
            Tokens per KV page (default 16, as :func:`kvsplit.kernels.plan.make_plan` and ``kvsplit plan``; the
            launch refuses a plan made for another page size than its cache's).
        device : DeviceSpec, optional
            Numbers of a GPU not in :mod:`kvsplit.kernels.device`'s table.
        kv_dtype : str, optional
            The KV cache's dtype (None: ``dtype``; ``"float8_e4m3fn"``).
        q_len : int
            Query tokens per request, 1..8. A batch is served only policies of its own KV dtype and q_len.

        Returns
        -------
        (Plan, bucket, policy)
            ``bucket`` = ``{"key", "matched", "distance"}`` (matched bucket key
            and distance are None on fallback); ``policy`` = ``{"id", "version",
            "name", "params", "source"}``.

        Raises
        ------
        ValueError
            On invalid arguments, naming them.
        """
        if shape is None:
            sc = fields = None
            # exact types only (1 == 1.0 == True would otherwise share a checked entry), and
            # no device or an immutable DeviceSpec (kept by identity; a mapping could change)
            if (
                type(num_kv_heads) is int
                and type(num_qo_heads) is int
                and type(head_dim) is int
                and type(page_size) is int
                and type(dtype) is str
                and (type(gpu) is str if device is None else type(device) is DeviceSpec)
                and (kv_dtype is None or type(kv_dtype) is str)
                and type(q_len) is int
            ):
                fields = (
                    gpu,
                    num_qo_heads,
                    num_kv_heads,
                    head_dim,
                    dtype,
                    page_size,
                    None if device is None else id(device),
                    kv_dtype,
                    q_len,
                )
                sc = self._shapes.get(fields)
                if sc is not None and sc.device is not device:
                    sc = None
            if sc is None:
                shape = Shape.of(
                    device=device if device is not None else gpu,
                    num_qo_heads=num_qo_heads,
                    num_kv_heads=num_kv_heads,
                    head_dim=head_dim,
                    dtype=dtype,
                    page_size=page_size,
                    kv_dtype=kv_dtype,
                    q_len=q_len,
                )
                if fields is not None:  # checked once per distinct argument tuple, then kept
                    sc = self._shape_ctx(fields, shape, device)
                else:
                    sc = _ShapeCtx(shape, self._rows.get(shape.family), self.distance_limit, None)
        else:
            if not isinstance(shape, Shape):
                raise ValueError(f"shape: expected a kvsplit.kernels.shape.Shape, got {type(shape).__name__}")
            sc = self._shapes.get(id(shape))
            if sc is None or sc.shape is not shape:
                sc = self._shape_ctx(id(shape), shape, shape)
        return sc.plan(self, kv_lens)

    def plan_buffers(self, kv_lens: Any, shape: Shape) -> tuple | None:
        """:meth:`plan` without the Plan object and the answer dicts, for a writer of the answer (the plan service).

        Returns ``(B, W, nc, b64, b32, spec, key, entry, distance)``: the compiled planner's buffers
        (:func:`kvsplit.kernels.fastplan.run_spec`), the resolved policy (:class:`~kvsplit.kernels.rulespec.RuleSpec`:
        ``spec.fields`` and ``spec.params`` are the Plan's other fields), the bucket key's text (ASCII letters,
        digits, ``.``, ``-``: uint8), the matched :class:`PolicyEntry` (None: the fallback) and its distance (None on
        fallback) -- the same plan, key, match and distance as :meth:`plan`. None when ``shape`` is not a
        :class:`Shape`. Raises :meth:`plan`'s ValueError.
        """
        sc = self._shapes.get(id(shape))
        if sc is None or sc.shape is not shape:
            if not isinstance(shape, Shape):
                return None
            sc = self._shape_ctx(id(shape), shape, shape)
        L, key, entry, scaled, sp, W, nc, b64, b32 = sc.run(self, kv_lens)
        return L.shape[0], W, nc, b64, b32, sp, key, entry, None if entry is None else int(scaled) / _SCALE

    def _shape_ctx(self, cache_key: Any, shape: Shape, owner: Any) -> _ShapeCtx:
        if len(self._shapes) >= 64:
            self._shapes.clear()
        sc = _ShapeCtx(shape, self._rows.get(shape.family), self.distance_limit, owner if owner is not shape else None)
        self._shapes[cache_key] = sc
        return sc


class _Rows:
    """One family's candidates for the compiled lookup: tuned rows then simulated
    rows, each part sorted by (bucket string, id): the first minimum of the distance is
    :func:`kvsplit.kernels.buckets.nearest`'s tie-break."""

    def __init__(self, tuned: Sequence[PolicyEntry], simulated: Sequence[PolicyEntry]) -> None:
        self.entries = list(tuned) + list(simulated)
        self.n_tuned = len(tuned)
        n = len(self.entries)
        self.cum = np.zeros((n, NUM_BINS), dtype=np.int64)
        for i, e in enumerate(self.entries):
            self.cum[i] = _cum_hist(e.key)
        self.cls = np.array([(e.key.batch_class, e.key.tokens_class) for e in self.entries], dtype=np.int64).reshape(
            n, 2
        )
        self.empty = np.array([not e.key.hist for e in self.entries], dtype=np.bool_)


_NO_ROWS = _Rows((), ())


class _ShapeCtx:
    """A validated shape of :meth:`PolicyTable.plan` and what planning with it
    needs besides the lengths: the family's candidate rows, the key prefix, the
    scaled distance limit, and the parsed policy of each row (made on first use)."""

    def __init__(self, shape: Shape, rows: _Rows | None, limit: float, device: Any) -> None:
        self.shape = shape
        self.device = device  # the ``device`` argument the entry was made for (identity)
        self.ctx = shape.plan_context()
        self.rows = rows if rows is not None else _NO_ROWS
        self.prefix = key_prefix(*shape.family)
        self.prefix_bytes = np.frombuffer(self.prefix.encode("ascii"), np.uint8).copy()
        self.lim = float(limit) * _SCALE  # d <= limit  <=>  scaled <= limit * 2^k (exact)
        n = len(self.rows.entries)
        self.specs: list[Any] = [None] * (n + 1)  # resolved policy of each row, the fallback's last
        self.spec_rows = np.zeros((n + 1, _fastplan.SV_LEN), np.int64)  # the same for the compiled pass

    def _parse(self, table: PolicyTable, i: int) -> Any:
        """Parse row ``i``'s policy (the fallback's for the last row), the reference's ValueError on bad params."""
        if i < len(self.rows.entries):
            name, params = self.rows.entries[i].name, self.rows.entries[i].params
        else:
            name, params = table.fallback_for(self.shape.kv_dtype, self.shape.q_len)
        c = self.ctx
        params = fit_heads_per_tile(params, self.shape.num_qo_heads, c.num_kv_heads, c.q_len)
        sp = resolve(
            name,
            params,
            num_kv_heads=c.num_kv_heads,
            device=c.device,
            head_dim=c.head_dim,
            page_size=c.page_size,
            dtype=c.dtype,
            kv_dtype=c.kv_dtype,
            q_len=c.q_len,
            num_qo_heads=self.shape.num_qo_heads,
        )
        _fastplan.spec_vector(sp, self.spec_rows[i])
        self.specs[i] = sp
        return sp

    def run(self, table: PolicyTable, kv_lens: Any) -> tuple:
        """The compiled key, lookup and plan pass (which checks the lengths), one call:
        ``(L, key, entry, scaled, spec, W, nc, b64, b32)``; ``key`` the bucket key's text as ASCII
        (uint8); ``entry`` None for the fallback; ``spec`` the parsed policy, False for one the
        compiled core does not plan (then no buffers: W is -1)."""
        L = _fastplan.as_kv_lens(kv_lens)
        r = self.rows
        while True:
            status, info, key, i, scaled, W, nc, b64, b32 = _fastplan.key_plan(
                L, r.cum, r.cls, r.empty, r.n_tuned, _CLASS_UNITS, self.lim, self.spec_rows, self.prefix_bytes
            )
            if status == 0:
                break
            if status == 1:
                raise _fastplan.range_error(L, info)
            if status == 2:
                raise _fastplan.too_many_items(info)
            j = i if i >= 0 else len(r.entries)  # status 3: the row's policy is resolved on first use
            self._parse(table, j)
        if self.shape.q_len > 1:  # (after the compiled pass's range check)
            check_covers_q_len(L, self.shape.q_len)
        sp = self.specs[i if i >= 0 else -1]
        if sp.whole_wave_specs:  # the whole-wave rule of the matched policy
            alt = _fastplan.whole_wave_spec(L, sp)
            if alt is not sp:
                sp = alt
                W, nc, b64, b32 = _fastplan.run_spec(L, sp, False)
        if i < 0:
            return L, key, None, 0, sp, W, nc, b64, b32
        return L, key, r.entries[i], scaled, sp, W, nc, b64, b32

    def plan(self, table: PolicyTable, kv_lens: Any) -> tuple[Plan, dict[str, Any], dict[str, Any]]:
        """:meth:`PolicyTable.plan` on the compiled core: one conversion and one compiled
        key, lookup and plan pass (:meth:`run`)."""
        L, key, entry, scaled, sp, W, nc, b64, b32 = self.run(table, kv_lens)
        key = key.tobytes().decode()
        plan = _fastplan.plan_of_buffers(L.shape[0], W, nc, b64, b32, sp)
        if entry is None:
            name, params = table.fallback_for(self.shape.kv_dtype, self.shape.q_len)
            return (
                plan,
                {"key": key, "matched": None, "distance": None},
                {"id": None, "version": None, "name": name, "params": params, "source": "fallback"},
            )
        return plan, {"key": key, "matched": entry.bucket, "distance": int(scaled) / _SCALE}, entry.info()


def _cum_hist(key: BucketKey) -> np.ndarray:
    h = np.zeros(NUM_BINS, dtype=np.int64)
    for b, u in key.hist:
        h[b] = u
    return np.cumsum(h)


_SCALE, _CLASS_UNITS = SCALE, SCALED_CLASS_UNITS


def check_policy_entry(entry: Mapping[str, Any]) -> None:
    """Raise ValueError unless a policy entry can be served.

    ``entry`` is either the ``kvsplit db export`` form (``bucket`` an object
    with the key and shape fields) or a policy-table entry (module doc:
    ``bucket`` the key string, the shape fields beside it).

    Checks that the policy name is known, that its params make a plan for its
    bucket's shape (:func:`~kvsplit.kernels.rulespec.resolve`), and that the bucket key parses
    (``BucketKey.parse``) and agrees with the bucket fields. Used by
    ``kvsplit db import``, ``POST /v1/policies/import`` and the service's table
    loader, so an entry that could not be served never reaches a table.
    """

    b = entry["bucket"]
    if isinstance(b, str):  # a policy-table entry
        b = {
            "key": b,
            **{f: entry[f] for f in _SHAPE_FIELDS},
            **{f: entry[f] for f in _FAMILY_EXTRA if f in entry},
        }
    if entry["name"] not in POLICIES:
        raise ValueError(f"name: unknown policy {entry['name']!r}; known: {sorted(POLICIES)}")
    try:
        device: Any = DeviceSpec.known(b["gpu"])
    except ValueError:
        d = entry.get("device")
        if d is None:
            raise ValueError(f"bucket.gpu: unknown GPU {b['gpu']!r} and no device numbers in the entry") from None
        device = DeviceSpec(
            name=d["name"],
            num_sms=d["num_sms"],
            hbm_bandwidth_gbps=d["hbm_bandwidth_gbps"],
            l2_bytes=50 * 2**20,
            smem_per_sm_bytes=228 * 1024,
            smem_per_block_bytes=227 * 1024,
        )
    try:
        key = BucketKey.parse(b["key"])
    except ValueError as exc:
        raise ValueError(f"bucket.key: {exc}") from None
    try:
        resolve(
            entry["name"],
            entry["params"],
            num_kv_heads=b["num_kv_heads"],
            device=device,
            head_dim=b["head_dim"],
            page_size=b["page_size"],
            dtype=b["dtype"],
            kv_dtype=key.kv_dtype,
            q_len=key.q_len,
        )
    except ValueError as exc:
        raise ValueError(f"params do not make a plan: {exc}") from None
    expect = {"gpu": gpu_slug(b["gpu"]), **{f: b[f] for f in ("num_kv_heads", "head_dim", "dtype", "page_size")}}
    for f, v in expect.items():
        if getattr(key, f) != v:
            raise ValueError(f"bucket.key: its {f} {getattr(key, f)!r} differs from the entry's {v!r}")
    fam = key.family
    for f, v, i in (("kv_dtype", b.get("kv_dtype"), 5), ("q_len", b.get("q_len"), 6)):
        if v is not None and v != fam[i]:
            raise ValueError(f"bucket.key: its {f} {fam[i]!r} differs from the entry's {v!r}")


SHIPPED_TABLES = ("data/h200_policies.json", "data/h100_policies.json")
"""The GPU-tuned tables the project ships, inside this package (format ``kvsplit.policies``, ``kvsplit db export``
documents; head_dim 128, bf16, page 16): the H200's, 263 published policies for H_kv 1, 4 and 8 (the three model
shapes), and the H100's (NVIDIA H100 80GB HBM3), 859: 123 for each of the same three shapes, built by
``kvsplit tune --campaign`` from an empty store, one campaign per shape, and on that store two more of the
Qwen3-30B-A3B shape (H_kv 4): 122 buckets at q_len 2 and 123 at q_len 4; then 123 at q_len 8 and 122 with an fp8
KV cache, each from a campaign on a store of its own (docs/results.md)."""


EXPORT_FORMAT = "kvsplit.policies"
"""The ``format`` of a policies export (``kvsplit db export``; :data:`kvsplit.db.store.EXPORT_FORMAT` names the
same string on the store's side, which this layer does not import)."""


def read_export(path: str | Path, *, arg: str) -> dict[str, Any]:
    """The ``kvsplit.policies`` export document (``kvsplit db export``, a shipped table) in the file ``path``, parsed.

    Checks what every reader of such a file needs: a JSON object whose ``format`` is :data:`EXPORT_FORMAT` and
    whose ``policies`` is a list. The entries themselves are checked where they are used
    (:meth:`PolicyTable.from_export`, ``kvsplit db import``).

    ``arg`` names the argument the path came from (``"--table"``, ``"--previous"``); every error names it.

    Raises
    ------
    ValueError
        ``"<arg>: cannot read <path>: ..."`` when the file cannot be read or is not JSON;
        ``"<arg>: <path> is not a kvsplit.policies export (kvsplit db export)"`` otherwise.
    """
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{arg}: cannot read {str(path)!r}: {exc}") from None
    if not isinstance(doc, Mapping) or doc.get("format") != EXPORT_FORMAT or not isinstance(doc.get("policies"), list):
        raise ValueError(f"{arg}: {str(path)!r} is not a {EXPORT_FORMAT} export (kvsplit db export)")
    return dict(doc)


def shipped_policies() -> dict[str, Any]:
    """The shipped tables (:data:`SHIPPED_TABLES`) as one policy export document: every table's policies, and the
    first table's (the H200's) ``format``, ``exported_at`` and ``policies_version``, which name the shipped set.
    Each file is a plain ``kvsplit db export`` whose ids are those of the store it came from, so they repeat
    across files; here every policy is numbered 1, 2, ... in file order, table after table, the ids an empty store
    gives them when it imports this document (``kvsplit db import``, the service's first start): a policy's id is
    the same in-process (:func:`load_shipped_table`) and over HTTP from such a store."""
    policies: list[dict[str, Any]] = []
    first: dict[str, Any] = {}
    for f in SHIPPED_TABLES:
        doc = json.loads(resources.files(__package__).joinpath(f).read_text())
        first = first or doc
        policies += [{**p, "id": len(policies) + i + 1} for i, p in enumerate(doc["policies"])]
    return {**first, "policies": policies}


def load_shipped_table() -> PolicyTable:
    """The table the shipped policies serve, in-process (no store, no server): :meth:`PolicyTable.from_export` of
    :func:`shipped_policies`, every entry published at version 1, the fallback ``balanced``.

    Example::

        from kvsplit.kernels import load_shipped_table
        plan, bucket, policy = load_shipped_table().plan(kv_lens, gpu="NVIDIA H200", num_qo_heads=32,
                                                          num_kv_heads=4, head_dim=128, dtype="bfloat16")
    """
    return PolicyTable.from_export(shipped_policies())
