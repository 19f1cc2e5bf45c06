"""The Tour page: one stop at a time, its explanation and its pre-recorded trace drawn with the shared
views (no model needed), a button to re-run the stop live, Previous/Next and a stop selector. The stop on
view is kept in session state and in the URL (?stop=ID). Strings from traces go through st.text or the
escaping views, never Markdown."""
from __future__ import annotations

import dataclasses

import streamlit as st

from decoding.core.errors import ConfigError
from decoding.core.trace import Trace, TraceFormatError
from ui.views import tour
from ui.views.chips import first_divergence
from ui.views.text import md_text
from ui.widgets import engine, keys, session, sidebar
from ui.widgets.display import show_chips, show_metrics
from ui.widgets.step_panel import ViewContext, show_step
from ui.widgets.waiting import with_waiting

SOURCES = ("Recorded", "Live")


def current_stop() -> tour.Stop:
    """The stop on view: session state, else the link's ?stop=, else the first stop."""
    state = st.session_state
    if keys.TOUR_STOP not in state:
        wanted = st.query_params.get(keys.QP_TOUR_STOP)
        known = wanted in tour.stop_ids()
        state[keys.TOUR_STOP] = wanted if known else tour.STOPS[0].id
        if wanted is not None and not known:
            state[keys.TOUR_BAD_STOP] = wanted
    return tour.stop_by_id(state[keys.TOUR_STOP])


def _go(stop_id: str) -> None:
    st.session_state[keys.TOUR_STOP] = stop_id


def _picked() -> None:
    _go(st.session_state[keys.TOUR_SELECT])


def navigation(stop: tour.Stop) -> None:
    ids = tour.stop_ids()
    st.session_state[keys.TOUR_SELECT] = stop.id          # the selector follows Previous/Next
    left, middle, right = st.columns([1, 4, 1], vertical_alignment="bottom")
    left.button("← Previous", key=keys.TOUR_PREV, on_click=_go, args=(tour.neighbour(stop.id, -1),),
                disabled=stop.id == ids[0], width="stretch")
    middle.selectbox("Stop", ids, format_func=tour.stop_label, key=keys.TOUR_SELECT, on_change=_picked)
    right.button("Next →", key=keys.TOUR_NEXT, on_click=_go, args=(tour.neighbour(stop.id, 1),),
                 disabled=stop.id == ids[-1], width="stretch")


def render() -> None:
    stop = current_stop()
    st.title("Tour: how a language model decodes, and how to make it faster")
    bad = st.session_state.pop(keys.TOUR_BAD_STOP, None)
    if bad is not None:
        st.warning(f"stop={md_text(repr(bad[:40]))} in the link is not a tour stop; showing the first one.")
    navigation(stop)
    st.query_params[keys.QP_TOUR_STOP] = stop.id
    st.header(tour.stop_label(stop.id))
    st.sidebar.info(f"This Tour stop runs its own settings ({md_text(stop.strategy)}, shown under **The trace**), "
                    "not the sidebar's: the sidebar's settings are the Playground's.")
    st.caption(stop.terms)
    st.markdown(stop.body)
    trace_section(stop)


# ---------------------------------------------------------------- the stop's trace

def trace_section(stop: tour.Stop) -> None:
    st.subheader("The trace")
    info, button = st.columns([4, 1], vertical_alignment="center")
    info.text(f"Prompt (chat template): {stop.prompt}\nSettings: {tour.config_line(stop)}")
    model = sidebar.default_model()
    if button.button("Playground →", key=keys.TOUR_OPEN, on_click=_to_playground, args=(stop,),
                     help="The Playground with this stop's prompt, strategy and settings in the sidebar; press Step "
                          "or Run there."):
        st.session_state[keys.QP_LOADED] = False       # the Playground's sidebar copies the link in, once
        st.switch_page("app_pages/playground.py", query_params=tour.playground_query(stop))
    if button.button("Re-run live", key=keys.TOUR_RUN, type="primary",
                     help=f"Runs this stop's settings now on the model {md_text(repr(model))} with the sidebar's "
                          "device and dtype (the recording used the embedded model)."):
        run_live(stop, model)
    recorded = recorded_or_error(stop)
    live = st.session_state.get(keys.TOUR_LIVE, {}).get(stop.id)
    source = SOURCES[0]
    if live is not None:
        source = st.segmented_control("Trace shown", SOURCES, key=keys.TOUR_SOURCE) or SOURCES[0]
        compare_line(recorded, live)
    trace = live if source == "Live" else recorded
    if trace is None:
        st.info("The trace of this stop is not recorded yet. Press **Re-run live** to run it now, or record it "
                f"with `python -m bench.tour record --only {stop.id}`.")
        return
    show_trace(stop, trace, source)


