"""A small server-side SVG line-chart renderer for the dashboard (no JavaScript, no CDN).

:func:`line_chart` draws series of (x, y) points on log2 or linear x, log10 or
linear y axes, with grid lines, tick labels, a legend and a ``<title>`` tooltip
on every point. Every point is a ``<circle class="pt">`` carrying
``data-series``, ``data-x`` and ``data-y`` so tests can read the plotted values.
A series marked ``simulated`` is drawn dashed with hollow markers (class
``pt simulated``), in the colour of the series it is a variant of (same name
before `` (``), and its legend entry shows the same line and marker.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

__all__ = ["line_chart", "PALETTE"]

# Colour-blind-safe palette (Okabe & Ito 2008), the tuned series first.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#D55E00", "#56B4E9", "#F0E442", "#000000")


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.0f}"
    if abs(v) >= 1:
        return f"{v:.3g}"
    return f"{v:.2g}"


def _log_ticks(lo: float, hi: float, base: int) -> list[float]:
    """Ticks at powers of ``base`` (and 2/5 multiples for decades spanning little)."""
    a, b = math.floor(math.log(lo, base) + 1e-9), math.ceil(math.log(hi, base) - 1e-9)
    ticks = [float(base**e) for e in range(a, b + 1)]
    if base == 10 and b - a <= 3:
        ticks = sorted({t * m for t in ticks for m in (1, 2, 5)})
    return [t for t in ticks if lo * 0.999 <= t <= hi * 1.001]


def lin_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    span = hi - lo or 1.0
    step = 10 ** math.floor(math.log10(span / n))
    for m in (1, 2, 5, 10):
        if span / (step * m) <= n:
            step *= m
            break
    start = math.ceil(lo / step) * step
    return [start + i * step for i in range(int((hi - start) / step + 1e-9) + 1)]


def line_chart(
    series: Sequence[tuple],
    *,
    title: str,
    x_label: str,
    y_label: str,
    x_log2: bool = True,
    y_log: bool | None = None,
    width: int = 520,
    height: int = 300,
    reference_y: float | None = 1.0,
) -> str:
    """Render a line chart as an inline ``<svg>`` string.

    Parameters
    ----------
    series : sequence of (name, points) or (name, points, kind)
        ``points`` are (x, y) pairs; non-finite or non-positive values (on log
        axes) are dropped. Series are drawn in order with :data:`PALETTE`, one
        colour per name before `` (``. ``kind`` ``"simulated"``: dashed line,
        hollow markers (points predicted by the simulator, not measured).
    title, x_label, y_label : str
        Texts (escaped).
    x_log2 : bool
        Log2 x axis (batch sizes); else linear.
    y_log : bool or None
        Log10 y axis; ``None`` picks it when the data span more than 8x.
    width, height : int
        Size in CSS pixels (the SVG scales with its container through viewBox).
    reference_y : float or None
        A dashed horizontal line (the HBM floor, ratio 1.0) when inside the range.

    Returns
    -------
    str
        SVG markup; an SVG with a "no data" note when no series has a point.
    """
    series = [(s[0], s[1], s[2] if len(s) > 2 else "measured") for s in series]
    legend_w = 14 + 7 * max((len(n) for n, _, _ in series), default=0)
    ml, mr, mt, mb = 54, 16 + legend_w, 28, 40
    pw, ph = width - ml - mr, height - mt - mb
    clean = []
    for name, pts, kind in series:
        ok = sorted(
            (float(x), float(y))
            for x, y in pts
            if math.isfinite(x) and math.isfinite(y) and (x > 0 or not x_log2) and y > 0
        )
        if ok:
            clean.append((name, ok, kind))
    head = (
        f'<svg class="chart" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        f'role="img" aria-label="{escape(title)}" xmlns="http://www.w3.org/2000/svg">'
        f'<text class="ctitle" x="{ml}" y="17">{escape(title)}</text>'
    )
    if not clean:
        return head + f'<text class="nodata" x="{width / 2}" y="{height / 2}" text-anchor="middle">no data</text></svg>'
    xs = [x for _, p, _ in clean for x, _ in p]
    ys = [y for _, p, _ in clean for _, y in p]
    xlo, xhi = min(xs), max(xs)
    ylo, yhi = min(ys), max(ys)
    if reference_y is not None and ylo <= reference_y * 1.6:
        ylo = min(ylo, reference_y)
    if y_log is None:
        y_log = yhi / ylo > 8
    if xlo == xhi:
        xlo, xhi = (xlo / 2, xhi * 2) if x_log2 else (xlo - 1, xhi + 1)
    if y_log:
        ylo, yhi = ylo / 1.15, yhi * 1.15
    else:
        pad = (yhi - ylo) * 0.08 or abs(yhi) * 0.1 or 1.0
        ylo, yhi = max(0.0, ylo - pad), yhi + pad

    def fx(x: float) -> float:
        t = (math.log2(x) - math.log2(xlo)) / (math.log2(xhi) - math.log2(xlo)) if x_log2 else (x - xlo) / (xhi - xlo)
        return ml + t * pw

    def fy(y: float) -> float:
        t = (
            (math.log10(y) - math.log10(ylo)) / (math.log10(yhi) - math.log10(ylo))
            if y_log
            else (y - ylo) / (yhi - ylo)
        )
        return mt + (1 - t) * ph

    out = [head, f'<rect class="plot" x="{ml}" y="{mt}" width="{pw}" height="{ph}"/>']
    xt = _log_ticks(xlo, xhi, 2) if x_log2 else lin_ticks(xlo, xhi)
    if len(xt) > 9:
        xt = xt[:: math.ceil(len(xt) / 9)]
    for t in xt:
        X = fx(t)
        out.append(
            f'<line class="grid" x1="{X:.1f}" y1="{mt}" x2="{X:.1f}" y2="{mt + ph}"/>'
            f'<text class="tick" x="{X:.1f}" y="{mt + ph + 14}" text-anchor="middle">{_fmt(t)}</text>'
        )
    yt = _log_ticks(ylo, yhi, 10) if y_log else lin_ticks(ylo, yhi)
    if y_log and len(yt) < 2:
        yt = lin_ticks(ylo, yhi, 4)
    for t in yt:
        Y = fy(t)
        out.append(
            f'<line class="grid" x1="{ml}" y1="{Y:.1f}" x2="{ml + pw}" y2="{Y:.1f}"/>'
            f'<text class="tick" x="{ml - 5}" y="{Y + 4:.1f}" text-anchor="end">{_fmt(t)}</text>'
        )
    if reference_y is not None and ylo <= reference_y <= yhi:
        Y = fy(reference_y)
        out.append(f'<line class="ref" x1="{ml}" y1="{Y:.1f}" x2="{ml + pw}" y2="{Y:.1f}"/>')
    out.append(
        f'<text class="axis" x="{ml + pw / 2}" y="{height - 6}" text-anchor="middle">{escape(x_label)}</text>'
        f'<text class="axis" transform="translate(13 {mt + ph / 2}) rotate(-90)" '
        f'text-anchor="middle">{escape(y_label)}</text>'
    )
    legend_x = ml + pw + 10
    colours: dict[str, str] = {}
    for i, (name, pts, kind) in enumerate(clean):
        base = name.split(" (", 1)[0]
        color = colours.setdefault(base, PALETTE[len(colours) % len(PALETTE)])
        sim = kind == "simulated"
        width_px = 2.6 if i == 0 else 1.6
        r = 3 if i == 0 else 2.4
        dash = ' stroke-dasharray="5 3"' if sim else ""
        fill = f'fill="#fff" stroke="{color}" stroke-width="1.4"' if sim else f'fill="{color}"'
        cls = "pt simulated" if sim else "pt"
        path = " ".join(f"{fx(x):.1f},{fy(y):.1f}" for x, y in pts)
        out.append(
            f'<g class="series" data-series="{escape(name)}" data-kind="{escape(kind)}">'
            f'<polyline fill="none" stroke="{color}" stroke-width="{width_px}"{dash} points="{path}"/>'
        )
        for x, y in pts:
            out.append(
                f'<circle class="{cls}" data-series="{escape(name)}" data-x="{x:g}" data-y="{y:.6g}" '
                f'cx="{fx(x):.1f}" cy="{fy(y):.1f}" r="{r}" {fill}>'
                f"<title>{escape(name)}: {x:g} \u2192 {y:.3g}</title></circle>"
            )
        out.append("</g>")
        ly = mt + 10 + 16 * i
        out.append(
            f'<g class="legend" data-series="{escape(name)}" data-kind="{escape(kind)}">'
            f'<line x1="{legend_x}" y1="{ly - 4}" x2="{legend_x + 16}" y2="{ly - 4}" '
            f'stroke="{color}" stroke-width="{width_px}"{dash}/>'
            f'<circle class="{"mark simulated" if sim else "mark"}" cx="{legend_x + 8}" cy="{ly - 4}" r="{r}" {fill}/>'
            f'<text x="{legend_x + 20}" y="{ly}">{escape(name)}</text></g>'
        )
    out.append("</svg>")
    return "".join(out)
