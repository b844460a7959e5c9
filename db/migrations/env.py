"""Alembic environment of the kvsplit store (run through kvsplit.db.store.upgrade).

The version table is ``kvsplit_alembic_version`` (Optuna keeps its own
``alembic_version`` when it shares the database); ``render_as_batch`` lets
SQLite ALTER tables by copy-and-move.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import engine_from_config, pool

from kvsplit.db.models import Base

VERSION_TABLE = "kvsplit_alembic_version"

config = context.config
target_metadata = Base.metadata


def run_migrations_offline() -> None:
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
        version_table=VERSION_TABLE,
        render_as_batch=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is None:
        engine = engine_from_config(
            config.get_section(config.config_ini_section, {}), prefix="sqlalchemy.", poolclass=pool.NullPool
        )
        with engine.connect() as connection:
            _run(connection)
    else:
        _run(connection)


def _run(connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        version_table=VERSION_TABLE,
        render_as_batch=True,
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
