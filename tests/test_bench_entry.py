"""`python -m bench` (what `make bench` runs) imports every benchmark module: run from the repository root
as the Makefile does, with no arguments it prints its usage line, not an ImportError."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_bench_entry_point_imports_every_benchmark():
    done = subprocess.run([sys.executable, "-m", "bench"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().startswith("usage: python -m bench {engine,speculative,"), done.stderr
    assert "Traceback" not in done.stderr


def test_the_readme_names_every_section_make_bench_runs():
    import re

    from bench.__main__ import BENCHES

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    start = readme.index("`make bench` runs every section")
    named = re.findall(r"`([a-z_-]+)`", readme[start:readme.index("(docs/serve.md)", start)])
    assert sorted(set(named) - {"make", "bench"}) == sorted(BENCHES)
