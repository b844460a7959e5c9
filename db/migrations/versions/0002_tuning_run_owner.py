"""Tuning runs record their owner process (host, PID, process start time) and a heartbeat.

A ``running`` row whose process is gone (same host) or whose heartbeat is
older than ``stale_after_s`` is marked ``failed`` (``abandoned: ...``) by
:func:`kvsplit.db.store.reap_runs`. Rows written before this revision have no
owner: only their start time can age them.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-04
"""

from collections.abc import Sequence
from typing import Union

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: Union[str, Sequence[str], None] = "0001"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    with op.batch_alter_table("tuning_runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("host", sa.String(length=255), nullable=True))
        batch_op.add_column(sa.Column("pid", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("proc_start", sa.String(length=32), nullable=True))
        batch_op.add_column(sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("stale_after_s", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tuning_runs", schema=None) as batch_op:
        batch_op.drop_column("stale_after_s")
        batch_op.drop_column("heartbeat_at")
        batch_op.drop_column("proc_start")
        batch_op.drop_column("pid")
        batch_op.drop_column("host")
