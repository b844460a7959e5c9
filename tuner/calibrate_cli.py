"""Commands of this area for the ``kvsplit`` CLI."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add this area's commands to ``app``."""
