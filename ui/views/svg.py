"""Plotly figures as standalone SVG, drawn here: no kaleido, no browser, nothing to install (the
modebar's camera button gives PNG; this gives the vector version for papers and slides).

It draws what the app's figures use: bars (vertical or horizontal, grouped / stacked / overlaid, with
bases, per-bar colours, hatch patterns and outside text), scatter traces (lines with dashes and
step shapes, markers with their symbols, text), heatmaps with a colour bar, horizontal reference
lines, annotations, a second y axis, reversed axes, the title and a legend. Other trace types are
listed as "not drawn" in the SVG rather than silently dropped. Hover text is not exported.

Labels arrive as plotly text (a subset of HTML, with trace strings already entity-escaped): tags are
dropped, entities decoded, then everything is XML-escaped once for the SVG."""
from __future__ import annotations

import html
import math
import re
from dataclasses import dataclass, field

FONT = "font-family=\"Helvetica, Arial, sans-serif\""
CHAR_W = 6.6                      # rough width of one 11-px character
DASHES = {"dash": "6,4", "dot": "2,3", "dashdot": "6,3,2,3", "longdash": "10,4", "solid": ""}
PATTERNS = {"/": "M0,8 L8,0", "\\": "M0,0 L8,8", "x": "M0,8 L8,0 M0,0 L8,8", "-": "M0,4 L8,4",
            "|": "M4,0 L4,8", "+": "M0,4 L8,4 M4,0 L4,8", ".": None}
DEFAULT_COLORS = ("#636efa", "#EF553B", "#00cc96", "#ab63fa", "#FFA15A", "#19d3f3")


def plain(text) -> str:
    """Plotly label -> plain text: <br> to a space, other tags dropped, entities decoded."""
    if text is None:
        return ""
    text = re.sub(r"<br\s*/?>", " ", str(text), flags=re.I)
    return html.unescape(re.sub(r"</?[A-Za-z][^<>]*>", "", text))


def esc(text) -> str:
    return html.escape(plain(text), quote=True)


# ---------------------------------------------------------------- axes

@dataclass
class Axis:
    lo: float = math.inf
    hi: float = -math.inf
    cats: list = field(default_factory=list)
    reversed: bool = False
    fixed: tuple | None = None
    title: str = ""
    tickformat: str = ""
    dtick: float | None = None
    pixels: tuple = (0.0, 1.0)     # screen start, end (left->right or bottom->top)

    @property
    def categorical(self) -> bool:
        return bool(self.cats)

    def add(self, values, pad: float = 0.0) -> None:
        for v in values:
            if v is None:
                continue
            if isinstance(v, str):
                if v not in self.cats:
                    self.cats.append(v)
                continue
            self.lo, self.hi = min(self.lo, v - pad), max(self.hi, v + pad)

    def pos(self, v) -> float:
        return float(self.cats.index(v)) if isinstance(v, str) else float(v)

    def bounds(self) -> tuple[float, float]:
        if self.fixed:
            return float(self.fixed[0]), float(self.fixed[1])
        if self.categorical:
            return -0.5, len(self.cats) - 0.5
        lo, hi = (0.0, 1.0) if self.lo > self.hi else (self.lo, self.hi)
        if hi == lo:
            lo, hi = lo - 0.5, hi + 0.5
        span = hi - lo
        return lo - 0.04 * span, hi + 0.04 * span

    def px(self, v) -> float:
        lo, hi = self.bounds()
        frac = (self.pos(v) - lo) / (hi - lo)
        if self.reversed:
            frac = 1 - frac
        return self.pixels[0] + frac * (self.pixels[1] - self.pixels[0])

    def ticks(self) -> list[tuple[float, str]]:
        if self.categorical:
            return [(i, c) for i, c in enumerate(self.cats)]
        lo, hi = self.bounds()
        step = self.dtick if self.dtick and (hi - lo) / self.dtick <= 40 else nice_step((hi - lo) / 6)
        first = math.ceil(lo / step) * step
        out, v = [], first
        while v <= hi + 1e-9 * step:
            out.append((v, self.fmt(v)))
            v += step
        return out

    def fmt(self, v: float) -> str:
        if self.tickformat.endswith("%"):
            return f"{v * 100:.0f}%"
        return f"{v:.6g}" if abs(v) >= 1e-9 else "0"


