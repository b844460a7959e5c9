"""Published policies of the store as a policy table: the one conversion from store records to table entries.

:mod:`kvsplit.db.store` returns rows; :mod:`kvsplit.kernels.policy_table`
plans from entries. Both the tuner (``kvsplit bench --trace``) and the service
(``GET /v1/policies``, ``kvsplit plan``) build their table here, so they serve
the same plans.
"""

from __future__ import annotations

import logging
from typing import Any

from ..db import store
from ..kernels.buckets import BucketKey
from ..kernels.policy_table import SOURCE_OF_BACKEND, PolicyTable, check_policy_entry

__all__ = ["table_entry", "load_table_doc"]

_log = logging.getLogger("kvsplit.service")


def table_entry(p: Any) -> dict[str, Any]:
    """The policy-table entry (kvsplit.kernels.policy_table module doc) of a published Policy row; its ``kv_dtype``
    and ``q_len`` are those of its bucket key's family (the row has no columns for them)."""
    b = p.bucket
    try:
        family = BucketKey.parse(p.bucket_key).family
    except ValueError:  # a key edited by hand: no family fields (check_policy_entry names the key)
        family = None
    entry = {
        "id": p.id,
        "version": p.version,
        "bucket": p.bucket_key,
        "gpu": b.gpu,
        "num_kv_heads": b.num_kv_heads,
        "head_dim": b.head_dim,
        "dtype": b.dtype,
        "page_size": b.page_size,
        "name": p.name,
        "params": dict(p.params or {}),
        "backend": p.backend,
        "source": SOURCE_OF_BACKEND[p.backend],
        "score": p.score,
        "tuning_run_id": p.tuning_run_id,
        "published_at": store.iso_utc(p.published_at),
    }
    if family is not None:
        entry["kv_dtype"], entry["q_len"] = family[5], family[6]
    return entry


def load_table_doc(url: str) -> dict[str, Any]:
    """The ``GET /v1/policies`` document of the store at ``url`` (one read transaction).

    A published row that could not be served (its key disagrees with its shape
    fields, or its params make no plan: only possible through a store edited
    by hand) is left out with a warning rather than failing the whole table.
    """
    with store.session_scope(url) as s:
        version = store.policies_version(s)
        entries = []
        for p in store.list_published(s):
            e = table_entry(p)
            try:
                check_policy_entry(e)
            except (ValueError, KeyError, TypeError) as exc:
                _log.warning("policy %s (bucket %s) left out of the served table: %s", p.id, e["bucket"], exc)
                continue
            entries.append(e)
    return PolicyTable.document(entries, version=version)