def _to_playground(stop: tour.Stop) -> None:
    """Before the switch: the stop's strategy starts from its defaults (the Tour's "the rest at their
    defaults"); the link's values are copied in by the sidebar after the switch."""
    prefix = keys.param_key("w", stop.strategy, "")
    for key in [k for k in st.session_state if str(k).startswith(prefix)]:
        del st.session_state[key]


def recorded_or_error(stop: tour.Stop) -> Trace | None:
    try:
        return tour.load_recorded(stop)
    except (TraceFormatError, OSError) as err:
        st.error(f"The recorded trace {md_text(tour.trace_path(stop).name)} cannot be read: {md_text(str(err)[:300])}")
        return None


def run_live(stop: tour.Stop, model: str) -> None:
    """Run the stop's config on `model`; the trace (complete, stopped or failed) goes to session state."""
    settings = dataclasses.replace(sidebar.current(), model=model, prompt=stop.prompt, chat_template=True)
    lm = session.lm_or_stop(settings)
    prompt_ids = session.prompt_ids_or_stop(lm, settings)
    config = stop.config()
    kwargs = session.strategy_kwargs_or_stop(config, settings)
    try:
        with st.spinner(md_text(with_waiting(f"Running {stop.title.lower()} live…"))):
            trace = engine.run(lm, prompt_ids, config, prompt_text=stop.prompt, **kwargs)
    except ConfigError as err:
        st.error(md_text(err))
        return
    st.session_state.setdefault(keys.TOUR_LIVE, {})[stop.id] = trace
    st.session_state[keys.TOUR_SOURCE] = "Live"
    st.session_state.pop(keys.tour_cursor(stop.id, "Live"), None)


def compare_line(recorded: Trace | None, live: Trace) -> None:
    if live.error:
        st.error(f"The live run stopped with an error: {md_text(live.error)}")
    if recorded is None:
        return
    at = first_divergence(recorded.output_ids, live.output_ids)
    if at is None:
        st.success(f"The live run reproduced the recording: the same {len(live.output_ids)} tokens.")
    else:
        st.warning(f"The live run differs from the recording from token {at:d} on (another model, device or "
                   "dtype gives other numbers).")
    st.caption(md_text(f"Speed: {tour.speed_line(recorded, live)}; {tour.SPEED_NOTE}."))


def show_trace(stop: tour.Stop, trace: Trace, source: str) -> None:
    st.text(tour.facts(trace))
    stale = tour.stale_fields(stop, trace)
    if stale:
        st.warning(f"This trace was recorded with other settings than the stop's ({md_text(', '.join(stale))}); "
                   f"record it again with `python -m bench.tour record --only {stop.id}`.")
    if not trace.steps:
        st.info("This trace has no steps.")
        return
    n = len(trace.steps)
    cursor_key = keys.tour_cursor(stop.id, source)
    start = st.session_state.get(cursor_key, tour.focus_step(stop, trace.steps))
    st.session_state[cursor_key] = min(max(int(start), 0), n - 1)
    cursor = st.slider("Step", 0, n - 1, key=cursor_key) if n > 1 else 0
    show_chips(trace.steps, current_step=cursor)
    show_metrics(trace.steps[: cursor + 1])
    st.markdown("**What to look at.** " + stop.look_for)
    show_step(trace.steps, cursor, ViewContext(f"tour.{stop.id}.{source}"))
