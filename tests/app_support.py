"""Driving the app through streamlit.testing.v1.AppTest (the tiny model's folder: conftest's `tiny_dir`)."""
from __future__ import annotations

from pathlib import Path

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
