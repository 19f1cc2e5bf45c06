"""The browserless client of the many-sessions benchmark (bench/ws_session.py, `bench load --client ws`):
its flags, its reading of Streamlit's messages (fed by hand), and one session on a real server."""
from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path

import pytest
from streamlit.proto.BackMsg_pb2 import BackMsg
from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

from bench.app import parse_timing
from bench.load import (
    _checked,
    _command,
    _section,
    main,
    parse_pace,
    render,
    render_ws,
    think_times,
)
from bench.ws_session import SessionError, WsSession

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("argv, message", [
    (["--client", "firefox"], "--client must be one of browser, ws, got 'firefox'"),
    (["--client", "ws", "--pace", "-1"], "--pace must be a finite number of seconds, 0 or more, got '-1'"),
    (["--client", "ws", "--pace", "nan"], "--pace must be a finite number"),
    (["--pace", "inf"], "--pace must be a finite number"),
    (["--pace", "soon"], "--pace must be a number of seconds, got 'soon'"),
    (["--pace", "1e300"], "--pace must be at most 600 seconds (a mean think time), got '1e300'"),
    (["--client", "ws", "--browsers", "low"], "--browsers low applies to --client browser only")])
def test_bad_client_and_pace_are_refused_in_one_line(argv, message):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert message in str(exit_info.value) and "\n" not in str(exit_info.value)


def test_pace_command_and_section():
    assert parse_pace("0") == 0.0 and parse_pace("2.5") == 2.5
    args, counts, pace = _checked(["--sessions", "1,2", "--steps", "2", "--model", "tiny", "--client", "ws",
                                   "--pace", "3"])
    assert _command(args, counts, pace) == ("python -m bench load --sessions 1,2 --steps 2 --model tiny --client ws "
                                            "--pace 3")
    assert _section(args, pace) == "load_ws_paced" and _section(args, 0.0) == "load_ws"
    browser = argparse.Namespace(steps=2, model="embedded", browsers="normal", client="browser")
    assert _command(browser, (1, 4, 8), 0.0) == "python -m bench load --sessions 1,4,8 --steps 2 --model embedded"
    assert _section(browser, 0.0) == "load"


def test_think_times_are_seeded_exponential_waits():
    assert think_times(0.0, 3, 4) == [0.0] * 4
    waits = think_times(2.0, 1, 400)
    assert waits == think_times(2.0, 1, 400) and waits != think_times(2.0, 2, 400)
    assert min(waits) > 0 and 1.6 < sum(waits) / len(waits) < 2.4     # mean 2 s; 400 draws: sd of the mean 0.1


def test_render_ws_names_its_client_and_pace():
    rows = [{"server_ms": 100.0, "press_to_chip_ms": 50.0, "press_to_finished_ms": 120.0},
            {"server_ms": float("nan"), "press_to_chip_ms": float("nan"), "press_to_finished_ms": 140.0}]
    text = render_ws({"1 session stepping": rows}, 2, "tiny", ((0.1,) * 3, (0.2,) * 3), "one process",
                     "python -m bench load --client ws --pace 3", 3.0)
    assert text.splitlines()[0] == "## Many sessions on one server, websocket clients (no browser), think time 3 s"
    assert "no browser: one process." in text and "mean 3 s" in text
    assert "| scenario | Steps | server p50 / p95 | press→chip p50 / p95 | press→finished p50 / p95 |" in text
    assert "| 1 session stepping | 2 | 100 / 100 | 50 / 50 | 130 / 139 | 1.00× |" in text
    assert "nan" not in text


def test_the_report_counts_the_steps_that_overlapped_the_run_to_end():
    rows = [{"server_ms": 100.0, "press_to_chip_ms": 50.0, "press_to_finished_ms": 120.0, "during_run": during}
            for during in (True, True, False)]
    text = render_ws({"1 session stepping": rows[:1], "1 stepping while 1 runs to end": rows}, 3, "tiny",
                     ((0.1,) * 3, (0.2,) * 3), "one process", "cmd", 2.0)
    assert "| 1 stepping while 1 runs to end | 3 (2 while the run went on) |" in text
    assert "| 1 session stepping | 1 (1 while the run went on) |" in text


def test_the_browser_report_names_a_pace_only_when_there_is_one():
    rows = {"1 session stepping": [{"click_to_chip_ms": 300.0, "server_ms": 100.0}]}
    paced = render(rows, 1, "tiny", ((0.1,) * 3, (0.2,) * 3), "150", "cmd", pace=2.0)
    closed = render(rows, 1, "tiny", ((0.1,) * 3, (0.2,) * 3), "150", "cmd")
    assert "mean 2 s" in paced and "all at once" not in paced
    assert "Step 1 times, all at once. Server:" in closed and "think time" not in closed


