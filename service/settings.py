"""Settings of the plan service: the store's settings class plus the service's fields.

:class:`Settings` extends :class:`kvsplit.db.settings.Settings`, so it reads the
same ``KVSPLIT_*`` variables and the same ``.env`` file as every other command.

=========================  ==========================================  ====================
variable                   meaning                                     default
=========================  ==========================================  ====================
KVSPLIT_DATABASE_URL       SQLAlchemy URL (or SQLite file path) of     sqlite:///./kvsplit.db
                           the policy store
KVSPLIT_DB_BUSY_TIMEOUT_MS SQLite busy timeout (ms)                    30000
KVSPLIT_ADMIN_TOKEN        bearer token of the admin routes; unset     unset (admin off)
                           or empty disables them
KVSPLIT_MAX_KV_LEN         largest kv_len accepted over HTTP (tokens)  16777216 (2^24)
KVSPLIT_RELOAD_INTERVAL_S  seconds between polls of the store's        2.0
                           policies version (0 disables polling)
KVSPLIT_MAX_BODY_BYTES     largest request body (bytes), refused with  2097152 (2 MiB)
                           413 before parsing
KVSPLIT_PORT               TCP port of ``kvsplit run`` and ``kvsplit   8000
                           serve`` when ``--port`` is not given
                           (0..65535)
KVSPLIT_TRAFFIC            record traffic statistics (per bucket key   1 (on)
                           and hour, no kv_lens) into the store;
                           0 turns them off
KVSPLIT_TRAFFIC_RETENTION  hours of traffic statistics kept; older     168 (7 days)
_HOURS                     hours are deleted at each flush (1..87600)
KVSPLIT_TRAFFIC_FLUSH      seconds between flushes of a server         5.0
_INTERVAL_S                process's counts into the store
                           (0.05..3600; also at shutdown)
=========================  ==========================================  ====================

A bad value stops every command with one line naming the variable
(:func:`kvsplit.service.cli.faults.load_settings`).
"""

from __future__ import annotations

from pydantic import Field, field_validator

from ..db.settings import DEFAULT_DATABASE_URL
from ..db.settings import Settings as StoreSettings
from ..kernels.plan import MAX_KV_LEN

__all__ = ["Settings", "DEFAULT_DATABASE_URL"]


class Settings(StoreSettings):
    """Service settings, read from ``KVSPLIT_*`` environment variables and ``./.env`` (see module doc)."""

    admin_token: str | None = None
    max_kv_len: int = Field(default=1 << 24, ge=0, le=MAX_KV_LEN)
    reload_interval_s: float = Field(default=2.0, ge=0.0, le=3600.0)
    max_body_bytes: int = Field(default=2 * 1024 * 1024, ge=1024, le=64 * 1024 * 1024)
    port: int = Field(default=8000, ge=0, le=65535)
    traffic: bool = True
    traffic_retention_hours: int = Field(default=168, ge=1, le=87600)
    traffic_flush_interval_s: float = Field(default=5.0, ge=0.05, le=3600.0)

    @field_validator("admin_token")
    @classmethod
    def _strip_token(cls, v: str | None) -> str | None:
        if v is None:
            return None
        v = v.strip()
        return v or None
