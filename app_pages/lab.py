"""The Lab: the claims the decoding story makes in words, measured live on the sidebar's model and device."""
import streamlit as st

from ui.widgets import lab_panels, queue_panel, sidebar

settings = sidebar.current()
st.title("Lab")
st.caption("Each section measures one claim on the model and device the sidebar has chosen. Results are kept for "
           "this session per model, device and settings, each with the settings that made it (marked out of date "
           "when they change); Measure runs again. Tables download as CSV, charts as SVG (the camera in the "
           "chart's toolbar).")
cost, throughput, accepted, held, exact, queue = st.tabs(["Cost of a forward", "Throughput and latency",
                                                          "Acceptance", "Memory", "Losslessness", "Queueing"])
with cost:
    lab_panels.cost_panel(settings)
with throughput:
    lab_panels.throughput_panel(settings)
with accepted:
    lab_panels.acceptance_panel(settings)
with held:
    lab_panels.memory_panel(settings)
with exact:
    lab_panels.lossless_panel(settings)
with queue:
    queue_panel.queue_panel(settings)
