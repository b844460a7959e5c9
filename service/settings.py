"""Settings of the plan service (pydantic-settings; environment variables ``KVSPLIT_*``).

=========================  ==========================================  ====================
variable                   meaning                                     default
=========================  ==========================================  ====================
KVSPLIT_DATABASE_URL       SQLAlchemy URL of the policy store          sqlite:///./kvsplit.db
KVSPLIT_ADMIN_TOKEN        bearer token of the admin routes; unset     unset (admin off)
                           or empty disables them
KVSPLIT_MAX_KV_LEN         largest kv_len accepted over HTTP (tokens)  16777216 (2^24)
KVSPLIT_RELOAD_INTERVAL_S  seconds between polls of the store's        2.0
                           policies version (0 disables polling)
KVSPLIT_MAX_BODY_BYTES     largest request body (bytes), refused with  2097152 (2 MiB)
                           413 before parsing
=========================  ==========================================  ====================
"""

from __future__ import annotations

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from ..kernels.plan import MAX_KV_LEN

__all__ = ["Settings", "DEFAULT_DATABASE_URL"]

DEFAULT_DATABASE_URL = "sqlite:///./kvsplit.db"


class Settings(BaseSettings):
    """Service settings, read from ``KVSPLIT_*`` environment variables (see module doc)."""

    model_config = SettingsConfigDict(env_prefix="KVSPLIT_", env_ignore_empty=True, extra="ignore")

    database_url: str = DEFAULT_DATABASE_URL
    admin_token: str | None = None
    max_kv_len: int = Field(default=1 << 24, ge=0, le=MAX_KV_LEN)
    reload_interval_s: float = Field(default=2.0, ge=0.0, le=3600.0)
    max_body_bytes: int = Field(default=2 * 1024 * 1024, ge=1024, le=64 * 1024 * 1024)

    @field_validator("admin_token")
    @classmethod
    def _strip_token(cls, v: str | None) -> str | None:
        if v is None:
            return None
        v = v.strip()
        return v or None