def nice_step(raw: float) -> float:
    if raw <= 0 or not math.isfinite(raw):
        return 1.0
    power = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * power:
            return m * power
    return 10 * power


def _axis(layout: dict, name: str) -> Axis:
    spec = layout.get(name, {})
    title = spec.get("title", {})
    title = title.get("text", "") if isinstance(title, dict) else title
    return Axis(reversed=spec.get("autorange") == "reversed", fixed=tuple(spec["range"]) if spec.get("range") else None,
                title=plain(title), tickformat=spec.get("tickformat", ""),
                dtick=spec.get("dtick") if isinstance(spec.get("dtick"), (int, float)) else None)


# ---------------------------------------------------------------- the figure

class Canvas:
    def __init__(self, fig, width: int, height: int | None):
        self.d = fig.to_dict()
        self.layout = self.d.get("layout", {})
        self.traces = self.d.get("data", [])
        self.width = width
        self.height = height or int(self.layout.get("height") or 450)
        self.parts: list[str] = []
        self.defs: list[str] = []
        self.x, self.y, self.y2 = (_axis(self.layout, n) for n in ("xaxis", "yaxis", "yaxis2"))
        self.skipped: list[str] = []
        self.stack: dict = {}          # running totals of stacked bars per category

    def yaxis(self, trace: dict) -> Axis:
        return self.y2 if trace.get("yaxis") == "y2" else self.y

    # -------------------------------------------------- extents
    def measure(self) -> None:
        for t in self.traces:
            kind = t.get("type", "scatter")
            if kind == "bar":
                self._measure_bar(t)
            elif kind == "scatter":
                self.x.add(t.get("x") or [])
                self.yaxis(t).add(t.get("y") or [])
            elif kind == "heatmap":
                self.x.add(t.get("x") or range(len((t.get("z") or [[]])[0])), pad=0.5)
                self.y.add(t.get("y") or range(len(t.get("z") or [])), pad=0.5)
            else:
                self.skipped.append(kind)

    def _measure_bar(self, t: dict) -> None:
        cat_axis, val_axis = (self.y, self.x) if t.get("orientation") == "h" else (self.x, self.yaxis(t))
        cats, vals = (t.get("y"), t.get("x")) if t.get("orientation") == "h" else (t.get("x"), t.get("y"))
        cat_axis.add(cats or [], pad=0.5)
        base = t.get("base")
        bases = base if isinstance(base, (list, tuple)) else [base or 0] * len(vals or [])
        ends = [(b or 0) + v for b, v in zip(bases, vals or []) if v is not None]
        stacked = self.layout.get("barmode") == "stack"
        val_axis.add([0] + list(bases) + ends + ([sum(v for v in vals if v)] if stacked and vals else []))

    def frame(self) -> None:
        left = 60 + min(220, CHAR_W * max((len(label) for _, label in self.y.ticks()), default=4))
        right = 30 + (60 if self.layout.get("yaxis2") else 0) + (70 if self._heatmaps() else 0)
        top = 60 if self._title_lines()[1:] else 46
        bottom = 60 + self._xlabel_room() + 22 * self._legend_rows(left)
        self.box = (left, top, self.width - right, self.height - bottom)
        self.x.pixels = (self.box[0], self.box[2])
        self.y.pixels = self.y2.pixels = (self.box[3], self.box[1])

    def _heatmaps(self) -> list:
        return [t for t in self.traces if t.get("type") == "heatmap"]

    def _rotate_x(self) -> bool:
        slot = (self.width - 200) / max(1, len(self.x.cats))
        return self.x.categorical and max((len(c) for c in self.x.cats), default=0) * CHAR_W > slot

    def _xlabel_room(self) -> float:
        if not self._rotate_x():
            return 0
        return min(160, 0.72 * CHAR_W * max(len(plain(c)) for c in self.x.cats))

    # -------------------------------------------------- legend
    def legend_items(self) -> list[dict]:
        return [t for t in self.traces if t.get("name") and t.get("showlegend", True) is not False
                and t.get("type") in ("bar", "scatter")]

    def _legend_rows(self, left: float) -> int:
        if self.layout.get("showlegend") is False:
            return 0
        rows, x = (1 if self.legend_items() else 0), left
        for t in self.legend_items():
            w = 34 + CHAR_W * len(plain(t["name"]))
            if x + w > self.width - 20 and x > left:
                rows, x = rows + 1, left
            x += w
        return rows

    def _title_lines(self) -> list[str]:
        title = self.layout.get("title", {})
        text = title.get("text", "") if isinstance(title, dict) else str(title or "")
        return [line for line in re.split(r"<br\s*/?>", text, flags=re.I) if plain(line).strip()]

    # -------------------------------------------------- output
    def render(self) -> str:
        self.measure()
        self.frame()
        draw_axes(self)
        for i, t in enumerate(self.traces):
            DRAWERS.get(t.get("type", "scatter"), lambda c, t, i: None)(self, t, i)
        draw_shapes(self)
        draw_title_and_legend(self)
        if self.skipped:
            self.parts.append(f'<text x="8" y="{self.height - 6}" font-size="10" {FONT}>'
                              f'not drawn: {esc(", ".join(sorted(set(self.skipped))))}</text>')
        head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.width}" height="{self.height}" '
                f'viewBox="0 0 {self.width} {self.height}">')
        defs = f"<defs>{''.join(self.defs)}</defs>" if self.defs else ""
        return (head + defs + f'<rect width="{self.width}" height="{self.height}" fill="white"/>'
                + "".join(self.parts) + "</svg>")


