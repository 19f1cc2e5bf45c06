"""An error no check caught (here: a view that raises on an uploaded trace) is one line on the page,
with no traceback and no server path; the uploaded trace is set aside and the uploader renewed, so the
next valid upload shows as usual and the sidebar's pages go on working."""
from __future__ import annotations

import pytest
from app_support import new_app

from decoding import GreedyConfig, ModelSpec, load, run, to_json
from ui.widgets import guard, keys, step_panel

SECRET = "/srv/secret/decodescope-weights"


@pytest.fixture(scope="module")
def trace_bytes(tiny_dir):  # noqa: F811
    lm = load(ModelSpec(str(tiny_dir)))
    return to_json(run(lm, [1, 2, 3], GreedyConfig(max_new_tokens=3))).encode()


def upload(at, payload: bytes):
    key = at.session_state[guard.GENERATION] if guard.GENERATION in at.session_state else 0
    name = keys.UPLOAD if key == 0 else f"{keys.UPLOAD}.{key}"
    at.file_uploader(key=name).set_value(("t.json", payload, "application/json")).run()
    return at


def page_text(at) -> str:
    return " ".join(str(e.value) for kind in ("error", "markdown", "text", "caption", "warning", "info")
                    for e in getattr(at, kind))


@pytest.mark.slow
def test_an_uncaught_error_is_one_line_and_the_next_upload_recovers(tiny_dir, trace_bytes, monkeypatch):  # noqa: F811
    def broken(*_args, **_kwargs):
        raise ValueError(f"cannot read {SECRET}")

    at = new_app({}).switch_page("app_pages/traces.py").run()
    monkeypatch.setattr(step_panel, "show_step", broken)
    upload(at, trace_bytes)
    assert not at.exception, [e.value for e in at.exception]
    assert [e.value for e in at.error] == [
        "This page could not be shown (ValueError); the details went to the server's log. Any uploaded trace "
        "was set aside: upload another, or go on in the sidebar."]
    assert SECRET not in page_text(at) and "Traceback" not in page_text(at)
    assert keys.REPLAY not in at.session_state and at.session_state[guard.GENERATION] == 1
    monkeypatch.undo()
    upload(at, trace_bytes)                                       # the renewed uploader, a valid trace
    assert not at.exception and not at.error
    assert at.session_state[keys.REPLAY].output_ids
    at.switch_page("app_pages/playground.py").run()
    assert not at.exception and not at.error


def test_a_page_that_fails_again_shows_the_line_once_and_stops(tiny_dir, monkeypatch):  # noqa: F811
    """No rerun loop: the page is run once more after a failure, and if that fails too it stops there."""
    at = new_app({}).switch_page("app_pages/traces.py").run()
    calls = []

    def always(base):
        calls.append(base)
        raise RuntimeError(f"broken {SECRET}")

    monkeypatch.setattr(guard, "uploader_key", always)
    at.run()
    assert not at.exception and len(calls) == 2                  # the failing run and the one rerun
    assert len(at.error) == 1 and "could not be shown (RuntimeError)" in at.error[0].value
    assert SECRET not in page_text(at)
