"""The Requests page (AppTest): a request log uploaded as files gives the percentile table, the histogram and
the requests slowest first; one request opens on the Traces page's replay; hostile files are one line; a
running server's log is read over HTTP; engines' telemetry shows its acceptance."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from app_support import new_app, ok
from requests_support import log_files, record

from decoding.core.trace import from_dict, to_dict
from ui.views.text import md_text
from ui.widgets import requests_panel as panel

DATA = Path(__file__).resolve().parent / "data"
PAGE = "app_pages/requests.py"


def requests_page():
    at = new_app()
    at.switch_page(PAGE).run()
    ok(at)
    at.segmented_control(key="rq.where").set_value("Log files").run()
    return at


def test_an_uploaded_log_shows_percentiles_and_opens_the_slowest_trace(tiny_dir):
    at = requests_page()
    at.file_uploader(key=panel.UPLOAD).set_value(log_files(9)).run()
    ok(at)
    assert not at.error
    percentiles, table = (d.value for d in at.dataframe[:2])
    assert set(percentiles["Strategy"]) == {"greedy", "speculative", "dspark"}
    assert list(table["End to end (ms)"]) == sorted(table["End to end (ms)"], reverse=True)
    slowest = table.iloc[0]["Request"]
    n = max(range(9), key=lambda k: record(k, k % 3)["timing"]["e2e_s"])       # greedy's, behind a queue
    assert slowest == record(n, n % 3)["id"] and n % 3 == 0
    at.selectbox(key=panel.PICK).set_value(slowest).run()
    at.button(key=panel.OPEN).click().run()
    ok(at)
    replay = at.session_state["ds.replay"]
    assert to_dict(replay) == to_dict(from_dict(record(n, 0)["trace"]))
    assert any('data-step="0"' in h.value for h in at.html)          # the Traces page's chips drew it
    timing = record(n, 0)["timing"]
    assert any(f"= queue {timing['queue_s'] * 1000:,.1f} ms + decoding" in c.value for c in at.caption)


@pytest.mark.parametrize("payload, words", [
    (b"{not json", "bad.json: not valid JSON"),
    (json.dumps({"timing": "fast"}).encode(), "bad.json: timing is missing or not an object"),
    (json.dumps({**record(0, 0), "strategy": "<script>alert(1)</script>"}).encode(), None),
])
def test_a_hostile_log_file_is_one_line_or_drawn_escaped(tiny_dir, payload, words):
    at = requests_page()
    at.file_uploader(key=panel.UPLOAD).set_value([("bad.json", payload, "application/json")]).run()
    ok(at)
    if words:
        assert [e.value for e in at.error] == [words]
    else:
        assert not at.error
        assert "<script>" not in "".join(h.value for h in at.html)
        assert md_text("<script>alert(1)</script>") in " ".join(str(c.value) for c in at.caption)
        assert at.dataframe[0].value["Strategy"].iloc[0] == "<script>alert(1)</script>"   # a grid cell is text


class LogServer(BaseHTTPRequestHandler):
    """Stands in for `python -m decoding serve`'s read-only log routes."""

    def do_GET(self):  # noqa: N802
        records = [record(n, n % 3) for n in range(3)]
        if self.path == panel.LOG_PATH:
            body = {"object": "list", "data": [{k: v for k, v in r.items() if k != "trace"} for r in records]}
        else:
            body = next((r for r in records if self.path == f"{panel.LOG_PATH}/{r['id']}"), None)
        data = json.dumps(body).encode()
        self.send_response(200 if body else 404)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def log_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), LogServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


def test_a_running_servers_log_is_read_and_a_trace_fetched_by_id(tiny_dir, log_server):
    at = new_app()
    at.switch_page(PAGE).run()
    at.text_input(key=panel.URL).set_value(log_server).run()
    at.button(key=panel.FETCH).click().run()
    ok(at)
    assert not at.error and len(at.dataframe[1].value) == 3
    at.selectbox(key=panel.PICK).set_value(record(1, 1)["id"]).run()
    at.button(key=panel.OPEN).click().run()
    ok(at)
    assert at.session_state["ds.replay"].strategy == "speculative"


