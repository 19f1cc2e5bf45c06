"""A link opens the demo: the Playground keeps the step on view in the URL (query parameter `step`), and a
session opened from such a link replays the run to that step once, so every student lands on the
teacher's round. The work is bounded as a link's settings bound it: a run has at most max new tokens
steps (every step emits at least one token), and the replay stops there or where the run ends."""
from __future__ import annotations

import re

import streamlit as st

from ui.widgets import keys, stepper
from ui.widgets.params import Settings

MAX_STEP_CHARS = 8


def linked_step(text: str | None, settings: Settings) -> tuple[int | None, str | None]:
    """(the step a link asks for, None) or (None, a one-line refusal naming the parameter); (None, None)
    when the link names none."""
    if text is None:
        return None, None
    limit = settings.max_new_tokens
    text = str(text)
    if len(text) > MAX_STEP_CHARS or not re.fullmatch(r"[0-9]+", text) or not 0 <= int(text) < limit:
        shown = text if len(text) <= MAX_STEP_CHARS else text[:MAX_STEP_CHARS] + "…"
        return None, f"step={shown!r} from the link is not a step of this run: give a whole number in [0, {limit})"
    return int(text), None


def open_linked_step(run, settings: Settings) -> None:
    """On the session's first Playground view, replay a fresh run to the link's step and view it; the
    message (done, or why not) is the stepper's flash."""
    if st.session_state.get(keys.LINK_STEP_READ):
        return
    st.session_state[keys.LINK_STEP_READ] = True
    step, refusal = linked_step(st.query_params.get(keys.QP_STEP), settings)
    if refusal:
        st.session_state[keys.FLASH] = ("error", refusal + " (ignored)")
        return
    if step is None or run.events:
        return
    with st.spinner(f"Replaying the run to step {step:d}, the step the link was made on…"):
        stepper.advance(run, step + 1)
    cursor = min(step, len(run.events) - 1)
    st.session_state[keys.CURSOR] = cursor
    ended = "" if cursor == step else f" (the run ended at step {cursor:d})"
    st.session_state[keys.FLASH] = ("success", f"Opened on step {cursor:d}, the step the link was made on: the run "
                                               f"was replayed to it{ended}.")


def keep_step_in_link(cursor: int) -> None:
    """The step on view into the URL (none before the first step), so a copied link opens on it."""
    value = str(cursor) if cursor >= 0 else None
    if st.query_params.get(keys.QP_STEP) == value:
        return
    if value is None:
        del st.query_params[keys.QP_STEP]
    else:
        st.query_params[keys.QP_STEP] = value
