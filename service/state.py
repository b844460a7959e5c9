"""The served policy table and its reload loop.

:class:`ServedTable` is an immutable snapshot: the :class:`PolicyTable`, the
``GET /v1/policies`` document as bytes and its ETag. :class:`TableHolder` keeps
the current snapshot and replaces it whole (one attribute assignment, atomic
under the GIL), so a request that already took a snapshot finishes with it and
none is dropped during a reload. The reload loop polls the store's
``policies_version`` every ``KVSPLIT_RELOAD_INTERVAL_S`` seconds in a worker
thread; admin routes call :meth:`TableHolder.reload` right after they commit.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from ..kernels.buckets import gpu_slug
from ..kernels.policy_table import PolicyTable
from . import metrics

__all__ = ["ServedTable", "TableHolder"]

log = logging.getLogger("kvsplit.service")


def _slug_or_none(name: str) -> str:
    """gpu_slug(name), or a value no policy has for a name without letters or digits."""
    try:
        return gpu_slug(name)
    except ValueError:
        return "\0"


def etag_of(body: bytes) -> str:
    """Strong ETag of a response body (first 20 hex digits of its SHA-256)."""
    return '"' + hashlib.sha256(body).hexdigest()[:20] + '"'


@dataclass(frozen=True)
class ServedTable:
    """One immutable snapshot of the published policies."""

    table: PolicyTable
    doc: dict[str, Any]
    body: bytes
    etag: str
    version: int
    _filtered: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> ServedTable:
        """The snapshot of a policy-table document (``GET /v1/policies``'s body, as a dict): its JSON bytes, their
        ETag, and the :class:`~kvsplit.kernels.policy_table.PolicyTable` built from those bytes (what a
        :class:`~kvsplit.service.client.PlanClient` plans from).

        Raises
        ------
        ValueError
            The document is not a valid policy table.
        """
        body = orjson.dumps(doc)
        # Build the table from the bytes a client would receive, so the server
        # plans from exactly what PlanClient plans from.
        table = PolicyTable.from_json(orjson.loads(body))
        return cls(table=table, doc=doc, body=body, etag=etag_of(body), version=int(doc["version"]))

    def filtered(self, flt: tuple) -> tuple[bytes, str]:
        """Body and ETag of the document restricted to ``flt`` = (gpu, H_kv, D, dtype, page_size, kv_dtype, q_len),
        None = any (an entry's ``kv_dtype`` and ``q_len`` are its bucket family's: :func:`kvsplit.tuner.published.table_entry`)."""
        if all(v is None for v in flt):
            return self.body, self.etag
        hit = self._filtered.get(flt)
        if hit is None:
            names = ("gpu", "num_kv_heads", "head_dim", "dtype", "page_size", "kv_dtype", "q_len")
            want = (None if flt[0] is None else _slug_or_none(flt[0]),) + tuple(flt[1:])
            pols = [
                p
                for p in self.doc["data"]
                if all(v is None or (gpu_slug(p["gpu"]) if n == "gpu" else p.get(n)) == v for n, v in zip(names, want))
            ]
            body = orjson.dumps({**self.doc, "count": len(pols), "data": pols})
            hit = (body, etag_of(body))
            if len(self._filtered) < 256:
                self._filtered[flt] = hit
        return hit


class TableHolder:
    """Holds the current :class:`ServedTable`; reloads it from the store.

    Parameters
    ----------
    load_doc : callable () -> dict
        Reads the published policies and returns the table document.
    read_version : callable () -> int
        Reads the store's ``policies_version`` (cheap; polled).
    """

    def __init__(self, load_doc: Callable[[], dict[str, Any]], read_version: Callable[[], int]) -> None:
        self._load_doc = load_doc
        self._read_version = read_version
        self._lock = threading.Lock()
        self.current: ServedTable | None = None
        self.last_error: str | None = None
        self.traffic: Any = None  # the process's TrafficRecorder (kvsplit.service.traffic), None when off

    def reload(self) -> ServedTable:
        """Load the table now (blocking; thread-safe) and make it current."""
        with self._lock:
            try:
                served = ServedTable.from_doc(self._load_doc())
            except Exception as exc:
                metrics.RELOADS.labels("error").inc()
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.exception("policy table reload failed; keeping the previous table")
                raise
            self.current = served
            self.last_error = None
            metrics.RELOADS.labels("ok").inc()
            counts = served.table.counts()
            for src, n in counts.items():
                metrics.POLICIES_LOADED.labels(src).set(n)
            metrics.POLICIES_VERSION.set(served.version)
            log.info("policy table loaded: version %d, %d published policies", served.version, len(served.table))
            return served

    def reload_if_changed(self) -> bool:
        """Reload when the store's version differs from the served one; True if reloaded."""
        version = self._read_version()
        cur = self.current
        if cur is not None and cur.version == version:
            return False
        self.reload()
        return True

    async def poll(self, interval_s: float) -> None:
        """Poll forever (cancel to stop); errors are logged and retried next tick."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                await asyncio.to_thread(self.reload_if_changed)
            except asyncio.CancelledError:
                raise
            except Exception:  # logged in reload(); the old table stays served
                log.warning("policy version poll failed", exc_info=True)
