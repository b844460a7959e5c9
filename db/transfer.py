"""Export and all-or-nothing import of published policies (part of :mod:`kvsplit.db.store`).

Versioned JSON (``format`` ``"kvsplit.policies"``, ``format_version`` 1; the stored calibrations, per GPU, KV
dtype and q_len, in a separate document, ``"kvsplit.calibrations"`` version 1: :func:`export_calibrations`). Import
validates every field of every entry before writing anything: the free-form
JSON fields (``verification``, ``params``, ``bucket.signature``,
``device.software``) nest at most :data:`~kvsplit.db.checks.MAX_JSON_DEPTH`
levels and hold at most :data:`MAX_IMPORT_FIELD_BYTES` of JSON text each, so
nothing an import stores can break a later read. The service's import route
and ``kvsplit db import`` both read the file with :func:`parse_export`.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from .checks import (
    MAX_JSON_DEPTH,
    echo_value,
    field_int,
    field_json_obj,
    field_num,
    field_str,
    iso_utc,
    software_fingerprint,
)
from .models import (
    BACKENDS,
    Calibration,
    Policy,
    utcnow,
)
from .policies import (
    bump_version,
    check_bucket_fields,
    create_policy,
    get_or_create_bucket,
    lock_store,
    policies_version,
    policy_to_dict,
    publish_refusal,
    published_of,
    set_published,
)
from .records import device_to_dict, get_or_create_device, list_calibrations, record_calibration

EXPORT_FORMAT = "kvsplit.policies"
EXPORT_FORMAT_VERSION = 1


MAX_IMPORT_FIELD_BYTES = 65536
"""Largest compact JSON text of one free-form field of an imported entry (characters; the shipped
policies' largest ``verification`` is under 400)."""


class ImportValidationError(ValueError):
    """An import file is malformed; nothing was stored."""


@contextlib.contextmanager
def _rejected_on_error() -> Iterator[None]:
    """Turn a ``ValueError`` naming a field into the one-line :class:`ImportValidationError` of an import (of
    bounded length: field names and keys come from the file)."""
    try:
        yield
    except ImportValidationError:
        raise
    except ValueError as exc:
        msg = " ".join(str(exc).split())
        raise ImportValidationError(f"import rejected, nothing stored: {msg[:600]}") from None


def _document_entries(data: Any, fmt: str, version: int, field: str, fields: set[str]) -> list[Any]:
    """The entry list ``data[field]`` of an export document of format ``fmt`` version ``version`` whose top-level
    fields are within ``fields``, after its header checks (raises ValueError naming the field)."""
    if not isinstance(data, Mapping):
        raise ValueError(f"file: expected a JSON object, got {type(data).__name__}")
    if data.get("format") != fmt:
        raise ValueError(f"format: expected {fmt!r}, got {echo_value(data.get('format'))}")
    fv = data.get("format_version")
    if fv != version or isinstance(fv, bool):
        raise ValueError(f"format_version: this kvsplit reads version {version}, got {echo_value(fv)}")
    unknown = set(data) - fields
    if unknown:
        raise ValueError(f"file: unknown fields {sorted(unknown)}")
    _parse_time("exported_at", data.get("exported_at"))
    entries = data.get(field)
    if not isinstance(entries, list):
        raise ValueError(f"{field}: expected a list")
    return entries


def _extra_check(pre: str, entry: dict[str, Any], validate_entry: Callable[[dict[str, Any]], None] | None) -> None:
    """The caller's extra check of a normalised entry, its ValueError prefixed with the entry's path ``pre``."""
    if validate_entry is not None:
        try:
            validate_entry(entry)
        except ValueError as exc:
            raise ValueError(f"{pre}: {exc}") from None


def parse_export(raw: bytes | str, source: str = "the file") -> Any:
    """The JSON document of an export file's text (UTF-8 bytes or str), for :func:`import_policies`.

    Raises
    ------
    ImportValidationError
        One line naming ``source`` when the text is not UTF-8 JSON, or nests so deeply that the parser
        refuses it (Python's recursion limit, about 1,000 levels; an import field nests at most
        :data:`~kvsplit.db.checks.MAX_JSON_DEPTH`, checked by :func:`validate_export`).
    """
    try:
        return json.loads(raw)
    except RecursionError:
        raise ImportValidationError(
            f"import rejected, nothing stored: {source} nests arrays and objects too "
            f"deeply to read (a field may nest at most {MAX_JSON_DEPTH} levels)"
        ) from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise ImportValidationError(f"import rejected, nothing stored: {source} is not JSON ({exc})") from None


_ENTRY_KEYS = {
    "bucket",
    "name",
    "params",
    "version",
    "backend",
    "score",
    "verification",
    "created_at",
    "published_at",
    "device",
}
_ENTRY_OPTIONAL = {"id", "status", "tuning_run_id"}
_BUCKET_KEYS = {"key", "gpu", "num_kv_heads", "head_dim", "dtype", "page_size", "signature", "source"}
_DEVICE_KEYS = {"name", "num_sms", "hbm_bandwidth_gbps", "read_bandwidth_gbps", "software", "fingerprint"}


def _check_device(name: str, dev: Any, what: str = "an object") -> dict[str, Any]:
    """The device object of an export entry (:func:`~kvsplit.db.records.device_to_dict`'s form), checked field
    by field (its fingerprint against its software versions), as the keyword arguments of
    :func:`~kvsplit.db.records.get_or_create_device`; raises ValueError naming the field."""
    if not isinstance(dev, Mapping) or set(dev) != _DEVICE_KEYS:
        raise ValueError(f"{name}: expected {what} with fields {sorted(_DEVICE_KEYS)}")
    device = {
        "name": field_str(f"{name}.name", dev["name"], max_len=128),
        "num_sms": field_int(f"{name}.num_sms", dev["num_sms"], 1),
        "hbm_bandwidth_gbps": field_num(f"{name}.hbm_bandwidth_gbps", dev["hbm_bandwidth_gbps"], positive=True),
        "read_bandwidth_gbps": field_num(
            f"{name}.read_bandwidth_gbps", dev["read_bandwidth_gbps"], positive=True, allow_none=True
        ),
        "software": field_json_obj(f"{name}.software", dev["software"], max_bytes=MAX_IMPORT_FIELD_BYTES),
    }
    fp = software_fingerprint(device["software"])
    if dev["fingerprint"] != fp:
        raise ValueError(
            f"{name}.fingerprint: {echo_value(dev['fingerprint'])} does not match its software versions (expected {fp!r})"
        )
    return device


def export_published(session: Session) -> dict[str, Any]:
    """Every published policy as versioned JSON-able data.

    Returns
    -------
    dict
        ``{"format": "kvsplit.policies", "format_version": 1, "exported_at":
        ISO-8601, "policies_version": int, "policies": [entry, ...]}``; each
        entry as :func:`policy_to_dict` (bucket, name, params, version,
        backend, score, verification, times, device with its software
        fingerprint).
    """
    pols = session.scalars(
        select(Policy)
        .options(selectinload(Policy.bucket), selectinload(Policy.device))
        .where(Policy.status == "published")
        .order_by(Policy.bucket_key)
    ).all()
    return {
        "format": EXPORT_FORMAT,
        "format_version": EXPORT_FORMAT_VERSION,
        "exported_at": utcnow().isoformat(),
        "policies_version": policies_version(session),
        "policies": [policy_to_dict(p) for p in pols],
    }


def _parse_time(name: str, v: Any) -> str | None:
    if v is None:
        return None
    if not isinstance(v, str):
        raise ValueError(f"{name}: expected an ISO-8601 string or null, got {echo_value(v)}")
    try:
        _dt.datetime.fromisoformat(v)
    except ValueError:
        raise ValueError(f"{name}: not an ISO-8601 time: {echo_value(v)}") from None
    return v


def validate_export(
    data: Any, *, validate_entry: Callable[[dict[str, Any]], None] | None = None
) -> list[dict[str, Any]]:
    """Check an export document field by field; return its normalised entries.

    Raises
    ------
    ImportValidationError
        On the first bad field, naming its path (``policies[3].bucket.head_dim``).
    """
    with _rejected_on_error():
        entries = _document_entries(
            data,
            EXPORT_FORMAT,
            EXPORT_FORMAT_VERSION,
            "policies",
            {"format", "format_version", "exported_at", "policies_version", "policies"},
        )
        out: list[dict[str, Any]] = []
        keys_seen: set[str] = set()
        for i, e in enumerate(entries):
            pre = f"policies[{i}]"
            if not isinstance(e, Mapping):
                raise ValueError(f"{pre}: expected an object")
            missing = _ENTRY_KEYS - set(e)
            if missing:
                raise ValueError(f"{pre}: missing fields {sorted(missing)}")
            extra = set(e) - _ENTRY_KEYS - _ENTRY_OPTIONAL
            if extra:
                raise ValueError(f"{pre}: unknown fields {sorted(extra)}")
            b = e["bucket"]
            if not isinstance(b, Mapping):
                raise ValueError(f"{pre}.bucket: expected an object")
            if set(b) != _BUCKET_KEYS:
                raise ValueError(f"{pre}.bucket: expected fields {sorted(_BUCKET_KEYS)}, got {sorted(b)}")
            key = field_str(f"{pre}.bucket.key", b["key"])
            if key in keys_seen:
                raise ValueError(f"{pre}.bucket.key: {key!r} appears twice in the file")
            keys_seen.add(key)
            gpu, hkv, hd, dt, ps = check_bucket_fields(
                f"{pre}.bucket", b["gpu"], b["num_kv_heads"], b["head_dim"], b["dtype"], b["page_size"]
            )
            if not isinstance(b["source"], str) or len(b["source"]) > 1024:
                raise ValueError(f"{pre}.bucket.source: expected a string of at most 1024 characters")
            signature = field_json_obj(f"{pre}.bucket.signature", b["signature"], max_bytes=MAX_IMPORT_FIELD_BYTES)
            bucket = {
                "key": key,
                "gpu": gpu,
                "num_kv_heads": hkv,
                "head_dim": hd,
                "dtype": dt,
                "page_size": ps,
                "signature": signature,
                "source": b["source"],
            }
            if "status" in e and e["status"] != "published":
                raise ValueError(
                    f"{pre}.status: only published policies can be imported, got {echo_value(e['status'])}"
                )
            if "tuning_run_id" in e and e["tuning_run_id"] is not None:
                field_int(f"{pre}.tuning_run_id", e["tuning_run_id"], 1)
            if "id" in e:
                field_int(f"{pre}.id", e["id"], 1)
            dev = e["device"]
            device = None
            if dev is not None:
                device = _check_device(f"{pre}.device", dev, "null or an object")
                if device["name"] != gpu:
                    raise ValueError(f"{pre}.device.name: {device['name']!r} differs from bucket.gpu {gpu!r}")
            entry = {
                "bucket": bucket,
                "name": field_str(f"{pre}.name", e["name"], max_len=64),
                "params": field_json_obj(
                    f"{pre}.params", e["params"], scalars_only=True, max_bytes=MAX_IMPORT_FIELD_BYTES
                ),
                "version": field_int(f"{pre}.version", e["version"], 1),
                "backend": field_str(f"{pre}.backend", e["backend"], choices=BACKENDS),
                "score": field_num(f"{pre}.score", e["score"], positive=True, allow_none=True),
                "verification": field_json_obj(
                    f"{pre}.verification", e["verification"], max_bytes=MAX_IMPORT_FIELD_BYTES
                ),
                "created_at": _parse_time(f"{pre}.created_at", e["created_at"]),
                "published_at": _parse_time(f"{pre}.published_at", e["published_at"]),
                "device": device,
            }
            _extra_check(pre, entry, validate_entry)
            out.append(entry)
        return out


def import_policies(
    session: Session,
    data: Any,
    *,
    validate_entry: Callable[[dict[str, Any]], None] | None = None,
) -> list[int]:
    """Import an export document; all-or-nothing. Returns the policy ids, in file order.

    Every entry is validated before anything is written
    (:func:`validate_export`). Each entry becomes a published policy of its
    bucket (bucket and device rows created as needed); an entry identical to a
    policy already stored (same bucket, params, backend, score) reuses that
    row, so importing the same file twice changes nothing (a policy retired
    since stays retired). The publish rules
    apply: an entry that may not replace the bucket's published policy (a
    GPU-measured or better one) is stored as ``draft`` with the reason in
    ``note``. Any error rolls the whole import back (the session's
    transaction is rolled back to where it was).
    """
    entries = validate_export(data, validate_entry=validate_entry)
    ids: list[int] = []
    changed = False
    with session.begin_nested():
        st = lock_store(session)
        for e in entries:
            b = e["bucket"]
            bucket = get_or_create_bucket(
                session,
                key=b["key"],
                gpu=b["gpu"],
                num_kv_heads=b["num_kv_heads"],
                head_dim=b["head_dim"],
                dtype=b["dtype"],
                page_size=b["page_size"],
                signature=b["signature"],
                source=b["source"],
            )
            device_id = None
            if e["device"] is not None:
                device_id = get_or_create_device(session, **e["device"]).id
            same = [
                p
                for p in session.scalars(select(Policy).where(Policy.bucket_id == bucket.id))
                if p.params == e["params"]
                and p.backend == e["backend"]
                and p.score == e["score"]
                and p.name == e["name"]
            ]
            if same:
                pol = next((p for p in same if p.status == "published"), same[0])
            else:
                pol = create_policy(
                    session,
                    bucket_id=bucket.id,
                    params=e["params"],
                    backend=e["backend"],
                    score=e["score"],
                    verification=e["verification"],
                    device_id=device_id,
                    name=e["name"],
                    note=f"imported (exported version {e['version']})",
                )
                changed = True
            if pol.status == "retired":
                # an operator retired this very policy: re-importing the same file (make run does, on
                # every start) must not bring it back
                ids.append(pol.id)
                continue
            if pol.status != "published":
                cur = published_of(session, bucket.id)
                why = publish_refusal(pol, cur)
                if why is None:
                    set_published(session, pol, cur)
                    changed = True
                else:
                    pol.note = f"imported, not published: {why}"[:2048]
            ids.append(pol.id)
        if changed:
            bump_version(st)
        session.flush()
    return ids


# ----------------------------------------------------------------------------
# Calibrations (``kvsplit db export --calibrations``)
# ----------------------------------------------------------------------------

CALIBRATIONS_FORMAT = "kvsplit.calibrations"
CALIBRATIONS_FORMAT_VERSION = 1
_CAL_KEYS = {
    "device",
    "kv_dtype",
    "q_len",
    "kernel_config",
    "constants",
    "error",
    "num_samples",
    "version",
    "created_at",
}


def calibration_to_dict(c: Calibration) -> dict[str, Any]:
    """Plain-data form of a calibration row (the calibrations export entry): its device
    (:func:`~kvsplit.db.records.device_to_dict`), ``kv_dtype``, ``q_len``, ``kernel_config``, ``constants``
    (SI units, :meth:`kvsplit.tuner.simulate.Calibration.to_dict`), ``error``, ``num_samples``, ``version``,
    ``created_at``."""
    return {
        "device": device_to_dict(c.device),
        "kv_dtype": c.kv_dtype,
        "q_len": c.q_len,
        "kernel_config": dict(c.kernel_config or {}),
        "constants": dict(c.constants or {}),
        "error": dict(c.error or {}),
        "num_samples": c.num_samples,
        "version": c.version,
        "created_at": iso_utc(c.created_at),
    }


def export_calibrations(session: Session, *, gpu: str | None = None) -> dict[str, Any]:
    """Every stored calibration (of GPU ``gpu`` when given) as versioned JSON-able data:
    ``{"format": "kvsplit.calibrations", "format_version": 1, "exported_at": ISO-8601, "calibrations":
    [entry, ...]}``, entries as :func:`calibration_to_dict`, oldest first."""
    return {
        "format": CALIBRATIONS_FORMAT,
        "format_version": CALIBRATIONS_FORMAT_VERSION,
        "exported_at": utcnow().isoformat(),
        "calibrations": [calibration_to_dict(c) for c in list_calibrations(session, gpu=gpu)],
    }


def validate_calibrations(
    data: Any, *, validate_entry: Callable[[dict[str, Any]], None] | None = None
) -> list[dict[str, Any]]:
    """Check a calibrations export document field by field; return its normalised entries. ``validate_entry``
    is an optional extra check of an entry (the CLI passes one that reads the constants and checks the KV
    dtype and q_len, :func:`kvsplit.tuner.calibrate.check_calibration_entry`).

    Raises
    ------
    ImportValidationError
        On the first bad field, naming its path (``calibrations[2].q_len``).
    """
    with _rejected_on_error():
        entries = _document_entries(
            data,
            CALIBRATIONS_FORMAT,
            CALIBRATIONS_FORMAT_VERSION,
            "calibrations",
            {"format", "format_version", "exported_at", "calibrations"},
        )
        out = []
        for i, e in enumerate(entries):
            pre = f"calibrations[{i}]"
            if not isinstance(e, Mapping) or set(e) != _CAL_KEYS:
                got = sorted(e) if isinstance(e, Mapping) else type(e).__name__
                raise ValueError(f"{pre}: expected an object with fields {sorted(_CAL_KEYS)}, got {got}")
            entry = {
                "device": _check_device(f"{pre}.device", e["device"]),
                "kv_dtype": field_str(f"{pre}.kv_dtype", e["kv_dtype"], max_len=32),
                "q_len": field_int(f"{pre}.q_len", e["q_len"], 1),
                "kernel_config": field_json_obj(
                    f"{pre}.kernel_config", e["kernel_config"], max_bytes=MAX_IMPORT_FIELD_BYTES
                ),
                "constants": field_json_obj(f"{pre}.constants", e["constants"], max_bytes=MAX_IMPORT_FIELD_BYTES),
                "error": field_json_obj(f"{pre}.error", e["error"], max_bytes=MAX_IMPORT_FIELD_BYTES),
                "num_samples": field_int(f"{pre}.num_samples", e["num_samples"], 0),
                "version": field_int(f"{pre}.version", e["version"], 1),
                "created_at": _parse_time(f"{pre}.created_at", e["created_at"]),
            }
            _extra_check(pre, entry, validate_entry)
            out.append(entry)
        return out


def import_calibrations(
    session: Session, data: Any, *, validate_entry: Callable[[dict[str, Any]], None] | None = None
) -> list[int]:
    """Import a calibrations export document; all-or-nothing. Returns the calibration ids, in file order.

    Every entry is validated first (:func:`validate_calibrations`). Each becomes a calibration of its device
    (created as needed), KV dtype and q_len, with the next version of that (device, config, KV dtype, q_len)
    in this store and the exported ``created_at`` (the time of the fit, which the lookup's "newest" reads); an entry equal to a stored calibration (same device, config, KV dtype, q_len, constants,
    error and sample count) reuses that row, so importing the same file twice changes nothing. Any error rolls
    the whole import back.
    """
    entries = validate_calibrations(data, validate_entry=validate_entry)
    ids: list[int] = []
    with session.begin_nested():
        for e in entries:
            dev = get_or_create_device(session, **e["device"])
            key = json.dumps(e["kernel_config"], sort_keys=True, separators=(",", ":"))
            same = session.scalars(
                select(Calibration).where(
                    Calibration.device_id == dev.id,
                    Calibration.config_key == key,
                    Calibration.kv_dtype == e["kv_dtype"],
                    Calibration.q_len == e["q_len"],
                )
            ).all()
            hit = next(
                (
                    c
                    for c in same
                    if c.constants == e["constants"] and c.error == e["error"] and c.num_samples == e["num_samples"]
                ),
                None,
            )
            if hit is None:
                hit = record_calibration(
                    session,
                    device_id=dev.id,
                    constants=e["constants"],
                    kv_dtype=e["kv_dtype"],
                    q_len=e["q_len"],
                    error=e["error"],
                    kernel_config=e["kernel_config"],
                    num_samples=e["num_samples"],
                )
                if e["created_at"] is not None:  # when it was fitted: the lookup takes the newest
                    t = _dt.datetime.fromisoformat(e["created_at"])
                    hit.created_at = t if t.tzinfo is not None else t.replace(tzinfo=_dt.UTC)
            ids.append(hit.id)
        session.flush()
    return ids
