"""The one settings class of kvsplit's store (pydantic-settings).

Every command (``run``, ``serve``, ``plan``, ``tune``, ``db``) reads its
settings through this class or :class:`kvsplit.service.settings.Settings`,
which extends it: the same ``KVSPLIT_*`` environment variables and the same
``.env`` file in the working directory apply everywhere.

``KVSPLIT_DATABASE_URL``
    Any SQLAlchemy URL, or a plain file path (``./kvsplit.db``), which means
    that SQLite file. Default ``sqlite:///./kvsplit.db``. SQLite files are
    opened in WAL mode with a busy timeout (:func:`kvsplit.db.store.get_engine`).
``KVSPLIT_DB_BUSY_TIMEOUT_MS``
    SQLite busy timeout in milliseconds (default 30,000).
"""

from __future__ import annotations

from functools import lru_cache

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["Settings", "get_settings", "DEFAULT_DATABASE_URL", "normalize_database_url"]

DEFAULT_DATABASE_URL = "sqlite:///./kvsplit.db"


def normalize_database_url(url: str) -> str:
    """``url`` as a SQLAlchemy URL: a plain file path (no ``://``) becomes a SQLite URL.

    >>> normalize_database_url("./kvsplit.db")
    'sqlite:///./kvsplit.db'
    >>> normalize_database_url("/tmp/k.db")
    'sqlite:////tmp/k.db'
    >>> normalize_database_url("postgresql+psycopg://u@h/db")
    'postgresql+psycopg://u@h/db'
    """
    s = url.strip()
    if s and "://" not in s and s != ":memory:":
        return "sqlite:///" + s
    return s


class Settings(BaseSettings):
    """Settings read from ``KVSPLIT_*`` environment variables and ``./.env``."""

    model_config = SettingsConfigDict(env_prefix="KVSPLIT_", env_file=".env", env_ignore_empty=True, extra="ignore")

    database_url: str = Field(
        DEFAULT_DATABASE_URL, description="SQLAlchemy URL or SQLite file path of the policy store"
    )
    db_busy_timeout_ms: int = Field(30_000, ge=0, description="SQLite busy timeout, ms")

    @field_validator("database_url")
    @classmethod
    def _url(cls, v: str) -> str:
        return normalize_database_url(v)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings (cached; tests call ``get_settings.cache_clear()``)."""
    return Settings()
