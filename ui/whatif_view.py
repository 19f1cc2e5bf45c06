"""Streamlit section of the what-if page for DSpark traces (numbers from ui/whatif_dspark, no model)."""
from __future__ import annotations

import streamlit as st

from ui import keys, views, whatif, whatif_dspark


def dspark(trace) -> None:
    st.markdown(
        "A DSpark round records its whole lattice with the drafter's calibrated scores ŝ, so the stage-1 DP "
        "can be re-run here for a shorter chain or any tree budget. **Forecast**: the DP's own expected "
        "accepted tokens (sum of survival products of ŝ) + 1. **Replayed** (temperature 0 only): the trace "
        "knows the target's greedy tokens for `accepted + 1` positions after each round's root, so another "
        "plan is re-verified exactly unless it matches that whole stretch (then it accepted at least that "
        "many: a lower bound, counted in `lower_bound_rounds`). No model runs here.")
    measured = whatif_dspark.measured(trace.steps)
    cols = st.columns(4)
    cols[0].metric("Rounds", measured["rounds"])
    cols[1].metric("Measured tokens / forward", f"{measured['tokens_per_forward']:.3f}")
    cols[2].metric("Plan in the trace", measured["select"])
    cols[3].metric("Lattice positions (γ)", measured["gamma"])
    budgets = st.multiselect("Tree budgets", [2, 4, 6, 8, 12, 16, 24, 32], default=[4, 8, 16],
                             key=keys.WHATIF_BUDGETS)
    table = whatif_dspark.sweep(trace.steps, range(1, measured["gamma"] + 1), sorted(budgets))
    views.plot(whatif_dspark.sweep_figure(table, measured), "wi.ds_sweep", "whatif-dspark-sweep")
    views.table(table, "wi.ds_table", "whatif-dspark-sweep")


def cost_caption(table, events) -> None:
    """For a cost-policy trace: the γ the recorded cost table makes fastest, against plain greedy."""
    priced = table.dropna(subset=["expected_ms_per_token"])
    if priced.empty:
        return
    best = priced.loc[priced["expected_ms_per_token"].idxmin()]
    greedy_ms = whatif.recorded_cost(events)[0][0]
    st.caption(f"With the cost table this trace recorded (`expected_ms_per_token`): the fastest fixed γ would be "
               f"{int(best['gamma'])} at {best['expected_ms_per_token']:.1f} ms per token; plain greedy costs "
               f"{greedy_ms:.1f} ms per token (one 1-token forward). Bookkeeping outside the forwards is not counted.")