def test_a_bad_server_address_is_one_line(tiny_dir):
    at = new_app()
    at.switch_page(PAGE).run()
    at.text_input(key=panel.URL).set_value("file:///etc/passwd").run()
    at.button(key=panel.FETCH).click().run()
    ok(at)
    assert [e.value for e in at.error] == [md_text("url='file:///etc/passwd' is not an http:// or https:// "
                                                   "address of a server")]


def test_engine_telemetry_shows_its_acceptance(tiny_dir):
    at = new_app()
    at.switch_page(PAGE).run()
    files = [(p.name, p.read_bytes(), "text/plain") for p in sorted(DATA.glob("*-*.*"))]
    at.file_uploader(key=panel.TELEMETRY).set_value(files).run()
    ok(at)
    lines = [t.value for t in at.text]
    assert any(line.startswith("vLLM (vllm-metrics.prom): 10 rounds") for line in lines), lines
    assert any(line.startswith("SGLang (sglang-replies.json)") for line in lines)
    assert any(line.startswith("llama.cpp (llamacpp-replies.json)") for line in lines)
    assert "vLLM per request (vllm-replies.json, 2 requests, 1 detailed): 11 rounds, 29 drafts proposed, 19 " \
           "accepted (acceptance rate 0.66, mean accepted length τ 2.73)" in lines, lines


def test_the_labs_queueing_tab_draws_from_the_logs_decoding_times(tiny_dir):
    at = requests_page()
    at.file_uploader(key=panel.UPLOAD).set_value(log_files(6)).run()
    at.switch_page("app_pages/lab.py").run()
    ok(at)
    fixed = next(d.value for d in at.dataframe if "P99 lower by" in d.value.columns)
    at.radio(key="lab.q.where").set_value("Measured in the Requests page's log (M/G/1)").run()
    at.selectbox(key="lab.q.strategy").set_value("greedy").run()
    ok(at)
    measured = next(d.value for d in at.dataframe if "P99 lower by" in d.value.columns)
    assert not measured.equals(fixed)                       # the log's times, not the fixed second
    assert any("decoding times of greedy from the request log" in c.value for c in at.caption)


def test_the_address_field_can_be_turned_off_for_log_files_only(tiny_dir, monkeypatch, log_server):
    """DECODESCOPE_REQUESTS_ADDRESS=off: no address field, no way to make the server GET anything; log files still
    read. Unset (the default, and the negative control) the field is there and reads a server; a value other than
    on/off is one line and the field stays off."""
    at = new_app()
    at.switch_page(PAGE).run()
    assert panel.URL in [t.key for t in at.text_input] and at.segmented_control(key="rq.where")
    for value, line in (("off", None), ("of", md_text(f"{panel.ADDRESS_ENV}='of' is not on or off; the server "
                                                      "address field is off"))):
        monkeypatch.setenv(panel.ADDRESS_ENV, value)
        at = new_app()
        at.switch_page(PAGE).run()
        ok(at)
        assert [e.value for e in at.error] == ([line] if line else [])
        assert panel.URL not in [t.key for t in at.text_input] and panel.FETCH not in [b.key for b in at.button]
        assert not [s for s in at.segmented_control if s.key == "rq.where"]
        at.file_uploader(key=panel.UPLOAD).set_value(log_files(3)).run()
        ok(at)
        assert len(at.dataframe[1].value) == 3
    monkeypatch.setenv(panel.ADDRESS_ENV, "on")
    at = new_app()
    at.switch_page(PAGE).run()
    at.text_input(key=panel.URL).set_value(log_server).run()
    at.button(key=panel.FETCH).click().run()
    ok(at)
    assert not at.error and len(at.dataframe[1].value) == 3
