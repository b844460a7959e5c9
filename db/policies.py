"""Buckets and policies with the publish rules (part of :mod:`kvsplit.db.store`).

``publish`` makes a policy its bucket's one published policy and retires the
previous one; it refuses (:class:`PublishRefused`) a policy whose verification
did not pass, a simulated policy over a GPU-measured one, and a worse score on
the same backend. Every publish, retire and import bumps ``policies_version``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from sqlalchemy import func, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, selectinload

from .checks import DTYPES, HEAD_DIMS, field_int, field_json_obj, field_num, field_str, iso_utc
from .models import (
    BACKENDS,
    POLICY_STATUSES,
    Bucket,
    Policy,
    StoreState,
    utcnow,
)
from .records import device_to_dict


class PublishRefused(ValueError):
    """``publish`` refused to replace the bucket's published policy."""


# ----------------------------------------------------------------------------
# Buckets and policies
# ----------------------------------------------------------------------------


def check_bucket_fields(prefix: str, gpu: Any, num_kv_heads: Any, head_dim: Any, dtype: Any, page_size: Any):
    gpu = field_str(f"{prefix}.gpu", gpu, max_len=128)
    num_kv_heads = field_int(f"{prefix}.num_kv_heads", num_kv_heads, 1, 1024)
    head_dim = field_int(f"{prefix}.head_dim", head_dim)
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"{prefix}.head_dim: expected one of {HEAD_DIMS}, got {head_dim}")
    dtype = field_str(f"{prefix}.dtype", dtype, choices=DTYPES)
    page_size = field_int(f"{prefix}.page_size", page_size, 1, 256)
    return gpu, num_kv_heads, head_dim, dtype, page_size


def get_or_create_bucket(
    session: Session,
    *,
    key: str,
    gpu: str,
    num_kv_heads: int,
    head_dim: int,
    dtype: str,
    page_size: int,
    signature: Mapping[str, Any] | None = None,
    source: str = "",
    sample_batches: Mapping[str, Any] | None = None,
) -> Bucket:
    """The bucket row of ``key``, created if missing.

    An existing row must have the same shape fields (else ValueError); its
    sample batches are kept (a bucket is tuned and verified on one fixed set)
    unless it has none yet.
    """
    key = field_str("bucket.key", key)
    gpu, num_kv_heads, head_dim, dtype, page_size = check_bucket_fields(
        "bucket", gpu, num_kv_heads, head_dim, dtype, page_size
    )
    sig = field_json_obj("bucket.signature", signature or {})
    batches = field_json_obj("bucket.sample_batches", sample_batches or {})
    b = session.scalars(select(Bucket).where(Bucket.key == key)).first()
    if b is None:
        b = Bucket(
            key=key,
            gpu=gpu,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            dtype=dtype,
            page_size=page_size,
            signature=sig,
            source=str(source)[:256],
            sample_batches=batches,
        )
        try:
            with session.begin_nested():
                session.add(b)
        except IntegrityError:
            b = session.scalars(select(Bucket).where(Bucket.key == key)).one()
    fields = (b.gpu, b.num_kv_heads, b.head_dim, b.dtype, b.page_size)
    if fields != (gpu, num_kv_heads, head_dim, dtype, page_size):
        raise ValueError(
            f"bucket.key: {key!r} is stored for (gpu, num_kv_heads, head_dim, dtype, page_size) = {fields}, "
            f"not {(gpu, num_kv_heads, head_dim, dtype, page_size)}"
        )
    if batches and not b.sample_batches:
        b.sample_batches = batches
    session.flush()
    return b


def get_bucket(session: Session, key: str) -> Bucket | None:
    """The bucket row of ``key`` or None."""
    return session.scalars(select(Bucket).where(Bucket.key == key)).first()


def list_buckets(session: Session, *, gpu: str | None = None) -> list[Bucket]:
    """All bucket rows (optionally of one GPU), by id."""
    q = select(Bucket)
    if gpu is not None:
        q = q.where(Bucket.gpu == gpu)
    return list(session.scalars(q.order_by(Bucket.id)))


