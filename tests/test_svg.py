"""The offline SVG export of plotly figures (ui/views/svg.py): well-formed XML with one shape per bar,
cell and marker, the figure's colours, dashes and symbols, and every label escaped."""
from __future__ import annotations

import xml.etree.ElementTree as ET

import plotly.graph_objects as go
import pytest

from ui.views import figures, svg

NS = "{http://www.w3.org/2000/svg}"


def parse(text: str) -> ET.Element:
    return ET.fromstring(text)


def texts(root: ET.Element) -> list[str]:
    return [el.text or "" for el in root.iter(f"{NS}text")]


def rects(root: ET.Element, fill: str) -> list[ET.Element]:
    return [el for el in root.iter(f"{NS}rect") if el.get("fill") == fill]


def test_vertical_bars_one_rect_each_with_height_by_value():
    fig = go.Figure(go.Bar(x=["a", "b", "c"], y=[1.0, 2.0, 4.0], marker_color="#123456", text=["x", "y", "z"]))
    fig.update_layout(title="Three bars", yaxis={"title": "value", "range": [0, 4]})
    root = parse(svg.figure_svg(fig, width=600, height=300))
    bars = rects(root, "#123456")
    assert len(bars) == 3
    heights = [float(b.get("height")) for b in bars]
    assert heights[1:] == pytest.approx([2 * heights[0], 4 * heights[0]], rel=1e-2)
    lefts = [float(b.get("x")) for b in bars]
    assert lefts == sorted(lefts)                                   # categories in order
    assert {"a", "b", "c", "x", "y", "z", "Three bars", "value"} <= set(texts(root))


def test_grouped_bars_sit_side_by_side_and_patterns_are_kept():
    fig = go.Figure()
    fig.add_bar(name="first", x=["a", "b"], y=[1, 1], marker_color="#111111")
    fig.add_bar(name="second", x=["a", "b"], y=[1, 1], marker={"color": "#222222", "pattern": {"shape": "x"}})
    root = parse(svg.figure_svg(fig))
    first, second = rects(root, "#111111"), rects(root, "#222222")
    assert len(first) == len(second) == 2 + 1                       # two bars and a legend swatch each
    assert float(first[0].get("x")) < float(second[0].get("x"))     # grouped, not overlaid
    assert [el.get("fill") for el in root.iter(f"{NS}rect") if (el.get("fill") or "").startswith("url(")]
    assert root.find(f"{NS}defs/{NS}pattern") is not None
    assert {"first", "second"} <= set(texts(root))


def test_horizontal_waterfall_uses_the_bases():
    fig = figures.timing_waterfall({"prefill": 40.0, "processing": 2.5, "sampling": 0.5})
    root = parse(svg.figure_svg(fig))
    bars = [el for el in root.iter(f"{NS}rect") if el.get("fill") in figures.palette.PHASE_COLORS[:3]]
    assert len(bars) == 3
    xs = [float(b.get("x")) for b in bars]
    widths = [float(b.get("width")) for b in bars]
    assert xs[1] == pytest.approx(xs[0] + widths[0], abs=0.2)       # each phase starts where the last ended
    assert widths[0] == pytest.approx(16 * widths[1], rel=0.02)


def test_heatmap_cells_colour_scale_and_colour_bar():
    fig = go.Figure(go.Heatmap(z=[[0.0, 1.0], [0.5, None]], x=[1, 2], y=[0, 1], colorscale="Cividis", zmin=0, zmax=1))
    root = parse(svg.figure_svg(fig))
    low, high = svg._scale_color(fig.data[0].colorscale, 0.0), svg._scale_color(fig.data[0].colorscale, 1.0)
    assert low == "#00224e" and high != low
    cells = [el for el in root.iter(f"{NS}rect") if el.get("height") and float(el.get("width")) > 30]
    fills = [c.get("fill") for c in cells]
    assert low in fills and high in fills
    assert len([f for f in fills if f not in ("white", "#F4F6FA")]) == 3       # the None cell is not drawn


def test_scatter_lines_dashes_markers_and_steps():
    fig = go.Figure()
    fig.add_scatter(name="dashed", x=[0, 1, None, 2, 3], y=[0, 1, None, 1, 0], mode="lines",
                    line={"color": "#aa0000", "dash": "dash"})
    fig.add_scatter(name="pts", x=[0, 1], y=[1, 0], mode="markers",
                    marker={"symbol": ["x", "diamond"], "color": "#00aa00"})
    fig.add_scatter(name="step", x=[0, 1, 2], y=[0, 1, 2], mode="lines", line={"color": "#0000aa", "shape": "hv"})
    root = parse(svg.figure_svg(fig))
    lines = [el for el in root.iter(f"{NS}polyline") if el.get("stroke") == "#aa0000"]
    assert len(lines) == 2 and all(el.get("stroke-dasharray") == "6,4" for el in lines)   # split at the gap
    step = next(el for el in root.iter(f"{NS}polyline") if el.get("stroke") == "#0000aa")
    assert len(step.get("points").split()) == 5                     # 3 points + 2 corners
    paths = [el for el in root.iter(f"{NS}path") if el.get("stroke") == "#00aa00" or el.get("fill") == "#00aa00"]
    assert len(paths) >= 2                                          # an x and a diamond, not two circles


def test_hline_annotation_second_axis_and_reversed_axis():
    fig = go.Figure(go.Bar(x=["a"], y=[0.5]))
    fig.add_scatter(x=["a"], y=[10], yaxis="y2", mode="markers", name="right")
    fig.add_hline(y=0.25, line={"color": "#abcdef", "dash": "dot"}, annotation_text="floor")
    fig.update_layout(yaxis2={"title": "ms", "overlaying": "y", "side": "right"})
    root = parse(svg.figure_svg(fig))
    assert [el for el in root.iter(f"{NS}line") if el.get("stroke") == "#abcdef"]
    assert {"floor", "ms"} <= set(texts(root))
    up = go.Figure(go.Scatter(x=[0, 1], y=[0, 1], mode="markers", marker={"color": "#010101"}))
    down = go.Figure(up).update_layout(yaxis={"autorange": "reversed"})

    def first_y(f):
        return float(next(el for el in parse(svg.figure_svg(f)).iter(f"{NS}circle")
                          if el.get("fill") == "#010101").get("cy"))
    assert first_y(up) > first_y(down)                              # y = 0 at the bottom, then at the top


def test_labels_are_decoded_once_and_escaped(monkeypatch):
    label = "<script>alert(1)</script> & <b>bold</b>"
    fig = go.Figure(go.Bar(x=[figures.html.escape(label)], y=[1], name="evil"))
    fig.update_layout(title="Title<br><sup>sub &amp; more</sup>")
    out = svg.figure_svg(fig)
    root = parse(out)
    assert not [el for el in root.iter() if el.tag.endswith("script") or el.tag.endswith("b")]
    assert label in texts(root) and "sub & more" in texts(root)
    # negative control: without escaping, the same label breaks out of the text element
    monkeypatch.setattr(svg, "esc", svg.plain)
    raw = svg.figure_svg(fig)
    try:
        bad = parse(raw)
    except ET.ParseError:
        return                                                      # not even well-formed any more
    assert [el for el in bad.iter() if el.tag.endswith("script")]   # or a script element got in


def test_unsupported_traces_are_named_not_dropped():
    fig = go.Figure(go.Pie(values=[1, 2]))
    assert "not drawn: pie" in " ".join(texts(parse(svg.figure_svg(fig))))
