"""Trace -> plotly figures. Pure: plain values in, go.Figure out (no streamlit, no tensors).

Probabilities are drawn in one space, the *processed* distribution the token was chosen from
(temperature-scaled, renormalised over the kept tokens). A removed candidate is drawn at the
probability it would have had there, exp((logit_i - logit_max) / T) * p_max, so bars, the min-p
floor and the removed tokens can be compared on one axis.

Plotly renders a subset of HTML in its text (<b>, <a href>, <br>), so every string from a trace is
escaped with plot_text before it becomes a label: <, > and & as entities, which plotly shows as the
plain characters; quotes stay as they are (plotly does not decode &quot;, and its text is no attribute).
"""
from __future__ import annotations

import html
import math
import textwrap
from collections.abc import Mapping, Sequence

import plotly.graph_objects as go

from decoding.core.trace_totals import emitted_count
from ui.views import palette
from ui.views.chips import visible
from ui.views.headers import header, value_word

FILTERS_ORDER = ("top_k", "top_p", "min_p")


def plot_text(text: str) -> str:
    """A trace string made safe for plotly's pseudo-HTML labels (quotes kept as characters)."""
    return html.escape(text, quote=False)


# ---------------------------------------------------------------- margins without plotly's automargin
CHAR_PX = 7.8          # average glyph width of the charts' 13 px font (FONT_PX)
LINE_PX = 18           # one line of tick labels or an axis title
NUMBER_CHARS = 6       # a numeric tick label ("0.0001", "1.25k")
MAY_TURN_ABOVE_PX = 400  # category labels wider than this in all may be turned by plotly (30°): room is kept
TURN_DEGREES = 30


def _category_labels(fig: go.Figure, axis: str) -> list[str]:
    """The string values the figure's traces put on `axis` ("x", "y", "y2"); empty when numeric."""
    letter = axis[0]
    labels = []
    for trace in fig.data:
        if (getattr(trace, letter + "axis", None) or letter) != axis:
            continue
        labels += [html.unescape(v) for v in (getattr(trace, letter, None) or ()) if isinstance(v, str)]
    return labels


def _side_px(fig: go.Figure, axis: str, name: str) -> int:
    """Width needed beside a vertical axis: its longest tick label plus its title."""
    layout_axis = fig.layout[name]
    if layout_axis.showticklabels is False:
        return 10
    labels = _category_labels(fig, axis)
    chars = max((len(t) for t in labels), default=NUMBER_CHARS)
    return int(chars * CHAR_PX + 14 + (LINE_PX + 6 if layout_axis.title.text else 0))


def fixed_margins(fig: go.Figure) -> go.Figure:
    """Margins computed from the labels, and automargin off on every axis. Plotly's automargin (on in
    its default template) measures the tick labels in the page and draws the chart a second time with
    the margins found: 15-30 % of plotly's time on a Step (measured with the browser's profiler; the
    app section of BENCHMARKS.md has the Step times). Room is kept below category labels on x for
    plotly turning them by 30°, as it does where they would overlap at the chart's width."""
    margin = fig.layout.margin
    left = _side_px(fig, "y", "yaxis")
    overlaid = "yaxis2" in fig.layout and fig.layout.yaxis2.overlaying   # not to_plotly_json: it copies the template
    right = _side_px(fig, "y2", "yaxis2") if overlaid else (margin.r if margin.r is not None else 10)
    labels = _category_labels(fig, "x")
    chars = max((len(t) for t in labels), default=NUMBER_CHARS)
    bottom = LINE_PX + 6
    if labels and len(set(labels)) * (chars * CHAR_PX + 12) > MAY_TURN_ABOVE_PX:
        bottom = max(bottom, int(chars * CHAR_PX * math.sin(math.radians(TURN_DEGREES)) + LINE_PX))
    bottom += LINE_PX + 6 if fig.layout.xaxis.title.text else 0
    fig.update_layout(margin={"l": left, "r": right, "b": bottom + 6})
    fig.update_xaxes(automargin=False)
    fig.update_yaxes(automargin=False)
    return fig


