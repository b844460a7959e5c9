"""The dashboard page (``GET /``): server-rendered HTML with inline SVG charts, no CDN."""

from .render import render_dashboard

__all__ = ["render_dashboard"]
