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

HEAD_DIMS = (64, 128, 256)
DTYPES = ("float16", "bfloat16", "float32")
_ECHO_CHARS = 80


def echo_value(v: Any) -> str:
    """A bad value as error messages quote it: ``repr`` up to 80 characters; a list or dict by its size only
    (its repr could be megabytes, or nest too deeply to print)."""
    if isinstance(v, (Mapping, list, tuple)):
        return f"<{type(v).__name__} of {len(v)} items>"
    r = repr(v)
    return r if len(r) <= _ECHO_CHARS else r[:_ECHO_CHARS] + "..."


def field_int(name: str, v: Any, lo: int | None = None, hi: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        try:
            import numpy as np  # plain-data helper; numpy integers are fine

            if isinstance(v, np.integer):
                v = int(v)
            else:
                raise TypeError
        except (ImportError, TypeError):
            raise ValueError(f"{name}: expected an integer, got {echo_value(v)}") from None
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise ValueError(f"{name}: expected an integer in [{lo}, {hi if hi is not None else 'inf'}], got {v}")
    return int(v)


def field_num(name: str, v: Any, *, positive: bool = False, allow_none: bool = False) -> float | None:
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
            raise ValueError(f"{name}: expected a finite number, got {echo_value(v)}") from None
    if positive and not float(v) > 0:
        raise ValueError(f"{name}: expected a number > 0, got {echo_value(v)}")
    return float(v)


def field_str(name: str, v: Any, *, max_len: int = 512, choices: Sequence[str] | None = None) -> str:
    if not isinstance(v, str) or not v.strip():
        raise ValueError(f"{name}: expected a non-empty string, got {echo_value(v)}")
    if len(v) > max_len:
        raise ValueError(f"{name}: longer than {max_len} characters")
    if choices is not None and v not in choices:
        raise ValueError(f"{name}: expected one of {tuple(choices)}, got {echo_value(v)}")
    return v


MAX_JSON_DEPTH = 32
"""Deepest nesting of arrays and objects accepted in a JSON field of the store (the field's own object is
level 1). The store's own fields nest three levels at most; orjson, which the service answers with, writes at
most 254, so a stored value within this bound can always be served."""

_INT64 = (-(1 << 63), (1 << 63) - 1)


def check_json_tree(name: str, v: Any, *, max_depth: int = MAX_JSON_DEPTH, depth_only: bool = False) -> None:
    """Check that ``v`` is plain JSON data that any reader of the store can serialise again.

    Plain JSON data: dicts with string keys, lists (tuples), strings, booleans, None, finite floats and
    integers in the int64 range, nested at most ``max_depth`` levels deep (each list or dict is one level,
    ``v`` itself included). The walk is iterative, so any depth is safe to check, and it stops at the first
    offence. ``depth_only``: check the nesting alone (the plan service's check of a parsed request body).

    Raises
    ------
    ValueError
        Naming the path of the offending value, e.g. ``policies[0].verification.a[3]: nested deeper than
        32 levels (arrays and objects)``.
    """
    stack = [([v], 0, False, name)]  # (container, its depth, is it a Mapping, its path); the root in a list
    lo, hi = _INT64
    while stack:
        x, depth, is_map, path = stack.pop()
        if not is_map and depth:  # a list of numbers (kv_lens of sample batches): C-speed scans, no Python loop
            kinds = set(map(type, x))
            if not kinds or (
                kinds <= _NUMBER_TYPES
                and (int not in kinds or lo <= min(x) and max(x) <= hi)
                and (float not in kinds or math.isfinite(sum(y for y in x if type(y) is float)))
            ):
                continue  # (a finite float sum: no inf or nan among them, and no overflow to inf)
            if depth_only and not kinds & _CONTAINER_TYPES:
                continue
        for k, y in x.items() if is_map else enumerate(x):
            if is_map and not isinstance(k, str):
                raise ValueError(f"{path}: keys must be strings, got {echo_value(k)}")
            container = isinstance(y, (Mapping, list, tuple))
            if y is None or isinstance(y, (str, bool)) or (depth_only and not container):
                continue
            if container:
                if depth + 1 > max_depth:
                    raise ValueError(
                        f"{_path(path, k, is_map, depth)}: nested deeper than {max_depth} levels (arrays and objects)"
                    )
                stack.append((y, depth + 1, isinstance(y, Mapping), _path(path, k, is_map, depth)))
            elif isinstance(y, int):
                if not lo <= y <= hi:
                    raise ValueError(f"{_path(path, k, is_map, depth)}: integer outside the 64-bit range")
            elif isinstance(y, float):
                if not math.isfinite(y):
                    raise ValueError(f"{_path(path, k, is_map, depth)}: expected a finite number, got {echo_value(y)}")
            else:
                raise ValueError(f"{_path(path, k, is_map, depth)}: not JSON data ({type(y).__name__})")


_NUMBER_TYPES = frozenset((int, float))
_CONTAINER_TYPES = frozenset((dict, list, tuple))


def _path(path: str, k: Any, is_map: bool, depth: int) -> str:
    """The path of member ``k`` of the container at ``path`` (``a.b``, ``a[3]``; the root's own name)."""
    if is_map:
        return f"{path}.{k[:64]}"
    return path if depth == 0 else f"{path}[{k}]"


def field_json_obj(name: str, v: Any, *, scalars_only: bool = False, max_bytes: int | None = None) -> dict[str, Any]:
    """``v`` as a plain dict after :func:`check_json_tree` (depth, keys, finite numbers); ``max_bytes``: the
    largest accepted size of its compact JSON text (None: no limit). ValueError naming the field."""
    if not isinstance(v, Mapping):
        raise ValueError(f"{name}: expected a JSON object, got {type(v).__name__}")
    out: dict[str, Any] = {}
    for k, x in v.items():
        if not isinstance(k, str) or not k:
            raise ValueError(f"{name}: keys must be non-empty strings, got {echo_value(k)}")
        if scalars_only and not (x is None or isinstance(x, (bool, int, float, str))):
            raise ValueError(f"{name}.{k}: expected a number, string, boolean or null, got {type(x).__name__}")
        if isinstance(x, float) and not math.isfinite(x):
            raise ValueError(f"{name}.{k}: expected a finite number, got {echo_value(x)}")
        out[k] = x
    check_json_tree(name, out)
    try:
        text = json.dumps(out, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name}: not JSON-serialisable ({exc})") from None
    if max_bytes is not None and len(text) > max_bytes:
        raise ValueError(f"{name}: {len(text)} characters of JSON, more than the {max_bytes} accepted")
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
        t = t.replace(tzinfo=_dt.UTC)
    return t.isoformat()
