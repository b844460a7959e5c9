"""In-process planning from a plan service's published policies: :class:`PlanClient`.

Needs only the core install (NumPy and the standard library; HTTP through
``urllib``): it pulls ``GET /v1/policies`` once, then plans every batch locally
with :class:`kvsplit.kernels.policy_table.PolicyTable` — the same code the
service runs — so ``PlanClient.plan(...)`` equals the plan part of
``POST /v1/plan`` for the same request and a server pays no HTTP on the decode
hot path.

Refreshing. :meth:`PlanClient.refresh` re-polls with ``If-None-Match`` (a 304
costs one small round trip). With ``refresh_interval_s`` set, a daemon thread
polls every that many seconds, so :meth:`PlanClient.plan` never touches the
network: it reads the table in hand, whatever the server is doing (stopped,
hung, answering errors or garbage). Each poll ends within ``timeout_s`` (a
watchdog shuts its socket down), and :meth:`PlanClient.close` cuts one short.
While polls fail the thread backs off exponentially (``backoff_initial_s``
doubling up to ``backoff_max_s``, minus up to ``backoff_jitter`` of it at
random so that many clients do not retry in step) and the client keeps
serving the last table it loaded.

Staleness. ``stale``, ``last_error`` and ``table_age_s`` say whether and for how
long the table in hand has not been confirmed by the server. The first failed
poll of an outage logs one warning on the ``kvsplit.service.client`` logger
(later failures of the same outage log at debug level); the first successful
poll after it logs one info line.

Example
-------
>>> with PlanClient("http://127.0.0.1:8000", refresh_interval_s=30) as client:      # doctest: +SKIP
...     plan = client.plan([4096, 17, 9000], gpu="NVIDIA H200", num_qo_heads=32,
...                        num_kv_heads=4, head_dim=128, dtype="bfloat16", page_size=16)
...     if client.stale:
...         print(f"planning from a table {client.table_age_s:.0f} s old: {client.last_error}")
"""

from __future__ import annotations

import functools
import http.client
import json
import logging
import math
import os
import random
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import weakref
from collections.abc import Mapping
from typing import Any

from ..kernels.device import DeviceSpec
from ..kernels.plan import Plan
from ..kernels.policy_table import PolicyTable

__all__ = ["PlanClient", "plan_from_response", "PlanServiceError"]

log = logging.getLogger(__name__)


class PlanServiceError(RuntimeError):
    """The plan service could not be reached or answered with an error."""


class _Closed(PlanServiceError):
    """A poll cut short by :meth:`PlanClient.close`."""


def plan_from_response(resp: Mapping[str, Any]) -> Plan:
    """The :class:`Plan` of a ``POST /v1/plan`` answer.

    The answer's ``policy`` is the object ``{id, version, name, params,
    source}``; ``Plan.to_dict()`` has the name there instead.

    Raises
    ------
    ValueError
        If the answer is not a plan answer (names the field).
    """
    if not isinstance(resp, Mapping) or not isinstance(resp.get("policy"), Mapping):
        raise ValueError("response.policy: expected the policy object of a plan answer")
    d = {k: v for k, v in resp.items() if k not in ("bucket",)}
    d["policy"] = resp["policy"].get("name")
    return Plan.from_dict(d)


def _positive(name: str, value: Any) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected a positive number of seconds, got {value!r}") from None
    if not (v > 0 and math.isfinite(v)):
        raise ValueError(f"{name}: expected a positive number of seconds, got {value!r}")
    return v


