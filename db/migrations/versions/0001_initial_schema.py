"""Initial schema of the kvsplit store: devices, calibrations, buckets, policies,
tuning runs, measurements and the single-row store_state (policies_version = 0).

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

import datetime
from collections.abc import Sequence
from typing import Union

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0001"
down_revision: Union[str, Sequence[str], None] = None
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Upgrade schema."""
    op.create_table(
        "buckets",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(length=512), nullable=False),
        sa.Column("gpu", sa.String(length=128), nullable=False),
        sa.Column("num_kv_heads", sa.Integer(), nullable=False),
        sa.Column("head_dim", sa.Integer(), nullable=False),
        sa.Column("dtype", sa.String(length=16), nullable=False),
        sa.Column("page_size", sa.Integer(), nullable=False),
        sa.Column("signature", sa.JSON(), nullable=False),
        sa.Column("source", sa.String(length=256), nullable=False),
        sa.Column("sample_batches", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("key"),
    )
    with op.batch_alter_table("buckets", schema=None) as batch_op:
        batch_op.create_index(
            "ix_buckets_shape", ["gpu", "num_kv_heads", "head_dim", "dtype", "page_size"], unique=False
        )

    op.create_table(
        "devices",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("num_sms", sa.Integer(), nullable=False),
        sa.Column("hbm_bandwidth_gbps", sa.Float(), nullable=False),
        sa.Column("read_bandwidth_gbps", sa.Float(), nullable=True),
        sa.Column("software", sa.JSON(), nullable=False),
        sa.Column("fingerprint", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("name", "fingerprint", name="uq_devices_name_fingerprint"),
    )
    op.create_table(
        "store_state",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("policies_version", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    state = sa.table(
        "store_state",
        sa.column("id", sa.Integer()),
        sa.column("policies_version", sa.Integer()),
        sa.column("updated_at", sa.DateTime(timezone=True)),
    )
    op.bulk_insert(state, [{"id": 1, "policies_version": 0, "updated_at": datetime.datetime.now(datetime.UTC)}])
    op.create_table(
        "calibrations",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("device_id", sa.Integer(), nullable=False),
        sa.Column("config_key", sa.String(length=256), nullable=False),
        sa.Column("kernel_config", sa.JSON(), nullable=False),
        sa.Column("constants", sa.JSON(), nullable=False),
        sa.Column("error", sa.JSON(), nullable=False),
        sa.Column("num_samples", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["device_id"], ["devices.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("device_id", "config_key", "version", name="uq_calibrations_device_config_version"),
    )
    op.create_table(
        "tuning_runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("bucket_id", sa.Integer(), nullable=False),
        sa.Column("study_name", sa.String(length=512), nullable=False),
        sa.Column("storage_kind", sa.String(length=32), nullable=False),
        sa.Column("backend", sa.String(length=8), nullable=False),
        sa.Column("device_id", sa.Integer(), nullable=True),
        sa.Column("n_trials", sa.Integer(), nullable=False),
        sa.Column("n_finished", sa.Integer(), nullable=False),
        sa.Column("workers", sa.Integer(), nullable=False),
        sa.Column("best_value", sa.Float(), nullable=True),
        sa.Column("best_params", sa.JSON(), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("message", sa.String(length=2048), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("backend in ('gpu', 'sim')", name="ck_tuning_runs_backend"),
        sa.CheckConstraint("status in ('running', 'finished', 'interrupted', 'failed')", name="ck_tuning_runs_status"),
        sa.ForeignKeyConstraint(["bucket_id"], ["buckets.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(
            ["device_id"],
            ["devices.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("tuning_runs", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_tuning_runs_bucket_id"), ["bucket_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_tuning_runs_study_name"), ["study_name"], unique=False)

    op.create_table(
        "policies",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("bucket_id", sa.Integer(), nullable=False),
        sa.Column("bucket_key", sa.String(length=512), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("backend", sa.String(length=8), nullable=False),
        sa.Column("tuning_run_id", sa.Integer(), nullable=True),
        sa.Column("device_id", sa.Integer(), nullable=True),
        sa.Column("verification", sa.JSON(), nullable=False),
        sa.Column("score", sa.Float(), nullable=True),
        sa.Column("note", sa.String(length=2048), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("published_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("retired_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("backend in ('gpu', 'sim')", name="ck_policies_backend"),
        sa.CheckConstraint("status in ('draft', 'published', 'retired')", name="ck_policies_status"),
        sa.CheckConstraint("version >= 1", name="ck_policies_version"),
        sa.ForeignKeyConstraint(["bucket_id"], ["buckets.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(
            ["device_id"],
            ["devices.id"],
        ),
        sa.ForeignKeyConstraint(["tuning_run_id"], ["tuning_runs.id"], ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("bucket_id", "version", name="uq_policies_bucket_version"),
    )
    with op.batch_alter_table("policies", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_policies_bucket_id"), ["bucket_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_policies_bucket_key"), ["bucket_key"], unique=False)
        batch_op.create_index(batch_op.f("ix_policies_status"), ["status"], unique=False)
        batch_op.create_index(
            "uq_policies_one_published",
            ["bucket_id"],
            unique=True,
            sqlite_where=sa.text("status = 'published'"),
            postgresql_where=sa.text("status = 'published'"),
        )

    op.create_table(
        "measurements",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("bucket_id", sa.Integer(), nullable=False),
        sa.Column("tuning_run_id", sa.Integer(), nullable=True),
        sa.Column("policy_id", sa.Integer(), nullable=True),
        sa.Column("device_id", sa.Integer(), nullable=True),
        sa.Column("stage", sa.String(length=32), nullable=False),
        sa.Column("policy_name", sa.String(length=64), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("batch_index", sa.Integer(), nullable=False),
        sa.Column("kv_lens", sa.JSON(), nullable=False),
        sa.Column("batch_size", sa.Integer(), nullable=False),
        sa.Column("total_tokens", sa.BigInteger(), nullable=False),
        sa.Column("time_s", sa.Float(), nullable=False),
        sa.Column("floor_s", sa.Float(), nullable=True),
        sa.Column("ratio", sa.Float(), nullable=True),
        sa.Column("backend", sa.String(length=8), nullable=False),
        sa.Column("software", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("backend in ('gpu', 'sim')", name="ck_measurements_backend"),
        sa.CheckConstraint("time_s > 0", name="ck_measurements_time"),
        sa.ForeignKeyConstraint(["bucket_id"], ["buckets.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(
            ["device_id"],
            ["devices.id"],
        ),
        sa.ForeignKeyConstraint(["policy_id"], ["policies.id"], ondelete="SET NULL"),
        sa.ForeignKeyConstraint(["tuning_run_id"], ["tuning_runs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint(
            "tuning_run_id",
            "stage",
            "policy_name",
            "role",
            "batch_index",
            name="uq_measurements_run_stage_policy_batch",
        ),
    )
    with op.batch_alter_table("measurements", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_measurements_bucket_id"), ["bucket_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_measurements_tuning_run_id"), ["tuning_run_id"], unique=False)


def downgrade() -> None:
    """Downgrade schema."""
    with op.batch_alter_table("measurements", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_measurements_tuning_run_id"))
        batch_op.drop_index(batch_op.f("ix_measurements_bucket_id"))

    op.drop_table("measurements")
    with op.batch_alter_table("policies", schema=None) as batch_op:
        batch_op.drop_index(
            "uq_policies_one_published",
            sqlite_where=sa.text("status = 'published'"),
            postgresql_where=sa.text("status = 'published'"),
        )
        batch_op.drop_index(batch_op.f("ix_policies_status"))
        batch_op.drop_index(batch_op.f("ix_policies_bucket_key"))
        batch_op.drop_index(batch_op.f("ix_policies_bucket_id"))

    op.drop_table("policies")
    with op.batch_alter_table("tuning_runs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_tuning_runs_study_name"))
        batch_op.drop_index(batch_op.f("ix_tuning_runs_bucket_id"))

    op.drop_table("tuning_runs")
    op.drop_table("calibrations")
    op.drop_table("store_state")
    op.drop_table("devices")
    with op.batch_alter_table("buckets", schema=None) as batch_op:
        batch_op.drop_index("ix_buckets_shape")

    op.drop_table("buckets")
