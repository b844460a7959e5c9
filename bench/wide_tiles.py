"""A/B helper (round 19): let a work tile hold more than the 16 query rows the launch allows today, so that
``heads_per_tile * G`` may reach ``rows`` (e.g. all four KV heads of Qwen3-30B-A3B's G = 8 in one tile: 32 rows,
``BLOCK_H = 32``), and the look-ahead (``next_item``) combine with ``heads_per_tile > 2``.

The kernel itself needs no change (``launch_decode`` pads ``G * heads_per_tile`` to a power of two >= 16); only
the checks of kvsplit.kernels.limits / decode / policies refuse such tiles. ``enable`` patches those module
globals in this process; nothing is patched unless a bench asks for it.
"""

from __future__ import annotations

import dataclasses


def enable(rows: int = 32) -> None:
    """Raise the query-row limit of one work tile to ``rows`` and drop the ``next_item``/``heads_per_tile <= 2``
    check, in every kvsplit module that holds them (process-wide)."""
    from kvsplit.kernels import decode, limits, plan, policies, registry, workplan

    for m in (limits, decode, policies):
        m.TILE_QUERY_ROWS = rows
    orig = limits._check_config

    def check(cfg, head_dim, dtype):
        if cfg.next_item and cfg.heads_per_tile > 2:
            return orig(dataclasses.replace(cfg, next_item=False), head_dim, dtype)
        return orig(cfg, head_dim, dtype)

    for m in (limits, plan, policies, registry, workplan):
        m._check_config = check
