"""Traffic statistics of the plan service: what it served, per bucket key and hour, bounded and private.

Each ``POST /v1/plan`` answered 200 appends one tuple (key, B, total tokens, source, distance, time) to this
process's :class:`TrafficRecorder` log: one ``list.append``, no lock and no database access on the request
path (about 0.2 us). The log is folded into cells (bucket key, hour) off the request path: every quarter
second by the server's flush task in a worker thread, in slices of :data:`FOLD_SLICE` requests between which
it releases the GIL to the event loop; before every flush; and on the request path only when :data:`MAX_LOG`
entries wait (a flush task that cannot keep up). A cell holds the request count, the batch-size and
total-token ranges, a coarse histogram of each (bin = ``x.bit_length()``, so bin k holds ``2^(k-1) <= x <
2^k``), requests per answer source (``tuned`` / ``simulated`` / ``fallback``), the requests matched farther
than :data:`kvsplit.kernels.buckets.DISTANCE_LIMIT` (``far``: served by a neighbour's policy, not their own
bucket's) and the largest and summed distance of the matched ones. The bucket key itself carries the batch's
length signature (its token-weighted half-octave histogram, :mod:`kvsplit.kernels.buckets`); no kv_lens is
ever kept.

Every ``KVSPLIT_TRAFFIC_FLUSH_INTERVAL_S`` seconds (and at shutdown, and before ``GET /v1/traffic``
answers) the process adds its cells into the store (:func:`kvsplit.db.traffic.add_traffic`, an atomic
upsert-add, so the workers of ``kvsplit serve --workers N`` and several servers on one store add up
exactly) and deletes the hours older than ``KVSPLIT_TRAFFIC_RETENTION_HOURS``. A flush that fails (store
unreachable) keeps its cells for the next one. At most :data:`MAX_CELLS` cells wait in memory: a request
of a new cell beyond that is not recorded and is counted in ``kvsplit_traffic_dropped_total``.
``KVSPLIT_TRAFFIC=0`` turns all of it off (no recorder; ``GET /v1/traffic`` still reads the store).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Optional

from pydantic import BaseModel, Field

from ..db import store
from ..kernels.buckets import DISTANCE_LIMIT, BucketKey, key_prefix
from . import metrics

__all__ = [
    "TrafficRecorder",
    "TrafficRow",
    "HistBin",
    "traffic_summary",
    "current_hour",
    "iso_hour",
    "MAX_CELLS",
    "MAX_LOG",
    "FAR_DISTANCE",
    "SOURCE_INDEX",
]

log = logging.getLogger("kvsplit.service")

MAX_CELLS = 10_000
"""Most (bucket key, hour) cells one process holds between flushes (each a few hundred bytes)."""
MAX_LOG = 65_536
"""Most requests the log holds before :meth:`TrafficRecorder.record` folds it itself (about 250 bytes each)."""
FOLD_INTERVAL_S = 0.25
"""Seconds between the flush task's folds of the log into cells."""
FOLD_SLICE = 256
"""Requests the flush task folds before it releases the GIL to the event loop."""
FAR_DISTANCE = DISTANCE_LIMIT
"""A request matched at a distance above this counts as ``far`` (its own bucket is not tuned)."""
SOURCE_INDEX = {"tuned": 1, "simulated": 2, "fallback": 3}
"""The ``source`` argument of :meth:`TrafficRecorder.record` for each answer source."""
# cell layout (a list: cheaper to update than an object; fold() uses the literal indices): requests, n_tuned,
# n_simulated, n_fallback, n_far, batch_min, batch_max, tokens_min, tokens_max, distance_max (None), distance_sum,
# joint bins {B.bit_length() << 8 | T.bit_length(): requests}
_N, _FAR, _BMIN, _BMAX, _TMIN, _TMAX, _DMAX, _DSUM, _BINS = 0, 4, 5, 6, 7, 8, 9, 10, 11


