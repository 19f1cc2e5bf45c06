"""The Lab's Queueing tab: P99 latency against load for a strategy and one k× faster per request, simulated
from one fixed service time (M/D/1) or from the decoding times measured in the Requests page's log."""
from __future__ import annotations

import streamlit as st

from ui.views import queueing
from ui.views.text import md_text
from ui.widgets import display, requests_panel

LOADS = (0.2, 0.4, 0.6, 0.8, 0.9, 0.95, 1.1, 1.3)
FIXED, MEASURED = "One fixed time per request (M/D/1)", "Measured in the Requests page's log (M/G/1)"


def _service() -> tuple[tuple[float, ...], str]:
    rows = st.session_state.get(requests_panel.ROWS) or []
    strategies = sorted({r.strategy for r in rows})
    where = st.radio("Service times", [FIXED, MEASURED] if strategies else [FIXED], key="lab.q.where",
                     horizontal=True)
    if where == MEASURED:
        strategy = st.selectbox("Strategy whose decoding times are drawn", strategies, key="lab.q.strategy")
        measured = queueing.measured_service(rows, strategy)
        if measured:
            return measured, f"{len(measured)} decoding times of {md_text(strategy)} from the request log"
        st.caption("That strategy has no decoding time in the log; a fixed time is used.")
    ms = st.number_input("Time per request (ms)", 10, 60_000, 1_000, step=100, key="lab.q.ms")
    return (ms / 1000,), f"every request {ms:,} ms"


def queue_panel() -> None:
    st.caption("One request decodes at a time, as `python -m decoding serve` does; requests arrive at random "
               "(Poisson) at a rate given as a share of the slower strategy's capacity. Simulated, seeded, 4,000 "
               "requests per point (Lindley's recursion), not measured live.")
    service, source = _service()
    speedup = st.slider("Faster strategy: times faster per request", 1.0, 3.0, 1.5, 0.1, key="lab.q.speedup")
    setup = queueing.QueueSetup(service, speedup, LOADS)
    display.plot(queueing.p99_figure(setup), "lab.q.fig", "queueing-p99")
    display.table(queueing.p99_table(setup), "lab.q.table", "queueing-p99")
    st.caption(f"Service: {md_text(source)}. At low load few requests wait, so P99 falls by a little more than the "
               "speedup; near "
               "the slower strategy's capacity its queue grows like ρ/(1−ρ) while the faster one runs at ρ/k, so "
               "P99 falls by far more; past the slower one's capacity (—) its queue has no steady P99 at all; "
               f"past {speedup:g}× that load the faster one's queue grows without bound too, and only more "
               "servers or batching help.")