def figure_svg(fig, width: int = 960, height: int | None = None) -> str:
    """The figure as an SVG document (a string)."""
    return Canvas(fig, width, height).render()


# ---------------------------------------------------------------- drawing

def _text(x, y, text, size=11, anchor="middle", color="#222", extra="") -> str:
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" fill="{color}" '
            f'{FONT} {extra}>{esc(text)}</text>')


def draw_axes(c: Canvas) -> None:
    x0, y0, x1, y1 = c.box
    c.parts.append(f'<rect x="{x0}" y="{y0}" width="{x1 - x0}" height="{y1 - y0}" fill="#F4F6FA"/>')
    for v, label in c.y.ticks():
        py = c.y.px(v if not c.y.categorical else c.y.cats[int(v)])
        c.parts.append(f'<line x1="{x0}" x2="{x1}" y1="{py:.1f}" y2="{py:.1f}" stroke="white"/>')
        c.parts.append(_text(x0 - 6, py + 4, label, anchor="end"))
    rotate = c._rotate_x()
    for v, label in c.x.ticks():
        px = c.x.px(v if not c.x.categorical else c.x.cats[int(v)])
        c.parts.append(f'<line y1="{y0}" y2="{y1}" x1="{px:.1f}" x2="{px:.1f}" stroke="white"/>')
        if rotate:
            c.parts.append(_text(px, y1 + 14, label, anchor="end", extra=f'transform="rotate(-40 {px:.1f} {y1 + 14})"'))
        else:
            c.parts.append(_text(px, y1 + 16, label))
    if c.layout.get("yaxis2"):
        for v, label in c.y2.ticks():
            c.parts.append(_text(x1 + 6, c.y2.px(v) + 4, label, anchor="start"))
        mid = (y0 + y1) / 2
        c.parts.append(_text(x1 + 50, mid, c.y2.title, extra=f'transform="rotate(90 {x1 + 50} {mid:.1f})"'))
    c.parts.append(_text((x0 + x1) / 2, y1 + 34 + c._xlabel_room(), c.x.title, size=12))
    mid = (y0 + y1) / 2
    c.parts.append(_text(18, mid, c.y.title, size=12, extra=f'transform="rotate(-90 18 {mid:.1f})"'))


def _color(spec, i: int, fallback: str) -> str:
    if isinstance(spec, (list, tuple)):
        return spec[i % len(spec)] if spec else fallback
    return spec or fallback


def _pattern(c: Canvas, shape: str, color: str) -> str | None:
    if not shape or shape not in PATTERNS:
        return None
    pid = f"pat{len(c.defs)}"
    path = PATTERNS[shape]
    body = (f'<circle cx="4" cy="4" r="1.3" fill="{color}"/>' if path is None
            else f'<path d="{path}" stroke="{color}" stroke-width="1.3"/>')
    c.defs.append(f'<pattern id="{pid}" width="8" height="8" patternUnits="userSpaceOnUse">{body}</pattern>')
    return pid


def _bar_slots(c: Canvas, t: dict, index: int) -> tuple[int, int]:
    """(this bar trace's slot, number of slots) among bar traces sharing the category axis."""
    if c.layout.get("barmode") in ("stack", "overlay"):
        return 0, 1
    bars = [i for i, u in enumerate(c.traces) if u.get("type") == "bar"
            and (u.get("orientation") == "h") == (t.get("orientation") == "h")]
    return bars.index(index), len(bars)


