"""What a page says while its model work waits for other sessions on the shared engine thread
(decoding.runtime.engine_thread serves the sessions in turn, one step, round or load each): one line,
shown by the Playground's steps, Compare's lanes, the Tour's live runs and the Lab's measurements (not
by model loading, which runs alone)."""
from __future__ import annotations

from ui.widgets import engine


def waiting_line(others: int) -> str | None:
    """What the page says while its steps take turns with `others` other sessions (None: none)."""
    if others <= 0:
        return None
    return (f"Waiting for {int(others):d} other session{'s' if others > 1 else ''} on this server: "
            "the model takes one step for each session in turn…")


def with_waiting(text: str) -> str:
    """`text`, followed by the waiting line while other sessions have work on the engine thread now
    (plain text: escape it where Streamlit reads Markdown)."""
    line = waiting_line(engine.ENGINE.others_ahead())
    return f"{text} — {line}" if line else text
