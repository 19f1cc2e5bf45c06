"""The UI's split, checked on the source: ui/views holds the pure view builders (trace -> figures, tables,
HTML), so no module there imports streamlit, nor reaches back into ui/widgets (the streamlit side that shows
what views build); ui/ has no module outside the two packages. Imports are read with ast at any depth, lazy
ones inside functions included. Negative controls: synthetic sources with each bad import are caught."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VIEWS = ROOT / "ui" / "views"
FORBIDDEN = {"streamlit": "imports streamlit", "ui.widgets": "imports ui.widgets"}


def imported(source: str) -> set[str]:
    """Every module a source imports (`from a import b` counts as a and a.b; relative imports as written)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            found.add(base)
            found.update(f"{base}.{alias.name}" if node.module else f"{base}{alias.name}" for alias in node.names)
    return found


def problems(source: str, where: str) -> list[str]:
    out = []
    for name in sorted(imported(source)):
        for banned, why in FORBIDDEN.items():
            if name == banned or name.startswith(banned + "."):
                out.append(f"{where}: {why} ({name})")
        if name.startswith(".") and "widgets" in name.split("."):
            out.append(f"{where}: imports ui.widgets ({name})")
    return out


def view_modules() -> list[Path]:
    return sorted(VIEWS.rglob("*.py"))


def test_views_import_neither_streamlit_nor_widgets():
    assert len(view_modules()) > 5
    found = [p for path in view_modules()
             for p in problems(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))]
    assert found == []


def test_ui_has_no_module_outside_views_and_widgets():
    assert sorted(p.name for p in (ROOT / "ui").glob("*.py")) == ["__init__.py"]
    assert {p.name for p in (ROOT / "ui").iterdir() if p.is_dir() and p.name != "__pycache__"} == {"views", "widgets"}


@pytest.mark.parametrize("source, expect", [
    ("import streamlit as st\n", "imports streamlit"),
    ("from streamlit.errors import StreamlitAPIException\n", "imports streamlit"),
    ("def f():\n    import streamlit\n", "imports streamlit"),
    ("from ui.widgets import keys\n", "imports ui.widgets"),
    ("from ui.widgets.params import build_config\n", "imports ui.widgets"),
    ("from ..widgets import keys\n", "imports ui.widgets"),
])
def test_a_bad_import_in_a_synthetic_view_is_caught(source, expect):
    clean = "from __future__ import annotations\n\nimport plotly.graph_objects as go\n\nfrom ui.views import chips\n"
    assert problems(clean, "synthetic.py") == []
    assert any(expect in p for p in problems(clean + source, "synthetic.py"))


def test_streamlit_in_a_name_or_string_is_not_an_import():
    assert problems('"""Not streamlit code."""\nstreamlit_like = "import streamlit"\n', "synthetic.py") == []