def draw_bar(c: Canvas, t: dict, index: int) -> None:
    horizontal = t.get("orientation") == "h"
    cat_axis, val_axis = (c.y, c.x) if horizontal else (c.x, c.yaxis(t))
    cats, vals = (t.get("y") or [], t.get("x") or []) if horizontal else (t.get("x") or [], t.get("y") or [])
    slot, slots = _bar_slots(c, t, index)
    marker = t.get("marker", {})
    base = t.get("base")
    lo, hi = cat_axis.bounds()
    unit = abs(cat_axis.pixels[1] - cat_axis.pixels[0]) / (hi - lo)     # pixels per category / unit
    width = 0.8 * unit / slots
    for i, (cat, v) in enumerate(zip(cats, vals)):
        if v is None:
            continue
        b = base[i] if isinstance(base, (list, tuple)) else (base or 0)
        if c.layout.get("barmode") == "stack":
            b = c.stack.get(cat, 0.0)
            c.stack[cat] = b + v
        centre = cat_axis.px(cat) + (slot - (slots - 1) / 2) * width * (-1 if horizontal else 1)
        a, z = val_axis.px(b), val_axis.px(b + v)
        color = _color(marker.get("color"), i, DEFAULT_COLORS[index % len(DEFAULT_COLORS)])
        _bar_rect(c, horizontal, centre, width, a, z, color, marker, i)
        _bar_text(c, t, i, horizontal, centre, z, a)


def _bar_rect(c: Canvas, horizontal, centre, width, a, z, color, marker, i) -> None:
    if horizontal:
        x, y, w, h = min(a, z), centre - width / 2, abs(z - a), width
    else:
        x, y, w, h = centre - width / 2, min(a, z), width, abs(z - a)
    line = marker.get("line", {})
    stroke = f' stroke="{_color(line.get("color"), i, "none")}" stroke-width="{line.get("width", 1)}"' \
        if line.get("color") else ""
    geo = f'x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}"'
    c.parts.append(f'<rect {geo} fill="{color}"{stroke}/>')
    shape = _color((marker.get("pattern") or {}).get("shape"), i, "")
    fg = (marker.get("pattern") or {}).get("fgcolor") or ("white" if color != "white" else "#222")
    pid = _pattern(c, shape, _color(fg, i, "#222"))
    if pid:
        c.parts.append(f'<rect {geo} fill="url(#{pid})"/>')


def _bar_text(c: Canvas, t: dict, i: int, horizontal, centre, z, a) -> None:
    text = t.get("text")
    label = _color(text, i, "") if text else ""
    if not label:
        return
    if horizontal:
        c.parts.append(_text(max(z, a) + 4, centre + 4, label, anchor="start", size=10))
    else:
        c.parts.append(_text(centre, min(z, a) - 4, label, size=10))


def _symbol(kind: str, x: float, y: float, r: float, color: str) -> str:
    kind = kind or "circle"
    open_ = kind.endswith("-open")
    fill, stroke = ("none", color) if open_ else (color, "#222")
    base = kind.replace("-open", "")
    if base in ("x", "cross"):
        d = (f"M{x - r},{y - r} L{x + r},{y + r} M{x - r},{y + r} L{x + r},{y - r}" if base == "x"
             else f"M{x - r},{y} L{x + r},{y} M{x},{y - r} L{x},{y + r}")
        return f'<path d="{d}" stroke="{color}" stroke-width="3"/>'
    if base == "diamond":
        return (f'<path d="M{x},{y - r} L{x + r},{y} L{x},{y + r} L{x - r},{y} Z" fill="{fill}" '
                f'stroke="{stroke}"/>')
    if base == "square":
        return f'<rect x="{x - r}" y="{y - r}" width="{2 * r}" height="{2 * r}" fill="{fill}" stroke="{stroke}"/>'
    return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r}" fill="{fill}" stroke="{stroke}" stroke-width="1.5"/>'


def _segments(xs, ys) -> list[list[tuple]]:
    out, cur = [], []
    for x, y in zip(xs, ys):
        if x is None or y is None:
            if cur:
                out.append(cur)
            cur = []
        else:
            cur.append((x, y))
    return out + ([cur] if cur else [])