# ---------------------------------------------------------------- projector defaults (one place for every chart)
FONT_PX = 13           # the charts' base font; no chart text is drawn below MIN_FONT_PX
MIN_FONT_PX = 12
TOOLBAR_PX = 30        # the band at the chart's top that plotly's toolbar (always shown) takes
TITLE_LINE_PX = 22     # one line of the title at FONT_PX + 3
TITLE_CHARS = 60       # a title line wraps at a space after this many characters (a chart in a half-width column
                       # at 1280 px is about 480 px wide)


def wrap_title(text: str) -> str:
    """The title with its long lines broken at spaces (plotly draws a title on one line and cuts it at the
    chart's edge); lines holding markup are left as they are."""
    lines = []
    for line in text.split("<br>"):
        lines += [line] if "<" in line else (textwrap.wrap(line, TITLE_CHARS, break_long_words=False) or [""])
    return "<br>".join(lines)


def _raise_fonts(fig: go.Figure) -> None:
    """Every font size set below MIN_FONT_PX (a legend, a trace's text, an annotation) raised to it."""
    def floor(font) -> None:
        if font is not None and font.size is not None:
            if isinstance(font.size, (int, float)):
                font.size = max(font.size, MIN_FONT_PX)
            else:
                font.size = [max(s, MIN_FONT_PX) for s in font.size]

    floor(fig.layout.legend.font)
    for note in fig.layout.annotations:
        floor(note.font)
    for trace in fig.data:
        floor(getattr(trace, "textfont", None))


def projector_layout(fig: go.Figure) -> go.Figure:
    """Every chart readable on a projector: text at FONT_PX (none below MIN_FONT_PX), the title wrapped and set
    below the toolbar's band (TOOLBAR_PX), with the top margin and the height grown by that band."""
    # uniformtext: plotly shrinks a bar's text to the bar's width unless told a floor ("show": drawn at it)
    fig.update_layout(font={"size": FONT_PX}, uniformtext={"minsize": MIN_FONT_PX, "mode": "show"})
    _raise_fonts(fig)
    title = fig.layout.title.text
    top = fig.layout.margin.t if fig.layout.margin.t is not None else 50
    if title:
        title = wrap_title(title)
        lines = title.count("<br>") + 1
        fig.update_layout(title={"text": title, "yref": "container", "y": 1, "yanchor": "top",
                                 "pad": {"t": TOOLBAR_PX}, "font": {"size": FONT_PX + 3}})
        grown = TOOLBAR_PX + lines * TITLE_LINE_PX + 12
    else:
        grown = TOOLBAR_PX + 6
    extra = max(0, grown - top)
    fig.update_layout(margin={"t": top + extra})
    if fig.layout.height is not None:
        fig.update_layout(height=fig.layout.height + extra)
    return fig


def export_config(filename: str) -> dict:
    """The plotly.js config of every chart: its toolbar always shown, and its camera saving the chart as
    `<filename>.svg` — drawn by plotly.js in the browser, at the size the chart has on the page."""
    return {"displaylogo": False, "displayModeBar": True,
            "toImageButtonOptions": {"format": "svg", "filename": filename}}

def _label(rank: int, piece: str) -> str:
    return plot_text(f"{rank}: {visible(piece)!r}")


def temperature(step) -> float:
    for cut in step.filters:
        if cut.name == "temperature":
            return cut.value
    return 1.0


def _cut(step, name: str):
    return next((c for c in step.filters if c.name == name), None)


def processed_space(step) -> list[float]:
    """Each top-N candidate's probability in the processed space (removed ones as if kept)."""
    top = step.processed_top
    anchor = max(range(len(top)), key=lambda i: top[i].prob)     # the argmax is always kept
    p_anchor, l_anchor = top[anchor].prob, step.raw_top[anchor].logit
    t = temperature(step)
    return [p_anchor * math.exp((raw.logit - l_anchor) / t) for raw in step.raw_top]


