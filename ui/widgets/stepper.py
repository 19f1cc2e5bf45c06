"""The playground's step controls and their state: buttons, long runs in chunks, the cursor over
recorded steps, branching by forcing a candidate. Long runs go in chunks of about CHUNK_S seconds, one
fragment rerun each, so the chips grow as they come and a click on Stop (whose callback ends the run)
is handled between chunks (a fragment's rerun is queued, not interrupted, by a click)."""
from __future__ import annotations

import time
from collections.abc import Sequence
from contextlib import nullcontext

import streamlit as st
from streamlit.errors import StreamlitAPIException

from decoding.core.errors import ConfigError
from ui.views import verdict
from ui.views.text import md_text
from ui.widgets import engine, keys
from ui.widgets.display import show_streams
from ui.widgets.waiting import waiting_line

VIEWS = ["This step", "All steps", "Branch"]
CHUNK_S = 0.5
# A pause between the new token (chips, metrics) and the step's details: without it their messages reach the
# browser together and it draws the charts before it paints the token; with it the token shows first (on the
# app benchmark, click->chip ~220 -> ~90-110 ms; the details no sooner than before: docs/app.md, "Speed").
HEAD_START_S = 0.06
LIVE_CHIPS = 400     # chips drawn while a long run goes on (all of them once it ends or stops)
STOP_HELP = "Stops a long run; the steps so far are kept"


def head_start() -> None:
    """Let the messages drawn so far (the new token) leave for the browser before the step's details."""
    time.sleep(HEAD_START_S)


def stop_running() -> None:
    st.session_state.pop(keys.RUNNING, None)


def rerun_fragment() -> None:
    """Rerun the fragment only (a full rerun where the fragment is not running on its own, as in AppTest)."""
    try:
        st.rerun(scope="fragment")
    except StreamlitAPIException:
        st.rerun()


def controls() -> dict:
    """The control row (one flowing row: each button as wide as its label, none cut off at 1280 px); returns
    which buttons were pressed and N."""
    row = st.container(horizontal=True, vertical_alignment="center", gap="small")
    pressed = {"step": row.button("Step", key=keys.STEP, type="primary")}
    n_steps = row.number_input("N", min_value=1, max_value=1024, value=8, step=1, key=keys.N_STEPS,
                               label_visibility="collapsed", width=120)
    pressed["run_n"] = row.button(f"Run {n_steps:d}", key=keys.RUN_N)
    pressed["run_end"] = row.button("Run to end", key=keys.RUN_END)
    going = keys.RUNNING in st.session_state or pressed["run_n"] or pressed["run_end"]
    pressed["stop_slot"] = row.empty()
    pressed["stop_slot"].button("Stop", key=keys.STOP, help=STOP_HELP, on_click=stop_running, disabled=not going)
    pressed["stop_enabled"] = going
    pressed["back"] = row.button("◀ Back", key=keys.BACK)
    pressed["forward"] = row.button("Forward ▶", key=keys.FORWARD)
    pressed["reset"] = row.button("Reset", key=keys.RESET)
    pressed["n"] = int(n_steps)
    return pressed


def settle_stop(pressed: dict) -> None:
    """After the rerun's chunk: a run that ended in it leaves Stop enabled above; a disabled one (another
    key: a widget is drawn once per rerun) takes its place."""
    if pressed["stop_enabled"] and keys.RUNNING not in st.session_state:
        pressed["stop_slot"].button("Stop", key=keys.STOP_DONE, help=STOP_HELP, disabled=True)


def advance(run, n: int, budget_s: float | None = None) -> None:
    """Up to n steps, or fewer when budget_s seconds have passed; the cursor follows. While other
    sessions have work on the engine thread, a spinner says how many (they take turns step by step)."""
    line = waiting_line(engine.ENGINE.others_ahead())
    with st.spinner(md_text(line)) if line else nullcontext():
        deadline = None if budget_s is None else time.perf_counter() + budget_s
        added = 0
        while added < n and not run.done and (deadline is None or time.perf_counter() < deadline):
            added += run.step(1)
    st.session_state[keys.CURSOR] = len(run.events) - 1


def start_long_run(run, n: int) -> None:
    st.session_state[keys.RUNNING] = len(run.events) + n


def run_chunk(run) -> bool:
    """One chunk of a long run; True while more chunks are to come."""
    until = st.session_state.get(keys.RUNNING)
    if until is None:
        return False
    advance(run, until - len(run.events), budget_s=CHUNK_S)
    if run.done or len(run.events) >= until:
        stop_running()
        return False
    st.progress(min(1.0, len(run.events) / until), text=f"{len(run.events)} steps — Stop ends the run here")
    return True


def move_cursor(run, pressed: dict) -> int:
    cursor = st.session_state.get(keys.CURSOR, -1)
    if pressed["back"]:
        cursor = max(0, cursor - 1)
    if pressed["forward"]:
        cursor = min(len(run.events) - 1, cursor + 1)
    cursor = min(cursor, len(run.events) - 1)
    st.session_state[keys.CURSOR] = cursor
    return cursor


def force(index: int, forced: Sequence[int]) -> None:
    """Callback of "Force & branch": a branch departing at step `index` that emits `forced` (every
    token after the prompt, the chosen one last; ui.widgets.forcing computes it), as long as the original
    run, shown in the Branch view."""
    run = st.session_state[keys.RUN]
    try:
        branch = run.fork(index, forced)
        branch.extend_to(run.reach)
    except ConfigError as err:
        st.session_state[keys.FLASH] = ("error", str(err))
        return
    st.session_state[keys.BRANCH] = branch
    st.session_state[keys.VIEW] = "Branch"
    st.session_state[keys.FLASH] = ("success", verdict.branched_line(index, forced, branch.events))


def adopt_branch() -> None:
    branch = st.session_state.pop(keys.BRANCH)
    st.session_state[keys.RUN] = branch
    st.session_state[keys.CURSOR] = len(branch.events) - 1


def drop_branch() -> None:
    st.session_state.pop(keys.BRANCH, None)


def branch_view(run) -> None:
    branch = st.session_state.get(keys.BRANCH)
    if branch is None:
        st.caption("Force a candidate on the step panel to branch; the original run stays here to compare.")
        return
    show_streams({"original": run.events, "branch": branch.events}, piece_of=run.lm.piece)
    b1, b2 = st.columns(2)
    b1.button("Continue from the branch", key=keys.ADOPT_BRANCH, on_click=adopt_branch)
    b2.button("Drop the branch", key=keys.DROP_BRANCH, on_click=drop_branch)


def show_flash() -> None:
    flash = st.session_state.pop(keys.FLASH, None)
    if flash:
        getattr(st, flash[0])(md_text(flash[1]))          # a piece, a prompt or a refusal: text, never markdown


def chosen_view() -> str:
    st.session_state.setdefault(keys.VIEW, VIEWS[0])
    return st.segmented_control("View", VIEWS, key=keys.VIEW, label_visibility="collapsed") or VIEWS[0]
