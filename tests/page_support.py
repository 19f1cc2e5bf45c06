"""The app's pages as a reader sees them: the AppTest `app` fixture (no model), golden traces, chart
texts, and hand-made lab reports."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from decoding.core.measures import BatchDecode, DeviceRates, ForwardTime
from decoding.core.roofline import ModelShape
from decoding.core.trace import from_json
from ui.views import lab

ROOT = Path(__file__).resolve().parents[1]
APP = str(ROOT / "app.py")
GOLDEN = ROOT / "tests" / "golden"


SHAPE = ModelShape(linear_params=25_000_000, weight_bytes=100_000_000, layers=4, q_dim=64, kv_dim=32,
                   element_bytes=4)


RATES = DeviceRates(bytes_per_s=1e9, flops_per_s=1e10, read_bytes=1 << 28, product="mlp (1×1) × 1 rows")


def _strings(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _strings(v)]
    return []


def _title(title) -> str | None:
    return title.get("text") if isinstance(title, dict) else title


def _trace_texts(trace: dict) -> list[tuple[str, str | None]]:
    """A trace's legend entry, colour-bar title, hover template and the strings its hover shows."""
    hover = _strings(trace.get("hovertemplate")) + _strings(trace.get("hovertext"))
    shown = " ".join(hover)
    data = [s for field in ("customdata", "text") if f"%{{{field}" in shown for s in _strings(trace.get(field))]
    return ([("legend", trace.get("name")), ("colour bar", _title(trace.get("colorbar", {}).get("title")))]
            + [("hover", h) for h in hover + data])


def report(ms_by_n: dict[int, float], batch: dict[int, float] | None = None) -> lab.CostReport:
    events = [ForwardTime("tokens", n, (ms, ms, ms)) for n, ms in ms_by_n.items()]
    events += [ForwardTime("batch", b, (ms,)) for b, ms in (batch or {}).items()]
    return lab.cost_report([RATES, *events, SHAPE], prefix_tokens=10)


def results():
    return [BatchDecode(1, (100.0, 100.0), (1, 2)), BatchDecode(4, (120.0, 130.0), (1, 2)),
            BatchDecode(16, (450.0, 470.0), (1, 2))]


def golden(name: str):
    return from_json((GOLDEN / f"{name}.json").read_text(encoding="utf-8"))


def rich_step(steps) -> int:
    """The step whose panel draws the most tables (a residual, finished hypotheses, a lattice, drafts)."""
    def weight(e) -> tuple:
        return tuple(bool(getattr(e, name, None)) for name in ("residual_top", "finished", "lattice", "drafts"))
    return max(range(len(steps)), key=lambda i: weight(steps[i]))


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    """AppTest without a model: the pages below draw recorded traces only."""
    from streamlit.testing.v1 import AppTest

    mp = pytest.MonkeyPatch()
    mp.setenv("DECODESCOPE_MODEL", str(tmp_path_factory.mktemp("no_model") / "absent"))
    yield lambda: AppTest.from_file(APP, default_timeout=60)
    mp.undo()


def chart_texts(fig: dict) -> list[tuple[str, str | None]]:
    """(where, text) for every piece of a plotly figure (as JSON) that names what it shows."""
    layout = fig.get("layout", {})
    out = [("title", _title(layout.get("title"))), ("legend title", _title(layout.get("legend", {}).get("title")))]
    out += [(f"{k} title", _title(v.get("title"))) for k, v in layout.items()
            if k.startswith(("xaxis", "yaxis")) and isinstance(v, dict)]
    out += [("annotation", a.get("text")) for a in layout.get("annotations", [])]
    return out + [t for trace in fig.get("data", []) for t in _trace_texts(trace)]


def page_charts(at) -> list[dict]:
    assert not at.exception, [e.value for e in at.exception]
    return [json.loads(chart.proto.spec) for chart in at.get("plotly_chart")]