def scaled_probs(step) -> list[float]:
    """Each top-N candidate's probability under softmax(logits / T) over the whole vocabulary."""
    kept_mass = 1.0 - sum(c.removed_mass for c in step.filters if c.name != "temperature")
    return [p * kept_mass for p in processed_space(step)]


def top_p_cumulative(step) -> list[float | None]:
    """Cumulative probability of the distribution top-p acted on (after temperature and top-k), in
    candidate order; None for candidates top-k had already removed."""
    top_k = _cut(step, "top_k")
    entering = 1.0 - (top_k.removed_mass if top_k else 0.0)
    out, total = [], 0.0
    for cand, p in zip(step.processed_top, scaled_probs(step)):
        if cand.removed_by == "top_k":
            out.append(None)
            continue
        total += p / entering if entering > 0 else 0.0
        out.append(total)
    return out


def probability_bars(step) -> go.Figure:
    """Top-N raw vs processed probabilities; removed candidates marked by the filter that removed them;
    top-p's cumulative line with its threshold; min-p's floor."""
    labels = [_label(i, c.piece) for i, c in enumerate(step.raw_top, start=1)]     # rank 1 = most probable
    fig = go.Figure()
    fig.add_bar(name="p raw (T=1, no filters)", x=labels, y=[c.prob for c in step.raw_top],
                marker_color=palette.RAW_COLOR, hovertemplate="%{x}<br>p raw %{y:.4f}<extra></extra>")
    space = processed_space(step)
    kept = [c.prob if c.removed_by is None else None for c in step.processed_top]
    fig.add_bar(name="p processed (sampled from)", x=labels, y=kept, marker_color=palette.PROCESSED_COLOR,
                hovertemplate="%{x}<br>p processed %{y:.4f}<extra></extra>")
    for name in FILTERS_ORDER:
        ys = [p if c.removed_by == name else None for c, p in zip(step.processed_top, space)]
        if any(y is not None for y in ys):
            color, shape = palette.FILTER_STYLE[name]
            words = value_word("removed_by", name)
            fig.add_bar(name=f"{header('removed_by')} {words} ✂", x=labels, y=ys,
                        marker={"color": "white", "line": {"color": color, "width": 1.5},
                                "pattern": {"shape": shape, "fgcolor": color}},
                        hovertemplate="%{x}<br>would have had p %{y:.4f}<extra>" + words + "</extra>")
    _add_chosen(fig, step, labels)
    _add_top_p(fig, step, labels)
    _add_min_p(fig, step, space)
    fig.update_layout(barmode="group", title=f"Step {step.index}: top-{len(labels)} candidates",
                      yaxis_title="probability", legend={"orientation": "h", "y": -0.3},
                      margin={"t": 50, "b": 10, "l": 10, "r": 10}, height=420)
    return fig


def _add_chosen(fig: go.Figure, step, labels: list[str]) -> None:
    ids = [c.token_id for c in step.raw_top]
    if step.chosen_id in ids:
        i = ids.index(step.chosen_id)
        top = max(step.raw_top[i].prob, step.processed_top[i].prob)
        fig.add_annotation(x=labels[i], y=top, text="chosen" + (" (forced)" if step.forced else ""),
                           showarrow=True, arrowhead=2, yshift=4)


def _add_top_p(fig: go.Figure, step, labels: list[str]) -> None:
    cut = _cut(step, "top_p")
    if cut is None:
        return
    fig.add_scatter(name="top-p: cumulative p (right axis)", x=labels, y=top_p_cumulative(step),
                    mode="lines+markers", yaxis="y2", line={"color": palette.PURPLE, "dash": "dot"},
                    marker={"symbol": "diamond"}, connectgaps=True)
    fig.add_shape(type="line", xref="paper", x0=0, x1=1, yref="y2", y0=cut.value, y1=cut.value,
                  line={"color": palette.PURPLE, "dash": "dash"})
    fig.add_annotation(xref="paper", x=1, yref="y2", y=cut.value, showarrow=False, xanchor="right", yshift=8,
                       text=f"{value_word('filter', 'top_p')} = {cut.value:g}")
    fig.update_layout(yaxis2={"title": "cumulative p", "overlaying": "y", "side": "right", "range": [0, 1.05],
                              "dtick": 0.25, "showgrid": False})


