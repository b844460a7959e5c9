"""SQLAlchemy 2.0 typed models of the policy store.

Tables (all created by the Alembic migrations in ``kvsplit/db/migrations``,
never by ``create_all`` outside tests):

``devices``
    One row per (GPU name, software fingerprint): SM count, vendor bandwidth,
    measured read bandwidth, software versions (torch, triton, CUDA, driver).
``calibrations``
    Fitted simulator constants per device, kernel config, KV cache dtype and
    q_len (the shape the sample was timed at), with their error against the
    GPU; ``version`` increases per (device, config_key, kv_dtype, q_len).
``buckets``
    A bucket key string (``kvsplit.kernels.buckets.BucketKey`` string form),
    its fields, its length signature, where it came from and the training /
    held-out batches it was tuned and verified on.
``policies``
    A tuned policy of one bucket: policy name (``tuned``), ``make_plan``
    params, ``version`` (increasing per bucket), ``status`` draft / published /
    retired, ``backend`` gpu / sim, the tuning run that made it, the
    verification summary (geomean time / HBM floor of ``tuned`` and each
    baseline on held-out batches). At most one published policy per bucket:
    enforced by :func:`kvsplit.db.store.publish` under a transaction and by a
    partial unique index (SQLite, PostgreSQL).
``tuning_runs``
    One ``kvsplit tune`` invocation for one bucket: Optuna study name, storage
    kind, backend, requested / finished trials, best value and params, status,
    started / finished times, and the owner process (host, PID, process start
    time) with its heartbeat: a ``running`` row whose process is gone (same
    host) or whose heartbeat is older than ``stale_after_s`` seconds is marked
    ``failed`` with an ``abandoned: ...`` message.
``measurements``
    One timed (policy, batch): policy or baseline name and params, bucket,
    batch (kv_lens), role (train / heldout), time in seconds, HBM floor in
    seconds and their ratio, backend, device, software versions.
``store_state``
    A single row holding ``policies_version``, bumped on every publish, retire
    and import so servers can poll one integer.
``traffic`` and ``traffic_bins``
    What the plan service served, per bucket key and hour (hours since the
    Unix epoch, UTC): request count, batch-size and total-token ranges,
    requests per answer source, distance figures (``traffic``), and coarse
    histograms of the batch size and the total tokens (``traffic_bins``: one
    row per key, hour, kind and bin). Counts only: no batch's kv_lens is kept.
    Written by :func:`kvsplit.db.traffic.add_traffic` (an atomic upsert-add, so
    several server processes add into one row without losing counts).
"""

from __future__ import annotations

import datetime as _dt
from typing import Any, Optional

from sqlalchemy import (
    JSON,
    BigInteger,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

__all__ = [
    "Base",
    "Device",
    "Calibration",
    "Bucket",
    "Policy",
    "TuningRun",
    "Measurement",
    "StoreState",
    "Traffic",
    "TrafficBin",
    "TRAFFIC_BIN_KINDS",
    "POLICY_STATUSES",
    "BACKENDS",
    "RUN_STATUSES",
    "ROLES",
    "utcnow",
]

POLICY_STATUSES = ("draft", "published", "retired")
BACKENDS = ("gpu", "sim")
RUN_STATUSES = ("running", "finished", "interrupted", "failed")
ROLES = ("train", "heldout")


def utcnow() -> _dt.datetime:
    """Current time, UTC, timezone-aware."""
    return _dt.datetime.now(_dt.UTC)


class Base(DeclarativeBase):
    """Declarative base; JSON columns map ``dict``/``list`` annotations."""

    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON}


