"""The policy store API: engines, sessions, migrations, policies, runs, measurements.

Everything other code needs from the database goes through this module; it
depends on nothing else of kvsplit (plain data in, ORM rows or plain data out).
The code lives in modules by concern, re-exported here: :mod:`.engine`
(engines, sessions, migrations), :mod:`.policies` (buckets, policies, the
publish rules), :mod:`.transfer` (export / import), :mod:`.records` (devices,
calibrations, runs, measurements) and :mod:`.checks` (field checks).

Engines and sessions
--------------------
``get_engine(url=None)``
    One cached engine per URL (default: ``KVSPLIT_DATABASE_URL``, see
    :mod:`kvsplit.db.settings`). SQLite files get WAL, ``busy_timeout`` and
    foreign keys; transactions are real (``BEGIN``, or ``BEGIN IMMEDIATE`` for
    write sessions) instead of pysqlite's implicit ones.
``session_scope(url=None, *, write=False, check=True)``
    Context manager yielding a :class:`~sqlalchemy.orm.Session` that commits on
    success and rolls back on error. ``write=True`` takes SQLite's write lock
    at the start (other writers wait up to the busy timeout). ``check=True``
    verifies the schema revision first (once per engine).
``upgrade(url=None)`` / ``check_schema(engine)`` / ``current_revision(engine)`` / ``head_revision()``
    Alembic migrations shipped in ``kvsplit/db/migrations`` with their own
    version table ``kvsplit_alembic_version``. ``check_schema`` raises
    :class:`SchemaError` telling to run ``kvsplit db upgrade`` when the
    database is empty or behind.

Policies (rows of :class:`~kvsplit.db.models.Policy`, bucket eagerly loaded)
--------------------------------------------------------------------------
``get_or_create_bucket(session, *, key, gpu, num_kv_heads, head_dim, dtype, page_size, signature=None, source="", sample_batches=None)``
``create_policy(session, *, bucket_id, params, backend, score=None, verification=None, tuning_run_id=None, device_id=None, name="tuned", note="")``
    A new ``draft`` with ``version`` = previous max + 1 for the bucket.
``publish(session, policy_id, *, force=False)``
    Makes it the bucket's one published policy and retires the previous one.
    Refuses (:class:`PublishRefused`, a ValueError) when the verification did
    not pass, when the bucket's published policy was measured on the GPU and
    this one only simulated, or when the published one scored better on the
    same backend (``score`` = geomean time / HBM floor on held-out batches,
    lower is better). ``force=True`` skips these checks.
``retire(session, policy_id)``
``get_published(session, bucket_key)`` / ``list_published(session, *, gpu=None, num_kv_heads=None, head_dim=None, dtype=None, page_size=None)`` / ``list_policies(...)``
``policies_version(session) -> int``
    Counter bumped by every publish, retire and import: servers poll it.
``export_published(session) -> dict`` / ``import_policies(session, data, *, validate_entry=None) -> list[int]``
    Versioned JSON (``format`` ``"kvsplit.policies"``, ``format_version`` 1)
    with each policy's bucket, params, verification and device fingerprint.
    Import validates every field of every entry first and raises
    :class:`ImportValidationError` (a ValueError naming the field) before
    writing anything; ``validate_entry`` is an optional extra check (the CLI
    passes one that builds a plan with the params).
``export_calibrations(session, *, gpu=None) -> dict`` / ``import_calibrations(session, data, *, validate_entry=None)``
    The stored calibrations (device, KV dtype, q_len, kernel config, constants, error), ``format``
    ``"kvsplit.calibrations"`` version 1; the import is all-or-nothing and idempotent like the policies'.

Devices, calibrations, runs, measurements
-----------------------------------------
``get_or_create_device(session, *, name, num_sms, hbm_bandwidth_gbps, software=None, read_bandwidth_gbps=None)``,
``record_calibration(session, *, device_id, constants, kv_dtype, q_len=1, ...)`` /
``latest_calibration(session, *, gpu, kv_dtype, q_len=1, config_key=None)`` (a calibration is per GPU, KV
cache dtype and q_len) / ``list_calibrations(session, *, gpu=None)``,
``start_run(...)`` / ``finish_run(...)`` / ``list_runs(...)``,
``run_heartbeat(url, run_id, interval_s)`` / ``reap_runs(session)`` (a ``running`` row whose owner
process is gone, or whose heartbeat is older than its ``stale_after_s``, becomes ``failed`` with an
``abandoned: ...`` message; ``start_run`` and ``GET /v1/runs`` call it),
``record_measurement(...)`` / ``list_measurements(...)``.

Traffic statistics (:mod:`.traffic`)
------------------------------------
``add_traffic(session, cells)`` (atomic upsert-add per bucket key and hour), ``prune_traffic(session, *,
before_hour)``, ``read_traffic(session, *, since_hour) -> list[TrafficSum]``.

Examples
--------
>>> from kvsplit.db import store
>>> url = "sqlite:///./kvsplit.db"
>>> store.upgrade(url)                                      # doctest: +SKIP
>>> with store.session_scope(url) as s:                     # doctest: +SKIP
...     table = [(p.bucket_key, p.params) for p in store.list_published(s, gpu="NVIDIA H200")]
...     version = store.policies_version(s)
"""

