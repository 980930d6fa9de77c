"""Static SVG charts with real axes: ticks and gridlines at round numbers, axis labels with units, a legend,
reference lines (SLOs), and series drawn as lines, steps or points. Pure string building: no network, no
script, so a page works offline and a test can read every drawn element from the DOM.
"""
from __future__ import annotations

import html
import math
from dataclasses import dataclass, field

PALETTE = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#4b5563")
BASELINE_COLOR, BEST_COLOR = "#6b7280", "#2563eb"


@dataclass
class Series:
    """One named set of points; kind is line, step (a CDF or a best-so-far) or points."""

    name: str
    xs: list[float]
    ys: list[float]
    kind: str = "line"
    color: str | None = None
    dashed: bool = False
    tips: list[str] = field(default_factory=list)  # one tooltip per point
    classes: list[str] = field(default_factory=list)  # one CSS class per point (points only)


@dataclass
class Guide:
    """A reference line across the plot at value on the x or y axis (an SLO, a limit)."""

    axis: str
    value: float
    label: str


def e(text: object) -> str:
    """HTML-escaped text."""
    return html.escape(str(text))


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values covering [lo, hi] (1, 2, 2.5 or 5 times a power of ten apart)."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return []
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / max(count, 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    first, last = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
    return [round(k * step, 12) for k in range(first, max(last, first + 1) + 1)]


def tick_text(value: float) -> str:
    """A tick label: short, no float noise."""
    if value == 0:
        return "0"
    if abs(value) >= 1e4 or abs(value) < 1e-3:
        return f"{value:.2g}"
    return f"{value:.4g}"


def chart(title: str, series: list[Series], x_label: str, y_label: str, css_class: str,
          guides: list[Guide] | None = None, width: int = 470, height: int = 290, y_from_zero: bool = True,
          empty: str = "no data") -> str:
    """One chart as an <svg> element with class "chart CSS_CLASS"; an explanatory <p> when nothing is drawn."""
    xs = [x for s in series for x in s.xs if math.isfinite(x)]
    ys = [y for s in series for y in s.ys if math.isfinite(y)]
    if not xs or not ys:
        return f'<p class="muted chart-empty {e(css_class)}">{e(title)}: {e(empty)}</p>'
    # a guide far past the data (a generous limit) is named, not drawn: drawing it would squash the data
    near = [g for g in guides or [] if _near(g.value, xs if g.axis == "x" else ys)]
    far = [g for g in guides or [] if g not in near]
    guides = near
    xs += [g.value for g in guides if g.axis == "x"]
    ys += [g.value for g in guides if g.axis == "y"]
    left, right, top, bottom = 58, 12, 30, 46
    x_ticks = nice_ticks(min(xs), max(xs))
    y_ticks = nice_ticks(0.0 if y_from_zero and min(ys) >= 0 else min(ys), max(ys))
    x0, x1 = x_ticks[0], x_ticks[-1]
    y0, y1 = y_ticks[0], y_ticks[-1]
    plot_w, plot_h = width - left - right, height - top - bottom

    def px(x: float) -> float:
        return left + (x - x0) / ((x1 - x0) or 1.0) * plot_w

    def py(y: float) -> float:
        return top + plot_h - (y - y0) / ((y1 - y0) or 1.0) * plot_h

    off = "; ".join(f"{g.label} (off the chart)" for g in far)
    parts = [f'<svg class="chart {e(css_class)}" role="img" aria-label="{e(title)}" width="{width}" '
             f'height="{height}" viewBox="0 0 {width} {height}">',
             f'<text x="{left}" y="16" class="title">{e(title)}</text>'
             + (f'<text x="{width - right}" y="16" class="guide-label" text-anchor="end">{e(off)}</text>' if off else "")]
    for t in x_ticks:
        parts.append(f'<line class="grid" x1="{px(t):.1f}" y1="{top}" x2="{px(t):.1f}" y2="{top + plot_h}"/>'
                     f'<text class="tick x-tick" x="{px(t):.1f}" y="{top + plot_h + 14}" '
                     f'text-anchor="middle">{tick_text(t)}</text>')
    for t in y_ticks:
        parts.append(f'<line class="grid" x1="{left}" y1="{py(t):.1f}" x2="{left + plot_w}" y2="{py(t):.1f}"/>'
                     f'<text class="tick y-tick" x="{left - 5}" y="{py(t) + 4:.1f}" '
                     f'text-anchor="end">{tick_text(t)}</text>')
    parts.append(f'<rect class="frame" x="{left}" y="{top}" width="{plot_w}" height="{plot_h}"/>'
                 f'<text class="axis-label x-label" x="{left + plot_w / 2:.0f}" y="{height - 8}" '
                 f'text-anchor="middle">{e(x_label)}</text>'
                 f'<text class="axis-label y-label" transform="translate(14 {top + plot_h / 2:.0f}) rotate(-90)" '
                 f'text-anchor="middle">{e(y_label)}</text>')
    for g in guides:
        if g.axis == "x":
            parts.append(f'<line class="guide" x1="{px(g.value):.1f}" y1="{top}" x2="{px(g.value):.1f}" '
                         f'y2="{top + plot_h}"/><text class="guide-label" x="{px(g.value) + 3:.1f}" '
                         f'y="{top + 10}">{e(g.label)}</text>')
        else:
            parts.append(f'<line class="guide" x1="{left}" y1="{py(g.value):.1f}" x2="{left + plot_w}" '
                         f'y2="{py(g.value):.1f}"/><text class="guide-label" x="{left + 3}" '
                         f'y="{py(g.value) - 3:.1f}">{e(g.label)}</text>')
    for i, s in enumerate(series):
        color = s.color or PALETTE[i % len(PALETTE)]
        parts.append(_draw(s, color, px, py))
        parts.append(f'<g class="legend-item"><rect x="{left + plot_w - 130}" y="{top + 6 + 15 * i}" width="10" '
                     f'height="10" fill="{color}"/><text class="legend" x="{left + plot_w - 116}" '
                     f'y="{top + 15 + 15 * i}">{e(s.name)}</text></g>')
    parts.append("</svg>")
    return "".join(parts)


def _near(value: float, data: list[float]) -> bool:
    """Whether a guide at value lies within the data's span widened by half on each side."""
    lo, hi = min(data), max(data)
    pad = max(hi - lo, abs(hi) * 0.1, 1e-12) * 0.5
    return lo - pad <= value <= hi + pad


def _draw(s: Series, color: str, px, py) -> str:  # noqa: ANN001 (the chart's scale functions)
    """A series' marks, each carrying data-series so a reader (or a test) can tell them apart."""
    points = [(x, y) for x, y in zip(s.xs, s.ys) if math.isfinite(x) and math.isfinite(y)]
    if s.kind == "points":
        marks = []
        for k, (x, y) in enumerate(points):
            cls = s.classes[k] if k < len(s.classes) else ""
            tip = f"<title>{e(s.tips[k])}</title>" if k < len(s.tips) else ""
            marks.append(f'<circle class="point {e(cls)}" data-series="{e(s.name)}" cx="{px(x):.1f}" '
                         f'cy="{py(y):.1f}" r="4" fill="{color}">{tip}</circle>')
        return "".join(marks)
    if s.kind == "step":
        stepped = []
        for k, (x, y) in enumerate(points):
            if k:
                stepped.append((x, points[k - 1][1]))
            stepped.append((x, y))
        points = stepped
    coords = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in points)
    dash = ' stroke-dasharray="5 3"' if s.dashed else ""
    return (f'<polyline class="series" data-series="{e(s.name)}" fill="none" stroke="{color}" stroke-width="1.8"'
            f'{dash} points="{coords}"/>')