def create_policy(
    session: Session,
    *,
    bucket_id: int,
    params: Mapping[str, Any],
    backend: str,
    score: float | None = None,
    verification: Mapping[str, Any] | None = None,
    tuning_run_id: int | None = None,
    device_id: int | None = None,
    name: str = "tuned",
    note: str = "",
) -> Policy:
    """A new ``draft`` policy of the bucket; ``version`` = previous max + 1.

    Parameters
    ----------
    params : dict
        ``make_plan`` params of policy ``name`` (flat JSON scalars).
    backend : str
        ``"gpu"`` (measured) or ``"sim"`` (simulated).
    score : float, optional
        Geomean time / HBM floor of this policy on the bucket's held-out
        batches (lower is better); ``publish`` compares it.
    verification : dict, optional
        Summary of the verification (geomean time / floor per policy, ...).
    """
    bucket = session.get(Bucket, bucket_id)
    if bucket is None:
        raise KeyError(f"bucket id {bucket_id} not found")
    backend = field_str("backend", backend, choices=BACKENDS)
    p = field_json_obj("params", params, scalars_only=True)
    ver = field_json_obj("verification", verification or {})
    sc = field_num("score", score, positive=True, allow_none=True)
    # serialize version numbering with publish/retire/import: two tuning hosts finishing the same bucket
    # at once on PostgreSQL would otherwise both take max + 1 and one would fail on the unique version
    lock_store(session)
    last = session.scalar(select(func.max(Policy.version)).where(Policy.bucket_id == bucket_id))
    pol = Policy(
        bucket_id=bucket_id,
        bucket_key=bucket.key,
        name=field_str("name", name, max_len=64),
        params=p,
        version=(last or 0) + 1,
        status="draft",
        backend=backend,
        tuning_run_id=tuning_run_id,
        device_id=device_id,
        verification=ver,
        score=sc,
        note=str(note)[:2048],
    )
    session.add(pol)
    session.flush()
    return pol


def lock_store(session: Session) -> StoreState:
    """Take the store's write lock (a no-op UPDATE of the state row) and return the row."""
    session.execute(update(StoreState).where(StoreState.id == 1).values(id=StoreState.id))
    st = session.get(StoreState, 1, populate_existing=True)
    if st is None:  # a database migrated without the seed row
        st = StoreState(id=1, policies_version=0)
        session.add(st)
        session.flush()
    return st


def bump_version(st: StoreState) -> None:
    st.policies_version = (st.policies_version or 0) + 1
    st.updated_at = utcnow()


def published_of(session: Session, bucket_id: int) -> Policy | None:
    return session.scalars(
        select(Policy).where(Policy.bucket_id == bucket_id, Policy.status == "published").order_by(Policy.id)
    ).first()


def publish_refusal(new: Policy, cur: Policy | None) -> str | None:
    """Why ``new`` must not replace ``cur`` (None when it may)."""
    ver = new.verification or {}
    if ver.get("passed") is False:
        return (
            f"policy {new.id} failed verification (tuned geomean {ver.get('tuned_geomean_ratio')} vs best "
            f"baseline {ver.get('best_baseline')} {ver.get('best_baseline_geomean_ratio')})"
        )
    if cur is None or cur.id == new.id:
        return None
    if cur.backend == "gpu" and new.backend == "sim":
        return f"bucket {cur.bucket_key!r} has a GPU-measured policy ({cur.id}); a simulated one never replaces it"
    if cur.backend == new.backend and cur.score is not None and new.score is not None and new.score > cur.score:
        return (
            f"bucket {cur.bucket_key!r}: published policy {cur.id} scores {cur.score:.4f} (time / HBM floor), "
            f"better than {new.score:.4f} of policy {new.id}"
        )
    return None


def publish(session: Session, policy_id: int, *, force: bool = False) -> Policy:
    """Make ``policy_id`` the published policy of its bucket (retiring the old one).

    Runs under the store's write lock, so two publishers of one bucket
    serialise; the partial unique index backs it up.

    Raises
    ------
    KeyError
        Unknown ``policy_id``.
    PublishRefused
        See the module docstring; nothing is changed.
    """
    st = lock_store(session)
    pol = session.get(Policy, policy_id, populate_existing=True)
    if pol is None:
        raise KeyError(f"policy id {policy_id} not found")
    cur = published_of(session, pol.bucket_id)
    if cur is not None and cur.id == pol.id:
        return pol
    if not force:
        why = publish_refusal(pol, cur)
        if why is not None:
            raise PublishRefused(why)
    set_published(session, pol, cur)
    bump_version(st)
    session.flush()
    return pol


