"""Requests served by `python -m decoding serve`: latency percentiles and histograms per strategy, every
request slowest first, one click to its trace on the Traces page; and engines' exported drafting numbers."""
import streamlit as st

from ui.widgets import requests_panel

st.title("Requests")
st.caption("Why was this request slow? Read a running `python -m decoding serve` (or its request-log files): "
           "queue, time to first token, inter-token latency and end to end per strategy; open any request's "
           "trace to see its drafts, acceptance and timing.")
requests_panel.choose_source()
rows = st.session_state.get(requests_panel.ROWS)
if rows:
    requests_panel.show_summary(rows)
    st.subheader("Requests, slowest first")
    requests_panel.show_requests(rows)
elif rows is not None:
    st.caption("The log holds no requests yet.")
st.subheader("Engine telemetry")
requests_panel.show_telemetry()