class Device(Base):
    """A GPU model with one software stack (unique by name + fingerprint)."""

    __tablename__ = "devices"
    __table_args__ = (UniqueConstraint("name", "fingerprint", name="uq_devices_name_fingerprint"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    num_sms: Mapped[int] = mapped_column(Integer)
    hbm_bandwidth_gbps: Mapped[float] = mapped_column(Float)
    read_bandwidth_gbps: Mapped[Optional[float]] = mapped_column(Float, nullable=True)
    software: Mapped[dict[str, Any]] = mapped_column(default=dict)
    fingerprint: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[_dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Calibration(Base):
    """Simulator constants fitted on one device for one kernel config, KV cache dtype and q_len.

    ``kv_dtype`` is the dtype of the K/V elements the sample was timed with (``"bfloat16"``, ``"float16"`` or
    ``"float8_e4m3fn"``: the model's dtype for a 16-bit cache), ``q_len`` its query tokens per request (1-8).
    Rows stored before these columns existed read as ``"bfloat16"`` and 1 (migration 0005).
    """

    __tablename__ = "calibrations"
    __table_args__ = (
        UniqueConstraint(
            "device_id", "config_key", "kv_dtype", "q_len", "version", name="uq_calibrations_device_config_version"
        ),
        CheckConstraint("q_len >= 1", name="ck_calibrations_q_len"),
        Index("ix_calibrations_lookup", "device_id", "kv_dtype", "q_len"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    device_id: Mapped[int] = mapped_column(ForeignKey("devices.id", ondelete="CASCADE"))
    config_key: Mapped[str] = mapped_column(String(256))
    kv_dtype: Mapped[str] = mapped_column(String(32), server_default="bfloat16")
    q_len: Mapped[int] = mapped_column(Integer, server_default="1")
    kernel_config: Mapped[dict[str, Any]] = mapped_column(default=dict)
    constants: Mapped[dict[str, Any]] = mapped_column(default=dict)
    error: Mapped[dict[str, Any]] = mapped_column(default=dict)
    num_samples: Mapped[int] = mapped_column(Integer, default=0)
    version: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[_dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    device: Mapped[Device] = relationship()


class Bucket(Base):
    """A tuning bucket: exact shape fields plus a length-distribution signature."""

    __tablename__ = "buckets"

    id: Mapped[int] = mapped_column(primary_key=True)
    key: Mapped[str] = mapped_column(String(512), unique=True)
    gpu: Mapped[str] = mapped_column(String(128))
    num_kv_heads: Mapped[int] = mapped_column(Integer)
    head_dim: Mapped[int] = mapped_column(Integer)
    dtype: Mapped[str] = mapped_column(String(16))
    page_size: Mapped[int] = mapped_column(Integer)
    signature: Mapped[dict[str, Any]] = mapped_column(default=dict)
    source: Mapped[str] = mapped_column(String(256), default="")
    sample_batches: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[_dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    policies: Mapped[list[Policy]] = relationship(back_populates="bucket", order_by="Policy.version")


Index("ix_buckets_shape", Bucket.gpu, Bucket.num_kv_heads, Bucket.head_dim, Bucket.dtype, Bucket.page_size)


class TuningRun(Base):
    """One tuning invocation for one bucket (an Optuna study may span several)."""

    __tablename__ = "tuning_runs"
    __table_args__ = (
        CheckConstraint("backend in ('gpu', 'sim')", name="ck_tuning_runs_backend"),
        CheckConstraint("status in ('running', 'finished', 'interrupted', 'failed')", name="ck_tuning_runs_status"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    bucket_id: Mapped[int] = mapped_column(ForeignKey("buckets.id", ondelete="CASCADE"), index=True)
    study_name: Mapped[str] = mapped_column(String(512), index=True)
    storage_kind: Mapped[str] = mapped_column(String(32), default="rdb")
    backend: Mapped[str] = mapped_column(String(8))
    device_id: Mapped[Optional[int]] = mapped_column(ForeignKey("devices.id"), nullable=True)
    n_trials: Mapped[int] = mapped_column(Integer)
    n_finished: Mapped[int] = mapped_column(Integer, default=0)
    workers: Mapped[int] = mapped_column(Integer, default=1)
    best_value: Mapped[Optional[float]] = mapped_column(Float, nullable=True)
    best_params: Mapped[Optional[dict[str, Any]]] = mapped_column(nullable=True)
    status: Mapped[str] = mapped_column(String(16), default="running")
    message: Mapped[str] = mapped_column(String(2048), default="")
    started_at: Mapped[_dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    finished_at: Mapped[Optional[_dt.datetime]] = mapped_column(DateTime(timezone=True), nullable=True)
    # the process that owns the run (kvsplit.db.store.process_identity) and its liveness signal:
    # a running row whose process is gone or silent is marked failed by kvsplit.db.store.reap_runs
    host: Mapped[Optional[str]] = mapped_column(String(255), nullable=True)
    pid: Mapped[Optional[int]] = mapped_column(Integer, nullable=True)
    proc_start: Mapped[Optional[str]] = mapped_column(String(32), nullable=True)  # "<start ticks>@<PID ns>"
    heartbeat_at: Mapped[Optional[_dt.datetime]] = mapped_column(DateTime(timezone=True), nullable=True)
    stale_after_s: Mapped[Optional[int]] = mapped_column(Integer, nullable=True)

    bucket: Mapped[Bucket] = relationship()


class Policy(Base):
    """A policy for one bucket (``tuned`` params), versioned per bucket."""

    __tablename__ = "policies"
    __table_args__ = (
        UniqueConstraint("bucket_id", "version", name="uq_policies_bucket_version"),
        CheckConstraint("status in ('draft', 'published', 'retired')", name="ck_policies_status"),
        CheckConstraint("backend in ('gpu', 'sim')", name="ck_policies_backend"),
        CheckConstraint("version >= 1", name="ck_policies_version"),
        # one published policy per bucket, where the backend has partial indexes
        Index(
            "uq_policies_one_published",
            "bucket_id",
            unique=True,
            sqlite_where=text("status = 'published'"),
            postgresql_where=text("status = 'published'"),
        ),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    bucket_id: Mapped[int] = mapped_column(ForeignKey("buckets.id", ondelete="CASCADE"), index=True)
    bucket_key: Mapped[str] = mapped_column(String(512), index=True)
    name: Mapped[str] = mapped_column(String(64), default="tuned")
    params: Mapped[dict[str, Any]] = mapped_column(default=dict)
    version: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16), default="draft", index=True)
    backend: Mapped[str] = mapped_column(String(8))
    tuning_run_id: Mapped[Optional[int]] = mapped_column(
        ForeignKey("tuning_runs.id", ondelete="SET NULL"), nullable=True
    )
    device_id: Mapped[Optional[int]] = mapped_column(ForeignKey("devices.id"), nullable=True)
    verification: Mapped[dict[str, Any]] = mapped_column(default=dict)
    score: Mapped[Optional[float]] = mapped_column(Float, nullable=True)
    note: Mapped[str] = mapped_column(String(2048), default="")
    created_at: Mapped[_dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    published_at: Mapped[Optional[_dt.datetime]] = mapped_column(DateTime(timezone=True), nullable=True)
    retired_at: Mapped[Optional[_dt.datetime]] = mapped_column(DateTime(timezone=True), nullable=True)

    bucket: Mapped[Bucket] = relationship(back_populates="policies")
    tuning_run: Mapped[Optional[TuningRun]] = relationship()
    device: Mapped[Optional[Device]] = relationship()


class Measurement(Base):
    """One timed (policy, batch) on one backend and device."""

    __tablename__ = "measurements"
    __table_args__ = (
        UniqueConstraint(
            "tuning_run_id",
            "stage",
            "policy_name",
            "role",
            "batch_index",
            name="uq_measurements_run_stage_policy_batch",
        ),
        CheckConstraint("backend in ('gpu', 'sim')", name="ck_measurements_backend"),
        CheckConstraint("time_s > 0", name="ck_measurements_time"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    bucket_id: Mapped[int] = mapped_column(ForeignKey("buckets.id", ondelete="CASCADE"), index=True)
    tuning_run_id: Mapped[Optional[int]] = mapped_column(
        ForeignKey("tuning_runs.id", ondelete="CASCADE"), nullable=True, index=True
    )
    policy_id: Mapped[Optional[int]] = mapped_column(ForeignKey("policies.id", ondelete="SET NULL"), nullable=True)
    device_id: Mapped[Optional[int]] = mapped_column(ForeignKey("devices.id"), nullable=True)
    stage: Mapped[str] = mapped_column(String(32), default="verify")
    policy_name: Mapped[str] = mapped_column(String(64))
    params: Mapped[dict[str, Any]] = mapped_column(default=dict)
    role: Mapped[str] = mapped_column(String(16), default="heldout")
    batch_index: Mapped[int] = mapped_column(Integer, default=0)
    kv_lens: Mapped[list[Any]] = mapped_column(default=list)
    batch_size: Mapped[int] = mapped_column(Integer)
    total_tokens: Mapped[int] = mapped_column(BigInteger)
    time_s: Mapped[float] = mapped_column(Float)
    floor_s: Mapped[Optional[float]] = mapped_column(Float, nullable=True)
    ratio: Mapped[Optional[float]] = mapped_column(Float, nullable=True)
    backend: Mapped[str] = mapped_column(String(8))
    software: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[_dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class StoreState(Base):
    """Single-row table (id = 1) with the policies version counter."""

    __tablename__ = "store_state"

    id: Mapped[int] = mapped_column(primary_key=True)
    policies_version: Mapped[int] = mapped_column(Integer, default=0)
    updated_at: Mapped[_dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


TRAFFIC_BIN_KINDS = ("batch", "tokens")
"""Histograms of :class:`TrafficBin`: the batch size B and the total tokens sum(kv_len) of each request."""


class Traffic(Base):
    """The plan requests of one bucket key in one hour (sums; :mod:`kvsplit.db.traffic`)."""

    __tablename__ = "traffic"
    __table_args__ = (
        CheckConstraint("requests >= 1", name="ck_traffic_requests"),
        Index("ix_traffic_hour", "hour"),
    )

    key: Mapped[str] = mapped_column(String(512), primary_key=True)
    hour: Mapped[int] = mapped_column(BigInteger, primary_key=True)  # floor(unix seconds / 3600), UTC
    requests: Mapped[int] = mapped_column(BigInteger)
    n_tuned: Mapped[int] = mapped_column(BigInteger, default=0)
    n_simulated: Mapped[int] = mapped_column(BigInteger, default=0)
    n_fallback: Mapped[int] = mapped_column(BigInteger, default=0)
    n_far: Mapped[int] = mapped_column(BigInteger, default=0)  # matched beyond kernels.buckets.DISTANCE_LIMIT
    batch_min: Mapped[int] = mapped_column(Integer)
    batch_max: Mapped[int] = mapped_column(Integer)
    tokens_min: Mapped[int] = mapped_column(BigInteger)
    tokens_max: Mapped[int] = mapped_column(BigInteger)
    distance_max: Mapped[Optional[float]] = mapped_column(Float, nullable=True)  # None: every request fell back
    distance_sum: Mapped[float] = mapped_column(Float, default=0.0)  # over the tuned + simulated requests


class TrafficBin(Base):
    """One histogram bin of :class:`Traffic`: ``n`` requests whose value ``x`` (B or total tokens)
    has ``x.bit_length() == bin`` (``2^(bin-1) <= x < 2^bin``; bin 0 holds x = 0)."""

    __tablename__ = "traffic_bins"
    __table_args__ = (
        CheckConstraint("kind in ('batch', 'tokens')", name="ck_traffic_bins_kind"),
        CheckConstraint("bin >= 0 and bin <= 64", name="ck_traffic_bins_bin"),
        Index("ix_traffic_bins_hour", "hour"),
    )

    key: Mapped[str] = mapped_column(String(512), primary_key=True)
    hour: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    kind: Mapped[str] = mapped_column(String(8), primary_key=True)
    bin: Mapped[int] = mapped_column(Integer, primary_key=True)
    n: Mapped[int] = mapped_column(BigInteger)
