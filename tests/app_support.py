"""Driving the app through streamlit.testing.v1.AppTest (the tiny model's folder: conftest's `tiny_dir`)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from ui.widgets import keys

APP = str(Path(__file__).resolve().parents[1] / "app.py")
TIMEOUT = 120


def new_app(query: dict | None = None):
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params.update({"max_new": "6", **(query or {})})
    return at.run()


def run_to_end(at):
    """Click Run to end and follow the run's chunks (~0.5 s each; the browser reruns the fragment per
    chunk, AppTest needs a run() per chunk)."""
    at.button(key="pg.run_end").click().run()
    for _ in range(200):
        if keys.RUNNING not in at.session_state:
            break
        at.run()
    return at


def ok(at) -> None:
    assert not at.exception, [e.value for e in at.exception]


def run_state(at):
    return at.session_state["ds.run"]


def trace_json(at) -> str:
    from decoding.core.trace import to_json

    run_to_end(at)
    return to_json(run_state(at).trace())


@pytest.fixture
def no_model(monkeypatch):
    """Any model load on the page fails the test (AppTest runs the app in this process)."""
    import ui.widgets.engine
    import ui.widgets.session

    calls = []

    def refuse(*args, **kwargs):
        calls.append(args)
        raise AssertionError("the tour loaded a model")

    monkeypatch.setattr(ui.widgets.session, "load_lm", refuse)
    monkeypatch.setattr(ui.widgets.engine, "load", refuse)
    return calls


def tour_app(query: dict | None = None):
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params.update(query or {})
    return at.switch_page("app_pages/tour.py").run()


def assert_same(a, b, where="trace"):
    """Equal plain values, floats up to 1e-4 relative or 1e-4 absolute: another CPU (its instruction set,
    the GEMM kernels its plan picks) or thread count sums in another order; replayed on an AVX2 machine, the
    recordings made on an AVX-512 one moved by up to 4.6e-5 on logits near 20 and 1e-5 on a log-probability
    near 0 (which a relative bound alone misses). Every token, piece, status and count must be identical."""
    assert type(a) is type(b) or {type(a), type(b)} <= {int, float}, where
    if isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, float) or isinstance(b, float):
        assert a == pytest.approx(b, rel=1e-4, abs=1e-4), where
    else:
        assert a == b, where


REPEAT = "one two three one two three one two three one two"


def html_of(at) -> str:
    return "".join(h.value for h in at.html)


@pytest.fixture(scope="module")
def drafter_file(tiny_dir):
    """A drafter whose first draft is the tiny model's (constant) greedy token and whose second is
    another token: every round has an accepted and a rejected draft at temperature 0."""
    from dspark_helpers import app_drafter

    return app_drafter(tiny_dir)


def chart_titled(at, words: str) -> dict:
    found = [c for c in charts(at) if words in json.dumps(c["layout"].get("title", ""))]
    assert found, f"no chart titled {words!r}"
    return found[0]


def frame_with(at, column: str):
    found = [d.value for d in at.dataframe if column in d.value.columns]
    assert found, f"no table with a {column!r} column"
    return found[0]


def charts(at) -> list[dict]:
    return [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
