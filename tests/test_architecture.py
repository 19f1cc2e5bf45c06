"""The dependency rules of docs/architecture.md, checked on the source: inside `decoding/` imports point one way
(core <- runtime <- drafters <- strategies <- runner/CLI and the Lab's measurements; nothing but the CLI's
`train` command imports the trainers) and form no cycle, lazy imports inside functions included; the engine
never imports streamlit, plotly or pandas; the UI and the pages never import torch. Negative control: a copy
of the tree with one bad import of each kind fails each rule."""
from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = {"core": 0, "runtime": 1, "drafters": 2, "strategies": 3, "lab": 4, "serve": 4}
TOP = 4                                    # decoding/__init__, __main__, runner (and lab, beside them)
UI_FORBIDDEN = ("torch", "transformers")
ENGINE_FORBIDDEN = ("streamlit", "plotly", "pandas", "ui", "app_pages", "bench")
PRODUCT = ("decoding", "ui", "app_pages", "app.py", "bench")   # what users run: none of it needs the tests


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(root: Path, folder: str) -> dict[str, Path]:
    return {module_name(p, root): p for p in sorted((root / folder).rglob("*.py"))}


def imports_of(path: Path, name: str, known: set[str]) -> set[str]:
    """Every module `path` imports, at any depth of its code; `from a import b` counts as a.b where that
    is a module."""
    found = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]
                                + ([base] if base else []))
            subs = {f"{base}.{a.name}" for a in node.names} & known
            found.update(subs or {base})
    return found


def layer(module: str) -> int | None:
    """Layer of a decoding module; None for the trainers."""
    parts = module.split(".")
    if len(parts) > 1 and parts[1] == "train":
        return None
    return LAYERS.get(parts[1], TOP) if len(parts) > 1 else TOP


def graph(root: Path) -> dict[str, set[str]]:
    engine = modules(root, "decoding")
    known = set(engine)
    return {name: {m for m in imports_of(path, name, known) if m in known} for name, path in engine.items()}


def wrong_way_edges(root: Path) -> list[str]:
    bad = []
    for src, targets in graph(root).items():
        for dst in targets:
            if layer(dst) is None and layer(src) is not None and src not in ("decoding.__main__",):
                bad.append(f"{src} -> {dst} (only the trainers and the CLI import decoding.train)")
            elif layer(src) is not None and layer(dst) is not None and layer(dst) > layer(src):
                bad.append(f"{src} -> {dst} (a lower layer imports a higher one)")
    return sorted(bad)


def cycles(root: Path) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (or a self-import)."""
    g = graph(root)
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in g[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in g[v]:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def forbidden(root: Path, folders: tuple[str, ...], banned: tuple[str, ...]) -> list[str]:
    bad = []
    for folder in folders:
        files = [root / folder] if folder.endswith(".py") else sorted((root / folder).rglob("*.py"))
        for path in files:
            name = module_name(path, root)
            for mod in imports_of(path, name, set()):
                if mod.split(".")[0] in banned:
                    bad.append(f"{path.relative_to(root)} imports {mod}")
    return bad


def violations(root: Path) -> list[str]:
    return (wrong_way_edges(root) + [" <-> ".join(c) for c in cycles(root)]
            + forbidden(root, ("decoding",), ENGINE_FORBIDDEN)
            + forbidden(root, ("ui", "app_pages", "app.py"), UI_FORBIDDEN))


def uses_of_the_tests(root: Path, folders: tuple[str, ...] = PRODUCT) -> list[str]:
    """Product modules that import from the tests (tests/, conftest) or put tests/ on sys.path."""
    hacks = [f"{p.relative_to(root)} puts tests/ on sys.path" for folder in folders
             for p in ([root / folder] if folder.endswith(".py") else sorted((root / folder).rglob("*.py")))
             if re.search(r"sys\.path\.\w+\(.*[\"']tests[\"']", p.read_text(encoding="utf-8"))]
    return forbidden(root, folders, ("tests", "conftest")) + hacks


def test_no_product_module_depends_on_the_tests():
    assert uses_of_the_tests(ROOT) == []


@pytest.mark.parametrize("line", ["from tests.toy import random_table", "import conftest",
                                  "sys.path.insert(0, str(ROOT / \"tests\"))"])
def test_a_product_module_using_the_tests_is_caught(tmp_path, line):
    shutil.copytree(ROOT / "bench", tmp_path / "bench", ignore=shutil.ignore_patterns("__pycache__"))
    assert uses_of_the_tests(tmp_path, ("bench",)) == []
    append(tmp_path / "bench" / "lossy.py", line)
    found = uses_of_the_tests(tmp_path, ("bench",))
    assert found and all("bench/lossy.py" in f for f in found), found


PLANTED_IN = ("test_lab.py", "test_cli.py", "cli_support.py", "app_support.py", "conftest.py", "dspark_helpers.py")


def copy_tests(folder: Path) -> None:
    """A few of the tests folder's modules (a test module, the one it may import, support modules, conftest),
    copied into `folder`: a negative control plants a line in the copy."""
    for name in PLANTED_IN:
        shutil.copy(ROOT / "tests" / name, folder / name)


def package_spelled_imports(folder: Path) -> list[str]:
    """Modules of the tests folder that import a helper as `tests.X`: pytest puts tests/ on sys.path and imports
    conftest.py as `conftest`, so `tests.X` loads a second copy of a module the others import as `X` (two module
    objects, each with its own caches and fixtures). One spelling: the bare one."""
    found = []
    for path in sorted(folder.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            found += [f"{path.name} imports {name}" for name in names if name == "tests" or name.startswith("tests.")]
    return found


def test_test_helpers_are_imported_by_one_spelling():
    assert package_spelled_imports(ROOT / "tests") == []


@pytest.mark.parametrize("line", ["from tests.dspark_helpers import varied_llama", "import tests.app_support",
                                  "def later():\n    from tests.conftest import TEST_DEVICE"])
def test_a_helper_imported_as_tests_x_is_caught(tmp_path, line):
    copy_tests(tmp_path)
    assert package_spelled_imports(tmp_path) == []
    append(tmp_path / "test_lab.py", line)
    found = package_spelled_imports(tmp_path)
    assert len(found) == 1 and found[0].startswith("test_lab.py imports tests."), found


def imported_test_modules(path: Path) -> set[str]:
    """The test modules (test_*.py) that `path` imports, lazy imports inside functions included."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            found |= {node.module or ""} | {f"{node.module or ''}.{a.name}" for a in node.names}
    return {name for name in found if any(part.startswith("test_") for part in name.split("."))}


