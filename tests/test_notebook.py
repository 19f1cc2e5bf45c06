"""docs/lab.ipynb runs top to bottom (nbclient) on a tiny random llama with the real tokenizer: every
cell without an error, the sentences and tables the Lab's builders make among its outputs, and the figure
shown with the app's export config (its camera saves SVG)."""
from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from bench.tiny_model import build_tiny_model_dir

ROOT = Path(__file__).resolve().parents[1]


def outputs_text(nb) -> str:
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            parts.append(out.get("text", ""))
            parts.append(str(out.get("data", {}).get("text/plain", "")))
            parts.append(str(out.get("data", {}).get("text/html", "")))
    return "\n".join(parts)


@pytest.mark.slow
def test_the_lab_notebook_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("DECODESCOPE_NOTEBOOK_MODEL", str(build_tiny_model_dir(tmp_path / "tiny")))
    nb = nbformat.read(ROOT / "docs" / "lab.ipynb", as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(ROOT / "docs")}}
                   ).execute()
    assert not [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    text = outputs_text(nb)
    assert "a one-token forward" in text and "tau_to_beat_greedy" in text          # the cost section
    assert "From b = 1 to b = 4" in text                                          # throughput
    assert "the cache holds" in text                                               # a trace
    plots = [o["data"]["application/vnd.plotly.v1+json"] for c in nb.cells for o in c.get("outputs", [])
             if "application/vnd.plotly.v1+json" in o.get("data", {})]
    assert len(plots) == 3
    assert plots[-1]["config"]["toImageButtonOptions"]["format"] == "svg"                # the export: SVG


def test_the_notebook_is_stored_without_outputs():
    """What the repository keeps is the recipe, not one machine's numbers."""
    nb = nbformat.read(ROOT / "docs" / "lab.ipynb", as_version=4)
    nbformat.validate(nb)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code")
