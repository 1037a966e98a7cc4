"""Server-side SVG charts: no JavaScript, no CDN, nothing fetched (air-gapped clusters).

Each function returns a complete, accessible `<svg>` (role="img", a <title> per mark for
hover read-outs) sized by its viewBox so it scales with the page, then its legend as an HTML
list. Colours come from CSS classes `s0`…`s7` (templates/static/css/app.css); series beyond
eight reuse them. Values are plain numbers (Decimal or float); charts are pictures of figures
that tables beside them state exactly.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal

from django.utils.formats import number_format
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

__all__ = ["Series", "line_chart", "nice_ticks", "stacked_bar_chart"]

Number = Decimal | float | int

_PALETTE = 8
# Room on the left for the y-axis labels, also at the larger size narrow screens draw them.
_LEFT, _RIGHT, _TOP, _BOTTOM = 72, 12, 24, 44


@dataclass(frozen=True)
class Series:
    name: str
    values: Sequence[Number | None]


def nice_ticks(top: float, count: int = 4) -> list[float]:
    """0 and `count`-ish round steps (1, 2, 2.5, 5 × 10^k) covering `top`."""
    if top <= 0 or not math.isfinite(top):
        return [0.0, 1.0]
    raw = top / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    n = math.ceil(top / step - 1e-9)
    return [i * step for i in range(n + 1)]


def _fmt(value: float, step: float) -> str:
    # As many decimals as the step needs (2.5 → one), so ticks never round to wrong labels ("2", "8").
    places = next((p for p in range(5) if abs(step * 10**p - round(step * 10**p)) < 1e-6), 4)
    return number_format(round(value, places), places, use_l10n=True, force_grouping=True)


def _frame(*, width: int, height: int, label: str, ticks: list[float], unit: str,
           categories: Sequence[str], x_of: Callable[[int], float], plot_h: float) -> list[str]:
    parts = [
        f'<svg class="chart" viewBox="0 0 {width} {height}" role="img" aria-label="{escape(label)}" '
        f'xmlns="http://www.w3.org/2000/svg" preserveAspectRatio="xMinYMin meet">',
        f"<title>{escape(label)}</title>",
    ]
    top = ticks[-1]
    step = ticks[1] - ticks[0] if len(ticks) > 1 else 1.0
    for t in ticks:
        y = _TOP + plot_h - (t / top) * plot_h
        parts.append(f'<line class="grid" x1="{_LEFT}" x2="{width - _RIGHT}" y1="{y:.1f}" y2="{y:.1f}"/>')
        parts.append(f'<text class="tick" x="{_LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{_fmt(t, step)}</text>')
    if unit:
        parts.append(f'<text class="unit" x="4" y="12">{escape(unit)}</text>')
    # At most ~12 category labels, evenly thinned, so dates never overprint; every other one is
    # "minor", which a narrow screen hides while it draws the rest larger (app.css).
    every = max(1, math.ceil(len(categories) / _CATEGORY_LABELS))
    for i, cat in enumerate(categories):
        if i % every == 0 or (i == len(categories) - 1 and len(categories) <= _CATEGORY_LABELS):
            minor = " minor" if (i // every) % 2 else ""
            parts.append(f'<text class="tick{minor}" x="{x_of(i):.1f}" y="{height - _BOTTOM + 22}" '
                         f'text-anchor="middle">{escape(cat)}</text>')
    return parts


_CATEGORY_LABELS = 12


def _legend(series: Sequence[Series]) -> str:
    """The legend as HTML after the picture, not SVG text inside it: it keeps the page's font size
    however small the picture is scaled (at 390 px the SVG's 11 px text came out near 5 px), and
    wraps onto more lines as text does. Each swatch is a tiny SVG with the series' colour class."""
    items = "".join(
        f'<li><svg class="swatch" viewBox="0 0 10 10" aria-hidden="true"><rect class="s{i % _PALETTE}" '
        f'width="10" height="10"/></svg>{escape(s.name)}</li>'
        for i, s in enumerate(series)
    )
    return f'<ul class="chart-legend">{items}</ul>'


def stacked_bar_chart(categories: Sequence[str], series: Sequence[Series], *, label: str, unit: str = "",
                      width: int = 720, height: int = 240) -> SafeString:
    """One bar per category, `series` stacked bottom-up in order; None counts as 0."""
    n = max(1, len(categories))
    totals = [sum(float(s.values[i] or 0) for s in series) for i in range(len(categories))]
    ticks = nice_ticks(max(totals, default=0.0))
    plot_w, plot_h = width - _LEFT - _RIGHT, height - _TOP - _BOTTOM
    slot = plot_w / n
    bar_w = max(1.0, slot * 0.72)

    def x_of(i: int) -> float:
        return _LEFT + slot * i + slot / 2

    parts = _frame(width=width, height=height, label=label, ticks=ticks, unit=unit, categories=categories,
                   x_of=x_of, plot_h=plot_h)
    scale = plot_h / ticks[-1]
    for i, cat in enumerate(categories):
        base: float = _TOP + plot_h
        for k, s in enumerate(series):
            v = float(s.values[i] or 0)
            if v <= 0:
                continue
            h = v * scale
            base -= h
            parts.append(
                f'<rect class="s{k % _PALETTE}" x="{x_of(i) - bar_w / 2:.1f}" y="{base:.1f}" width="{bar_w:.1f}" '
                f'height="{h:.1f}"><title>{escape(cat)} · {escape(s.name)}: '
                f'{number_format(round(v, 2), 2, use_l10n=True, force_grouping=True)} {escape(unit)}</title></rect>'
            )
    parts.append("</svg>")
    parts.append(_legend(series))
    return mark_safe("".join(parts))  # noqa: S308 - every text above is escaped


def line_chart(categories: Sequence[str], series: Sequence[Series], *, label: str, unit: str = "",
               y_max: float | None = None, width: int = 720, height: int = 240) -> SafeString:
    """One polyline per series; a None value breaks the line (no data is not zero)."""
    values = [float(v) for s in series for v in s.values if v is not None]
    ticks = nice_ticks(y_max if y_max is not None else max(values, default=0.0))
    plot_w, plot_h = width - _LEFT - _RIGHT, height - _TOP - _BOTTOM
    n = len(categories)

    def x_of(i: int) -> float:
        return _LEFT + (plot_w * i / (n - 1) if n > 1 else plot_w / 2)

    parts = _frame(width=width, height=height, label=label, ticks=ticks, unit=unit, categories=categories,
                   x_of=x_of, plot_h=plot_h)
    scale = plot_h / ticks[-1]
    for k, s in enumerate(series):
        runs: list[list[str]] = [[]]
        for i, v in enumerate(s.values):
            if v is None:
                runs.append([])
                continue
            y = _TOP + plot_h - float(v) * scale
            runs[-1].append(f"{x_of(i):.1f},{y:.1f}")
            parts.append(
                f'<circle class="s{k % _PALETTE}" cx="{x_of(i):.1f}" cy="{y:.1f}" r="2.5"><title>'
                f'{escape(categories[i])} · {escape(s.name)}: '
                f'{number_format(round(float(v), 2), 2, use_l10n=True, force_grouping=True)} {escape(unit)}'
                f"</title></circle>"
            )
        for run in runs:
            if len(run) > 1:
                parts.append(f'<polyline class="line s{k % _PALETTE}" points="{" ".join(run)}"/>')
    parts.append("</svg>")
    parts.append(_legend(series))
    return mark_safe("".join(parts))  # noqa: S308 - every text above is escaped
