"""Decode-batch workloads: the reference study's synthetic length families.

DESIGN.md §6: at a fixed total of ``T`` tokens,

- ``uniform``: every request holds T / B tokens;
- ``skewed40``, ``skewed60``, ``skewed80``: one request holds 40/60/80 % of T,
  the others share the rest equally;
- ``2x40``: two requests hold 40 % each, the others share the remaining 20 %
  (B >= 3).

Remainders are spread one token at a time over the first requests so the sum is
exactly T; heavy requests come first in the batch. B = 1 is one request of T
tokens for every family.
"""

from __future__ import annotations

import numpy as np

__all__ = ["FAMILIES", "REFERENCE_BATCH_SIZES", "REFERENCE_TOTALS", "family_kv_lens", "reference_cases"]

FAMILIES = ("uniform", "skewed40", "skewed60", "skewed80", "2x40")
REFERENCE_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
REFERENCE_TOTALS = (262_144, 1_048_576)


def _spread(total: int, n: int) -> np.ndarray:
    """``n`` near-equal non-negative integers summing to ``total`` (larger ones first)."""
    base, rem = divmod(total, n)
    out = np.full(n, base, dtype=np.int64)
    out[:rem] += 1
    return out


def family_kv_lens(family: str, batch_size: int, total_tokens: int) -> np.ndarray:
    """kv_lens ``[B]`` (int64) of one reference-family batch, heavy requests first.

    Raises
    ------
    ValueError
        Unknown ``family``; ``batch_size`` < 1, or 2 for ``2x40``;
        ``total_tokens`` < ``batch_size``.

    Notes
    -----
    ``2x40`` needs B >= 3; B = 1 gives one request of T tokens (every family) and
    B = 2 is rejected for ``2x40``.
    """
    if family not in FAMILIES:
        raise ValueError(f"family: expected one of {FAMILIES}, got {family!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"batch_size: expected an integer >= 1, got {batch_size!r}")
    if isinstance(total_tokens, bool) or not isinstance(total_tokens, (int, np.integer)) or total_tokens < batch_size:
        raise ValueError(f"total_tokens: expected an integer >= batch_size ({batch_size}), got {total_tokens!r}")
    B, T = int(batch_size), int(total_tokens)
    if B == 1:
        return np.array([T], dtype=np.int64)
    if family == "uniform":
        return _spread(T, B)
    if family == "2x40":
        if B < 3:
            raise ValueError(f"batch_size: family '2x40' needs B >= 3 (or B == 1), got {B}")
        heavy = (4 * T) // 10
        rest = T - 2 * heavy
        return np.concatenate([[heavy, heavy], _spread(rest, B - 2)]).astype(np.int64)
    share = {"skewed40": 4, "skewed60": 6, "skewed80": 8}[family]
    heavy = (share * T) // 10
    return np.concatenate([[heavy], _spread(T - heavy, B - 1)]).astype(np.int64)


def reference_cases(total_tokens: int) -> list[tuple[str, int]]:
    """The 48 (family, B) cases of the reference workload, as in the H200 anchors.

    Every family at B in {1, 2, 4, ..., 512}, except ``2x40`` which starts at B = 4.
    """
    return [(fam, B) for fam in FAMILIES for B in REFERENCE_BATCH_SIZES if not (fam == "2x40" and B < 4)]
