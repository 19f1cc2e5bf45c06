"""Figure export: every chart the app draws goes through ui/widgets/display.plot, whose plotly config makes
the toolbar's camera save the chart as SVG, drawn by plotly.js in the browser. Nothing on the server draws
SVG (issue 39: the hand-written writer raised on the DSpark calibration chart and looped on one trace)."""
from __future__ import annotations

import ast
import json
from pathlib import Path

from streamlit.testing.v1 import AppTest

from ui.views import figures

ROOT = Path(__file__).resolve().parents[1]
HELPER = ("ui/widgets/display.py", "plot")


def chart_calls(source: str) -> list[str]:
    """The functions of `source` that call `<anything>.plotly_chart(...)` ("<module>" outside any)."""
    found = []

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else where
            if isinstance(child, ast.Call) and getattr(child.func, "attr", None) == "plotly_chart":
                found.append(where)
            visit(child, inner)

    visit(ast.parse(source), "<module>")
    return found


def test_every_chart_is_drawn_by_the_one_helper():
    files = [ROOT / "app.py", *sorted((ROOT / "ui").rglob("*.py")), *sorted((ROOT / "app_pages").rglob("*.py"))]
    calls = {(str(p.relative_to(ROOT)), f) for p in files for f in chart_calls(p.read_text(encoding="utf-8"))}
    assert calls == {HELPER}
    # negative control: a chart drawn elsewhere is found
    assert chart_calls("import streamlit as st\ndef page(fig):\n    st.plotly_chart(fig)\n") == ["page"]


def test_the_export_config_saves_svg_named_by_the_chart():
    config = figures.export_config("round1-lattice")
    assert config["toImageButtonOptions"] == {"format": "svg", "filename": "round1-lattice"}
    assert config["displayModeBar"] is True and config["displaylogo"] is False


def _one_chart():
    import plotly.graph_objects as go

    from ui.widgets import display

    display.plot(go.Figure(go.Bar(x=["a", "b"], y=[1, 2])), "t.chart", "Round 1: lattice / ŝ")


def test_the_helper_hands_the_config_to_the_browser_and_draws_no_svg_itself():
    at = AppTest.from_function(_one_chart).run()
    assert not at.exception
    [chart] = at.get("plotly_chart")
    assert json.loads(chart.proto.config) == figures.export_config("Round-1-lattice-")
    assert not at.get("download_button")