def _add_min_p(fig: go.Figure, step, space: list[float]) -> None:
    cut = _cut(step, "min_p")
    if cut is None:
        return
    floor = cut.value * max(space)
    fig.add_hline(y=floor, line={"color": palette.ORANGE, "dash": "dashdot"},
                  annotation_text=f"min-p floor = {cut.value:g} × max p = {floor:.4f}",
                  annotation_position="top right")


def kept_coverage(step) -> float:
    """Processed probability mass of the kept top-N candidates (1 when they are all the kept tokens)."""
    return sum(c.prob for c in step.processed_top if c.removed_by is None)


def draw_cdf(step, tolerance: float = 1e-3) -> go.Figure | None:
    """The inverse-CDF draw: the engine accumulates probabilities in vocabulary order and takes the
    first token whose cumulative probability exceeds u. Drawn exactly only when the recorded candidates
    hold all kept tokens (coverage 1); otherwise None (the positions of unrecorded tokens are unknown)."""
    if step.draw is None or abs(kept_coverage(step) - 1.0) > tolerance:
        return None
    kept = sorted((c for c in step.processed_top if c.removed_by is None), key=lambda c: c.token_id)
    xs, lows, total = [], [], 0.0
    for cand in kept:
        lows.append(total)
        total += cand.prob
        xs.append(plot_text(f"{cand.token_id}: {visible(cand.piece)!r}"))
    highs = [low + c.prob for low, c in zip(lows, kept)]
    colors = [palette.VERMILLION if c.token_id == step.chosen_id else palette.GREY for c in kept]
    fig = go.Figure()
    fig.add_bar(name="cdf interval", x=xs, y=[c.prob for c in kept], base=lows, marker_color=colors,
                hovertemplate="%{x}<br>[%{base:.4f}, %{y:.4f} wide)<extra></extra>")
    fig.add_scatter(name="cumulative p (vocabulary order)", x=xs, y=highs, mode="lines+markers",
                    line={"color": palette.BLACK, "shape": "hv"})
    fig.add_hline(y=step.draw * total, line={"color": palette.VERMILLION, "dash": "dash"},
                  annotation_text=f"u = {step.draw:.4f}", annotation_position="top left",
                  annotation_bgcolor="white")
    fig.update_layout(title="The draw: u against the CDF (chosen interval in vermillion)",
                      yaxis={"title": "cumulative p", "range": [0, 1.02]}, showlegend=False,
                      xaxis={"title": "kept tokens in vocabulary order (id: text), the order the draw sums in"},
                      margin={"t": 50, "b": 10, "l": 10, "r": 10}, height=380)
    return fig


def timing_waterfall(timings_ms: Mapping[str, float], title: str = "Where the step's time went") -> go.Figure:
    """One bar per phase, each starting where the previous ended (phases in recorded order)."""
    names = list(timings_ms)
    starts, t = [], 0.0
    for name in names:
        starts.append(t)
        t += timings_ms[name]
    colors = [palette.PHASE_COLORS[i % len(palette.PHASE_COLORS)] for i in range(len(names))]
    fig = go.Figure(go.Bar(x=[timings_ms[n] for n in names], y=[plot_text(value_word("phase", n)) for n in names],
                           base=starts,
                           orientation="h", marker_color=colors, text=[f"{timings_ms[n]:.2f} ms" for n in names],
                           textposition="outside", cliponaxis=False,
                           hovertemplate="%{y}: %{x:.3f} ms<extra></extra>"))
    fig.update_layout(title=f"{title} (total {t:.1f} ms)",
                      xaxis={"title": "ms since step start", "range": [0, t * 1.2]}, yaxis={"autorange": "reversed"},
                      margin={"t": 50, "b": 10, "l": 10, "r": 10},
                      height=80 + 40 * max(1, len(names)))
    return fig


