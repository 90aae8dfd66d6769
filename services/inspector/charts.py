# ruff: noqa: E501  (SVG elements read better whole than split mid-attribute)
"""Charts as SVG, rendered on the server: no script, no library, readable at any width (the
``viewBox`` scales), and accessible: each is an ``img`` with a title and a description, series are
told apart by dash and marker as well as colour (Okabe-Ito colours, dark enough on white), and
every page that draws one also shows its numbers in a table."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import date

from markupsafe import Markup, escape

__all__ = ["Bar", "Series", "bar_chart", "line_chart", "stacked_columns"]

PALETTE = ["#0072B2", "#B34700", "#007A5A", "#A6458A", "#7A5C00", "#2B6F91", "#333333"]
DASHES = ["", "6 3", "2 3", "8 3 2 3", "1 2", "10 4", "4 2 1 2"]
MARKERS = ["circle", "square", "diamond", "triangle", "circle-open", "square-open", "diamond-open"]
FLAG = "#B34700"
BAR = "#0072B2"
WIDTH = 560


def _num(value: float) -> str:
    return f"{value:.1f}".rstrip("0").rstrip(".")


def _frame(chart_id: str, title: str, desc: str, height: float, body: list[str]) -> Markup:
    head = (
        f'<svg class="chart" viewBox="0 0 {WIDTH} {_num(height)}" role="img" '
        f'aria-labelledby="{chart_id}-t {chart_id}-d" xmlns="http://www.w3.org/2000/svg" '
        f'preserveAspectRatio="xMinYMin meet">'
        f'<title id="{chart_id}-t">{escape(title)}</title><desc id="{chart_id}-d">{escape(desc)}</desc>'
    )
    return Markup(head + "".join(body) + "</svg>")


def _marker(kind: str, x: float, y: float, colour: str) -> str:
    fill = "white" if kind.endswith("-open") else colour
    shape = kind.removesuffix("-open")
    s = 3.5
    if shape == "square":
        return f'<rect x="{_num(x - s)}" y="{_num(y - s)}" width="{_num(2 * s)}" height="{_num(2 * s)}" fill="{fill}" stroke="{colour}"/>'
    if shape == "diamond":
        pts = f"{_num(x)},{_num(y - s - 1)} {_num(x + s + 1)},{_num(y)} {_num(x)},{_num(y + s + 1)} {_num(x - s - 1)},{_num(y)}"
        return f'<polygon points="{pts}" fill="{fill}" stroke="{colour}"/>'
    if shape == "triangle":
        pts = f"{_num(x)},{_num(y - s - 1)} {_num(x + s + 1)},{_num(y + s)} {_num(x - s - 1)},{_num(y + s)}"
        return f'<polygon points="{pts}" fill="{fill}" stroke="{colour}"/>'
    return f'<circle cx="{_num(x)}" cy="{_num(y)}" r="{_num(s)}" fill="{fill}" stroke="{colour}"/>'


# ------------------------------------------------------------------------------ horizontal bars


@dataclass(frozen=True)
class Bar:
    label: str
    value: float
    flagged: bool = False
    """Drawn hatched and in the warning colour, with ``flag_text`` after its value."""
    text: str = ""
    """The value as printed at the bar's end (default: the number)."""


def bar_chart(
    chart_id: str,
    title: str,
    bars: Sequence[Bar],
    *,
    threshold: float | None = None,
    threshold_label: str = "",
    flag_text: str = "below",
) -> Markup:
    """One horizontal bar per row, longest scale at the larger of the values and the threshold."""
    label_w, right_w, row_h, top = 150.0, 120.0, 26.0, 30.0
    plot_w = WIDTH - label_w - right_w
    top_value = max([b.value for b in bars] + [threshold or 0.0]) or 1.0
    height = top + row_h * max(len(bars), 1) + 12
    body = [
        '<defs><pattern id="' + chart_id + '-hatch" width="6" height="6" patternUnits="userSpaceOnUse" '
        'patternTransform="rotate(45)"><rect width="6" height="6" fill="' + FLAG + '"/>'
        '<line x1="0" y1="0" x2="0" y2="6" stroke="white" stroke-width="2"/></pattern></defs>'
    ]
    for i, b in enumerate(bars):
        y = top + i * row_h
        w = plot_w * (b.value / top_value) if top_value else 0
        fill = f"url(#{chart_id}-hatch)" if b.flagged else BAR
        label = b.label if len(b.label) <= 22 else b.label[:21] + "…"
        text = (b.text or _num(b.value)) + (f" ({flag_text})" if b.flagged else "")
        body.append(
            f'<text x="{_num(label_w - 8)}" y="{_num(y + 16)}" text-anchor="end" class="chart-label">{escape(label)}</text>'
            f'<rect x="{_num(label_w)}" y="{_num(y + 4)}" width="{_num(max(w, 1))}" height="16" fill="{fill}"/>'
            f'<text x="{_num(label_w + max(w, 1) + 6)}" y="{_num(y + 16)}" class="chart-value">{escape(text)}</text>'
        )
    if threshold is not None:
        x = label_w + plot_w * (threshold / top_value)
        body.append(
            f'<line x1="{_num(x)}" y1="{_num(top - 6)}" x2="{_num(x)}" y2="{_num(height - 8)}" '
            f'stroke="#222" stroke-width="1.5" stroke-dasharray="5 3"/>'
            f'<text x="{_num(x)}" y="{_num(top - 10)}" text-anchor="middle" class="chart-label">{escape(threshold_label)}</text>'
        )
    if not bars:
        body.append(f'<text x="{_num(label_w)}" y="{_num(top + 16)}" class="chart-label">no data</text>')
    desc = "; ".join(f"{b.label}: {b.text or _num(b.value)}" + (f" ({flag_text})" if b.flagged else "") for b in bars)
    return _frame(chart_id, title, desc or "no data", height, body)


