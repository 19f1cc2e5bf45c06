"""Step through one run: Step, Run N, Run to end, Back/Forward, Reset; force a candidate to branch.

The stepper is an st.fragment: its buttons rerun only the fragment, not the sidebar and the page.
Long runs go in chunks of about CHUNK_S seconds, one fragment rerun each, so the chips grow as they
come and a click on Stop (whose callback ends the run) is handled between chunks."""
import time

import streamlit as st
from streamlit.errors import StreamlitAPIException

from decoding.errors import ConfigError
from ui import keys, session, sidebar, views

settings = sidebar.current()
st.title("Playground")
config = session.config_or_stop(settings)
lm = session.lm_or_stop(settings)
prompt_ids = session.prompt_ids_or_stop(lm, settings)
session.live_run(lm, settings, prompt_ids)          # a fresh run when the settings changed
with st.expander(f"Prompt as the model sees it ({len(prompt_ids)} tokens)"):
    st.text(lm.decode(prompt_ids))


VIEWS = ["This step", "All steps", "Branch"]
CHUNK_S = 0.5


def stop_running() -> None:
    st.session_state.pop(keys.RUNNING, None)


def rerun_stepper() -> None:
    """Rerun the fragment only (a full rerun where the fragment is not running on its own, as in AppTest)."""
    try:
        st.rerun(scope="fragment")
    except StreamlitAPIException:
        st.rerun()


def controls() -> dict:
    c = st.columns([1, 1.3, 1, 1, 1, 1, 1, 1])
    pressed = {"step": c[0].button("Step", key=keys.STEP, type="primary")}
    n_steps = c[1].number_input("N", min_value=1, max_value=1024, value=8, step=1, key=keys.N_STEPS,
                                label_visibility="collapsed")
    pressed["run_n"] = c[2].button(f"Run {n_steps}", key=keys.RUN_N)
    pressed["run_end"] = c[3].button("Run to end", key=keys.RUN_END)
    c[4].button("Stop", key=keys.STOP, help="Stops a long run; the steps so far are kept", on_click=stop_running,
                disabled=keys.RUNNING not in st.session_state)
    pressed["back"] = c[5].button("◀ Back", key=keys.BACK)
    pressed["forward"] = c[6].button("Forward ▶", key=keys.FORWARD)
    pressed["reset"] = c[7].button("Reset", key=keys.RESET)
    pressed["n"] = int(n_steps)
    return pressed


def advance(run, n: int, budget_s: float | None = None) -> None:
    """Up to n steps, or fewer when budget_s seconds have passed."""
    deadline = None if budget_s is None else time.perf_counter() + budget_s
    added = 0
    while added < n and not run.done and (deadline is None or time.perf_counter() < deadline):
        added += run.step(1)
    st.session_state[keys.CURSOR] = len(run.events) - 1


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


def force(index: int, token_id: int) -> None:
    """Callback of "Force & branch": branch the run and show the Branch view."""
    run = st.session_state[keys.RUN]
    try:
        branch = run.branch(index, token_id)
        branch.step(max(0, len(run.events) - len(branch.events)))
    except ConfigError as err:
        st.session_state[keys.FLASH] = ("error", str(err))
        return
    st.session_state[keys.BRANCH] = branch
    st.session_state[keys.VIEW] = "Branch"
    st.session_state[keys.FLASH] = ("success", f"Branched at step {index} with token id {token_id}.")


def branch_tab(run) -> None:
    branch = st.session_state.get(keys.BRANCH)
    if branch is None:
        st.caption("Force a candidate on the step panel to branch; the original run stays here to compare.")
        return
    views.show_streams({"original": run.events, "branch": branch.events})
    b1, b2 = st.columns(2)
    b1.button("Continue from the branch", key=keys.ADOPT_BRANCH, on_click=adopt_branch)
    b2.button("Drop the branch", key=keys.DROP_BRANCH, on_click=lambda: st.session_state.pop(keys.BRANCH, None))


def adopt_branch() -> None:
    branch = st.session_state.pop(keys.BRANCH)
    st.session_state[keys.RUN] = branch
    st.session_state[keys.CURSOR] = len(branch.events) - 1


@st.fragment
def stepper() -> None:
    started = time.perf_counter()
    pressed = controls()
    run = st.session_state[keys.RUN]
    if pressed["reset"]:
        stop_running()
        run = session.reset_run(lm, settings, prompt_ids)
    before = len(run.events)
    if pressed["step"]:
        advance(run, 1)
    elif pressed["run_n"] or pressed["run_end"]:
        more = pressed["n"] if pressed["run_n"] else config.max_new_tokens + 1
        st.session_state[keys.RUNNING] = len(run.events) + more
    more_to_come = run_chunk(run)
    cursor = move_cursor(run, pressed)
    model_ms = sum(sum(e.timings_ms.values()) for e in run.events[before:])
    if run.error:
        st.error(f"The run stopped with an error: {run.error}")
    status = "finished" if run.done else "in progress"
    st.caption(f"{len(run.events)} step(s) recorded ({status}); viewing step {cursor if cursor >= 0 else '—'}. "
               f"Strategy {config.strategy}, seed {config.seed}.")
    if not run.events:
        st.info("Press **Step** to generate the first token, or **Run to end**.")
    else:
        views.show_chips(run.events, current_step=cursor)
        views.show_metrics(run.events[: cursor + 1])
        flash = st.session_state.pop(keys.FLASH, None)
        if flash:
            getattr(st, flash[0])(flash[1])
        st.session_state.setdefault(keys.VIEW, "This step")
        view = st.segmented_control("View", VIEWS, key=keys.VIEW, label_visibility="collapsed") or "This step"
        if view == "This step":
            views.show_step(run.events, cursor, views.ViewContext("pg", on_force=force))
        elif view == "All steps":
            views.show_all_steps(run.events, views.ViewContext("pg.all"), f"{config.strategy}-run")
        else:
            branch_tab(run)
    timing = {"model_ms": model_ms, "render_ms": (time.perf_counter() - started) * 1000.0 - model_ms}
    st.session_state[keys.LAST_RENDER_MS] = timing
    st.caption(f"This rerun: model {timing['model_ms']:.0f} ms, page beyond the model {timing['render_ms']:.0f} ms "
               "(server side).")
    if more_to_come:
        rerun_stepper()


stepper()
