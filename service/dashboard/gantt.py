"""The plan viewer's picture: a plan's work tiles on SMs over time (a Gantt chart), from the simulator's model.

:func:`gantt_svg` draws a :class:`kvsplit.tuner.simulate.Timeline`: one row per SM, each resident slot of the SM a
lane, each work tile a bar from its start to its end, coloured by the request it reads (a request's splits share a
colour), the HBM floor and the main kernel's end as vertical lines, the LSE merge as a band after it. Tiles thinner
than a pixel that follow each other in one lane are drawn as one bar (its tooltip says how many), so a plan of
thousands of tiles stays a small SVG.
"""

from __future__ import annotations

from html import escape
from typing import Any

import numpy as np

from .svg import lin_ticks

__all__ = ["gantt_svg"]

_COLOURS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#D55E00", "#56B4E9", "#8c6d31", "#666666")


def _lanes(sm: np.ndarray, start: np.ndarray, end: np.ndarray, num_sms: int) -> tuple[np.ndarray, int]:
    """A lane (row within its SM) per tile: the first lane of its SM free at its start; the lane count."""
    lane = np.zeros(sm.shape[0], dtype=np.int64)
    free: list[list[float]] = [[] for _ in range(num_sms)]
    for i in np.lexsort((end, start)):
        f = free[sm[i]]
        for j, t in enumerate(f):
            if t <= start[i] + 1e-15:
                f[j] = end[i]
                lane[i] = j
                break
        else:
            lane[i] = len(f)
            f.append(end[i])
    return lane, max((len(f) for f in free), default=1)