def _marginal(joint: dict[int, int], shift: int) -> dict[int, int]:
    out: dict[int, int] = {}
    for b, n in joint.items():
        x = (b >> shift) & 0xFF
        out[x] = out.get(x, 0) + n
    return out


def current_hour(now: float | None = None) -> int:
    """``floor(unix seconds / 3600)``: the hour a request is counted in (UTC)."""
    return int((time.time() if now is None else now) // 3600)


class TrafficRecorder:
    """This process's traffic cells between flushes (module doc).

    Parameters
    ----------
    url : str
        SQLAlchemy URL of the store the cells are flushed into.
    retention_hours : int
        Hours kept in the store; older ones are deleted at each flush.
    clock : callable () -> float
        Unix seconds (``time.time``; tests pass their own).
    max_cells : int
        Bound of the cells held in memory.
    max_log : int
        Requests the log holds before :meth:`record` folds it on the request path.
    """

    def __init__(
        self,
        url: str,
        *,
        retention_hours: int,
        clock: Callable[[], float] = time.time,
        max_cells: int = MAX_CELLS,
        max_log: int = MAX_LOG,
    ) -> None:
        self.url = url
        self.retention_hours = int(retention_hours)
        self.clock = clock
        self.max_cells = int(max_cells)
        self.max_log = int(max_log)
        self._lock = threading.Lock()  # the cells and the folding of the log
        self._flush_lock = threading.Lock()
        self._log: list[tuple] = []  # appended by record() without a lock (list.append is atomic)
        self._cells: dict[tuple[bytes, int], list] = {}
        self._dropped = metrics.adder(metrics.TRAFFIC_DROPPED)

    def record(self, key: bytes, batch_size: int, total_tokens: int, source: int, distance: float | None) -> None:
        """Count one answered request: appends it to the log (about 0.2 us; the cells are updated when the log
        is folded, module doc).

        Parameters
        ----------
        key : bytes
            The bucket key's string form, ASCII.
        batch_size : int
            B (>= 1).
        total_tokens : int
            sum(kv_len) (>= 0).
        source : int
            :data:`SOURCE_INDEX` of the answer's source (``tuned``, ``simulated``, ``fallback``).
        distance : float or None
            Distance to the matched bucket; None on fallback.
        """
        log = self._log
        log.append((key, batch_size, total_tokens, source, distance, self.clock()))
        if len(log) >= self.max_log:
            self.fold()

    def fold(self, slice_size: int | None = None) -> None:
        """Move the logged requests into their cells (the hour of each is the one it was recorded in). Safe
        against concurrent :meth:`record` calls: it takes the log's first entries and deletes exactly those, so
        a request appended meanwhile stays for the next fold. With ``slice_size``, in slices of that many
        requests, releasing the GIL between them (``time.sleep(0)``): the flush task's worker thread folds
        this way, so the event loop's requests never wait behind a whole fold."""
        n = len(self._log)
        step = n if slice_size is None else max(1, int(slice_size))
        while n > 0:
            with self._lock:
                done = self._fold_locked(min(n, step))
            if not done:
                return
            n -= done
            if n > 0:
                time.sleep(0)

    def _fold_locked(self, n: int) -> int:
        """Fold the log's first ``n`` entries (``self._lock`` held); returns how many."""
        log = self._log
        if n <= 0:
            return 0
        items = log[:n]
        n = len(items)
        del log[:n]
        cells = self._cells
        for key, batch_size, total_tokens, source, distance, t in items:
            k = (key, int(t // 3600))
            c = cells.get(k)
            if c is None:
                if len(cells) >= self.max_cells:
                    self._dropped()
                    continue
                c = cells[k] = [0, 0, 0, 0, 0, batch_size, batch_size, total_tokens, total_tokens, None, 0.0, {}]
            c[0] += 1
            c[source] += 1
            if batch_size < c[5]:
                c[5] = batch_size
            elif batch_size > c[6]:
                c[6] = batch_size
            if total_tokens < c[7]:
                c[7] = total_tokens
            elif total_tokens > c[8]:
                c[8] = total_tokens
            h = c[11]
            bins = (batch_size.bit_length() << 8) | total_tokens.bit_length()
            h[bins] = h.get(bins, 0) + 1
            if distance is not None:
                c[10] += distance
                if c[9] is None or distance > c[9]:
                    c[9] = distance
                if distance > FAR_DISTANCE:
                    c[4] += 1
        return n

    def pending(self) -> int:
        """Requests recorded and not yet flushed (those beyond :attr:`max_cells` cells are dropped at the fold)."""
        self.fold()
        with self._lock:
            return sum(c[_N] for c in self._cells.values())

    def _take(self) -> dict[tuple[bytes, int], list]:
        self.fold()
        with self._lock:
            cells, self._cells = self._cells, {}
        return cells

    def _give_back(self, cells: dict[tuple[bytes, int], list]) -> None:
        """Merge cells of a failed flush back (bounded like :meth:`record`)."""
        with self._lock:
            for k, c in cells.items():
                cur = self._cells.get(k)
                if cur is None:
                    if len(self._cells) >= self.max_cells:
                        metrics.TRAFFIC_DROPPED.inc(c[_N])
                        continue
                    self._cells[k] = c
                    continue
                for i in range(_BMIN):
                    cur[i] += c[i]
                cur[_BMIN] = min(cur[_BMIN], c[_BMIN])
                cur[_BMAX] = max(cur[_BMAX], c[_BMAX])
                cur[_TMIN] = min(cur[_TMIN], c[_TMIN])
                cur[_TMAX] = max(cur[_TMAX], c[_TMAX])
                ds = [d for d in (cur[_DMAX], c[_DMAX]) if d is not None]
                cur[_DMAX] = max(ds) if ds else None
                cur[_DSUM] += c[_DSUM]
                for b, n in c[_BINS].items():
                    cur[_BINS][b] = cur[_BINS].get(b, 0) + n

    def flush(self) -> int:
        """Add the pending cells into the store and prune hours past the retention; returns the requests
        written. On a store error the cells are kept for the next flush and the error is raised."""
        with self._flush_lock:
            cells = self._take()
            before = current_hour(self.clock()) - self.retention_hours + 1
            rows = [
                store.TrafficCell(
                    key=k.decode("ascii"),
                    hour=h,
                    requests=c[_N],
                    n_tuned=c[1],
                    n_simulated=c[2],
                    n_fallback=c[3],
                    n_far=c[_FAR],
                    batch_min=c[_BMIN],
                    batch_max=c[_BMAX],
                    tokens_min=c[_TMIN],
                    tokens_max=c[_TMAX],
                    distance_max=c[_DMAX],
                    distance_sum=c[_DSUM],
                    batch_bins=_marginal(c[_BINS], 8),
                    tokens_bins=_marginal(c[_BINS], 0),
                )
                for (k, h), c in cells.items()
                if h >= before
            ]
            try:
                with store.session_scope(self.url, write=True) as s:
                    store.add_traffic(s, rows)
                    store.prune_traffic(s, before_hour=before)
            except BaseException:
                self._give_back(cells)
                metrics.TRAFFIC_FLUSHES.labels("error").inc()
                raise
            metrics.TRAFFIC_FLUSHES.labels("ok").inc()
            return sum(r.requests for r in rows)

    async def run(self, interval_s: float, fold_interval_s: float = FOLD_INTERVAL_S) -> None:
        """Fold the log every ``fold_interval_s`` seconds (in slices of :data:`FOLD_SLICE`) and flush every
        ``interval_s`` seconds, both in a worker thread (it uses the loop's idle time), until cancelled (flush
        errors are logged and retried next time)."""
        step = min(float(interval_s), float(fold_interval_s))
        next_flush = time.monotonic() + interval_s
        while True:
            await asyncio.sleep(step)
            if time.monotonic() < next_flush:
                await asyncio.to_thread(self.fold, FOLD_SLICE)
                continue
            next_flush = time.monotonic() + interval_s
            try:
                await asyncio.to_thread(self.flush)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - a store error: keep serving, keep the counts
                log.warning("traffic statistics flush failed (kept for the next one): %s", exc)


class HistBin(BaseModel):
    """``requests`` requests had a value in ``[lo, hi]``."""

    lo: int
    hi: int
    requests: int


class TrafficRow(BaseModel):
    """One bucket key's traffic summed over a window of hours (:func:`traffic_summary`)."""

    key: str = Field(description="bucket key (kvsplit.kernels.buckets string form)")
    family: str = Field(
        description="the key's family part: gpu, H_kv, head_dim, dtype, page_size and, when not the defaults, the "
        "KV dtype (.kvfp8) and q_len (.q4)"
    )
    requests: int
    b_min: int = Field(description="smallest batch size B")
    b_max: int
    tokens_min: int = Field(description="smallest sum(kv_len) of a request")
    tokens_max: int
    batch_hist: list[HistBin] = Field(description="requests per log2 class of B")
    tokens_hist: list[HistBin] = Field(description="requests per log2 class of sum(kv_len)")
    by_source: dict[str, int] = Field(description="requests per answer source: tuned, simulated, fallback")
    far: int = Field(description=f"requests matched at a distance above {FAR_DISTANCE:g} (a neighbour's policy)")
    max_distance: Optional[float] = Field(description="largest distance of a matched request; null: none matched")
    mean_distance: Optional[float] = Field(description="mean distance of the matched (tuned + simulated) requests")
    first_hour: str = Field(description="start of the first hour with requests (ISO 8601, UTC)")
    last_hour: str


def _family(key: str) -> str:
    """The family part of a stored key's string (:func:`kvsplit.kernels.buckets.key_prefix` of its family)."""
    try:
        return key_prefix(*BucketKey.parse(key).family)
    except ValueError:  # not a key this version writes: the whole string is its own family
        return key


def _hist(bins: dict[int, int]) -> list[HistBin]:
    return [HistBin(lo=0 if b == 0 else 1 << (b - 1), hi=(1 << b) - 1, requests=n) for b, n in sorted(bins.items())]


def iso_hour(h: int) -> str:
    """The UTC start of hour ``h`` (:func:`current_hour` units: unix seconds // 3600) as ``"YYYY-MM-DDTHH:00:00Z"``."""
    return time.strftime("%Y-%m-%dT%H:00:00Z", time.gmtime(h * 3600))


def traffic_summary(session, *, hours: int, now: float | None = None) -> list[TrafficRow]:
    """Per bucket key, the traffic of the last ``hours`` hours (the current hour and the ``hours - 1``
    before it), most requests first.

    Parameters
    ----------
    session : sqlalchemy.orm.Session
        A session of the store (:func:`kvsplit.db.store.session_scope`).
    hours : int
        Window length, >= 1.
    now : float, optional
        Unix seconds (default: now).

    Raises
    ------
    ValueError
        ``hours`` is not an integer >= 1.
    """
    if isinstance(hours, bool) or not isinstance(hours, int) or hours < 1:
        raise ValueError(f"hours: expected an integer >= 1, got {hours!r}")
    since = current_hour(now) - hours + 1
    out = []
    for t in store.read_traffic(session, since_hour=since):
        matched = t.n_tuned + t.n_simulated
        out.append(
            TrafficRow(
                key=t.key,
                family=_family(t.key),
                requests=t.requests,
                b_min=t.batch_min,
                b_max=t.batch_max,
                tokens_min=t.tokens_min,
                tokens_max=t.tokens_max,
                batch_hist=_hist(dict(t.batch_bins)),
                tokens_hist=_hist(dict(t.tokens_bins)),
                by_source={"tuned": t.n_tuned, "simulated": t.n_simulated, "fallback": t.n_fallback},
                far=t.n_far,
                max_distance=t.distance_max,
                mean_distance=(t.distance_sum / matched) if matched else None,
                first_hour=iso_hour(t.first_hour),
                last_hour=iso_hour(t.last_hour),
            )
        )
    return out
