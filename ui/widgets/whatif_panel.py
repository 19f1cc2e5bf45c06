"""Streamlit sections of the what-if page: a DSpark trace's sweep over chain lengths and tree budgets
(numbers from ui/views/whatif_dspark.py) and the cost-table caption of a speculative one (ui/views/whatif.py).
No model."""
from __future__ import annotations

import streamlit as st

from ui.views import whatif, whatif_dspark
from ui.views.text import md_text
from ui.widgets import display, keys


def dspark(trace) -> None:
    st.markdown(
        "A DSpark round records its whole lattice with the drafter's calibrated scores ŝ, so the stage-1 DP "
        "can be re-run here for a shorter chain or any tree budget. **Forecast**: the DP's own expected "
        "accepted tokens (sum of survival products of ŝ) + 1. **Replayed** (temperature 0 only): the trace "
        "knows the target's greedy tokens for `accepted + 1` positions after each round's root, so another "
        "plan is re-verified exactly unless it matches that whole stretch (then it accepted at least that "
        "many: a lower bound, counted in *rounds at a lower bound*). No model runs here.")
    measured = whatif_dspark.measured(trace.steps)
    cols = st.columns(4)
    cols[0].metric("Rounds", f"{measured['rounds']:d}")
    cols[1].metric("Measured tokens / forward", f"{measured['tokens_per_forward']:.3f}")
    cols[2].metric("Plan in the trace", md_text(measured["select"]))
    cols[3].metric("Lattice positions (γ)", f"{measured['gamma']:d}")
    line = whatif_dspark.measured_vs_replayed(trace.steps)
    if line is not None:
        st.caption(md_text(line))
    budgets = st.multiselect("Tree budgets", [2, 4, 6, 8, 12, 16, 24, 32], default=[4, 8, 16],
                             key=keys.WHATIF_BUDGETS)
    table = whatif_dspark.sweep(trace.steps, range(1, measured["gamma"] + 1), sorted(budgets))
    display.plot(whatif_dspark.sweep_figure(table, measured), "wi.ds_sweep", "whatif-dspark-sweep")
    display.table(table, "wi.ds_table", "whatif-dspark-sweep")


def cost_caption(table, events) -> None:
    """For a cost-policy trace: the γ the recorded cost table makes fastest, against plain greedy."""
    note = whatif.cost_note(table, events)
    if note is not None:
        st.caption(note)