# ------------------------------------------------------------------------------ lines over days


@dataclass
class Series:
    name: str
    points: dict[date, float] = field(default_factory=dict)
    """Value per day; a day without a value is a gap in the line."""


def _x_of(days: Sequence[date], left: float, plot_w: float) -> Callable[[date], float]:
    span = max(len(days) - 1, 1)
    index = {d: i for i, d in enumerate(days)}
    return lambda d: left + plot_w * index[d] / span


def _day_ticks(days: Sequence[date], x: Callable[[date], float], baseline: float) -> list[str]:
    if not days:
        return []
    picks = sorted({0, len(days) // 2, len(days) - 1})
    return [
        f'<text x="{_num(x(days[i]))}" y="{_num(baseline + 16)}" text-anchor="{_anchor(i, len(days))}" class="chart-label">'
        f"{days[i].strftime('%b %d')}</text>"
        for i in picks
    ]


def _legend_columns(names: Sequence[str]) -> int:
    """Three legend entries a row, two when a name is long enough to reach the next one."""
    return 2 if any(len(n) > 16 for n in names) else 3


def _anchor(i: int, n: int) -> str:
    """The first day's label starts at its tick, the last ends at it: neither leaves the chart."""
    return "start" if i == 0 and n > 1 else "end" if i == n - 1 and n > 1 else "middle"


def line_chart(
    chart_id: str, title: str, days: Sequence[date], series: Sequence[Series], *, percent: bool = True
) -> Markup:
    """One line per series over ``days`` (y from 0 to 100 % when ``percent``)."""
    left, right, top, plot_h = 48.0, 16.0, 16.0, 180.0
    plot_w = WIDTH - left - right
    cols = _legend_columns([s.name for s in series])
    legend_rows = (len(series) + cols - 1) // cols
    baseline = top + plot_h
    height = baseline + 28 + legend_rows * 20
    top_value = 1.0 if percent else max([v for s in series for v in s.points.values()] + [1.0])
    x = _x_of(days, left, plot_w)

    def y(v: float) -> float:
        return baseline - plot_h * (v / top_value)

    body = []
    for frac in (0.0, 0.25, 0.5, 0.75, 1.0):
        yy = y(top_value * frac)
        label = f"{int(frac * 100)}%" if percent else _num(top_value * frac)
        body.append(
            f'<line x1="{_num(left)}" y1="{_num(yy)}" x2="{_num(WIDTH - right)}" y2="{_num(yy)}" stroke="#ddd"/>'
            f'<text x="{_num(left - 6)}" y="{_num(yy + 4)}" text-anchor="end" class="chart-label">{label}</text>'
        )
    body += _day_ticks(days, x, baseline)
    for n, s in enumerate(series):
        colour, dash, marker = PALETTE[n % len(PALETTE)], DASHES[n % len(DASHES)], MARKERS[n % len(MARKERS)]
        run: list[str] = []
        runs: list[list[str]] = []
        for d in days:
            if d in s.points:
                run.append(f"{_num(x(d))},{_num(y(s.points[d]))}")
            elif run:
                runs.append(run)
                run = []
        if run:
            runs.append(run)
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        for r in runs:
            if len(r) > 1:
                body.append(
                    f'<polyline points="{" ".join(r)}" fill="none" stroke="{colour}" stroke-width="2"{dash_attr}/>'
                )
        body += [_marker(marker, x(d), y(v), colour) for d, v in sorted(s.points.items()) if d in set(days)]
        lx = left + (n % cols) * (plot_w / cols)
        ly = baseline + 34 + (n // cols) * 20
        body.append(
            f'<line x1="{_num(lx)}" y1="{_num(ly - 4)}" x2="{_num(lx + 26)}" y2="{_num(ly - 4)}" stroke="{colour}" stroke-width="2"{dash_attr}/>'
            + _marker(marker, lx + 13, ly - 4, colour)
            + f'<text x="{_num(lx + 32)}" y="{_num(ly)}" class="chart-label">{escape(s.name)}</text>'
        )
    if not any(s.points for s in series):
        body.append(
            f'<text x="{_num(left + 8)}" y="{_num(top + 20)}" class="chart-label">no data in this window</text>'
        )
    desc = "; ".join(
        f"{s.name}: "
        + ", ".join(
            f"{d.isoformat()} {round(v * 100)}%" if percent else f"{d.isoformat()} {_num(v)}"
            for d, v in sorted(s.points.items())
        )
        for s in series
    )
    return _frame(chart_id, title, desc or "no data", height, body)


# ------------------------------------------------------------------------------ stacked columns


def stacked_columns(
    chart_id: str, title: str, days: Sequence[date], keys: Sequence[str], values: dict[tuple[date, str], int]
) -> Markup:
    """One column per day, stacked by key (e.g. tokens per purpose), with a legend."""
    left, right, top, plot_h = 64.0, 16.0, 16.0, 180.0
    plot_w = WIDTH - left - right
    baseline = top + plot_h
    cols = _legend_columns(keys)
    legend_rows = (len(keys) + cols - 1) // cols
    height = baseline + 28 + legend_rows * 20
    totals = {d: sum(values.get((d, k), 0) for k in keys) for d in days}
    top_value = max([*totals.values(), 1])
    slot = plot_w / max(len(days), 1)
    col_w = max(min(slot * 0.7, 28.0), 2.0)
    body = []
    for frac in (0.0, 0.5, 1.0):
        yy = baseline - plot_h * frac
        body.append(
            f'<line x1="{_num(left)}" y1="{_num(yy)}" x2="{_num(WIDTH - right)}" y2="{_num(yy)}" stroke="#ddd"/>'
            f'<text x="{_num(left - 6)}" y="{_num(yy + 4)}" text-anchor="end" class="chart-label">{int(top_value * frac):,}</text>'
        )
    body.append(
        "<defs>"
        + "".join(
            f'<pattern id="{chart_id}-p{n}" width="6" height="6" patternUnits="userSpaceOnUse" '
            f'patternTransform="rotate({(n * 45) % 180})"><rect width="6" height="6" fill="{PALETTE[n % len(PALETTE)]}"/>'
            + ('<line x1="0" y1="0" x2="0" y2="6" stroke="white" stroke-width="1.5"/>' if n % 2 else "")
            + "</pattern>"
            for n in range(len(keys))
        )
        + "</defs>"
    )
    for i, d in enumerate(days):
        cx = left + slot * i + (slot - col_w) / 2
        acc = 0
        for n, k in enumerate(keys):
            v = values.get((d, k), 0)
            if not v:
                continue
            h = plot_h * v / top_value
            yy = baseline - plot_h * (acc + v) / top_value
            body.append(
                f'<rect x="{_num(cx)}" y="{_num(yy)}" width="{_num(col_w)}" height="{_num(max(h, 0.5))}" '
                f'fill="url(#{chart_id}-p{n})"><title>{escape(k)} {d.isoformat()}: {v:,}</title></rect>'
            )
            acc += v
    if days:
        picks = sorted({0, len(days) // 2, len(days) - 1})
        body += [
            f'<text x="{_num(left + slot * i + (0 if _anchor(i, len(days)) == "start" else slot if _anchor(i, len(days)) == "end" else slot / 2))}" '
            f'y="{_num(baseline + 16)}" text-anchor="{_anchor(i, len(days))}" class="chart-label">{days[i].strftime("%b %d")}</text>'
            for i in picks
        ]
    for n, k in enumerate(keys):
        lx = left + (n % cols) * (plot_w / cols)
        ly = baseline + 34 + (n // cols) * 20
        body.append(
            f'<rect x="{_num(lx)}" y="{_num(ly - 11)}" width="14" height="12" fill="url(#{chart_id}-p{n})" stroke="#333"/>'
            f'<text x="{_num(lx + 20)}" y="{_num(ly)}" class="chart-label">{escape(k)}</text>'
        )
    if not values:
        body.append(
            f'<text x="{_num(left + 8)}" y="{_num(top + 20)}" class="chart-label">no spend in this window</text>'
        )
    desc = "; ".join(f"{k}: {sum(values.get((d, k), 0) for d in days):,} tokens" for k in keys)
    return _frame(chart_id, title, desc or "no data", height, body)
