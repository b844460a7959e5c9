"""kvsplit.db: the policy store (SQLAlchemy 2.0 models, Alembic migrations, store API).

See :mod:`kvsplit.db.store` for the API other code uses and
:mod:`kvsplit.db.models` for the tables.
"""
