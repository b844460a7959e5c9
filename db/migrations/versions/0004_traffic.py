"""Traffic statistics of the plan service: ``traffic`` and ``traffic_bins`` (per bucket key and hour).

Counts and ranges only, never a batch's kv_lens (:mod:`kvsplit.db.traffic`).

Revision ID: 0004
Revises: 0002
Create Date: 2026-12-04
"""

from collections.abc import Sequence
from typing import Union

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: Union[str, Sequence[str], None] = "0002"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    op.create_table(
        "traffic",
        sa.Column("key", sa.String(length=512), nullable=False),
        sa.Column("hour", sa.BigInteger(), nullable=False),
        sa.Column("requests", sa.BigInteger(), nullable=False),
        sa.Column("n_tuned", sa.BigInteger(), nullable=False),
        sa.Column("n_simulated", sa.BigInteger(), nullable=False),
        sa.Column("n_fallback", sa.BigInteger(), nullable=False),
        sa.Column("n_far", sa.BigInteger(), nullable=False),
        sa.Column("batch_min", sa.Integer(), nullable=False),
        sa.Column("batch_max", sa.Integer(), nullable=False),
        sa.Column("tokens_min", sa.BigInteger(), nullable=False),
        sa.Column("tokens_max", sa.BigInteger(), nullable=False),
        sa.Column("distance_max", sa.Float(), nullable=True),
        sa.Column("distance_sum", sa.Float(), nullable=False),
        sa.CheckConstraint("requests >= 1", name="ck_traffic_requests"),
        sa.PrimaryKeyConstraint("key", "hour"),
    )
    with op.batch_alter_table("traffic", schema=None) as batch_op:
        batch_op.create_index("ix_traffic_hour", ["hour"], unique=False)
    op.create_table(
        "traffic_bins",
        sa.Column("key", sa.String(length=512), nullable=False),
        sa.Column("hour", sa.BigInteger(), nullable=False),
        sa.Column("kind", sa.String(length=8), nullable=False),
        sa.Column("bin", sa.Integer(), nullable=False),
        sa.Column("n", sa.BigInteger(), nullable=False),
        sa.CheckConstraint("kind in ('batch', 'tokens')", name="ck_traffic_bins_kind"),
        sa.CheckConstraint("bin >= 0 and bin <= 64", name="ck_traffic_bins_bin"),
        sa.PrimaryKeyConstraint("key", "hour", "kind", "bin"),
    )
    with op.batch_alter_table("traffic_bins", schema=None) as batch_op:
        batch_op.create_index("ix_traffic_bins_hour", ["hour"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("traffic_bins", schema=None) as batch_op:
        batch_op.drop_index("ix_traffic_bins_hour")
    op.drop_table("traffic_bins")
    with op.batch_alter_table("traffic", schema=None) as batch_op:
        batch_op.drop_index("ix_traffic_hour")
    op.drop_table("traffic")
