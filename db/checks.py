"""Field checks shared by the store's writers and its import (part of :mod:`kvsplit.db.store`).

Each raises ValueError naming the field.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

# ----------------------------------------------------------------------------
# Validation helpers
# ----------------------------------------------------------------------------

_HEAD_DIMS = (64, 128, 256)
_DTYPES = ("float16", "bfloat16", "float32")


def _int(name: str, v: Any, lo: int | None = None, hi: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        try:
            import numpy as np  # plain-data helper; numpy integers are fine

            if isinstance(v, np.integer):
                v = int(v)
            else:
                raise TypeError
        except (ImportError, TypeError):
            raise ValueError(f"{name}: expected an integer, got {v!r}") from None
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise ValueError(f"{name}: expected an integer in [{lo}, {hi if hi is not None else 'inf'}], got {v}")
    return int(v)


def _num(name: str, v: Any, *, positive: bool = False, allow_none: bool = False) -> float | None:
    if v is None and allow_none:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(float(v)):
        try:
            import numpy as np

            if isinstance(v, np.floating | np.integer) and math.isfinite(float(v)):
                v = float(v)
            else:
                raise TypeError
        except (ImportError, TypeError):
            raise ValueError(f"{name}: expected a finite number, got {v!r}") from None
    if positive and not float(v) > 0:
        raise ValueError(f"{name}: expected a number > 0, got {v!r}")
    return float(v)


def _str(name: str, v: Any, *, max_len: int = 512, choices: Sequence[str] | None = None) -> str:
    if not isinstance(v, str) or not v.strip():
        raise ValueError(f"{name}: expected a non-empty string, got {v!r}")
    if len(v) > max_len:
        raise ValueError(f"{name}: longer than {max_len} characters")
    if choices is not None and v not in choices:
        raise ValueError(f"{name}: expected one of {tuple(choices)}, got {v!r}")
    return v


def _json_obj(name: str, v: Any, *, scalars_only: bool = False) -> dict[str, Any]:
    if not isinstance(v, Mapping):
        raise ValueError(f"{name}: expected a JSON object, got {type(v).__name__}")
    out: dict[str, Any] = {}
    for k, x in v.items():
        if not isinstance(k, str) or not k:
            raise ValueError(f"{name}: keys must be non-empty strings, got {k!r}")
        if scalars_only and not (x is None or isinstance(x, (bool, int, float, str))):
            raise ValueError(f"{name}.{k}: expected a number, string, boolean or null, got {type(x).__name__}")
        if isinstance(x, float) and not math.isfinite(x):
            raise ValueError(f"{name}.{k}: expected a finite number, got {x!r}")
        out[k] = x
    try:
        json.dumps(out, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name}: not JSON-serialisable ({exc})") from None
    return out


def software_fingerprint(software: Mapping[str, Any] | None) -> str:
    """16-hex-digit sha256 of the canonical JSON of a software-versions dict."""
    blob = json.dumps(dict(software or {}), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def iso_utc(t: _dt.datetime | None) -> str | None:
    """ISO 8601 with its zone: the store keeps UTC, and SQLite gives the values back without tzinfo."""
    if t is None:
        return None
    if t.tzinfo is None:  # SQLite drops the zone; values are stored as UTC
        t = t.replace(tzinfo=_dt.timezone.utc)
    return t.isoformat()

