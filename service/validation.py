"""Lean parsing and validation of ``POST /v1/plan`` bodies (orjson + NumPy).

FastAPI's pydantic path costs more than the whole plan for a batch of a few
hundred requests (it builds a Python int object per kv_len twice and validates
each one in a loop). Here the raw body is parsed once with orjson, the scalar
fields are checked by hand and ``kv_lens`` is checked with one type scan and
NumPy range tests.

The common request (the seven fields, no ``device``, a header already seen)
takes a faster path: the header's validated :class:`Shape` comes from a small
dict keyed by the exact field values and types, and ``kv_lens`` is read from
the body bytes by the compiled scan of :mod:`kvsplit.service.fastparse` (strict
JSON integers in range, straight into int64; orjson then parses the rest of the
body with the list replaced by ``0``, once per distinct header text: the bytes
around the list are remembered too). Without numba, ``kv_lens`` is converted
from orjson's list by ``array.array("q", ...)`` (which refuses anything but
ints, with no per-element Python loop) plus one unsigned maximum for the range.
Anything unusual (a bool anywhere in the body, a value out of range, another
field, a duplicate key) falls through to the full checks below, which name the
offending field and index. Errors have the shape of FastAPI's ``RequestValidationError``
answer (``{"detail": [{"type", "loc", "msg", "input"}]}``), with the exact field
path and list index, e.g. ``["body", "kv_lens", 3]``.

Limits (docs/concepts/design.md §3): kv_len <= ``KVSPLIT_MAX_KV_LEN`` (default 2^24), at most
65,536 requests, head_dim in (64, 128, 256), page_size 1..256, H_kv 1..1024 and
H_q a multiple of H_kv; optional ``kv_dtype`` (null, dtype's name, ``float8_e4m3fn`` or ``fp8`` with a 16-bit
dtype) and ``q_len`` (1..8, ``G * q_len <= 64``).
"""

from __future__ import annotations

import array
import dataclasses
from typing import Any, NamedTuple

import numpy as np
import orjson

from ..db.checks import check_json_tree
from ..kernels.device import DeviceSpec, known_devices, resolve_device
from ..kernels.limits import (
    KV_DTYPE_SHORT,
    KV_DTYPES,
    MAX_Q_LEN,
    MAX_TILE_ROWS,
    check_kv_dtype,
    q_len_shortfall,
    q_len_shortfall_message,
)
from ..kernels.plan import DTYPES, HEAD_DIMS, MAX_BATCH, MAX_PAGE_SIZE
from ..kernels.shape import DTYPE_ALIASES, MAX_HEADS, MAX_QO_HEADS, Shape
from . import fastparse

__all__ = [
    "RequestValidationFailed",
    "PlanRequestData",
    "parse_plan_request",
    "check_kv_lens",
    "error",
    "unsupported_media_type",
]

MAX_GPU_NAME = 200
_DEVICE_FIELDS = {f.name for f in dataclasses.fields(DeviceSpec)}
_REQUIRED = ("gpu", "num_qo_heads", "num_kv_heads", "head_dim", "dtype", "page_size", "kv_lens")
_OPTIONAL_SHAPE = ("kv_dtype", "q_len")
_ALLOWED = frozenset(_REQUIRED + ("device",) + _OPTIONAL_SHAPE)


def unsupported_media_type(content_type: bytes | str | None) -> bytes | None:
    """The 415 answer body for a request ``Content-Type`` that is not JSON, else None.

    JSON is ``application/json`` or any ``application/*+json`` (parameters such
    as ``; charset=utf-8`` ignored). A request without the header is read as
    JSON, as FastAPI reads JSON bodies.
    """
    if content_type is None:
        return None
    if isinstance(content_type, bytes):
        content_type = content_type.decode("latin-1")
    media = content_type.split(";", 1)[0].strip().lower()
    if not media or media == "application/json" or (media.startswith("application/") and media.endswith("+json")):
        return None
    return orjson.dumps({"detail": f"Content-Type: expected application/json, got {content_type[:100]!r}"})


