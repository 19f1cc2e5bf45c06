"""The projector-first helpers without a browser (issue 46, items 3 and 6): a DSpark tree round drawn as a tree
(ui.views.dspark.tree_dot) on recorded golden traces, every chart's projector layout (figures.projector_layout)
and the table's column parts (ui.widgets.display.column_parts). Each rule has a negative control."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import pytest

from decoding.core.trace import from_json
from ui.views import dspark, figures
from ui.widgets import display

GOLDEN = Path(__file__).parent / "golden"
NODE = re.compile(r'^  (n\d+|next) \[label="((?:[^"\\]|\\.)*)"(.*)\];$')
EDGE = re.compile(r"^  (n\d+) -> (n\d+|next)( \[.*\])?;?$")


def tree_rounds(name: str = "dspark_tree_cost") -> list:
    rounds = [e for e in dspark.drafting_rounds(from_json((GOLDEN / f"{name}.json").read_text()).steps) if e.nodes]
    assert rounds and all(e.select == "tree" for e in rounds)
    return rounds


def parse(dot: str) -> tuple[dict, list]:
    """{node: (label, attributes)} and [(parent, child, attributes)] of tree_dot's output, every line accounted
    for (a line that is neither a node, an edge nor a known header fails)."""
    nodes, edges = {}, []
    for line in dot.splitlines()[1:-1]:
        if m := NODE.match(line):
            nodes[m[1]] = (m[2], m[3])
        elif m := EDGE.match(line):
            edges.append((m[1], m[2], m[3] or ""))
        else:
            assert re.match(r"^  (rankdir|nodesep|ranksep|node|edge)\b", line), line
    return nodes, edges


def test_a_tree_round_is_drawn_as_its_tree():
    for event in tree_rounds():
        nodes, edges = parse(dspark.tree_dot(event))
        assert set(nodes) == {"n0", "next"} | {f"n{n.node}" for n in event.nodes}
        assert {(p, c) for p, c, _ in edges} == ({(f"n{n.parent}", f"n{n.node}") for n in event.nodes}
                                                  | {(f"n{(event.accepted_path or (0,))[-1]}", "next")})
        bold = {c for _, c, attrs in edges if "penwidth=4" in attrs}
        assert bold == {f"n{i}" for i in event.accepted_path} | {"next"}      # the accepted path, then the token
        for n in event.nodes:
            label, attrs = nodes[f"n{n.node}"]
            fill, ink = dspark.score_colors(n.score)
            assert f'fillcolor="{fill}"' in attrs and f'fontcolor="{ink}"' in attrs   # its own ŝ, not a cell's
            assert f"ŝ {n.score:.2f}" in label and dspark.TREE_STYLE[n.verdict][3] in label


def test_each_node_is_filled_by_its_own_score_not_its_cells():
    """Negative control: the same node under another ŝ gets another fill; the fill follows the score scale."""
    event = tree_rounds()[0]
    n = event.nodes[0]
    low, high = dataclasses.replace(n, score=0.05), dataclasses.replace(n, score=0.95)
    fills = [parse(dspark.tree_dot(dataclasses.replace(event, nodes=(m, *event.nodes[1:]))))[0][f"n{n.node}"][1]
             for m in (low, high)]
    assert fills[0] != fills[1]
    assert dspark.score_colors(0.05)[1] == "#FFFFFF" and dspark.score_colors(0.95)[1] == "#000000"  # readable ink


HOSTILE = ['"]; evil [label="x', "a\\nb\\l", "<b>bold</b>", "\x00\x1b", "}\ndigraph x {"]


@pytest.mark.parametrize("piece", HOSTILE)
def test_tokens_cannot_break_out_of_their_labels(piece):
    event = tree_rounds()[0]
    nodes = tuple(dataclasses.replace(n, piece=piece) for n in event.nodes)
    dot = dspark.tree_dot(dataclasses.replace(event, nodes=nodes))
    parsed, _ = parse(dot)                       # every line still a node, an edge or a header
    assert len(parsed) == len(event.nodes) + 2
    for n in event.nodes:
        label = parsed[f"n{n.node}"][0]
        escapes = re.findall(r"\\.|[^\\]", label)                # DOT's reading: an escape or a character
        assert escapes.count("\\n") == 2                          # three lines: no line break from the token
        assert not {"\\l", "\\r", "\\N", "\\G"} & set(escapes)     # nor another of Graphviz's escapes


def test_projector_layout_clears_the_toolbar_and_floors_the_fonts():
    fig = go.Figure(go.Scatter(x=[1], y=[1], text=["a"], mode="text", textfont={"size": 9}))
    fig.update_layout(title="A title long enough to wrap on a chart half the width of a projector's main column",
                      legend={"font": {"size": 10}}, height=300, margin={"t": 50})
    fig.add_annotation(text="note", font={"size": 8})
    out = figures.projector_layout(fig)
    assert out.layout.font.size >= figures.MIN_FONT_PX
    assert out.data[0].textfont.size == out.layout.legend.font.size == out.layout.annotations[0].font.size \
        == figures.MIN_FONT_PX
    assert out.layout.title.pad.t == figures.TOOLBAR_PX and out.layout.title.yanchor == "top"
    lines = out.layout.title.text.split("<br>")
    assert len(lines) == 2 and all(len(line) <= figures.TITLE_CHARS for line in lines)
    assert out.layout.margin.t >= figures.TOOLBAR_PX + 2 * figures.TITLE_LINE_PX
    assert out.layout.height == 300 + out.layout.margin.t - 50           # the plot keeps its height
    untouched = go.Figure(go.Scatter(x=[1], y=[1], textfont={"size": 9}))   # negative control: not laid out
    assert untouched.data[0].textfont.size == 9 and untouched.layout.title.pad.t is None


def test_wrapping_leaves_markup_lines_alone():
    title = "x " * 50 + "<br>colour = <b>ŝ</b> " + "y " * 40
    lines = figures.wrap_title(title).split("<br>")
    assert lines[-1] == "colour = <b>ŝ</b> " + "y " * 40 and len(lines) == 3


def test_wide_tables_put_their_key_columns_first_and_split_the_rest():
    event = tree_rounds()[0]
    table = dspark.verdicts_table(event)
    parts = display.column_parts(table)
    assert parts[0][:4] == ["node", "verdict", "piece", "source"]
    assert len(parts) > 1 and all(part[0] == "node" for part in parts)
    assert sorted(f for part in parts for f in part[1:]) == sorted(set(table.columns) - {"node"})
    from ui.views import headers
    view = headers.shown(table)
    for part in parts:
        fields = [headers.header(f) for f in part]
        assert sum(display.column_px(view, f) for f in fields) <= display.TABLE_WIDTH_PX
    narrow = pd.DataFrame({"rank": [1, 2], "verdict": ["accepted", "rejected"], "a": [0.5, 0.25]})
    assert display.column_parts(narrow) == [["rank", "verdict", "a"]]       # a table that fits stays whole
    assert display.column_order(["a", "piece", "k", "verdict"]) == ["k", "verdict", "piece", "a"]
