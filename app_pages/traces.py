"""Save the playground's trace as JSON; upload a trace and replay it in the same views, no model needed."""
import streamlit as st

from decoding.core.trace import MAX_TRACE_BYTES, TraceFormatError, from_json, to_json
from ui.views import headers
from ui.views.text import md_text
from ui.widgets import display, guard, keys, requests_panel, step_panel

st.title("Traces")

st.subheader("Download")
run = st.session_state.get(keys.RUN)
if run is None or not (run.events or run.error):
    st.caption("Run something in the Playground first; its trace can then be saved here.")
else:
    trace = run.trace()
    if trace.error:
        st.warning(f"This run stopped with an error; the trace keeps its {len(trace.steps)} step(s) so far "
                   f"and the message: {md_text(trace.error)}")
    st.download_button(f"Download the playground trace ({len(trace.steps)} steps, JSON)", to_json(trace, indent=1),
                       file_name=f"decodescope-{trace.strategy}-seed{trace.config.get('seed', 0)}.json",
                       mime="application/json", key=keys.DOWNLOAD, on_click="ignore")

st.subheader("Replay")
upload = st.file_uploader("Upload a trace (.json)", type=["json"], key=guard.uploader_key(keys.UPLOAD))
if upload is not None:
    if upload.size > MAX_TRACE_BYTES:
        st.error(f"{md_text(upload.name)} is {upload.size:d} bytes, over the {MAX_TRACE_BYTES} byte limit")
    else:
        try:
            st.session_state[keys.REPLAY] = from_json(upload.getvalue())
        except TraceFormatError as err:
            st.session_state.pop(keys.REPLAY, None)
            st.error(f"{md_text(upload.name)} is not a readable trace: {md_text(err)}")

replay = st.session_state.get(keys.REPLAY)
if replay is not None:
    requests_panel.show_opened(replay)          # a trace opened from the Requests page: its request's timing
    st.text(f"Strategy {replay.strategy} · model {replay.model.get('name', '?')} · "     # text: no markdown
            f"{len(replay.steps)} steps · stop: {headers.value_word('stop_reason', replay.stop_reason)}")
    with st.expander("Prompt"):
        st.text(replay.prompt_text)
    if replay.steps:
        cursor = st.slider("Step", 0, max(0, len(replay.steps) - 1), key=keys.REPLAY_CURSOR) \
            if len(replay.steps) > 1 else 0
        display.show_chips(replay.steps, current_step=cursor)
        display.show_metrics(replay.steps[: cursor + 1])
        view = st.segmented_control("View", ["This step", "All steps"], default="This step", key=keys.REPLAY_VIEW,
                                    label_visibility="collapsed")
        if view == "All steps":
            step_panel.show_all_steps(replay.steps, step_panel.ViewContext("tr.all"), f"{replay.strategy}-replay")
        else:
            step_panel.show_step(replay.steps, cursor, step_panel.ViewContext("tr"))
