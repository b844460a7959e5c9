"""Settings of the policy store (pydantic-settings).

Environment variables (prefix ``KVSPLIT_``; a ``.env`` file in the working
directory is read too):

``KVSPLIT_DATABASE_URL``
    Any SQLAlchemy URL. Default ``sqlite:///./kvsplit.db``. SQLite files are
    opened in WAL mode with a busy timeout (:func:`kvsplit.db.store.get_engine`).
``KVSPLIT_DB_BUSY_TIMEOUT_MS``
    SQLite busy timeout in milliseconds (default 30,000).
"""

from __future__ import annotations

from functools import lru_cache

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["Settings", "get_settings", "DEFAULT_DATABASE_URL"]

DEFAULT_DATABASE_URL = "sqlite:///./kvsplit.db"


class Settings(BaseSettings):
    """Store settings read from ``KVSPLIT_*`` environment variables."""

    model_config = SettingsConfigDict(env_prefix="KVSPLIT_", env_file=".env", env_ignore_empty=True, extra="ignore")

    database_url: str = Field(DEFAULT_DATABASE_URL, description="SQLAlchemy URL of the policy store")
    db_busy_timeout_ms: int = Field(30_000, ge=0, description="SQLite busy timeout, ms")


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings (cached; tests call ``get_settings.cache_clear()``)."""
    return Settings()