class FakeSocket:
    """Stands in for the websocket: hands out the given ForwardMsgs and keeps what is sent."""

    def __init__(self, messages: list[ForwardMsg]) -> None:
        self.incoming = [m.SerializeToString() for m in messages]
        self.sent: list[BackMsg] = []

    async def send(self, data: bytes) -> None:
        msg = BackMsg()
        msg.ParseFromString(data)
        self.sent.append(msg)

    async def recv(self) -> bytes:
        if not self.incoming:
            await asyncio.sleep(10)
        return self.incoming.pop(0)


def _element(kind: str, fragment: str = "", **fields) -> ForwardMsg:
    msg = ForwardMsg()
    msg.delta.fragment_id = fragment
    element = getattr(msg.delta.new_element, kind)
    for name, value in fields.items():
        setattr(element, name, value)
    return msg


def _finished(status=ForwardMsg.FINISHED_FRAGMENT_RUN_SUCCESSFULLY) -> ForwardMsg:
    msg = ForwardMsg()
    msg.script_finished = status
    return msg


def _page(chips: int) -> list[ForwardMsg]:
    nav = ForwardMsg()
    nav.navigation.page_script_hash = "page-hash"
    chip_html = "".join(f'<span class="ds-chip" data-step="{i}">x</span>' for i in range(chips))
    return [nav, _element("button", "frag", id="w-step", label="Step"),
            _element("html", body='<div class="ds-legend"><span class="ds-chip">target</span></div>'),
            _element("html", body=f'<div class="ds-chips">{chip_html}</div>'),
            _element("markdown", body="This rerun: model 5 ms, page beyond the model 40 ms (server side)."),
            _finished()]


def test_a_press_is_sent_as_a_browser_sends_it_and_its_run_is_read():
    sock = FakeSocket(_page(0) + _page(1))
    session = WsSession(sock, "max_new=4&seed=1")
    opened = asyncio.run(session._collect(0.0, 5.0))
    assert opened.chips == 0 and opened.chip_s is None and session.buttons["Step"].fragment_id == "frag"
    run = asyncio.run(session.press("Step", timeout_s=5.0))
    press = sock.sent[-1].rerun_script
    assert (press.query_string, press.page_script_hash, press.fragment_id) == ("max_new=4&seed=1", "page-hash", "frag")
    assert [(w.id, w.trigger_value) for w in press.widget_states.widgets] == [("w-step", True)]
    assert run.chips == 1 and run.chip_s is not None and parse_timing(run.caption) == (5.0, 40.0)


def test_what_a_session_cannot_read_is_a_clear_error():
    session = WsSession(FakeSocket(_page(0)), "")
    asyncio.run(session._collect(0.0, 5.0))
    with pytest.raises(SessionError, match=r"no button labelled 'Jump' on the page \(buttons: Step\)"):
        asyncio.run(session.press("Jump"))
    ref = ForwardMsg()
    ref.ref_hash = "abc"
    raised = _element("exception", type="ValueError", message="bad seed")
    for messages, error in (([ref], "cached-message reference"), ([raised], "the page raised ValueError: bad seed"),
                            ([_finished(ForwardMsg.FINISHED_WITH_COMPILE_ERROR)], "did not run"),
                            ([], "did not finish within 0.05 s")):
        with pytest.raises(SessionError, match=error):
            asyncio.run(WsSession(FakeSocket(messages), "")._collect(0.0, 0.05))


@pytest.mark.slow
def test_a_websocket_session_steps_on_a_real_server(tmp_path):
    """`streamlit run app.py` on the tiny model, one session with no browser: Step twice, then Run to end."""
    from bench.browser import streamlit_server
    from bench.tiny_model import build_tiny_model_dir

    env = {**os.environ, "DECODESCOPE_MODEL": str(build_tiny_model_dir(tmp_path / "model"))}

    async def drive(url: str) -> list:
        session = await WsSession.open(url, "max_new=6&seed=0", timeout_s=60)
        try:
            runs = [await session.press("Step", timeout_s=30) for _ in range(2)]
            with pytest.raises(SessionError, match="no button labelled 'Jump'"):
                await session.send_press("Jump")
            return runs + [await session.press("Run to end", timeout_s=30)]
        finally:
            await session.close()

    with streamlit_server(ROOT / "app.py", env, tmp_path / "server.log", cwd=ROOT) as url:
        first, second, long_run = asyncio.run(drive(url))
    assert [first.chips, second.chips] == [1, 2] and second.chip_s is not None
    assert second.chip_s <= second.finished_s
    model_ms, page_ms = parse_timing(second.caption)
    assert model_ms >= 0 and model_ms + page_ms > 0
    assert long_run.chips >= 3                     # Run to end takes at least one more step in its first chunk
