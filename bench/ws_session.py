"""One Streamlit session without a browser: a websocket to `/_stcore/stream` that speaks Streamlit's own
protocol (the BackMsg and ForwardMsg protobufs shipped with streamlit), as a browser tab does. It opens the
app at a query string, presses buttons found by their labels, and keeps of each script run only what the
load benchmark reads: the buttons, the Playground's timing caption, the number of token chips and when the
message carrying a new chip arrived.

What a browser tab does and this client does not: it draws nothing, and it sends a button's trigger alone,
not the values of the other widgets (the server keeps the values of the run before; the Playground's
settings are seen unchanged after a press). It declares no forward-message cache, so the server sends every
message whole, never a `ref_hash` reference (a browser, with a cache, is sent references to elements it
already holds: a little less to send).
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from streamlit.proto.BackMsg_pb2 import BackMsg
from streamlit.proto.ForwardMsg_pb2 import ForwardMsg
from websockets.asyncio.client import ClientConnection, connect

from bench.app import TIMING

STREAM = "/_stcore/stream"
OPEN_TIMEOUT_S = 300.0        # the first session's run loads the model
RUN_TIMEOUT_S = 120.0
MAX_MESSAGE = 64 * 2**20      # bytes of one ForwardMsg (a figure can be large)
CHIP = 'data-step="'          # one per token chip in the Playground's chips HTML (ui/views/chips.py)
DONE = {ForwardMsg.FINISHED_SUCCESSFULLY, ForwardMsg.FINISHED_FRAGMENT_RUN_SUCCESSFULLY,
        ForwardMsg.FINISHED_EARLY_FOR_RERUN}


class SessionError(RuntimeError):
    """The page did not behave as a Playground session should (no such button, an exception, a timeout)."""


@dataclass(frozen=True)
class Button:
    widget_id: str
    fragment_id: str            # "" outside an st.fragment


@dataclass(frozen=True)
class Run:
    """What is kept of one script run. Times in seconds from the press (or the opening rerun)."""
    caption: str                # the timing caption's text, "" when the run drew none
    chips: int                  # token chips in the run's chips HTML (the previous count when none was drawn)
    chip_s: float | None        # when the message with more chips than before arrived; None if none did
    finished_s: float


@dataclass
class _Reading:
    """Filled message by message while a run goes on."""
    started: float
    chips_before: int
    caption: str = ""
    chips: int = -1
    chip_s: float | None = None
    buttons: dict[str, Button] = field(default_factory=dict)

    def delta(self, msg: ForwardMsg) -> None:
        if msg.delta.WhichOneof("type") != "new_element":
            return
        element = msg.delta.new_element
        kind = element.WhichOneof("type")
        if kind == "button":
            self.buttons[element.button.label] = Button(element.button.id, msg.delta.fragment_id)
        elif kind == "markdown" and TIMING.search(element.markdown.body):
            self.caption = element.markdown.body
        elif kind == "html" and CHIP in element.html.body:
            self.chips = max(self.chips, element.html.body.count(CHIP))
            if self.chip_s is None and self.chips > self.chips_before:
                self.chip_s = time.perf_counter() - self.started
        elif kind == "exception":
            raise SessionError(f"the page raised {element.exception.type}: {element.exception.message}")

    def run(self) -> Run:
        chips = self.chips if self.chips >= 0 else self.chips_before
        return Run(self.caption, chips, self.chip_s, time.perf_counter() - self.started)


class WsSession:
    """One session: `await WsSession.open(url, query)`, then `press(label)`; `close()` at the end."""

    def __init__(self, ws: ClientConnection, query: str) -> None:
        self._ws = ws
        self._query = query
        self._page_hash = ""
        self.buttons: dict[str, Button] = {}
        self.last = Run("", 0, None, 0.0)
        self.last_message_at = 0.0

    @classmethod
    async def open(cls, url: str, query: str, timeout_s: float = OPEN_TIMEOUT_S) -> WsSession:
        """A new session on the app at `url` (http://host:port) with `query` (e.g. "max_new=8&seed=0"),
        after its first run has finished."""
        ws_url = url.replace("http://", "ws://", 1).replace("https://", "wss://", 1) + STREAM
        ws = await asyncio.wait_for(connect(ws_url, subprotocols=["streamlit"], max_size=MAX_MESSAGE), timeout_s)
        session = cls(ws, query)
        try:
            await session._send(None)
            await session._collect(time.perf_counter(), timeout_s)
        except BaseException:
            await ws.close()
            raise
        return session

    async def press(self, label: str, timeout_s: float = RUN_TIMEOUT_S) -> Run:
        """Press the button labelled `label` and wait for the run it starts to finish."""
        started = await self.send_press(label)
        return await self._collect(started, timeout_s)

    async def send_press(self, label: str) -> float:
        """Press the button labelled `label` without waiting; returns the time it was sent."""
        button = self.buttons.get(label)
        if button is None:
            raise SessionError(f"no button labelled {label!r} on the page (buttons: {', '.join(self.buttons)})")
        return await self._send(button)

    async def follow(self, quiet_s: float) -> None:
        """Read the runs the server goes on with by itself (a Run to end's chunks) until none has sent a
        message for `quiet_s` seconds; the buttons they drew are kept, and `last_message_at` says when the
        latest arrived (perf_counter), so a caller can tell whether the run was still going at a given time."""
        reading = _Reading(time.perf_counter(), self.last.chips)
        while True:
            try:
                data = await asyncio.wait_for(self._ws.recv(), quiet_s)
            except TimeoutError:
                break
            self.last_message_at = time.perf_counter()
            self._take(data, reading)
        self.buttons.update(reading.buttons)

    async def close(self) -> None:
        await self._ws.close()

    async def _send(self, button: Button | None) -> float:
        msg = BackMsg()
        rerun = msg.rerun_script
        rerun.query_string = self._query
        rerun.page_script_hash = self._page_hash
        if button is not None:
            state = rerun.widget_states.widgets.add()
            state.id = button.widget_id
            state.trigger_value = True
            rerun.fragment_id = button.fragment_id
        started = time.perf_counter()
        await self._ws.send(msg.SerializeToString())
        return started

    async def _collect(self, started: float, timeout_s: float) -> Run:
        reading = _Reading(started, self.last.chips)
        try:
            async with asyncio.timeout(timeout_s):
                while not self._take(await self._ws.recv(), reading):
                    pass
        except TimeoutError:
            raise SessionError(f"the run did not finish within {timeout_s:g} s") from None
        self.buttons.update(reading.buttons)
        self.last = reading.run()
        return self.last

    def _take(self, data: bytes, reading: _Reading) -> bool:
        """Read one ForwardMsg into `reading`; True when it ends the run."""
        msg = ForwardMsg()
        msg.ParseFromString(data)
        kind = msg.WhichOneof("type")
        if kind == "delta":
            reading.delta(msg)
        elif kind == "new_session":
            self._page_hash = msg.new_session.page_script_hash
        elif kind == "navigation":
            self._page_hash = msg.navigation.page_script_hash
        elif kind == "ref_hash":
            raise SessionError("the server sent a cached-message reference, yet this client declares no cache")
        elif kind == "script_finished":
            if msg.script_finished not in DONE:
                raise SessionError(f"the script did not run (status {msg.script_finished})")
            return True
        return False
