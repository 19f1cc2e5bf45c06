"""Step through one run: Step, Run N, Run to end, Back/Forward, Reset; force a candidate to branch.

The stepper is an st.fragment: its buttons rerun only the fragment, not the sidebar and the page."""
import time

import streamlit as st

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


def controls() -> dict:
    c = st.columns([1, 1.3, 1, 1, 1, 1, 1, 1])
    pressed = {"step": c[0].button("Step", key=keys.STEP, type="primary")}
    n_steps = c[1].number_input("N", min_value=1, max_value=1024, value=8, step=1, key=keys.N_STEPS,
                                label_visibility="collapsed")
    pressed["run_n"] = c[2].button(f"Run {n_steps}", key=keys.RUN_N)
    pressed["run_end"] = c[3].button("Run to end", key=keys.RUN_END)
    c[4].button("Stop", key=keys.STOP, help="Stops a long run (any click interrupts it; steps so far are kept)")
    pressed["back"] = c[5].button("◀ Back", key=keys.BACK)
    pressed["forward"] = c[6].button("Forward ▶", key=keys.FORWARD)
    pressed["reset"] = c[7].button("Reset", key=keys.RESET)
    pressed["n"] = int(n_steps)
    return pressed


def advance(run, n: int) -> None:
    progress = st.progress(0.0, text="Generating…") if n > 1 else None

    def on_event(event):
        st.session_state[keys.CURSOR] = len(run.events) - 1
        if progress is not None:
            progress.progress(min(1.0, len(run.events) / config.max_new_tokens), text=f"{len(run.events)} steps")

    run.step(n, on_event=on_event)
    if progress is not None:
        progress.empty()


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
        run = session.reset_run(lm, settings, prompt_ids)
    before = len(run.events)
    if pressed["step"]:
        advance(run, 1)
    elif pressed["run_n"]:
        advance(run, pressed["n"])
    elif pressed["run_end"]:
        advance(run, config.max_new_tokens + 1)
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


stepper()
