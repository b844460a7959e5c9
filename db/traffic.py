"""Traffic statistics of the plan service in the store (part of :mod:`kvsplit.db.store`).

The service aggregates what it serves per bucket key and hour in memory
(:mod:`kvsplit.service.traffic`) and adds each aggregate here with
:func:`add_traffic`: one ``INSERT ... ON CONFLICT DO UPDATE SET requests =
traffic.requests + excluded.requests, ...`` per row (SQLite >= 3.24 and
PostgreSQL), so several server processes adding into the same (key, hour) at
once never lose a count; ranges merge with min / max, the distance sum adds.
Nothing here holds a batch's lengths: only counts, ranges and the coarse
histograms of :class:`~kvsplit.db.models.TrafficBin`.

``hour`` is ``floor(unix seconds / 3600)`` (UTC hours since the epoch).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import and_, case, delete, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from .models import TRAFFIC_BIN_KINDS, Traffic, TrafficBin

__all__ = ["TrafficCell", "add_traffic", "prune_traffic", "read_traffic", "TrafficSum"]


@dataclass
class TrafficCell:
    """The requests of one (bucket key, hour) as one server process aggregated them.

    ``batch_bins`` / ``tokens_bins`` map ``x.bit_length()`` to a request count
    (:class:`~kvsplit.db.models.TrafficBin`). ``distance_sum`` and
    ``distance_max`` are over the requests answered by a tuned or simulated
    policy (``n_tuned + n_simulated``); ``distance_max`` is None when there
    were none.
    """

    key: str
    hour: int
    requests: int = 0
    n_tuned: int = 0
    n_simulated: int = 0
    n_fallback: int = 0
    n_far: int = 0
    batch_min: int = 0
    batch_max: int = 0
    tokens_min: int = 0
    tokens_max: int = 0
    distance_max: float | None = None
    distance_sum: float = 0.0
    batch_bins: dict[int, int] = field(default_factory=dict)
    tokens_bins: dict[int, int] = field(default_factory=dict)


def _insert_for(session: Session):
    name = session.get_bind().dialect.name
    if name == "postgresql":
        return postgresql.insert
    if name == "sqlite":
        return sqlite.insert
    raise ValueError(
        f"traffic statistics: the {name!r} database has no INSERT ... ON CONFLICT; use SQLite or PostgreSQL"
    )


def _least(a, b):
    return case((b < a, b), else_=a)


def _greatest(a, b):
    return case((b > a, b), else_=a)


def add_traffic(session: Session, cells: Iterable[TrafficCell]) -> int:
    """Add ``cells`` into the store (atomic upsert-add per row, module doc); returns the rows written.

    Raises
    ------
    ValueError
        A cell with ``requests < 1`` (nothing to add), or a database without ``ON CONFLICT``.
    """
    cells = list(cells)
    if not cells:
        return 0
    for c in cells:
        if c.requests < 1:
            raise ValueError(f"traffic cell {c.key!r} hour {c.hour}: requests must be >= 1, got {c.requests}")
    insert = _insert_for(session)
    rows = [
        {
            "key": c.key,
            "hour": c.hour,
            "requests": c.requests,
            "n_tuned": c.n_tuned,
            "n_simulated": c.n_simulated,
            "n_fallback": c.n_fallback,
            "n_far": c.n_far,
            "batch_min": c.batch_min,
            "batch_max": c.batch_max,
            "tokens_min": c.tokens_min,
            "tokens_max": c.tokens_max,
            "distance_max": c.distance_max,
            "distance_sum": c.distance_sum,
        }
        for c in sorted(cells, key=lambda c: (c.key, c.hour))  # one lock order for every writer (PostgreSQL)
    ]
    t = Traffic.__table__
    stmt = insert(t)
    ex = stmt.excluded
    dmax_ex = func.coalesce(ex.distance_max, t.c.distance_max)
    dmax_cur = func.coalesce(t.c.distance_max, ex.distance_max)
    stmt = stmt.on_conflict_do_update(
        index_elements=[t.c.key, t.c.hour],
        set_={
            **{n: t.c[n] + ex[n] for n in ("requests", "n_tuned", "n_simulated", "n_fallback", "n_far")},
            "distance_sum": t.c.distance_sum + ex.distance_sum,
            "batch_min": _least(t.c.batch_min, ex.batch_min),
            "batch_max": _greatest(t.c.batch_max, ex.batch_max),
            "tokens_min": _least(t.c.tokens_min, ex.tokens_min),
            "tokens_max": _greatest(t.c.tokens_max, ex.tokens_max),
            "distance_max": _greatest(dmax_cur, dmax_ex),
        },
    )
    session.execute(stmt, rows)
    bins = [
        {"key": c.key, "hour": c.hour, "kind": kind, "bin": int(b), "n": int(n)}
        for c in sorted(cells, key=lambda c: (c.key, c.hour))
        for kind, hist in (("batch", c.batch_bins), ("tokens", c.tokens_bins))
        for b, n in sorted(hist.items())
    ]
    if bins:
        tb = TrafficBin.__table__
        bstmt = insert(tb)
        bstmt = bstmt.on_conflict_do_update(
            index_elements=[tb.c.key, tb.c.hour, tb.c.kind, tb.c.bin], set_={"n": tb.c.n + bstmt.excluded.n}
        )
        session.execute(bstmt, bins)
    return len(rows)


def prune_traffic(session: Session, *, before_hour: int) -> int:
    """Delete the statistics of every hour before ``before_hour``; returns the ``traffic`` rows deleted."""
    n = session.execute(delete(Traffic).where(Traffic.hour < before_hour)).rowcount
    session.execute(delete(TrafficBin).where(TrafficBin.hour < before_hour))
    return int(n or 0)


@dataclass(frozen=True)
class TrafficSum:
    """One bucket key's statistics summed over a window of hours (:func:`read_traffic`)."""

    key: str
    requests: int
    n_tuned: int
    n_simulated: int
    n_fallback: int
    n_far: int
    batch_min: int
    batch_max: int
    tokens_min: int
    tokens_max: int
    distance_max: float | None
    distance_sum: float
    first_hour: int
    last_hour: int
    batch_bins: Mapping[int, int]
    tokens_bins: Mapping[int, int]


