"""The UI loads no torch at import. In one fresh interpreter, in order: every module under ui/, then the
import statements of the Streamlit scripts (app.py and each page in app_pages/); after each, sys.modules is
checked for torch, so a failure names the first import that brought it in. The scripts themselves are not
imported: Streamlit runs them, and running one is running the app (app.py sets the engine thread's width from
torch's own thread count, and the default page loads a model), so what a script brings in at import is what
its import statements bring in. Negative controls: after all of them, the facade's first use loads torch and
is named; and the same probe names `import decoding.runner` placed among them, and only it. The rule on
direct imports is tests/test_architecture.py's.

The widgets reach the engine's torch side through one module, ui/widgets/engine.py, and it holds only that
side: read statically, every module its table names loads torch, and no other module of ui/, app_pages/ or
app.py imports (at any depth of its code) a decoding module whose import loads torch, transformers,
accelerate or safetensors, directly or through the modules it imports when it is imported. The static
reading is checked against the fresh-interpreter probe; negative controls: two such imports planted in a copy
of the tree are each caught, as is a torch-free name put behind the facade."""
from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROBE = """
import json, sys
loaded, scope = [], {}
for statement in sys.argv[1:]:
    before = "torch" in sys.modules
    exec(statement, scope)
    if not before and "torch" in sys.modules:
        loaded.append(statement)
print(json.dumps(loaded))
"""


def ui_modules() -> list[str]:
    return sorted(module_name(p, ROOT) for p in (ROOT / "ui").rglob("*.py") if "__pycache__" not in p.parts)


def script_imports() -> list[str]:
    """The import statements app.py and the pages run when Streamlit runs them, each once, in file order (the
    scripts themselves are run by Streamlit, never imported: see the module's docstring)."""
    scripts = [ROOT / "app.py", *sorted((ROOT / "app_pages").glob("*.py"))]
    found = [ast.unparse(node) for path in scripts
             for node in load_time_imports(ast.parse(path.read_text(encoding="utf-8")))]
    return list(dict.fromkeys(found))


def ui_imports() -> list[str]:
    return [f"import {name}" for name in ui_modules()] + script_imports()


def torch_importers(statements: list[str]) -> list[str]:
    """The statements among `statements` (run in this order, one fresh interpreter, one namespace) after which
    torch was first in sys.modules."""
    done = subprocess.run([sys.executable, "-c", PROBE, *statements], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_no_ui_module_and_no_page_import_loads_torch():
    """All of them, and then the facade's first use: that, and nothing before it, loads torch."""
    statements = ui_imports()
    assert len(ui_modules()) > 40 and len(script_imports()) > 20
    assert "import ui.widgets.engine" in statements and "import ui.widgets.sidebar" in statements
    first_use = ["from ui.widgets import engine", "engine.ENGINE", "engine.run"]
    assert torch_importers(statements + first_use) == ["engine.ENGINE"]


def test_probe_catches_a_module_that_imports_torch():
    statements = ui_imports()
    planted = "import decoding.runner"
    assert torch_importers(statements[: len(statements) // 4] + [planted]) == [planted]


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


def load_time_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """The import statements a module runs when it is imported: not inside a function, nor under
    TYPE_CHECKING."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(nodes) -> None:
        for node in nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                visit(node.orelse)
                continue
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found.append(node)
            visit(ast.iter_child_nodes(node))

    visit(tree.body)
    return found


def imports_on_load(tree: ast.Module) -> set[str]:
    """The modules a module imports when it is imported."""
    return set().union(*map(named_imports, load_time_imports(tree)))


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


def facade_table(root: Path) -> dict[str, str]:
    """The facade's names and the engine modules they come from, read from its source (`_LAZY`)."""
    tree = ast.parse((root / FACADE).read_text(encoding="utf-8"))
    table = next(node.value for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
                 and "_LAZY" in ast.unparse(node.targets[0] if isinstance(node, ast.Assign) else node.target))
    return ast.literal_eval(table)


def torch_free_behind_the_facade(root: Path) -> list[str]:
    """The facade's names whose module loads no torch (those the UI imports directly instead)."""
    reaching = torch_side(root)
    return sorted(name for name, module in facade_table(root).items() if module not in reaching)


def test_the_facade_holds_only_the_torch_side_and_each_name_resolves():
    """Behind the facade only modules that load torch (what loads none is imported directly), and every name
    in its table is one its module has."""
    from ui.widgets import engine

    behind = set(facade_table(ROOT).values())
    assert {"decoding.runner", "decoding.runtime.engine_thread", "decoding.runtime.models"} <= behind
    assert torch_free_behind_the_facade(ROOT) == []
    assert facade_table(ROOT) == engine._LAZY and sorted(engine.__all__) == sorted(engine._LAZY)
    assert all(getattr(engine, name) is not None for name in engine._LAZY)


def test_the_static_reading_matches_a_fresh_interpreter():
    """The decoding modules the UI imports are not torch-side and load no torch; placement, which is, loads
    it: the static reading names what a real import does."""
    reaching = torch_side(ROOT)
    engine = {module_name(p, ROOT) for p in (ROOT / "decoding").rglob("*.py")}
    widgets = set().union(*(decoding_imports(ROOT, p.relative_to(ROOT).as_posix())
                            for p in ui_files(ROOT) if p.relative_to(ROOT).as_posix() != FACADE)) & engine
    assert len(widgets) >= 8 and not widgets & reaching
    assert "decoding.runtime.model_spec" in widgets and "decoding.runtime.placement" in reaching
    statements = [f"import {name}" for name in sorted(widgets)]
    assert torch_importers([*statements, "import decoding.runtime.placement"]) == ["import decoding.runtime.placement"]


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
    facade = tmp_path / FACADE
    facade.write_text(facade.read_text(encoding="utf-8").replace(
        "_LAZY = {", '_LAZY = {\n    "ModelSpec": "decoding.runtime.model_spec",', 1), encoding="utf-8")
    assert torch_free_behind_the_facade(tmp_path) == ["ModelSpec"]