from __future__ import annotations

# The store is split by concern; this module is its one public face (``from kvsplit.db import store``).
from .checks import iso_utc, software_fingerprint
from .engine import (
    VERSION_TABLE,
    SchemaError,
    check_exists,
    check_schema,
    current_revision,
    describe_error,
    dispose_engines,
    get_engine,
    head_revision,
    resolve_url,
    safe_url,
    schema_lock,
    session_scope,
    upgrade,
    upgrade_from,
)
from .policies import (
    PublishRefused,
    create_policy,
    get_bucket,
    get_or_create_bucket,
    get_policy,
    get_published,
    list_buckets,
    list_policies,
    list_published,
    policies_version,
    policy_to_dict,
    publish,
    retire,
)
from .records import (
    DEFAULT_STALE_AFTER_S,
    beat_run,
    finish_run,
    get_device,
    get_or_create_device,
    latest_calibration,
    list_calibrations,
    list_measurements,
    list_runs,
    measured_read_bandwidth,
    process_alive,
    process_identity,
    reap_runs,
    record_calibration,
    record_measurement,
    run_abandoned,
    run_heartbeat,
    set_device_bandwidth,
    start_run,
)
from .traffic import TrafficCell, TrafficSum, add_traffic, prune_traffic, read_traffic
from .transfer import (
    CALIBRATIONS_FORMAT,
    EXPORT_FORMAT,
    EXPORT_FORMAT_VERSION,
    ImportValidationError,
    export_calibrations,
    export_published,
    import_calibrations,
    import_policies,
    validate_export,
)

__all__ = [
    "VERSION_TABLE",
    "EXPORT_FORMAT",
    "EXPORT_FORMAT_VERSION",
    "CALIBRATIONS_FORMAT",
    "SchemaError",
    "PublishRefused",
    "ImportValidationError",
    "resolve_url",
    "safe_url",
    "describe_error",
    "check_exists",
    "get_engine",
    "dispose_engines",
    "session_scope",
    "upgrade",
    "upgrade_from",
    "schema_lock",
    "check_schema",
    "current_revision",
    "head_revision",
    "software_fingerprint",
    "iso_utc",
    "get_or_create_device",
    "get_device",
    "set_device_bandwidth",
    "measured_read_bandwidth",
    "record_calibration",
    "latest_calibration",
    "list_calibrations",
    "get_or_create_bucket",
    "get_bucket",
    "list_buckets",
    "create_policy",
    "publish",
    "retire",
    "get_policy",
    "get_published",
    "list_published",
    "list_policies",
    "policies_version",
    "policy_to_dict",
    "export_published",
    "export_calibrations",
    "import_calibrations",
    "import_policies",
    "validate_export",
    "start_run",
    "finish_run",
    "list_runs",
    "reap_runs",
    "run_abandoned",
    "run_heartbeat",
    "beat_run",
    "process_identity",
    "process_alive",
    "DEFAULT_STALE_AFTER_S",
    "record_measurement",
    "list_measurements",
    "TrafficCell",
    "TrafficSum",
    "add_traffic",
    "prune_traffic",
    "read_traffic",
]
