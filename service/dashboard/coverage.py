"""The coverage map: batch size x total tokens per length family, coloured by the tuned gain, holes visible.

For one (GPU, shape) and one family, a cell is (batch-size class, total-token class) = (round(log2 B),
round(log2 tokens)), the two classes of a bucket key (:mod:`kvsplit.kernels.buckets`). A cell shows:

- a published bucket of that family and cell: filled with its measured gain over ``balanced`` (its time /
  the balanced time on the same batch, from the store), or grey "not timed" when the served plan has no timing;
- no bucket, but a batch of that family there (``kvsplit.tuner.workloads.family_kv_lens``) is served a tuned
  policy by the served table's nearest-bucket lookup (:meth:`kvsplit.kernels.policy_table.PolicyTable.plan`):
  light, with the lookup's distance in its tooltip;
- no bucket, and that batch falls back to ``balanced``: a hatched **fallback hole**;
- buckets without a published policy (drafts) only: the cell is what is served there, as if it had no bucket
  (a neighbour or a hole; its tooltip names the drafts), or grey when no lookup is possible.

Traffic (rows of :func:`kvsplit.service.queries.traffic_summary`, recorded by the plan service) is a second layer: one
circle per (bucket key, hour-aggregated) row at the middle of its B and token ranges, its area by request count,
red when any of its requests was served by the fallback.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from html import escape
from typing import Any

from ..queries import served_gain, served_gain_base
from .render import count

__all__ = ["coverage_svg", "coverage_cells", "GAIN_STOPS"]

GAIN_STOPS = ((0.97, "#d73027"), (1.0, "#f7f7f7"), (1.1, "#a6d96a"), (1.3, "#1a9850"), (1.6, "#00552a"))
"""Colour scale of the tuned gain over ``balanced`` (time of balanced / time of the served plan)."""
_SYNTH = ("uniform", "skewed40", "skewed60", "skewed80", "2x40")


def _hex(c: str) -> tuple[int, int, int]:
    return int(c[1:3], 16), int(c[3:5], 16), int(c[5:7], 16)


def gain_colour(g: float) -> str:
    """Fill colour of gain ``g`` on :data:`GAIN_STOPS` (clamped at both ends, linear in between)."""
    if g <= GAIN_STOPS[0][0]:
        return GAIN_STOPS[0][1]
    for (a, ca), (b, cb) in zip(GAIN_STOPS, GAIN_STOPS[1:]):
        if g <= b:
            t = (g - a) / (b - a)
            x, y = _hex(ca), _hex(cb)
            return "#" + "".join(f"{round(u + (v - u) * t):02x}" for u, v in zip(x, y))
    return GAIN_STOPS[-1][1]


def coverage_cells(
    buckets: Sequence[dict[str, Any]], family: str, lookup: Any | None, b_range: range, t_range: range
) -> dict[tuple[int, int], dict[str, Any]]:
    """The cells of one family's map: ``(b_class, t_class) -> {"kind", "gain", "n", "title"}``.

    ``kind``: ``measured`` (a published bucket with a gain over balanced), ``untimed`` (published, no timing of
    the served plan), ``near`` (no published bucket; ``lookup`` serves a tuned policy), ``hole`` (``lookup`` falls
    back), ``draft`` (buckets without a published policy and no lookup possible; with one, such a cell is ``near``
    or ``hole``, what is served there, its title naming the drafts), no cell (no bucket and no lookup possible).
    ``lookup(kv_lens) -> (source, distance)`` or None (then empty cells are ``none``).
    """
    by_cell: dict[tuple[int, int], list[dict]] = defaultdict(list)
    for b in buckets:
        if b["family"] == family and b.get("b_class") is not None:
            by_cell[(b["b_class"], b["t_class"])].append(b)
    cells: dict[tuple[int, int], dict[str, Any]] = {}
    for bc in b_range:
        for tc in t_range:
            bs = by_cell.get((bc, tc), [])
            pub = [b for b in bs if b["policy"] is not None]
            label = f"{family}, B ≈ {2**bc:,}, tokens ≈ {2**tc:,}"
            if pub:
                gains = [served_gain(b["speedups"]) for b in pub]
                gains = [g for g in gains if g is not None and math.isfinite(g)]
                if gains:
                    g = math.exp(sum(math.log(x) for x in gains) / len(gains))
                    ev = {b["evidence"] for b in pub}
                    evs = "held-out" if ev == {"held-out"} else "training batch" if ev == {"training"} else "mixed"
                    cells[(bc, tc)] = {
                        "kind": "measured",
                        "gain": g,
                        "n": len(pub),
                        "title": f"{label}: {len(pub)} tuned bucket(s), {g:.3f}× {served_gain_base(pub)} ({evs})",
                    }
                else:
                    cells[(bc, tc)] = {
                        "kind": "untimed",
                        "n": len(pub),
                        "title": f"{label}: {len(pub)} tuned bucket(s), served plan not timed",
                    }
                continue
            draft = {"kind": "draft", "n": len(bs), "title": f"{label}: bucket(s) without a published policy"}
            here = f"{len(bs)} draft bucket(s) here, not served" if bs else "no bucket here"
            if lookup is None or family not in _SYNTH or 2**bc > 2**tc or (family == "2x40" and 2**bc < 3):
                if bs:
                    cells[(bc, tc)] = draft
                continue
            from ...tuner.workloads import family_kv_lens

            try:
                src, dist = lookup(family_kv_lens(family, 2**bc, 2**tc))
            except ValueError:
                if bs:
                    cells[(bc, tc)] = draft
                continue
            if src == "fallback":
                cells[(bc, tc)] = {
                    "kind": "hole",
                    "title": f"{label}: {here}; fallback (balanced), no bucket within reach",
                }
            else:
                cells[(bc, tc)] = {
                    "kind": "near",
                    "title": f"{label}: {here}; served {src} by a neighbour at distance {dist:.2f}",
                }
    return cells


def coverage_svg(
    buckets: Sequence[dict[str, Any]],
    family: str,
    *,
    lookup: Any | None,
    b_range: range,
    t_range: range,
    traffic: Sequence[dict[str, Any]] = (),
    cell: int = 14,
    cells: dict[tuple[int, int], dict[str, Any]] | None = None,
) -> str:
    """One family's coverage map as an inline ``<svg>`` (cells ``rect.cov`` with ``data-kind``, ``data-b``,
    ``data-t`` and a ``<title>``; traffic ``circle.traffic`` with ``data-requests``). ``cells``: the
    :func:`coverage_cells` of the same arguments when the caller has them already."""
    if cells is None:
        cells = coverage_cells(buckets, family, lookup, b_range, t_range)
    ml, mt, mb = 30, 18, 26
    nb, nt = len(b_range), len(t_range)
    w, h = max(ml + nb * cell + 6, ml + 7 * len(family)), mt + nt * cell + mb  # room for the title
    out = [
        f'<svg class="coverage" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" '
        f'aria-label="{escape(family)} coverage" data-family="{escape(family)}" xmlns="http://www.w3.org/2000/svg">',
        '<defs><pattern id="hatch" width="4" height="4" patternUnits="userSpaceOnUse" '
        'patternTransform="rotate(45)"><rect width="4" height="4" fill="#fff"/>'
        '<line x1="0" y1="0" x2="0" y2="4" stroke="#d92d20" stroke-width="1.6"/></pattern></defs>',
        f'<text class="ctitle" x="{ml}" y="12">{escape(family)}</text>',
    ]

    def X(bc: float) -> float:
        return ml + (bc - b_range.start) * cell

    def Y(tc: float) -> float:
        return mt + (t_range.stop - 1 - tc) * cell

    for (bc, tc), c in sorted(cells.items()):
        k = c["kind"]
        fill = {
            "measured": gain_colour(c.get("gain", 1.0)),
            "untimed": "#98a2b3",
            "draft": "#d0d5dd",
            "near": "#e8f2fb",
            "hole": "url(#hatch)",
        }[k]
        gain = f' data-gain="{c["gain"]:.4f}"' if "gain" in c else ""
        out.append(
            f'<rect class="cov" data-kind="{k}" data-b="{bc}" data-t="{tc}"{gain} x="{X(bc):.0f}" y="{Y(tc):.0f}" '
            f'width="{cell - 1}" height="{cell - 1}" fill="{fill}"><title>{escape(c["title"])}</title></rect>'
        )
    # axes: B classes every 2, token classes every 2
    for bc in b_range:
        if bc % 2 == 0:
            lab = f"{2**bc:,}" if 2**bc < 1000 else f"{2 ** (bc - 10)}k"
            out.append(
                f'<text class="tick" x="{X(bc) + cell / 2:.0f}" y="{mt + nt * cell + 10}" '
                f'text-anchor="middle">{lab}</text>'
            )
    for tc in t_range:
        if tc % 2 == 0:
            lab = f"{2**tc:,}" if tc < 10 else f"{2 ** (tc - 10)}k" if tc < 20 else f"{2 ** (tc - 20)}M"
            out.append(f'<text class="tick" x="{ml - 3}" y="{Y(tc) + cell - 3:.0f}" text-anchor="end">{lab}</text>')
    out.append(f'<text class="axis" x="{ml + nb * cell / 2:.0f}" y="{h - 3}" text-anchor="middle">batch size B</text>')
    for r in traffic:
        try:
            bmid = 0.5 * (math.log2(max(1, r["b_min"])) + math.log2(max(1, r["b_max"])))
            tmid = 0.5 * (math.log2(max(1, r["tokens_min"])) + math.log2(max(1, r["tokens_max"])))
            n = int(r["requests"])
        except (KeyError, TypeError, ValueError):
            continue
        if not (
            b_range.start - 0.5 <= bmid <= b_range.stop - 0.5 and t_range.start - 0.5 <= tmid <= t_range.stop - 0.5
        ):
            continue
        fb = int((r.get("by_source") or {}).get("fallback", 0))
        rad = min(cell * 0.9, 2.0 + 1.2 * math.log10(max(n, 1)) * 2)
        cls = "traffic fallback" if fb else "traffic"
        out.append(
            f'<circle class="{cls}" data-requests="{n}" data-fallback="{fb}" cx="{X(bmid) + cell / 2:.1f}" '
            f'cy="{Y(tmid) + cell / 2:.1f}" r="{rad:.1f}"><title>{escape(str(r.get("key", "")))}: {count(n, "request")}'
            f"{f', {fb:,} by the fallback' if fb else ''}</title></circle>"
        )
    out.append("</svg>")
    return "".join(out)