class RequestValidationFailed(Exception):
    """A request failed validation; ``errors`` are FastAPI-shaped error dicts.

    ``status_code`` is 422.
    """

    def __init__(self, errors: list[dict[str, Any]], status_code: int = 422) -> None:
        super().__init__(errors[0]["msg"] if errors else "invalid request")
        self.errors = errors
        self.status_code = status_code

    def body(self) -> bytes:
        """The 422 response body, ``{"detail": errors}`` as JSON bytes."""
        return orjson.dumps({"detail": self.errors})


def error(type_: str, loc: tuple | list, msg: str, input_: Any = None, **ctx: Any) -> dict[str, Any]:
    """One error entry in FastAPI's shape; the echoed ``input`` and the keys in ``loc`` bounded by :func:`_short`."""
    echo = _short(input_)
    if isinstance(echo, (list, dict)) and len(orjson.dumps(echo)) > _ECHO_BYTES:
        echo = _short(input_, _ECHO_LEVELS)  # its size only
    e: dict[str, Any] = {
        "type": type_,
        "loc": [x[:64] if type(x) is str else x for x in loc],
        "msg": msg,
        "input": echo,
    }
    if ctx:
        e["ctx"] = ctx
    return e


_ECHO_LEVELS = 2
"""Levels of arrays and objects an error echoes of its input; deeper ones are echoed by their size only."""
_ECHO_BYTES = 1024
"""Largest JSON echo of an array or object input in an error; a larger one is echoed by its size only."""


def _short(v: Any, level: int = 0) -> Any:
    """Inputs echoed in errors stay small and shallow: at most 8 list items, 16 keys (64 characters each),
    200 characters of a string and :data:`_ECHO_LEVELS` levels of nesting (never the whole kv_lens list, and
    always within what orjson writes); :func:`error` also bounds an array or object echo to
    :data:`_ECHO_BYTES` of JSON."""
    if isinstance(v, list):
        if len(v) > 8 or level >= _ECHO_LEVELS:
            return f"<list of {len(v)} items>"
        return [_short(x, level + 1) for x in v]
    if isinstance(v, dict):
        if len(v) > 16 or level >= _ECHO_LEVELS:
            return f"<object with {len(v)} keys>"
        return {str(k)[:64]: _short(x, level + 1) for k, x in v.items()}
    if isinstance(v, str) and len(v) > 200:
        return v[:200] + "..."
    return v


class PlanRequestData(NamedTuple):
    """A validated plan request. ``kv_lens`` is int64 ``[B]``; ``device`` the resolved GPU; ``shape`` the
    batch's :class:`~kvsplit.kernels.shape.Shape` (built from the fields checked here, not checked again)."""

    gpu: str
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    dtype: str
    page_size: int
    kv_lens: np.ndarray
    device: DeviceSpec
    shape: Shape