def draw_scatter(c: Canvas, t: dict, index: int) -> None:
    ya = c.yaxis(t)
    xs, ys = t.get("x") or [], t.get("y") or []
    mode = t.get("mode", "lines+markers")
    color = (t.get("line") or {}).get("color") or _color((t.get("marker") or {}).get("color"), 0,
                                                         DEFAULT_COLORS[index % len(DEFAULT_COLORS)])
    if "lines" in mode:
        _draw_lines(c, t, xs, ys, ya, color)
    if "markers" in mode:
        marker = t.get("marker") or {}
        for i, (x, y) in enumerate(zip(xs, ys)):
            if x is not None and y is not None:
                c.parts.append(_symbol(_color(marker.get("symbol"), i, "circle"), c.x.px(x), ya.px(y),
                                       (marker.get("size") or 8) / 2, _color(marker.get("color"), i, color)))
    if "text" in mode:
        font = t.get("textfont") or {}
        for i, (x, y) in enumerate(zip(xs, ys)):
            if x is not None and y is not None:
                c.parts.append(_text(c.x.px(x), ya.px(y) + 4, _color(t.get("text"), i, ""), size=font.get("size") or 11,
                                     color=_color(font.get("color"), i, "#222")))


def _draw_lines(c: Canvas, t: dict, xs, ys, ya: Axis, color: str) -> None:
    line = t.get("line") or {}
    dash = DASHES.get(line.get("dash") or "solid", "")
    style = f' stroke-dasharray="{dash}"' if dash else ""
    for seg in _segments(xs, ys):
        pts = [(c.x.px(x), ya.px(y)) for x, y in seg]
        if line.get("shape") == "hv":
            pts = [p for a, b in zip(pts, pts[1:]) for p in (a, (b[0], a[1]))] + pts[-1:]
        coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
        c.parts.append(f'<polyline points="{coords}" fill="none" stroke="{color}" '
                       f'stroke-width="{line.get("width") or 2}"{style}/>')


def _scale_color(scale, frac: float) -> str:
    frac = min(1.0, max(0.0, frac))
    stops = [(float(p), _rgb(col)) for p, col in scale]
    for (p0, c0), (p1, c1) in zip(stops, stops[1:]):
        if frac <= p1:
            w = 0 if p1 == p0 else (frac - p0) / (p1 - p0)
            return "#{:02x}{:02x}{:02x}".format(*(round(a + w * (b - a)) for a, b in zip(c0, c1)))
    return "#{:02x}{:02x}{:02x}".format(*stops[-1][1])


def _rgb(color: str) -> tuple[int, int, int]:
    if color.startswith("#"):
        h = color[1:]
        h = "".join(ch * 2 for ch in h) if len(h) == 3 else h
        return tuple(int(h[i:i + 2], 16) for i in (0, 2, 4))
    nums = re.findall(r"[\d.]+", color)
    return tuple(int(float(v)) for v in nums[:3])


def draw_heatmap(c: Canvas, t: dict, index: int) -> None:
    z = t.get("z") or []
    xs = t.get("x") or list(range(len(z[0]) if z else 0))
    ys = t.get("y") or list(range(len(z)))
    flat = [v for row in z for v in row if v is not None]
    lo = t.get("zmin", min(flat, default=0))
    hi = t.get("zmax", max(flat, default=1))
    scale = t.get("colorscale") or [[0, "#00224e"], [1, "#fee838"]]
    gap = max(t.get("xgap") or 0, t.get("ygap") or 0) / 2
    for j, row in enumerate(z):
        for i, v in enumerate(row):
            if v is None:
                continue
            xa, xb = sorted((c.x.px(c.x.pos(xs[i]) - 0.5), c.x.px(c.x.pos(xs[i]) + 0.5)))
            ya, yb = sorted((c.y.px(c.y.pos(ys[j]) - 0.5), c.y.px(c.y.pos(ys[j]) + 0.5)))
            color = _scale_color(scale, (v - lo) / (hi - lo) if hi > lo else 0.5)
            c.parts.append(f'<rect x="{xa + gap:.1f}" y="{ya + gap:.1f}" width="{xb - xa - 2 * gap:.1f}" '
                           f'height="{yb - ya - 2 * gap:.1f}" fill="{color}"/>')
    _colorbar(c, t, scale, lo, hi)