def set_published(session: Session, pol: Policy, cur: Policy | None) -> None:
    now = utcnow()
    if cur is not None and cur.id != pol.id:
        cur.status = "retired"
        cur.retired_at = now
        session.flush()  # before the new one, or the partial unique index fires
    pol.status = "published"
    pol.published_at = now
    pol.retired_at = None
    session.flush()


def retire(session: Session, policy_id: int) -> Policy:
    """Retire a policy (the bucket then falls back to the default policy)."""
    st = lock_store(session)
    pol = session.get(Policy, policy_id, populate_existing=True)
    if pol is None:
        raise KeyError(f"policy id {policy_id} not found")
    if pol.status != "retired":
        pol.status = "retired"
        pol.retired_at = utcnow()
        bump_version(st)
        session.flush()
    return pol


def get_policy(session: Session, policy_id: int) -> Policy | None:
    """A policy row by id (bucket loaded), or None."""
    return session.scalars(select(Policy).options(selectinload(Policy.bucket)).where(Policy.id == policy_id)).first()


def get_published(session: Session, bucket_key: str) -> Policy | None:
    """The published policy of ``bucket_key`` or None."""
    return session.scalars(
        select(Policy)
        .options(selectinload(Policy.bucket))
        .where(Policy.bucket_key == bucket_key, Policy.status == "published")
    ).first()


def list_published(
    session: Session,
    *,
    gpu: str | None = None,
    num_kv_heads: int | None = None,
    head_dim: int | None = None,
    dtype: str | None = None,
    page_size: int | None = None,
) -> list[Policy]:
    """Published policies, optionally filtered by the bucket's shape fields.

    ``gpu`` matches the stored GPU name (``"NVIDIA H200"``) or the slug that
    starts bucket keys (``"nvidia-h200"``). Each row's ``bucket`` is loaded
    (usable after the session closes). Order:
    GPU-measured before simulated, then by bucket key.
    """
    q = select(Policy).join(Bucket).options(selectinload(Policy.bucket)).where(Policy.status == "published")
    if gpu is not None:
        # the GPU name as stored ("NVIDIA H200") or the bucket-key slug ("nvidia-h200")
        slug = re.sub(r"[^a-z0-9]+", "-", str(gpu).lower()).strip("-")
        q = q.where(or_(Bucket.gpu == gpu, Bucket.key.startswith(slug + ".", autoescape=True)))
    for col, v in (
        (Bucket.num_kv_heads, num_kv_heads),
        (Bucket.head_dim, head_dim),
        (Bucket.dtype, dtype),
        (Bucket.page_size, page_size),
    ):
        if v is not None:
            q = q.where(col == v)
    return list(session.scalars(q.order_by(Policy.backend, Policy.bucket_key)))


def list_policies(
    session: Session, *, bucket_key: str | None = None, status: str | None = None, limit: int | None = None
) -> list[Policy]:
    """Policies of any status, newest first."""
    q = select(Policy).options(selectinload(Policy.bucket))
    if bucket_key is not None:
        q = q.where(Policy.bucket_key == bucket_key)
    if status is not None:
        q = q.where(Policy.status == field_str("status", status, choices=POLICY_STATUSES))
    q = q.order_by(Policy.id.desc())
    if limit is not None:
        q = q.limit(field_int("limit", limit, 1))
    return list(session.scalars(q))


def policies_version(session: Session) -> int:
    """The counter bumped by every publish, retire and import (0 for a new store)."""
    v = session.scalar(select(StoreState.policies_version).where(StoreState.id == 1))
    return int(v or 0)


def policy_to_dict(p: Policy) -> dict[str, Any]:
    """Plain-data form of a policy row and its bucket (the export entry form)."""
    b = p.bucket
    dev = p.device
    return {
        "id": p.id,
        "bucket": {
            "key": b.key,
            "gpu": b.gpu,
            "num_kv_heads": b.num_kv_heads,
            "head_dim": b.head_dim,
            "dtype": b.dtype,
            "page_size": b.page_size,
            "signature": dict(b.signature or {}),
            "source": b.source,
        },
        "name": p.name,
        "params": dict(p.params or {}),
        "version": p.version,
        "status": p.status,
        "backend": p.backend,
        "score": p.score,
        "verification": dict(p.verification or {}),
        "tuning_run_id": p.tuning_run_id,
        "created_at": iso_utc(p.created_at),
        "published_at": iso_utc(p.published_at),
        "device": None if dev is None else device_to_dict(dev),
    }
