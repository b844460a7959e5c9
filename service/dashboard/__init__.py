"""The dashboard (``GET /``, ``/shapes/{slug}``, ``/plan``): server-rendered HTML with inline SVG, no CDN."""

from .render import render

__all__ = ["render"]