def _colorbar(c: Canvas, t: dict, scale, lo: float, hi: float) -> None:
    x = c.box[2] + 20 + (60 if c.layout.get("yaxis2") else 0)
    top, bottom = c.box[1] + 10, c.box[3] - 10
    steps = 24
    for s in range(steps):
        frac = s / (steps - 1)
        y = bottom - (s + 1) * (bottom - top) / steps
        c.parts.append(f'<rect x="{x}" y="{y:.1f}" width="14" height="{(bottom - top) / steps + 0.5:.1f}" '
                       f'fill="{_scale_color(scale, frac)}"/>')
    for frac in (0.0, 0.5, 1.0):
        c.parts.append(_text(x + 18, bottom - frac * (bottom - top) + 4, f"{lo + frac * (hi - lo):.3g}", anchor="start",
                             size=10))
    title = ((t.get("colorbar") or {}).get("title") or {}).get("text", "")
    c.parts.append(_text(x, top - 4, title, anchor="start", size=10))


DRAWERS = {"bar": draw_bar, "scatter": draw_scatter, "heatmap": draw_heatmap}


def draw_shapes(c: Canvas) -> None:
    """Horizontal lines (add_hline and paper-wide line shapes) and annotations."""
    x0, _, x1, _ = c.box
    for s in c.layout.get("shapes", []):
        if s.get("type") != "line" or s.get("y0") != s.get("y1") or s.get("xref") not in ("paper", "x domain"):
            continue
        ya = c.y2 if s.get("yref") == "y2" else c.y
        py = ya.px(s["y0"])
        line = s.get("line") or {}
        dash = DASHES.get(line.get("dash") or "solid", "")
        style = f' stroke-dasharray="{dash}"' if dash else ""
        c.parts.append(f'<line x1="{x0}" x2="{x1}" y1="{py:.1f}" y2="{py:.1f}" '
                       f'stroke="{line.get("color") or "#222"}" stroke-width="1.5"{style}/>')
    for a in c.layout.get("annotations", []):
        ya = c.y2 if a.get("yref") == "y2" else c.y
        xref = str(a.get("xref", "x"))
        px = x0 + (a.get("x") or 0) * (x1 - x0) if ("domain" in xref or xref == "paper") else c.x.px(a.get("x"))
        anchor = {"right": "end", "left": "start"}.get(a.get("xanchor"), "middle")
        c.parts.append(_text(px, ya.px(a.get("y") or 0) - 6, a.get("text", ""), size=10, anchor=anchor))


def draw_title_and_legend(c: Canvas) -> None:
    for n, line in enumerate(c._title_lines()):
        c.parts.append(_text(12, 24 + 18 * n, line, size=15 if n == 0 else 11, anchor="start"))
    if c.layout.get("showlegend") is False:
        return
    x, y = c.box[0], c.height - 22 * c._legend_rows(c.box[0]) + 4
    for i, t in enumerate(c.legend_items()):
        w = 34 + CHAR_W * len(plain(t["name"]))
        if x + w > c.width - 20 and x > c.box[0]:
            x, y = c.box[0], y + 22
        c.parts.append(_swatch(c, t, i, x, y))
        c.parts.append(_text(x + 28, y + 4, t["name"], anchor="start"))
        x += w


def _swatch(c: Canvas, t: dict, i: int, x: float, y: float) -> str:
    marker = t.get("marker") or {}
    if t.get("type") == "bar":
        color = _color(marker.get("color"), 0, DEFAULT_COLORS[i % len(DEFAULT_COLORS)])
        line = (marker.get("line") or {}).get("color")
        return f'<rect x="{x}" y="{y - 6}" width="22" height="12" fill="{color}" stroke="{line or "none"}"/>'
    mode = t.get("mode", "lines+markers")
    color = (t.get("line") or {}).get("color") or _color(marker.get("color"), 0, DEFAULT_COLORS[i % 6])
    out = ""
    if "lines" in mode:
        dash = DASHES.get((t.get("line") or {}).get("dash") or "solid", "")
        style = f' stroke-dasharray="{dash}"' if dash else ""
        out += f'<line x1="{x}" x2="{x + 22}" y1="{y}" y2="{y}" stroke="{color}" stroke-width="2"{style}/>'
    if "markers" in mode:
        out += _symbol(_color(marker.get("symbol"), 0, "circle"), x + 11, y, 5, _color(marker.get("color"), 0, color))
    return out