class PlanClient:
    """Plans batches locally with a plan service's published policies.

    Parameters
    ----------
    url : str
        Base URL of the service, e.g. ``"http://127.0.0.1:8000"``.
    timeout_s : float
        Deadline of each poll, seconds (the first pull included): of each
        socket operation, and of the whole answer (a watchdog shuts the socket
        down when a server trickles it).
    refresh_interval_s : float or None
        When set (> 0), a daemon thread polls the table (ETag) every this many
        seconds while the server answers; ``None`` (default) refreshes only on
        :meth:`refresh`. :meth:`plan` never refreshes itself.
    filters : dict, optional
        Query filters of ``GET /v1/policies`` (``gpu``, ``num_kv_heads``,
        ``head_dim``, ``dtype``, ``page_size``) to pull only part of the table;
        batches of other shapes then get the fallback policy.
    backoff_initial_s, backoff_max_s : float
        Back-off of the refresh thread while polls fail, seconds: after the
        n-th failure in a row it waits ``min(backoff_max_s, backoff_initial_s *
        2 ** (n - 1))`` (defaults 1 and 60), less the jitter, before the next
        poll; after a success it polls every ``refresh_interval_s`` again.
    backoff_jitter : float
        Fraction in [0, 1) of each back-off wait drawn off at random (default
        0.2: each wait is 80-100 % of the nominal one, so the waits still grow).

    Attributes
    ----------
    url : str
        The base URL, without a trailing slash.
    table : PolicyTable
        The table :meth:`plan` uses (replaced whole by a refresh).
    etag : str or None
        The ETag of ``table``'s answer.
    fetched_at : float
        ``time.monotonic()`` of the last successful poll (a 200 or a 304): when
        the server last confirmed ``table``. A failed poll leaves it alone.
    last_error : str or None
        Why the most recent poll failed (the URL and the cause: connection
        refused, timed out, ``HTTP 500: ...``, not a policy table: ...);
        ``None`` once a poll succeeds.
    consecutive_failures : int
        Failed polls since the last successful one (0 while the server answers).
    refresh_attempts : int
        Polls made since construction, the first pull included.

    Raises
    ------
    PlanServiceError
        When the first pull fails (the client has no table to plan with); the
        message names the URL and the cause.
    ValueError
        On a non-http(s) URL, an unknown filter or a non-positive duration, naming it.

    Notes
    -----
    Use it as a context manager or call :meth:`close` to stop the refresh
    thread; the thread also ends once the client is garbage-collected. A
    process forked from one holding the client (an engine's worker) starts its
    own refresh thread.
    """

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 10.0,
        refresh_interval_s: float | None = None,
        filters: Mapping[str, Any] | None = None,
        backoff_initial_s: float = 1.0,
        backoff_max_s: float = 60.0,
        backoff_jitter: float = 0.2,
    ) -> None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"url: expected an http(s) URL, got {url!r}")
        self.url = url.rstrip("/")
        self.timeout_s = _positive("timeout_s", timeout_s)
        self.refresh_interval_s = (
            None if refresh_interval_s is None else _positive("refresh_interval_s", refresh_interval_s)
        )
        self.backoff_initial_s = _positive("backoff_initial_s", backoff_initial_s)
        self.backoff_max_s = _positive("backoff_max_s", backoff_max_s)
        if self.backoff_max_s < self.backoff_initial_s:
            raise ValueError(f"backoff_max_s: {backoff_max_s!r} is below backoff_initial_s {backoff_initial_s!r}")
        if not (isinstance(backoff_jitter, (int, float)) and 0 <= backoff_jitter < 1):
            raise ValueError(f"backoff_jitter: expected a fraction in [0, 1), got {backoff_jitter!r}")
        self.backoff_jitter = float(backoff_jitter)
        q = {k: v for k, v in (filters or {}).items() if v is not None}
        bad = set(q) - {"gpu", "num_kv_heads", "head_dim", "dtype", "page_size"}
        if bad:
            raise ValueError(f"filters: unknown keys {sorted(bad)}")
        self._policies_url = self.url + "/v1/policies" + ("?" + urllib.parse.urlencode(q) if q else "")
        self._lock = threading.Lock()  # table / etag / fetched_at change together
        self._refresh_lock = threading.Lock()  # one poll at a time (the thread's and refresh()'s)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._outage_since: float | None = None
        self._poll_in_flight: _Poll | None = None
        self.etag: str | None = None
        self.table: PolicyTable
        self.fetched_at = 0.0
        self.last_error: str | None = None
        self.consecutive_failures = 0
        self.refresh_attempts = 0
        try:
            self.refresh()
        except PlanServiceError as exc:
            raise PlanServiceError(f"cannot load the policy table: {exc}") from None
        if self.refresh_interval_s is not None:
            self._start_thread()
            if hasattr(os, "register_at_fork"):  # a forked child (a worker process) gets its own thread
                os.register_at_fork(after_in_child=functools.partial(_after_fork_in_child, weakref.ref(self)))

    def _start_thread(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=_refresh_loop,
            args=(weakref.ref(self), self._stop),
            name=f"kvsplit-plan-client {self.url}",
            daemon=True,
        )
        weakref.finalize(self, self._stop.set)  # a client dropped without close() stops its thread
        self._thread.start()

    # -- state ---------------------------------------------------------------------------------------

    @property
    def version(self) -> int:
        """The store's policies_version of the table in use."""
        return self.table.version

    @property
    def table_age_s(self) -> float:
        """Seconds since the server last confirmed the table in use (``fetched_at``); grows during an outage."""
        return time.monotonic() - self.fetched_at

    @property
    def stale(self) -> bool:
        """True when the table in use may be out of date: the last poll failed, or (with a refresh thread)
        no poll has succeeded for ``refresh_interval_s + timeout_s`` seconds (a poll stuck where the
        deadline cannot reach it, such as name resolution)."""
        if self.last_error is not None:
            return True
        return self.refresh_interval_s is not None and self.table_age_s > self.refresh_interval_s + self.timeout_s

    @property
    def refreshing(self) -> bool:
        """True while the refresh thread runs (``refresh_interval_s`` set and the client not closed)."""
        return self._thread is not None and self._thread.is_alive()

    # -- polling -------------------------------------------------------------------------------------

    def refresh(self) -> bool:
        """Re-pull the table if it changed (If-None-Match); True when a new table was loaded.

        Runs on the calling thread (it waits for a poll of the refresh thread in flight). A failure keeps
        the table in use, sets ``last_error`` and leaves ``fetched_at`` alone.

        Raises
        ------
        PlanServiceError
            On a network error, a timeout (``timeout_s``), an error status or an answer that is not a
            policy table; the message names the URL.
        """
        with self._refresh_lock:
            self.refresh_attempts += 1
            try:
                changed = self._poll()
            except _Closed:  # no outage: the client was closed during the poll
                raise
            except PlanServiceError as exc:
                self._failed(str(exc))
                raise
            self._succeeded()
            return changed

    def _poll(self) -> bool:
        where = f"GET {self._policies_url}"
        req = urllib.request.Request(self._policies_url, headers={"Accept": "application/json"})
        if self.etag is not None:
            req.add_header("If-None-Match", self.etag)
        # socket timeouts bound each operation; the watchdog bounds the whole poll (a server trickling its
        # status line or body byte by byte) by shutting the socket down, as close() does
        poll = _Poll()
        self._poll_in_flight = poll
        watchdog = threading.Timer(self.timeout_s, poll.abort, args=("deadline",))
        watchdog.daemon = True
        watchdog.start()
        try:
            with self._opener_for(poll).open(req, timeout=self.timeout_s) as resp:
                body = resp.read()
                etag = resp.headers.get("ETag")
        except urllib.error.HTTPError as exc:
            if exc.code == 304:
                with self._lock:
                    self.fetched_at = time.monotonic()
                return False
            try:
                detail = exc.read(500)
            except (OSError, http.client.HTTPException):
                detail = b""
            raise PlanServiceError(f"{where}: HTTP {exc.code}: {detail!r}") from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            # URLError wraps connect failures; OSError: timeouts and resets mid-answer;
            # HTTPException: a status line or headers that are not HTTP
            reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            if poll.aborted == "close":
                raise _Closed(f"{where}: stopped by close()") from None
            if poll.aborted == "deadline" or isinstance(reason, TimeoutError):
                raise PlanServiceError(f"{where}: no complete answer within timeout_s = {self.timeout_s:g} s") from None
            detail = str(reason)[:200]
            if not detail.isprintable():  # a status line of garbage bytes: keep the log line one line of text
                detail = ascii(detail)
            raise PlanServiceError(f"{where}: {type(reason).__name__}: {detail}") from None
        finally:
            watchdog.cancel()
            self._poll_in_flight = None
        try:
            table = PolicyTable.from_json(json.loads(body))
        except (ValueError, TypeError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError: ValueError
            raise PlanServiceError(f"{where}: not a policy table: {exc}") from None
        with self._lock:
            self.table = table
            self.etag = etag
            self.fetched_at = time.monotonic()
        return True

    @staticmethod
    def _opener_for(poll: _Poll) -> urllib.request.OpenerDirector:
        """urllib's opener (proxies, redirects as usual) whose HTTP(S) connections report their socket to
        ``poll``."""
        return urllib.request.build_opener(_TrackedHTTPHandler(poll), _TrackedHTTPSHandler(poll))

    def _failed(self, error: str) -> None:
        self.last_error = error
        self.consecutive_failures += 1
        if not hasattr(self, "table"):  # the first pull: __init__ raises
            return
        if self._outage_since is None:
            self._outage_since = time.monotonic()
            log.warning(
                "cannot refresh the policy table; planning with the cached one (version %d, confirmed "
                "%.1f s ago) until the service answers: %s",
                self.table.version,
                self.table_age_s,
                error,
            )
        else:
            log.debug("policy table refresh failed again (%d in a row): %s", self.consecutive_failures, error)

    def _succeeded(self) -> None:
        if self._outage_since is not None:
            log.info(
                "policy table refreshed again after %.1f s and %d failed polls (version %d)",
                time.monotonic() - self._outage_since,
                self.consecutive_failures,
                self.table.version,
            )
            self._outage_since = None
        self.last_error = None
        self.consecutive_failures = 0

    def _next_delay(self) -> float:
        """Seconds the refresh thread waits before its next poll."""
        n = self.consecutive_failures
        if n == 0:
            return self.refresh_interval_s  # type: ignore[return-value]
        nominal = min(self.backoff_max_s, self.backoff_initial_s * 2.0 ** min(n - 1, 64))
        return nominal * (1.0 - self.backoff_jitter * random.random())

    # -- lifetime ------------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the refresh thread (a poll in flight is cut short); the client still plans with the table
        in hand. Idempotent."""
        self._stop.set()
        poll = self._poll_in_flight
        if poll is not None:
            poll.abort("close")
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(self.timeout_s + 1.0)

    def __enter__(self) -> PlanClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- planning ------------------------------------------------------------------------------------

    def plan_with_info(
        self,
        kv_lens: Any,
        *,
        gpu: str,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: str,
        page_size: int = 16,
        device: DeviceSpec | None = None,
        kv_dtype: str | None = None,
        q_len: int = 1,
    ) -> tuple[Plan, dict[str, Any], dict[str, Any]]:
        """Like :meth:`plan`, also returning the answer's ``bucket`` and ``policy`` objects."""
        return self.table.plan(
            kv_lens,
            gpu=gpu,
            num_qo_heads=num_qo_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            dtype=dtype,
            page_size=page_size,
            device=device,
            kv_dtype=kv_dtype,
            q_len=q_len,
        )

    def plan(
        self,
        kv_lens: Any,
        *,
        gpu: str,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: str,
        page_size: int = 16,
        device: DeviceSpec | None = None,
        kv_dtype: str | None = None,
        q_len: int = 1,
    ) -> Plan:
        """Plan one decode batch locally with the table in hand: no HTTP, no waiting on the refresh thread.

        Parameters
        ----------
        kv_lens : array-like of int, ``[B]``
            Tokens in each request's KV cache.
        gpu, num_qo_heads, num_kv_heads, head_dim, dtype, page_size, device, kv_dtype, q_len
            As the fields of ``POST /v1/plan``; ``page_size`` defaults to 16 here, as in
            :meth:`kvsplit.kernels.policy_table.PolicyTable.plan` and ``make_plan`` (the HTTP body needs it).

        Returns
        -------
        Plan
            Equal to ``plan_from_response(POST /v1/plan answer)`` for the same
            request and table version (see ``stale`` for whether that version is current).

        Raises
        ------
        ValueError
            On invalid arguments, naming them.
        """
        return self.plan_with_info(
            kv_lens,
            gpu=gpu,
            num_qo_heads=num_qo_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            dtype=dtype,
            page_size=page_size,
            device=device,
            kv_dtype=kv_dtype,
            q_len=q_len,
        )[0]


class _Poll:
    """The sockets of one poll, to shut down at its deadline or on close()."""

    def __init__(self) -> None:
        self.sockets: list[socket.socket] = []
        self.aborted: str | None = None
        self._lock = threading.Lock()

    def add(self, sock: socket.socket) -> None:
        with self._lock:
            self.sockets.append(sock)
            aborted = self.aborted
        if aborted:
            self._shutdown(sock)

    def abort(self, why: str) -> None:
        with self._lock:
            if self.aborted is None:
                self.aborted = why
            socks = list(self.sockets)
        for sock in socks:
            self._shutdown(sock)

    @staticmethod
    def _shutdown(sock: socket.socket) -> None:
        try:  # the plain socket's shutdown (also under TLS): the blocked read returns at once
            socket.socket.shutdown(sock, socket.SHUT_RDWR)
        except OSError:
            pass


class _Tracking:
    """Mixin of urllib's HTTP(S) handlers: each connection hands its socket to the poll once connected."""

    def __init__(self, poll: _Poll, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._poll = poll

    def do_open(self, http_class: Any, req: Any, **kwargs: Any) -> Any:
        poll = self._poll

        def connection(host: str, **kw: Any) -> http.client.HTTPConnection:
            conn = http_class(host, **kw)
            connect = conn.connect

            def tracked_connect() -> None:
                connect()
                poll.add(conn.sock)

            conn.connect = tracked_connect
            return conn

        return super().do_open(connection, req, **kwargs)  # type: ignore[misc]


class _TrackedHTTPHandler(_Tracking, urllib.request.HTTPHandler):
    pass


class _TrackedHTTPSHandler(_Tracking, urllib.request.HTTPSHandler):
    pass


def _after_fork_in_child(ref: weakref.ref[PlanClient]) -> None:
    """In a forked child: fresh locks (the parent's refresh thread may have held one) and, unless the
    client was closed, a refresh thread of its own (threads do not survive ``fork``)."""
    client = ref()
    if client is None:
        return
    client._lock = threading.Lock()
    client._refresh_lock = threading.Lock()
    if client._thread is not None and not client._stop.is_set():
        client._start_thread()


def _refresh_loop(ref: weakref.ref[PlanClient], stop: threading.Event) -> None:
    """The refresh thread: poll, wait (interval or back-off), repeat until ``stop`` or the client is gone.

    Holds the client only during a poll, so an unclosed client can still be garbage-collected."""
    client = ref()
    if client is None:
        return
    delay = client._next_delay()
    del client
    while not stop.wait(delay):
        client = ref()
        if client is None:
            return
        try:
            client.refresh()
        except PlanServiceError:
            pass  # recorded in last_error and logged once per outage by refresh()
        except Exception as exc:  # a bug must not end the thread silently and freeze the table
            client._failed(f"{type(exc).__name__}: {exc}")
            log.exception("plan client refresh failed unexpectedly")
        delay = client._next_delay()
        del client