def modules_importing_test_modules(folder: Path) -> list[str]:
    """Modules of the tests folder that import a test module: what tests share lives in a support module
    (app_support.py, cli_support.py, ...) or, for fixtures, in conftest.py."""
    return [f"{p.name} imports {sorted(imported_test_modules(p))}" for p in sorted(folder.glob("*.py"))
            if imported_test_modules(p)]


def test_no_test_module_imports_another():
    assert modules_importing_test_modules(ROOT / "tests") == []


@pytest.mark.parametrize("line", ["from test_cli import cli", "import test_cli",
                                  "from tests.test_cli import cli", "from tests import test_cli",
                                  "def later():\n    from test_cli import cli"])
def test_a_test_module_importing_another_is_caught(tmp_path, line):
    copy_tests(tmp_path)
    assert modules_importing_test_modules(tmp_path) == []
    append(tmp_path / "test_lab.py", line)
    append(tmp_path / "cli_support.py", "from decoding.runtime.models import LM")   # not a test module
    found = modules_importing_test_modules(tmp_path)
    assert len(found) == 1 and found[0].startswith("test_lab.py imports ") and "test_cli" in found[0], found


@pytest.mark.slow
def test_the_tree_keeps_the_dependency_rules():
    assert violations(ROOT) == []


def test_every_engine_module_sits_in_a_known_place():
    top_level = {n for n in modules(ROOT, "decoding") if n.count(".") == 1}
    assert top_level <= {"decoding.__main__", "decoding.runner"} | {f"decoding.{p}" for p in [*LAYERS, "train"]}


@pytest.fixture
def tree_copy(tmp_path):
    for folder in ("decoding", "ui", "app_pages"):
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "app.py", tmp_path / "app.py")
    return tmp_path


def append(path: Path, line: str) -> None:
    path.write_text(path.read_text(encoding="utf-8") + f"\n{line}\n", encoding="utf-8")


@pytest.mark.parametrize("where, line, expect", [
    ("decoding/core/errors.py", "from decoding.strategies import dspark", "a lower layer imports a higher one"),
    ("decoding/drafters/base.py", "def f():\n    from decoding.train import parallel", "only the trainers"),
    ("decoding/runtime/paths.py", "from decoding.runtime.models import LM", " <-> "),
    ("decoding/core/trace.py", "import plotly.graph_objects", "imports plotly.graph_objects"),
    ("ui/views/chips.py", "import torch", "imports torch"),
    ("app_pages/compare.py", "from torch import nn", "imports torch"),
])
@pytest.mark.slow
def test_a_bad_import_is_caught(tree_copy, where, line, expect):
    assert violations(tree_copy) == []
    append(tree_copy / where, line)
    assert any(expect in v for v in violations(tree_copy)), violations(tree_copy)
