"""Step through one run: Step, Run N, Run to end, Stop, Back/Forward, Reset; force a candidate to branch.
The stepper is an st.fragment: its buttons rerun only the fragment, not the sidebar and the page."""
import time

import streamlit as st

from ui.views import glossary, made_with, presets
from ui.views.text import md_text
from ui.widgets import display, keys, links, session, sidebar, step_panel, stepper

settings = sidebar.current()
st.title("Playground")


def use_preset(preset: presets.Preset) -> None:
    """A preset's prompt, with the chat template, into the sidebar (a callback: before the sidebar draws)."""
    st.session_state[keys.PROMPT] = preset.prompt
    st.session_state[keys.CHAT] = True


def preset_row() -> None:
    """One click to a prompt that shows drafting at its best or its worst; the current one's hint below."""
    cols = st.columns([0.9] + [1.0] * len(presets.PRESETS), vertical_alignment="center")
    cols[0].markdown("**Try a prompt:**")
    for i, (col, preset) in enumerate(zip(cols[1:], presets.PRESETS)):
        col.button(md_text(preset.name), key=f"{keys.PRESET}{i}", help=md_text(preset.hint), on_click=use_preset,
                   args=(preset,), width="stretch")
    chosen = presets.preset_for(settings.prompt)
    if chosen is not None:
        st.caption(md_text(f"{chosen.name}: {chosen.hint}"))


preset_row()
config = session.config_or_stop(settings)


def open_run() -> list[int]:
    """The prompt's ids, with this session's run ready. The model stays out of the page's globals: the
    fragment below keeps them while the tab is open, and an idle tab must not keep a model alive."""
    lm = session.lm_or_stop(settings)
    prompt_ids = session.prompt_ids_or_stop(lm, settings)
    run = session.live_run(lm, settings, prompt_ids)    # a fresh run when the settings changed
    links.open_linked_step(run, settings)               # a link's step: the run replayed to it, once
    with st.expander(f"Prompt as the model sees it ({len(prompt_ids)} tokens)"):
        st.text(lm.decode(prompt_ids))
    return prompt_ids


prompt_ids = open_run()


@st.fragment
def step_through() -> None:
    started = time.perf_counter()
    pressed = stepper.controls()
    run = st.session_state[keys.RUN]
    if pressed["reset"]:
        run = session.reset_run(session.lm_or_stop(settings), settings, prompt_ids)
    before = len(run.events)
    if pressed["step"]:
        stepper.advance(run, 1)
    elif pressed["run_n"] or pressed["run_end"]:
        stepper.start_long_run(run, pressed["n"] if pressed["run_n"] else config.max_new_tokens + 1)
    more_to_come = stepper.run_chunk(run)
    stepper.settle_stop(pressed)
    cursor = stepper.move_cursor(run, pressed)
    model_ms = sum(sum(e.timings_ms.values()) for e in run.events[before:])
    links.keep_step_in_link(cursor)
    if run.error:
        st.error(f"The run stopped with an error: {md_text(session.shown(run.error, settings))}")
    made = st.session_state.get(keys.RUN_MADE_WITH, {})
    st.caption(f"{md_text(glossary.steps_recorded(len(run.events), run.done, cursor))}. Made with: "
               f"{md_text(made_with.line(made, ('strategy', 'seed', 'max new tokens', 'prompt')))}.")
    stepper.show_flash()
    if not run.events:
        st.info("Press **Step** to generate the first token, or **Run to end**.")
    else:
        display.show_chips(run.events, current_step=cursor, keep=stepper.LIVE_CHIPS if more_to_come else None)
        display.show_metrics(run.events[: cursor + 1])
        view = stepper.chosen_view()
        if more_to_come:      # a step's charts every chunk would cost the page more than the model
            st.caption("The step's details are drawn when the run ends or you press Stop.")
        elif view == "This step":
            stepper.head_start()
            step_panel.show_step(run.events, cursor, step_panel.ViewContext("pg", on_force=stepper.force))
        elif view == "All steps":
            step_panel.show_all_steps(run.events, step_panel.ViewContext("pg.all"), f"{config.strategy}-run")
        else:
            stepper.branch_view(run)
    render_ms = (time.perf_counter() - started) * 1000.0 - model_ms
    st.session_state[keys.LAST_RENDER_MS] = {"model_ms": model_ms, "render_ms": render_ms}
    st.caption(f"This rerun: model {model_ms:.0f} ms, page beyond the model {render_ms:.0f} ms (server side).")
    if more_to_come:
        stepper.rerun_fragment()


step_through()