def tokens_vs_time(lanes: Mapping[str, Sequence]) -> go.Figure:
    """Cumulative tokens against cumulative measured step time, one line per lane's events."""
    fig = go.Figure()
    for i, (label, events) in enumerate(lanes.items()):
        xs, ys, t, n = [0.0], [0], 0.0, 0
        for event in events:
            t += sum(getattr(event, "timings_ms", {}).values())
            n += emitted_count(event)
            xs.append(t)
            ys.append(n)
        fig.add_scatter(name=label, x=xs, y=ys, mode="lines+markers",
                        line={"color": palette.LANE_COLORS[i % 4], "dash": palette.LANE_DASHES[i % 4], "shape": "hv"})
    fig.update_layout(title="Tokens vs wall time", xaxis_title="ms (sum of step timings)",
                      yaxis_title="tokens emitted", margin={"t": 50, "b": 10, "l": 10, "r": 10}, height=380)
    return fig


def tokens_per_forward_bars(rows: Sequence[tuple[str, float]]) -> go.Figure:
    """Tokens emitted per target forward, one bar per lane (1 for plain decoding; beam search
    emits one token per forward over B beams), each lane with its colour and pattern."""
    labels = [plot_text(label) for label, _ in rows]
    fig = go.Figure(go.Bar(x=labels, y=[v for _, v in rows], text=[f"{v:.2f}" for _, v in rows],
                           textposition="outside", cliponaxis=False,
                           marker={"color": [palette.LANE_COLORS[i % 4] for i in range(len(rows))],
                                   "pattern": {"shape": [LANE_PATTERNS[i % 4] for i in range(len(rows))]}}))
    peak = max([v for _, v in rows] + [1.0])
    fig.update_layout(title="Tokens per target forward", yaxis={"title": "tokens / forward", "range": [0, peak * 1.2]},
                      margin={"t": 50, "b": 10, "l": 10, "r": 10}, height=340)
    return fig


LANE_PATTERNS = ("", "/", ".", "x")


def per_position_lanes(lanes: Mapping[str, Sequence[float] | None],
                       counts: Mapping[str, Sequence[int]] | None = None) -> go.Figure:
    """Per-position acceptance (position k accepted / drafted) grouped by k, one bar series per lane
    that has it (None: a lane without drafts, skipped but keeping every lane's colour and pattern); with
    `counts` (rounds that drafted k, per lane) each bar says its n and is faded below MIN_ROUNDS."""
    from ui.views.acceptance import MIN_ROUNDS

    fig = go.Figure()
    for i, (label, rates) in enumerate(lanes.items()):
        if not rates:
            continue
        n = list((counts or {}).get(label, ()))[:len(rates)] or [None] * len(rates)
        fig.add_bar(name=plot_text(label), x=[f"k={k + 1}" for k in range(len(rates))], y=list(rates),
                    marker={"color": palette.LANE_COLORS[i % 4], "pattern": {"shape": LANE_PATTERNS[i % 4]},
                            "opacity": [0.35 if c is not None and c < MIN_ROUNDS else 1.0 for c in n]},
                    text=["" if c is None else f"n={c}" for c in n], textposition="outside", cliponaxis=False,
                    hovertemplate="%{x}: %{y:.3f} (%{text})<extra>" + plot_text(label) + "</extra>")
    faded = f"; faded: fewer than {MIN_ROUNDS} rounds" if counts else ""
    fig.update_layout(barmode="group", title=f"Per-position acceptance (n = rounds that drafted k{faded})",
                      yaxis={"title": "acceptance", "range": [0, 1.05]}, legend={"orientation": "h", "y": -0.25},
                      margin={"t": 50, "b": 10, "l": 10, "r": 10}, height=360)
    return fig
