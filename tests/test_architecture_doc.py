"""docs/architecture.md keeps up with the tree. The doc names every module by its path from the repository root
(`decoding/core/trace.py`, `ui/views/chips.py`, `app.py`): every .py file under decoding/, ui/, app_pages/ and
bench/ must appear there by that path, and every `.py` path the doc names must exist. Negative controls: the
doc's text with one module's line removed is reported missing; a made-up module in the text is reported gone."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
PACKAGES = ("decoding", "ui", "app_pages", "bench")
PY_PATH = re.compile(r"(?<![\w./-])[A-Za-z_][\w./-]*\.py\b")


def modules(root: Path = ROOT) -> set[str]:
    """Every module file under the listed packages, as a path from the root."""
    return {p.relative_to(root).as_posix() for pkg in PACKAGES for p in (root / pkg).rglob("*.py")
            if "__pycache__" not in p.parts}


def named(text: str) -> set[str]:
    """Every .py path the text names."""
    return set(PY_PATH.findall(text))


def missing(text: str, root: Path = ROOT) -> list[str]:
    return sorted(modules(root) - named(text))


def gone(text: str, root: Path = ROOT) -> list[str]:
    return sorted(p for p in named(text) if not (root / p).is_file())


def doc_text() -> str:
    return DOC.read_text(encoding="utf-8")


def test_every_module_is_in_the_doc():
    assert missing(doc_text()) == []


def test_every_module_the_doc_names_exists():
    assert gone(doc_text()) == []


def test_a_module_left_out_is_reported():
    text = doc_text()
    line = next(x for x in text.splitlines() if x.startswith("decoding/runtime/heap.py "))
    cut = "\n".join(x for x in text.splitlines() if x != line)
    assert missing(cut) == ["decoding/runtime/heap.py"]


def test_a_made_up_module_is_reported_gone():
    text = doc_text() + "\ndecoding/core/no_such_module.py   a module that was removed\n"
    assert gone(text) == ["decoding/core/no_such_module.py"]


def test_a_module_added_to_the_tree_is_reported(tmp_path):
    for pkg in PACKAGES:
        (tmp_path / pkg).mkdir()
    (tmp_path / "ui" / "new_view.py").write_text("", encoding="utf-8")
    assert missing("", tmp_path) == ["ui/new_view.py"]
    assert missing("see ui/new_view.py", tmp_path) == []


def test_a_path_inside_a_longer_path_is_not_read_alone():
    assert named("`tests/golden/cases.py` and `decoding/runner.py`.") == {"tests/golden/cases.py", "decoding/runner.py"}
    assert named("x.python and docs/cli.md") == set()
