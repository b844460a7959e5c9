"""In-process planning from a plan service's published policies: :class:`PlanClient`.

Needs only the core install (NumPy and the standard library; HTTP through
``urllib``): it pulls ``GET /v1/policies`` once, then plans every batch locally
with :class:`kvsplit.kernels.policy_table.PolicyTable` — the same code the
service runs — so ``PlanClient.plan(...)`` equals the plan part of
``POST /v1/plan`` for the same request and a server pays no HTTP on the decode
hot path. :meth:`PlanClient.refresh` re-polls with ``If-None-Match`` (a 304
costs one small round trip); ``refresh_interval_s`` makes :meth:`plan` refresh
by itself when the table is older than that (checked on the calling thread,
never in the background; a failed refresh keeps the current table).

Example
-------
>>> client = PlanClient("http://127.0.0.1:8000")                   # doctest: +SKIP
>>> plan = client.plan([4096, 17, 9000], gpu="NVIDIA H200", num_qo_heads=32,
...                    num_kv_heads=4, head_dim=128, dtype="bfloat16", page_size=16)  # doctest: +SKIP
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Mapping

from ..kernels.device import DeviceSpec
from ..kernels.plan import Plan
from ..kernels.policy_table import PolicyTable

__all__ = ["PlanClient", "plan_from_response", "PlanServiceError"]


class PlanServiceError(RuntimeError):
    """The plan service could not be reached or answered with an error."""


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


class PlanClient:
    """Plans batches locally with a plan service's published policies.

    Parameters
    ----------
    url : str
        Base URL of the service, e.g. ``"http://127.0.0.1:8000"``.
    timeout_s : float
        Timeout of each HTTP request, seconds.
    refresh_interval_s : float or None
        When set, :meth:`plan` refreshes the table (ETag poll) once it is older
        than this many seconds; ``None`` refreshes only on :meth:`refresh`.
    filters : dict, optional
        Query filters of ``GET /v1/policies`` (``gpu``, ``num_kv_heads``,
        ``head_dim``, ``dtype``, ``page_size``) to pull only part of the table;
        batches of other shapes then get the fallback policy.

    Raises
    ------
    PlanServiceError
        When the first pull fails (the client has no table to plan with).
    """

    def __init__(self, url: str, *, timeout_s: float = 10.0, refresh_interval_s: float | None = None,
                 filters: Mapping[str, Any] | None = None) -> None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"url: expected an http(s) URL, got {url!r}")
        self.url = url.rstrip("/")
        self.timeout_s = float(timeout_s)
        self.refresh_interval_s = refresh_interval_s
        q = {k: v for k, v in (filters or {}).items() if v is not None}
        bad = set(q) - {"gpu", "num_kv_heads", "head_dim", "dtype", "page_size"}
        if bad:
            raise ValueError(f"filters: unknown keys {sorted(bad)}")
        self._policies_url = self.url + "/v1/policies" + ("?" + urllib.parse.urlencode(q) if q else "")
        self._lock = threading.Lock()
        self.etag: str | None = None
        self.table: PolicyTable
        self.fetched_at = 0.0
        self.refresh()

    @property
    def version(self) -> int:
        """The store's policies_version of the table in use."""
        return self.table.version

    def refresh(self) -> bool:
        """Re-pull the table if it changed (If-None-Match); True when a new table was loaded.

        Raises
        ------
        PlanServiceError
            On a network error or an error status.
        """
        req = urllib.request.Request(self._policies_url, headers={"Accept": "application/json"})
        if self.etag is not None:
            req.add_header("If-None-Match", self.etag)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                body = resp.read()
                etag = resp.headers.get("ETag")
        except urllib.error.HTTPError as exc:
            if exc.code == 304:
                self.fetched_at = time.monotonic()
                return False
            raise PlanServiceError(f"GET {self._policies_url}: HTTP {exc.code}: {exc.read()[:500]!r}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise PlanServiceError(f"GET {self._policies_url}: {exc}") from None
        try:
            table = PolicyTable.from_json(json.loads(body))
        except ValueError as exc:
            raise PlanServiceError(f"GET {self._policies_url}: not a policy table: {exc}") from None
        with self._lock:
            self.table = table
            self.etag = etag
            self.fetched_at = time.monotonic()
        return True

    def _maybe_refresh(self) -> None:
        if self.refresh_interval_s is not None and time.monotonic() - self.fetched_at >= self.refresh_interval_s:
            try:
                self.refresh()
            except PlanServiceError:
                self.fetched_at = time.monotonic()  # keep serving the current table; retry next interval

    def plan_with_info(self, kv_lens: Any, *, gpu: str, num_qo_heads: int, num_kv_heads: int, head_dim: int,
                       dtype: str, page_size: int = 16,
                       device: DeviceSpec | None = None) -> tuple[Plan, dict[str, Any], dict[str, Any]]:
        """Like :meth:`plan`, also returning the answer's ``bucket`` and ``policy`` objects."""
        self._maybe_refresh()
        return self.table.plan(kv_lens, gpu=gpu, num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads,
                               head_dim=head_dim, dtype=dtype, page_size=page_size, device=device)

    def plan(self, kv_lens: Any, *, gpu: str, num_qo_heads: int, num_kv_heads: int, head_dim: int, dtype: str,
             page_size: int = 16, device: DeviceSpec | None = None) -> Plan:
        """Plan one decode batch locally (no HTTP unless a timed refresh is due).

        Parameters
        ----------
        kv_lens : array-like of int, ``[B]``
            Tokens in each request's KV cache.
        gpu, num_qo_heads, num_kv_heads, head_dim, dtype, page_size, device
            As the fields of ``POST /v1/plan``; ``page_size`` defaults to 16 here, as in
            :meth:`kvsplit.kernels.policy_table.PolicyTable.plan` and ``make_plan`` (the HTTP body needs it).

        Returns
        -------
        Plan
            Equal to ``plan_from_response(POST /v1/plan answer)`` for the same
            request and table version.

        Raises
        ------
        ValueError
            On invalid arguments, naming them.
        """
        return self.plan_with_info(kv_lens, gpu=gpu, num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads,
                                   head_dim=head_dim, dtype=dtype, page_size=page_size, device=device)[0]
