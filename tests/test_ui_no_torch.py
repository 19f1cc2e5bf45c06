"""The UI's views load no torch: every module under ui/views/ is imported, in sorted order, in one fresh
interpreter, and after each import sys.modules is checked for torch, so a failure names the first view
that brought it in. Negative control: the same probe flags decoding.runner (which imports torch) placed
among the views, and only it. The rule on direct imports is tests/test_architecture.py's."""
from __future__ import annotations

import json
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
    """ui/views/tour.py validates a stop through decoding.core.config.CONFIGS, not the runner's STRATEGIES."""
    from decoding.core.config import CONFIGS
    from decoding.runner import STRATEGIES

    assert list(CONFIGS) == list(STRATEGIES)
    assert all(CONFIGS[name] is strategy.config_cls for name, strategy in STRATEGIES.items())