def gantt_svg(tl: Any, plan: Any, *, title: str, t_max: float | None = None, width: int = 560) -> str:
    """A :class:`~kvsplit.tuner.simulate.Timeline` of ``plan`` as an inline ``<svg class="gantt">``.

    Parameters
    ----------
    tl : Timeline
    plan : Plan
        The plan the timeline is of (its ``work_request`` and ``cta_indptr`` name each tile's request).
    title : str
    t_max : float, optional
        Seconds at the right edge (to draw several plans on one scale); default the timeline's own end.
    width : int
        CSS pixels (the SVG scales with its container).

    Returns
    -------
    str
        SVG markup; ``data-total-us`` carries the predicted time, each bar ``rect.tile`` its ``data-sm``,
        ``data-tiles`` and ``data-request`` (-1 for a bar of several requests).
    """
    S = tl.num_sms
    first_item = plan.cta_indptr[:-1][tl.tile_cta]
    request = plan.work_request[first_item]
    lane, nl = _lanes(tl.sm, tl.start_s, tl.end_s, S)
    row_h = max(2.0, min(4.5, 600.0 / S))  # ~600 px of SM rows: three slot lanes of about 1.5 px each
    lane_h = row_h / nl
    ml, mr, mt, mb = 44, 10, 30, 34
    ph = S * row_h
    pw = width - ml - mr
    height = int(mt + ph + mb)
    end_main = tl.main_s
    span = t_max if t_max is not None else end_main + tl.merge_s
    span = max(span, 1e-9)

    def fx(t: float) -> float:
        return ml + pw * t / span

    out = [
        f'<svg class="gantt" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
        f'aria-label="{escape(title)}" data-total-us="{tl.total_s * 1e6:.3f}" data-tiles="{tl.sm.shape[0]}" '
        f'xmlns="http://www.w3.org/2000/svg">',
        f'<text class="ctitle" x="{ml}" y="14">{escape(title)}</text>',
        f'<text class="sub" x="{ml}" y="26">predicted {tl.total_s * 1e6:,.1f} µs '
        f"({f'{tl.total_s / tl.floor_s:.2f}× the HBM floor' if tl.floor_s > 0 else 'no HBM floor: 0 tokens'}) · "
        f"{tl.sm.shape[0]:,} work tiles · {S} SMs × {tl.slots} "
        f"slot{'' if tl.slots == 1 else 's'}</text>",
        f'<rect class="plot" x="{ml}" y="{mt}" width="{pw}" height="{ph:.1f}"/>',
    ]
    # bars, coalescing sub-pixel neighbours of one lane
    n_tiles = int(tl.sm.shape[0])
    px = span / pw * (1.0 if n_tiles <= 1500 else 3.0)  # coarser coalescing for big plans keeps the SVG small
    order = np.lexsort((tl.start_s, lane, tl.sm))
    cur: list[Any] | None = None
    bars: list[list[Any]] = []
    for i in order:
        s, e = float(tl.start_s[i]), float(tl.end_s[i])
        key = (int(tl.sm[i]), int(lane[i]))
        if cur is not None and cur[0] == key and s - cur[2] < px and (e - s < px or cur[2] - cur[1] < px):
            cur[2] = max(cur[2], e)
            cur[3] += 1
            if cur[4] != int(request[i]):
                cur[4] = -1
            continue
        if cur is not None:
            bars.append(cur)
        cur = [key, s, e, 1, int(request[i])]
    if cur is not None:
        bars.append(cur)
    hh = max(lane_h - 0.3, 0.5)
    if n_tiles <= 1500:  # one element per bar, with a tooltip and the data tests read
        for (sm, ln), s, e, n, req in bars:
            y = mt + sm * row_h + ln * lane_h
            colour = "#475467" if req < 0 else _COLOURS[req % len(_COLOURS)]
            what = f"request {req}" if req >= 0 else "several requests"
            tip = f"SM {sm}, slot {ln}: {n} tile{'s' if n > 1 else ''} of {what}, {s * 1e6:.1f}–{e * 1e6:.1f} µs"
            out.append(
                f'<rect class="tile" data-sm="{sm}" data-tiles="{n}" data-request="{req}" x="{fx(s):.1f}" '
                f'y="{y:.1f}" width="{max(fx(e) - fx(s), 0.4):.1f}" height="{hh:.1f}" fill="{colour}">'
                f"<title>{escape(tip)}</title></rect>"
            )
    else:  # big plans: one path per colour (about 25 bytes a bar), no per-bar tooltip
        paths: dict[str, list[str]] = {}
        for (sm, ln), s, e, _n, req in bars:
            y = mt + sm * row_h + ln * lane_h
            colour = "#475467" if req < 0 else _COLOURS[req % len(_COLOURS)]
            w = max(fx(e) - fx(s), 0.4)
            paths.setdefault(colour, []).append(f"M{fx(s):.1f} {y:.1f}h{w:.1f}v{hh:.1f}h{-w:.1f}z")
        for colour, segs in paths.items():
            out.append(f'<path class="tiles" data-bars="{len(segs)}" fill="{colour}" d="{"".join(segs)}"/>')
    # floor, main end, merge
    yb = mt + ph
    out.append(
        f'<line class="floor" x1="{fx(tl.floor_s):.1f}" y1="{mt}" x2="{fx(tl.floor_s):.1f}" y2="{yb:.1f}">'
        f"<title>HBM floor {tl.floor_s * 1e6:.2f} µs</title></line>"
    )
    out.append(
        f'<line class="mainend" x1="{fx(end_main):.1f}" y1="{mt}" x2="{fx(end_main):.1f}" y2="{yb:.1f}">'
        f"<title>main kernel ends {end_main * 1e6:.2f} µs</title></line>"
    )
    if tl.merge_s > 0:
        out.append(
            f'<rect class="merge" x="{fx(end_main):.1f}" y="{mt}" width="{fx(end_main + tl.merge_s) - fx(end_main):.1f}" '
            f'height="{ph:.1f}"><title>LSE merge {tl.merge_s * 1e6:.2f} µs</title></rect>'
        )
    for t_us in lin_ticks(0.0, span * 1e6, 5):
        if t_us <= span * 1e6 * 0.97:
            out.append(
                f'<text class="tick" x="{fx(t_us * 1e-6):.1f}" y="{yb + 12:.1f}" text-anchor="middle">{t_us:g}</text>'
            )
    out.append(f'<text class="axis" x="{ml + pw / 2:.0f}" y="{height - 4}" text-anchor="middle">µs</text>')
    for sm in range(0, S, max(1, S // 6)):
        out.append(f'<text class="tick" x="{ml - 4}" y="{mt + sm * row_h + row_h:.1f}" text-anchor="end">{sm}</text>')
    out.append(
        f'<text class="axis" transform="translate(10 {mt + ph / 2:.0f}) rotate(-90)" text-anchor="middle">SM</text>'
    )
    out.append("</svg>")
    return "".join(out)