def _type_name(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    return {int: "integer", float: "number", str: "string", list: "array", dict: "object"}.get(
        type(v), type(v).__name__
    )


def _check_int(errs: list, loc: tuple, v: Any, lo: int, hi: int) -> int | None:
    if type(v) is not int:
        if isinstance(v, float) and v.is_integer() and abs(v) < 2**63:
            msg = "Input should be a valid integer, got a number with a decimal point"
        elif isinstance(v, float) and v.is_integer():
            errs.append(error("less_than_equal", loc, f"Input should be less than or equal to {hi}", v, le=hi))
            return None
        elif isinstance(v, float):
            msg = "Input should be a valid integer, got a number with a fractional part"
        else:
            msg = f"Input should be a valid integer, got {_type_name(v)}"
        errs.append(error("int_type", loc, msg, v))
        return None
    if v < lo:
        errs.append(error("greater_than_equal", loc, f"Input should be greater than or equal to {lo}", v, ge=lo))
        return None
    if v > hi:
        errs.append(error("less_than_equal", loc, f"Input should be less than or equal to {hi}", v, le=hi))
        return None
    return v


def check_kv_lens(errs: list, v: Any, max_kv_len: int) -> np.ndarray | None:
    """The ``kv_lens`` rule of ``POST /v1/plan``, also the plan viewer's (:mod:`kvsplit.service.dashboard.viewer`).

    Parameters
    ----------
    errs : list
        FastAPI-shaped errors (:func:`error`) are appended here: at most one, located at ``["body", "kv_lens"]``
        (not a list, empty, longer than ``MAX_BATCH``) or ``["body", "kv_lens", i]`` (the first bad entry).
    v : Any
        The decoded JSON value: a list of 1..65,536 (``kvsplit.kernels.plan.MAX_BATCH``) integers, each in
        ``0..max_kv_len`` tokens (0: an empty slot, planned as one empty work item). A bool, a string or a
        number with a decimal point is not an integer.
    max_kv_len : int
        Largest kv_len accepted (tokens; ``KVSPLIT_MAX_KV_LEN``).

    Returns
    -------
    numpy.ndarray or None
        int64 ``[B]``, or None when an error was appended.
    """
    loc = ("body", "kv_lens")
    if type(v) is not list:
        errs.append(error("list_type", loc, f"Input should be a valid list, got {_type_name(v)}", v))
        return None
    n = len(v)
    if n < 1:
        errs.append(
            error(
                "too_short",
                loc,
                "List should have at least 1 item after validation, not 0",
                v,
                field_type="List",
                min_length=1,
                actual_length=0,
            )
        )
        return None
    if n > MAX_BATCH:
        errs.append(
            error(
                "too_long",
                loc,
                f"List should have at most {MAX_BATCH} items after validation, not {n}",
                v,
                field_type="List",
                max_length=MAX_BATCH,
                actual_length=n,
            )
        )
        return None
    # fast path: every entry a Python int (bool is a subclass of int but not `int` itself)
    types = set(map(type, v))
    if types == {int}:
        try:
            arr = np.array(v, dtype=np.int64)
        except OverflowError:
            arr = None
        if arr is not None:
            bad = (arr < 0) | (arr > max_kv_len)
            if not bad.any():
                return arr
            i = int(bad.argmax())
            _check_int(errs, loc + (i,), int(arr[i]), 0, max_kv_len)
            return None
    # slow path: find the first offending entry and say what is wrong with it
    for i, x in enumerate(v):
        if _check_int(errs, loc + (i,), x, 0, max_kv_len) is None:
            return None
    raise AssertionError("unreachable: kv_lens failed the fast path but every entry is valid")


def _kv_dtype(errs: list, v: Any, dtype: str | None) -> str | None:
    """The KV dtype of ``kv_dtype`` (null or ``dtype``'s name: ``dtype``; ``float8_e4m3fn``/``fp8`` with a 16-bit
    ``dtype``), or None with an error at ``["body", "kv_dtype"]``. With ``dtype`` invalid, None and no error."""
    if dtype is None:
        return None
    if v is None or type(v) is str:
        try:
            return check_kv_dtype(v, dtype)  # the planner's rule; the error below is the schema's form of it
        except ValueError:
            pass
    long = {s: k for k, s in KV_DTYPE_SHORT.items()}
    kd = long.get(v, v) if type(v) is str else None
    if kd in KV_DTYPES and dtype in ("float16", "bfloat16"):
        return kd
    sixteen = dtype in ("float16", "bfloat16")  # FP8 K/V are read with a 16-bit q only
    names = [None, dtype, *((*sorted(KV_DTYPES), *sorted(KV_DTYPE_SHORT.values())) if sixteen else ())]
    shown = [("null" if n is None else repr(n)) for n in names]
    msg = "Input should be " + (", ".join(shown[:-1]) + " or " + shown[-1] if len(shown) > 1 else shown[0])
    if kd in KV_DTYPES:  # an FP8 cache asked for with a 32-bit q
        msg += f" with dtype {dtype!r}: FP8 K/V ({v!r}) need a float16 or bfloat16 q"
    errs.append(
        error(
            "literal_error",
            ("body", "kv_dtype"),
            msg,
            v,
            expected=", ".join("null" if n is None else str(n) for n in names),
        )
    )
    return None


def _device(errs: list, v: Any, gpu: str | None) -> DeviceSpec | None:
    loc = ("body", "device")
    if type(v) is not dict:
        errs.append(error("model_type", loc, f"Input should be an object, got {_type_name(v)}", v))
        return None
    fields = dict(v)
    unknown = sorted(set(fields) - _DEVICE_FIELDS)
    if unknown:
        for k in unknown[:8]:
            errs.append(error("extra_forbidden", loc + (k,), "Extra inputs are not permitted", fields[k]))
        return None
    if fields.get("name", None) is None:
        if gpu is None:
            return None
        fields["name"] = gpu
    elif type(fields["name"]) is not str or not fields["name"].strip() or len(fields["name"]) > MAX_GPU_NAME:
        errs.append(
            error(
                "string_type",
                loc + ("name",),
                f"Input should be a non-empty string of at most {MAX_GPU_NAME} characters",
                fields["name"],
            )
        )
        return None
    missing = [
        k
        for k in ("num_sms", "hbm_bandwidth_gbps", "l2_bytes", "smem_per_sm_bytes", "smem_per_block_bytes")
        if k not in fields
    ]
    for k in missing:
        errs.append(error("missing", loc + (k,), "Field required", None))
    if missing:
        return None
    limits = {
        "num_sms": (1, 1 << 16),
        "l2_bytes": (0, 1 << 40),
        "smem_per_sm_bytes": (1, 1 << 24),
        "smem_per_block_bytes": (1, 1 << 24),
        "regs_per_sm": (1, 1 << 24),
        "max_threads_per_sm": (32, 1 << 16),
    }
    ok = True
    for k, (lo, hi) in limits.items():
        if k in fields and _check_int(errs, loc + (k,), fields[k], lo, hi) is None:
            ok = False
    bw = fields["hbm_bandwidth_gbps"]
    if isinstance(bw, bool) or not isinstance(bw, (int, float)) or not (0 < bw <= 1e6):
        errs.append(
            error(
                "float_type" if not isinstance(bw, (int, float)) or isinstance(bw, bool) else "greater_than",
                loc + ("hbm_bandwidth_gbps",),
                "Input should be a number in (0, 1e6] GB/s",
                bw,
            )
        )
        ok = False
    if "compute_capability" in fields:
        cc = fields["compute_capability"]
        if type(cc) is not list or len(cc) != 2 or not all(type(c) is int and 0 <= c <= 100 for c in cc):
            errs.append(
                error(
                    "tuple_type",
                    loc + ("compute_capability",),
                    "Input should be [major, minor], two integers in [0, 100]",
                    cc,
                )
            )
            ok = False
        else:
            fields["compute_capability"] = tuple(cc)
    if not ok:
        return None
    try:
        return DeviceSpec(**fields)
    except ValueError as exc:  # DeviceSpec's own checks (defence in depth)
        errs.append(error("value_error", loc, f"Value error, {exc}", None))
        return None


MAX_DEPTH = 8
"""Deepest nesting of arrays and objects accepted in a plan request (the body's own object is level 1; a valid
request nests 3: body, ``device``, ``compute_capability``). Deeper bodies get one ``json_too_deep`` error before
any field is validated, so no error echoes a deep value."""


def _too_deep(loc: tuple) -> dict[str, Any]:
    return error(
        "json_too_deep",
        loc,
        f"JSON nested deeper than {MAX_DEPTH} levels (arrays and objects); a plan request nests at most 3",
        None,
        max_depth=MAX_DEPTH,
    )


def _check_depth(loc: tuple, v: Any) -> None:
    """RequestValidationFailed (422, ``json_too_deep`` at ``loc``) when the value ``v`` at ``loc`` nests deeper
    than :data:`MAX_DEPTH` counted from the body (:func:`kvsplit.db.checks.check_json_tree`, the store's
    check of JSON fields)."""
    if not isinstance(v, (list, dict)):
        return
    try:
        check_json_tree("body", v, max_depth=MAX_DEPTH - (len(loc) - 1), depth_only=True)
    except ValueError:
        raise RequestValidationFailed([_too_deep(loc)]) from None


HEADER_CACHE: dict[tuple, tuple] = {}
"""Headers that passed the checks below, in two forms: (gpu, H_q, H_kv, D, dtype, page_size) of a request
without ``device`` -> (device, Shape), only exact types reaching it (a bool or float equal to an int is never
looked up); and (the body's bytes before its kv_lens list, the bytes after it) of a request the compiled scan
took and whose header then passed through the first form -> (gpu, H_q, H_kv, D, dtype, page_size, device,
Shape), so the same header text is not parsed again. One dict: clearing it forgets both."""
HEADER_CACHE_MAX = 1024


def _known_header(doc: dict) -> tuple | None:
    """(gpu, H_q, H_kv, D, dtype, page_size, device, shape, kv_lens value) of a body of the seven fields (and
    optionally ``kv_dtype``, ``q_len``) whose header passed the full checks before, else None."""
    kd = doc.get("kv_dtype")
    ql = doc.get("q_len", 1)
    if len(doc) != 7 + ("kv_dtype" in doc) + ("q_len" in doc) or not (kd is None or type(kd) is str):
        return None
    if type(ql) is not int:
        return None
    try:
        gpu = doc["gpu"]
        hq = doc["num_qo_heads"]
        hkv = doc["num_kv_heads"]
        hd = doc["head_dim"]
        dt = doc["dtype"]
        ps = doc["page_size"]
        v = doc["kv_lens"]
    except KeyError:
        return None
    if not (
        type(gpu) is str
        and type(hq) is int
        and type(hkv) is int
        and type(hd) is int
        and type(dt) is str
        and type(ps) is int
    ):
        return None
    hit = HEADER_CACHE.get((gpu, hq, hkv, hd, dt, ps, kd, ql))
    if hit is None:
        return None
    return gpu, hq, hkv, hd, dt, ps, hit[0], hit[1], v


def _scanned_header(raw: tuple[bytes, bytes]) -> tuple | None:
    """orjson's reading of the body with its kv_lens list replaced by ``0``: the header through _known_header."""
    try:
        doc = orjson.loads(raw[0] + b"0" + raw[1])
    except orjson.JSONDecodeError:
        return None
    if type(doc) is not dict:
        return None
    h = _known_header(doc)
    if h is None or type(h[8]) is not int or h[8] != 0:  # the 0 put in place of the list, at the top level
        return None
    return h[:8]


def scan_request(body: bytes, max_kv_len: int) -> tuple | None:
    """The common request via the compiled kv_lens scan (module doc): ``(kv_lens, header, start, end, plain,
    total)`` with ``header`` = ``(gpu, H_q, H_kv, head_dim, dtype, page_size, device, shape)`` as the full checks
    would give them, where the ``kv_lens`` list lies in ``body``, whether that list is plain and its sum
    (:func:`~kvsplit.service.fastparse.scan_kv_lens`), or None to take the other paths."""
    found = fastparse.scan_kv_lens(body, max_kv_len, MAX_BATCH)
    if found is None:
        return None
    kv, start, end, plain, total = found
    raw = (body[:start], body[end:])
    h = HEADER_CACHE.get(raw)
    if h is None:
        h = _scanned_header(raw)
        if h is None:
            return None
        if len(HEADER_CACHE) < HEADER_CACHE_MAX:
            HEADER_CACHE[raw] = h
    return kv, h, start, end, plain, total


def _fast_scan(body: bytes, max_kv_len: int) -> PlanRequestData | None:
    """The common request via the compiled kv_lens scan, or None (module doc)."""
    found = scan_request(body, max_kv_len)
    if found is None:
        return None
    kv, h = found[0], found[1]
    if h[7].q_len > 1 and q_len_shortfall(kv, h[7].q_len) >= 0:
        return None  # a kv_len below q_len: the full checks name it
    return PlanRequestData(h[0], h[1], h[2], h[3], h[4], h[5], kv, h[6], h[7])


def _fast_path(doc: dict, body: bytes, max_kv_len: int) -> PlanRequestData | None:
    """The common request from orjson's document (no numba), or None to run the full checks (module doc)."""
    h = _known_header(doc)
    if h is None:
        return None
    gpu, hq, hkv, hd, dt, ps, dev, shape, v = h
    if not (type(v) is list and 0 < len(v) <= MAX_BATCH):
        return None
    try:  # ints only: a float, string, null, list or int over 2^63 raises
        kv = np.frombuffer(array.array("q", v), dtype=np.int64)
    except (TypeError, OverflowError):
        return None
    if kv.view(np.uint64).max() > max_kv_len:  # a negative length is a huge unsigned one
        return None
    if b"true" in body or b"false" in body:  # a JSON bool is an int subclass that array.array takes as 0/1
        return None
    if shape.q_len > 1 and q_len_shortfall(kv, shape.q_len) >= 0:
        return None  # a kv_len below q_len: the full checks name it
    return PlanRequestData(gpu, hq, hkv, hd, dt, ps, kv, dev, shape)


def parse_plan_request(body: bytes, *, max_kv_len: int) -> PlanRequestData:
    """Parse and validate a plan request body.

    Parameters
    ----------
    body : bytes
        Raw JSON body.
    max_kv_len : int
        Largest kv_len accepted (tokens).

    Returns
    -------
    PlanRequestData

    Raises
    ------
    RequestValidationFailed
        Status 422 with FastAPI-shaped errors; a body that is not JSON is a
        ``json_invalid`` error at ``["body", position]`` as in FastAPI.
    """
    if fastparse.ENABLED and type(body) is bytes and HEADER_CACHE:
        fast = _fast_scan(body, max_kv_len)
        if fast is not None:
            return fast
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        why = str(exc.msg if hasattr(exc, "msg") else exc)
        pos = int(getattr(exc, "pos", 0) or 0)
        if "depth limit" in why:  # orjson's own limit (1,024 levels), far above ours
            raise RequestValidationFailed([_too_deep(("body", pos))]) from None
        raise RequestValidationFailed(
            [error("json_invalid", ("body", pos), "JSON decode error", None, error=why)]
        ) from None
    if type(doc) is dict:
        fast = _fast_path(doc, body, max_kv_len)
        if fast is not None:
            return fast
    else:
        if type(doc) is list and body.count(b"[") > MAX_DEPTH:
            _check_depth(("body",), doc)
        raise RequestValidationFailed(
            [
                error(
                    "model_attributes_type",
                    ("body",),
                    f"Input should be a valid dictionary or object to extract fields from, got {_type_name(doc)}",
                    doc,
                )
            ]
        )
    if body.count(b"[") + body.count(b"{") > MAX_DEPTH:  # else no value can nest deeper (C-speed count)
        for k, v in doc.items():
            _check_depth(("body", k), v)
    errs: list[dict[str, Any]] = []
    for k in _REQUIRED:
        if k not in doc:
            errs.append(error("missing", ("body", k), "Field required", None))
    for k in doc:
        if k not in _ALLOWED:
            errs.append(error("extra_forbidden", ("body", k), "Extra inputs are not permitted", doc[k]))
            if len(errs) > 16:
                break
    if errs:
        raise RequestValidationFailed(errs)

    gpu = doc["gpu"]
    if type(gpu) is not str or not gpu.strip() or len(gpu) > MAX_GPU_NAME:
        errs.append(
            error(
                "string_type",
                ("body", "gpu"),
                f"Input should be a non-empty string of at most {MAX_GPU_NAME} characters",
                gpu,
            )
        )
        gpu = None
    hq = _check_int(errs, ("body", "num_qo_heads"), doc["num_qo_heads"], 1, MAX_QO_HEADS)
    hkv = _check_int(errs, ("body", "num_kv_heads"), doc["num_kv_heads"], 1, MAX_HEADS)
    hd = doc["head_dim"]
    if type(hd) is not int or hd not in HEAD_DIMS:
        errs.append(
            error(
                "literal_error",
                ("body", "head_dim"),
                "Input should be " + " or ".join(str(h) for h in HEAD_DIMS),
                hd,
                expected=", ".join(str(h) for h in HEAD_DIMS),
            )
        )
        hd = None
    dt_raw = doc["dtype"]
    dt = DTYPE_ALIASES.get(dt_raw, dt_raw) if type(dt_raw) is str else dt_raw  # "bf16" -> "bfloat16", as the CLI
    if type(dt) is not str or dt not in DTYPES:
        names = sorted(DTYPES)
        errs.append(
            error(
                "literal_error",
                ("body", "dtype"),
                "Input should be "
                + ", ".join(repr(n) for n in names)
                + " (or an alias: "
                + ", ".join(repr(a) for a in DTYPE_ALIASES)
                + ")",
                dt_raw,
                expected=", ".join(names + list(DTYPE_ALIASES)),
            )
        )
        dt = None
    ps = _check_int(errs, ("body", "page_size"), doc["page_size"], 1, MAX_PAGE_SIZE)
    if hq is not None and hkv is not None and hq % hkv:
        errs.append(
            error(
                "value_error",
                ("body", "num_qo_heads"),
                f"Value error, num_qo_heads ({hq}) must be a multiple of num_kv_heads ({hkv})",
                hq,
            )
        )
    kd_raw = doc.get("kv_dtype")
    kd = _kv_dtype(errs, kd_raw, dt)
    ql = _check_int(errs, ("body", "q_len"), doc.get("q_len", 1), 1, MAX_Q_LEN)
    if ql is not None and ql > 1 and hq is not None and hkv and not hq % hkv and hq // hkv * ql > MAX_TILE_ROWS:
        errs.append(
            error(
                "value_error",
                ("body", "q_len"),
                f"Value error, q_len {ql} x GQA group {hq // hkv} = {hq // hkv * ql} query rows per work tile, "
                f"above the kernel's {MAX_TILE_ROWS}",
                ql,
            )
        )
    kv = check_kv_lens(errs, doc["kv_lens"], max_kv_len)
    if kv is not None and ql is not None and (short := q_len_shortfall(kv, ql)) >= 0:
        n = int(kv[short])
        errs.append(
            error("value_error", ("body", "kv_lens", short), f"Value error, {q_len_shortfall_message(n, ql)}", n)
        )
    dev: DeviceSpec | None = None
    if "device" in doc and doc["device"] is not None:
        dev = _device(errs, doc["device"], gpu)
    elif gpu is not None:
        try:
            dev = resolve_device(gpu)
        except ValueError:
            known = ", ".join(sorted(d.name for d in known_devices()))
            errs.append(
                error(
                    "value_error",
                    ("body", "gpu"),
                    f"Value error, unknown GPU {gpu!r}; known: {known}; for another GPU send a "
                    f"`device` object with its numbers",
                    gpu,
                )
            )
    if errs:
        raise RequestValidationFailed(errs)
    assert dev is not None and kv is not None and gpu is not None
    shape = Shape(dev, hq, hkv, hd, dt, ps, kd, ql)  # type: ignore[arg-type]
    if doc.get("device") is None and len(HEADER_CACHE) < HEADER_CACHE_MAX:
        HEADER_CACHE[(gpu, hq, hkv, hd, dt_raw, ps, kd_raw, doc.get("q_len", 1))] = (dev, shape)
    return PlanRequestData(gpu, hq, hkv, hd, dt, ps, kv, dev, shape)  # type: ignore[arg-type]
