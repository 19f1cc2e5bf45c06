"""The UI's views load no torch: every module under ui/views/ is imported, in sorted order, in one fresh
interpreter, and after each import sys.modules is checked for torch, so a failure names the first view
that brought it in. Negative control: the same probe flags decoding.runner (which imports torch) placed
among the views, and only it. The rule on direct imports is tests/test_architecture.py's.

The widgets reach the engine's torch side through one module, ui/widgets/engine.py: read statically, no
other module of ui/, app_pages/ or app.py imports (at any depth of its code) a decoding module whose
import loads torch, transformers, accelerate or safetensors, directly or through the modules it imports
when it is imported. The static reading is checked against the fresh-interpreter probe; negative control:
two such imports planted in a copy of the tree are each caught."""
from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROBE = """
import importlib, json, sys
loaded = []
for name in sys.argv[1:]:
    before = "torch" in sys.modules
    importlib.import_module(name)
    if not before and "torch" in sys.modules:
        loaded.append(name)
print(json.dumps(loaded))
"""


def view_modules() -> list[str]:
    return sorted("ui.views." + p.stem if p.stem != "__init__" else "ui.views"
                  for p in (ROOT / "ui" / "views").glob("*.py"))


def torch_importers(names: list[str]) -> list[str]:
    """The modules among `names` whose import (in this order, one fresh interpreter) first loaded torch."""
    done = subprocess.run([sys.executable, "-c", PROBE, *names], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_view_imports_without_torch():
    names = view_modules()
    assert len(names) > 20
    assert torch_importers(names) == []


def test_probe_catches_a_module_that_imports_torch():
    names = view_modules()
    middle = len(names) // 2
    assert torch_importers(names[:middle] + ["decoding.runner"] + names[middle:]) == ["decoding.runner"]


def test_the_torch_free_config_table_matches_the_runner():
    """The UI validates a config through decoding.core.config.CONFIGS (the tour's stops, the sidebar's
    parameters), not the runner's STRATEGIES: the two tables hold the same configs in the same order."""
    from decoding.core.config import CONFIGS
    from decoding.runner import STRATEGIES

    assert list(CONFIGS) == list(STRATEGIES)
    assert all(CONFIGS[name] is strategy.config_cls for name, strategy in STRATEGIES.items())


FACADE = "ui/widgets/engine.py"
TORCH_SIDE = ("torch", "transformers", "accelerate", "safetensors")
UI_FILES = ("ui", "app_pages", "app.py")


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def named_imports(node: ast.AST) -> set[str]:
    """What one import statement names: `from a import b` names a and a.b (a module or not)."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names}
    if isinstance(node, ast.ImportFrom) and node.module:
        return {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return set()


def imports_on_load(tree: ast.Module) -> set[str]:
    """The modules a module imports when it is imported: not inside a function, nor under TYPE_CHECKING."""
    found: set[str] = set()

    def visit(nodes) -> None:
        for node in nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                visit(node.orelse)
                continue
            found.update(named_imports(node))
            visit(ast.iter_child_nodes(node))

    visit(tree.body)
    return found


def with_packages(names: set[str]) -> set[str]:
    """Importing a.b.c imports a and a.b first."""
    return {".".join(n.split(".")[:i]) for n in names for i in range(1, n.count(".") + 2)}


def torch_side(root: Path) -> set[str]:
    """The decoding modules whose import loads a torch-side library, read from the source."""
    engine = {module_name(p, root): p for p in sorted((root / "decoding").rglob("*.py"))}
    edges = {name: with_packages(imports_on_load(ast.parse(path.read_text(encoding="utf-8"))))
             for name, path in engine.items()}
    reaching: set[str] = {name for name, mods in edges.items() if any(m in TORCH_SIDE for m in mods)}
    grew = True
    while grew:
        grown = {name for name, mods in edges.items() if mods & reaching}
        grew = not grown <= reaching
        reaching |= grown
    return reaching


def ui_files(root: Path) -> list[Path]:
    return [root / "app.py"] + sorted((root / "ui").rglob("*.py")) + sorted((root / "app_pages").rglob("*.py"))


def around_the_facade(root: Path) -> list[str]:
    """Each import of a torch-side decoding module from a UI module other than the facade."""
    reaching = torch_side(root)
    bad = []
    for path in ui_files(root):
        rel = path.relative_to(root).as_posix()
        if rel == FACADE:
            continue
        mods = set().union(*map(named_imports, ast.walk(ast.parse(path.read_text(encoding="utf-8")))))
        bad += [f"{rel} imports {m}" for m in sorted(mods & reaching)]
    return bad


def decoding_imports(root: Path, rel: str) -> set[str]:
    tree = ast.parse((root / rel).read_text(encoding="utf-8"))
    return {m for m in imports_on_load(tree) if m.startswith("decoding.")}


def test_only_the_facade_reaches_the_engines_torch_side():
    assert around_the_facade(ROOT) == []


def test_the_static_reading_matches_a_fresh_interpreter():
    """The facade's imports are torch-side and load torch; the decoding modules the other widgets import
    are not, and do not: the static reading names what a real import does."""
    reaching = torch_side(ROOT)
    facade = decoding_imports(ROOT, FACADE) & reaching
    assert {"decoding.runner", "decoding.runtime.engine_thread", "decoding.runtime.models"} <= facade
    engine = {module_name(p, ROOT) for p in (ROOT / "decoding").rglob("*.py")}
    widgets = set().union(*(decoding_imports(ROOT, p.relative_to(ROOT).as_posix())
                            for p in ui_files(ROOT) if p.relative_to(ROOT).as_posix() != FACADE)) & engine
    assert len(widgets) >= 8 and not widgets & reaching
    assert "decoding.runtime.placement" in reaching           # torch-side: the one import that loads torch here
    assert torch_importers([*sorted(widgets), "decoding.runtime.placement"]) == ["decoding.runtime.placement"]


def test_an_import_around_the_facade_is_caught(tmp_path):
    for part in (*UI_FILES, "decoding"):
        copy = shutil.copytree if (ROOT / part).is_dir() else shutil.copy
        copy(ROOT / part, tmp_path / part, **({"ignore": shutil.ignore_patterns("__pycache__")}
                                               if (ROOT / part).is_dir() else {}))
    display = tmp_path / "ui" / "widgets" / "display.py"
    display.write_text(display.read_text(encoding="utf-8")
                       + "\n\ndef late():\n    from decoding.runner import run\n    return run\n", encoding="utf-8")
    traces = tmp_path / "app_pages" / "traces.py"
    traces.write_text("import decoding.runtime.placement\n" + traces.read_text(encoding="utf-8"), encoding="utf-8")
    assert around_the_facade(tmp_path) == ["ui/widgets/display.py imports decoding.runner",
                                           "app_pages/traces.py imports decoding.runtime.placement"]
