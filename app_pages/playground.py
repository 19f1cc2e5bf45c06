"""Step through one run: Step, Run N, Run to end, Back/Forward, Reset; force a candidate to branch."""
import time

import streamlit as st

from decoding.errors import ConfigError
from ui import keys, session, sidebar, views

started = time.perf_counter()
settings = sidebar.current()
st.title("Playground")
config = session.config_or_stop(settings)
lm = session.lm_or_stop(settings)
prompt_ids = session.prompt_ids_or_stop(lm, settings)
run = session.live_run(lm, settings, prompt_ids)

# ---------------------------------------------------------------- controls (drawn before any work)
c = st.columns([1, 1.3, 1, 1, 1, 1, 1, 1])
do_step = c[0].button("Step", key=keys.STEP, type="primary")
n_steps = c[1].number_input("N", min_value=1, max_value=1024, value=8, step=1, key=keys.N_STEPS,
                            label_visibility="collapsed")
do_run_n = c[2].button(f"Run {n_steps}", key=keys.RUN_N)
do_run_end = c[3].button("Run to end", key=keys.RUN_END)
c[4].button("Stop", key=keys.STOP, help="Stops a long run (any click interrupts it; steps so far are kept)")
do_back = c[5].button("◀ Back", key=keys.BACK)
do_forward = c[6].button("Forward ▶", key=keys.FORWARD)
do_reset = c[7].button("Reset", key=keys.RESET)

if do_reset:
    run = session.reset_run(lm, settings, prompt_ids)


def advance(n: int) -> None:
    progress = st.progress(0.0, text="Generating…") if n > 1 else None

    def on_event(event):
        st.session_state[keys.CURSOR] = len(run.events) - 1
        if progress is not None:
            done = len(run.events)
            progress.progress(min(1.0, done / max(1, config.max_new_tokens)), text=f"{done} steps")

    run.step(n, on_event=on_event)
    if progress is not None:
        progress.empty()


model_started = time.perf_counter()
events_before = len(run.events)
if do_step:
    advance(1)
elif do_run_n:
    advance(int(n_steps))
elif do_run_end:
    advance(config.max_new_tokens + 1)
cursor = st.session_state.get(keys.CURSOR, -1)
if do_back:
    cursor = max(0, cursor - 1)
if do_forward:
    cursor = min(len(run.events) - 1, cursor + 1)
cursor = min(cursor, len(run.events) - 1)
st.session_state[keys.CURSOR] = cursor
model_ms = sum(sum(e.timings_ms.values()) for e in run.events[events_before:])

if run.error:
    st.error(f"The run stopped with an error: {run.error}")


def force(index: int, token_id: int) -> None:
    try:
        branch = run.branch(index, token_id)
        branch.step(max(0, len(run.events) - len(branch.events)))
    except ConfigError as err:
        st.error(str(err))
        return
    st.session_state[keys.BRANCH] = branch
    st.success(f"Branched at step {index}: see the Branch tab.")


# ---------------------------------------------------------------- views
status = "finished" if run.done else "in progress"
st.caption(f"{len(run.events)} step(s) recorded ({status}); viewing step {cursor if cursor >= 0 else '—'}. "
           f"Strategy {config.strategy}, seed {config.seed}, prompt {len(prompt_ids)} tokens.")
with st.expander(f"Prompt as the model sees it ({len(prompt_ids)} tokens)"):
    st.text(lm.decode(prompt_ids))
if not run.events:
    st.info("Press **Step** to generate the first token, or **Run to end**.")
else:
    views.show_chips(run.events, current_step=cursor)
    views.show_metrics(run.events[: cursor + 1])
    tab_step, tab_all, tab_branch = st.tabs(["This step", "All steps", "Branch"])
    with tab_step:
        views.show_step(run.events, cursor, views.ViewContext("pg", on_force=force))
    with tab_all:
        views.show_all_steps(run.events, views.ViewContext("pg.all"), f"{config.strategy}-run")
    with tab_branch:
        branch = st.session_state.get(keys.BRANCH)
        if branch is None:
            st.caption("Force a candidate on the step panel to branch; the original run stays here to compare.")
        else:
            views.show_streams({"original": run.events, "branch": branch.events})
            b1, b2 = st.columns(2)
            if b1.button("Continue from the branch", key=keys.ADOPT_BRANCH):
                st.session_state[keys.RUN] = branch
                st.session_state[keys.CURSOR] = len(branch.events) - 1
                st.session_state.pop(keys.BRANCH)
                st.rerun()
            if b2.button("Drop the branch", key=keys.DROP_BRANCH):
                st.session_state.pop(keys.BRANCH)
                st.rerun()

timing = {"page_ms": (time.perf_counter() - started) * 1000.0, "model_ms": model_ms,
          "render_ms": (time.perf_counter() - model_started) * 1000.0 - model_ms}
st.session_state[keys.LAST_RENDER_MS] = timing
st.caption(f"This rerun: model {timing['model_ms']:.0f} ms, page beyond the model {timing['render_ms']:.0f} ms "
           "(server side).")