def read_traffic(session: Session, *, since_hour: int) -> list[TrafficSum]:
    """Per bucket key, the statistics of the hours ``>= since_hour`` summed, most requests first
    (ties by key)."""
    T = Traffic
    q = (
        select(
            T.key,
            func.sum(T.requests),
            func.sum(T.n_tuned),
            func.sum(T.n_simulated),
            func.sum(T.n_fallback),
            func.sum(T.n_far),
            func.min(T.batch_min),
            func.max(T.batch_max),
            func.min(T.tokens_min),
            func.max(T.tokens_max),
            func.max(T.distance_max),
            func.sum(T.distance_sum),
            func.min(T.hour),
            func.max(T.hour),
        )
        .where(T.hour >= since_hour)
        .group_by(T.key)
    )
    bins: dict[str, dict[str, dict[int, int]]] = {}
    bq = (
        select(TrafficBin.key, TrafficBin.kind, TrafficBin.bin, func.sum(TrafficBin.n))
        .where(and_(TrafficBin.hour >= since_hour, TrafficBin.kind.in_(TRAFFIC_BIN_KINDS)))
        .group_by(TrafficBin.key, TrafficBin.kind, TrafficBin.bin)
    )
    for key, kind, b, n in session.execute(bq):
        bins.setdefault(key, {k: {} for k in TRAFFIC_BIN_KINDS})[kind][int(b)] = int(n)
    out = []
    for r in session.execute(q):
        hb: dict[str, Any] = bins.get(r[0], {})
        out.append(
            TrafficSum(
                key=r[0],
                requests=int(r[1]),
                n_tuned=int(r[2]),
                n_simulated=int(r[3]),
                n_fallback=int(r[4]),
                n_far=int(r[5]),
                batch_min=int(r[6]),
                batch_max=int(r[7]),
                tokens_min=int(r[8]),
                tokens_max=int(r[9]),
                distance_max=None if r[10] is None else float(r[10]),
                distance_sum=float(r[11] or 0.0),
                first_hour=int(r[12]),
                last_hour=int(r[13]),
                batch_bins=dict(sorted(hb.get("batch", {}).items())),
                tokens_bins=dict(sorted(hb.get("tokens", {}).items())),
            )
        )
    out.sort(key=lambda s: (-s.requests, s.key))
    return out
