"""What-if: from a recorded speculative trace (the playground's run or an uploaded one), expected
acceptance and tokens per target forward for other γ, next to what the trace measured. No model."""
import streamlit as st

from decoding.core.trace import MAX_TRACE_BYTES, TraceFormatError, from_json
from ui.views import made_with, whatif, whatif_dspark
from ui.views.text import md_text
from ui.widgets import display, guard, keys, whatif_panel

st.title("What-if: other γ or budgets from a recorded trace")
st.markdown(
    "Each recorded round holds, for every drafted position `i`, the probability `a_i` that the verifier "
    "accepts it given that all earlier drafts were accepted. At temperature 0 it is the round's **acceptance "
    "probability** (1 or 0: the draft token is or is not the target's argmax), as in the round's table and "
    "DSpark's stage 2; for a sampled trace it is **Σmin(p,q)** = `Σ_x min(p target(x), q draft(x))`, the "
    "chance before the draft is drawn (p target of the draft token for prompt lookup). "
    "**Assumption:** the positions' outcomes are independent given these recorded "
    "values, and the drafter would propose the same tokens at another γ. Then a round with γ drafts "
    "accepts on average `Σ_{k=1..γ} Π_{i≤k} a_i` of them, and emits one more token (residual or bonus) "
    "per target forward. A round that recorded fewer drafts than γ counts only those. No model runs here.")

sources = ["Playground run", "Upload a trace"]
source = st.segmented_control("Trace", sources, default=sources[0], key=keys.WHATIF_SOURCE) or sources[0]
trace = None
if source == sources[0]:
    run = st.session_state.get(keys.RUN)
    trace = run.trace() if run is not None and run.events else None
    if trace is None:
        st.info("Run the speculative or dspark strategy in the Playground first, or upload a trace.")
    else:                                     # the run follows the sidebar (a new one when it changes)
        made = st.session_state.get(keys.RUN_MADE_WITH, {})
        st.caption(md_text(f"From the Playground run ({len(run.events)} steps), made with: "
                           f"{made_with.line(made, ('strategy', 'seed', 'max new tokens', 'prompt'))}."))
else:
    upload = st.file_uploader("Upload a speculative or dspark trace (.json)", type=["json"],
                              key=guard.uploader_key(keys.WHATIF_UPLOAD))
    if upload is not None:
        if upload.size > MAX_TRACE_BYTES:
            st.error(f"{md_text(upload.name)} is {upload.size:d} bytes, over the {MAX_TRACE_BYTES} byte limit")
        else:
            try:
                st.session_state[keys.WHATIF_TRACE] = from_json(upload.getvalue())
            except TraceFormatError as err:
                st.session_state.pop(keys.WHATIF_TRACE, None)
                st.error(f"{md_text(upload.name)} is not a readable trace: {md_text(err)}")
    trace = st.session_state.get(keys.WHATIF_TRACE)
    if trace is not None:
        st.caption(md_text(f"From the uploaded trace: strategy {trace.strategy}, model "
                           f"{made_with.model_name(trace.model.get('name', '—'))}, prompt "
                           f"{made_with.short(trace.prompt_text)!r}, {len(trace.steps)} steps."))

if trace is not None and whatif_dspark.dspark_rounds(trace.steps):
    whatif_panel.dspark(trace)
    st.stop()
if trace is not None:
    rounds = whatif.spec_rounds(trace.steps)
    if not rounds:
        st.warning(f"This trace is from strategy {md_text(repr(trace.strategy))}; the what-if needs speculative or "
                   "dspark rounds.")
        st.stop()
    measured = whatif.measured(trace.steps)
    recorded = whatif.max_recorded(trace.steps)
    top = st.number_input("Largest γ to show", min_value=1, max_value=32, value=max(8, recorded), step=1,
                          key=keys.WHATIF_MAX_GAMMA)
    table = whatif.with_cost(whatif.sweep(trace.steps, range(1, int(top) + 1)), trace.steps)
    cols = st.columns(4)
    cols[0].metric("Rounds", md_text(measured["rounds"]))
    cols[1].metric("Measured tokens / forward", f"{measured['tokens_per_forward']:.3f}")
    rate = measured["acceptance_rate"]
    cols[2].metric("Measured acceptance rate", "—" if rate is None else f"{rate:.1%}")
    cols[3].metric("γ in the trace", md_text(", ".join(str(g) for g in measured["gammas"])))
    if recorded < int(top):
        st.caption(f"Rounds recorded at most {recorded:d} drafts; for larger γ the rows count only those "
                   "(see rounds with fewer drafts). Record more with the sidebar's gamma max.")
    if "expected_ms_per_token" in table:
        whatif_panel.cost_caption(table, trace.steps)
    display.plot(whatif.sweep_figure(table, measured), "wi.sweep", "whatif-sweep")
    display.table(table, "wi.table", "whatif-sweep")
