"""Calibrations are per (device, kernel config, KV cache dtype, q_len): ``kv_dtype`` and ``q_len`` columns.

A fit timed with an FP8 cache or with q_len > 1 query tokens per request is a calibration of that shape only;
the lookup (:func:`kvsplit.db.store.latest_calibration`) selects by both. Rows written before this revision
were all timed at q_len 1 with K/V in the model's dtype, and that dtype was bfloat16 for every one the project
made (``kvsplit calibrate``'s default ``--dtype``, the shipped H200 fit ``service/data/h200_calibration.json``):
the server defaults fill them in as ``"bfloat16"`` and 1. The unique constraint and a lookup index take both
columns (the version counts per device, config key, KV dtype and q_len).

Downgrade drops the two columns; it refuses while a row of another KV dtype or q_len is stored (the old
schema cannot tell such a row from a bf16 q_len-1 fit, and its version would collide with theirs).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-04
"""

from collections.abc import Sequence
from typing import Union

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: Union[str, Sequence[str], None] = "0004"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

_OLD_UNIQUE = ("device_id", "config_key", "version")
_NEW_UNIQUE = ("device_id", "config_key", "kv_dtype", "q_len", "version")


def upgrade() -> None:
    with op.batch_alter_table("calibrations", schema=None) as batch_op:
        batch_op.add_column(sa.Column("kv_dtype", sa.String(length=32), server_default="bfloat16", nullable=False))
        batch_op.add_column(sa.Column("q_len", sa.Integer(), server_default="1", nullable=False))
        batch_op.drop_constraint("uq_calibrations_device_config_version", type_="unique")
        batch_op.create_unique_constraint("uq_calibrations_device_config_version", list(_NEW_UNIQUE))
        batch_op.create_check_constraint("ck_calibrations_q_len", "q_len >= 1")
        batch_op.create_index("ix_calibrations_lookup", ["device_id", "kv_dtype", "q_len"], unique=False)


def downgrade() -> None:
    n = op.get_bind().scalar(sa.text("SELECT count(*) FROM calibrations WHERE kv_dtype <> 'bfloat16' OR q_len <> 1"))
    if n:
        raise RuntimeError(
            f"downgrade below 0005 refused: {n} calibration(s) of another KV dtype than bfloat16 or of q_len > 1 "
            "are stored, which the older schema cannot tell apart from the bf16 q_len-1 fits; delete them first"
        )
    with op.batch_alter_table("calibrations", schema=None) as batch_op:
        batch_op.drop_index("ix_calibrations_lookup")
        batch_op.drop_constraint("ck_calibrations_q_len", type_="check")
        batch_op.drop_constraint("uq_calibrations_device_config_version", type_="unique")
        batch_op.create_unique_constraint("uq_calibrations_device_config_version", list(_OLD_UNIQUE))
        batch_op.drop_column("q_len")
        batch_op.drop_column("kv_dtype")
