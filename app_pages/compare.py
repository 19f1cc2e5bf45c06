"""2-4 strategies on the same prompt and seed. The verdict first (token-identical to greedy, or where a lane
diverges, and why a lane is slower), then each lane's text (its drafting one toggle away), metrics with the
speedup vs greedy, tokens vs time, tokens per target forward, per-position acceptance."""
import streamlit as st

from decoding.core.config import CONFIGS
from decoding.core.errors import ConfigError
from ui.views import acceptance, figures, made_with, memory, tables, verdict
from ui.views.text import md_text
from ui.widgets import display, engine, keys, session, sidebar
from ui.widgets.params import build_config
from ui.widgets.waiting import with_waiting

settings = sidebar.current()
st.title("Compare")
st.caption("Each lane runs on the sidebar's model, prompt, seed and max new tokens. The lanes run in lockstep "
           "(one step of each in turn, after a warm-up forward), so the machine's slow spells fall on all alike.")


def is_lane_widget(key: str) -> bool:
    """The lane pickers' widget keys: the lane count, each lane's strategy and parameters (not uploads)."""
    return key == keys.LANES or (key.startswith("cmp") and (key.endswith(".strategy") or ".param." in key)
                                 and not key.endswith(".file"))


def restore_lanes() -> None:
    """Streamlit forgets a page's widgets while another page is on view; put back what they held."""
    for key, value in st.session_state.get(keys.COMPARE_KEPT, {}).items():
        st.session_state.setdefault(key, value)


def keep_lanes() -> None:
    st.session_state[keys.COMPARE_KEPT] = {k: st.session_state[k] for k in list(st.session_state.keys())
                                           if is_lane_widget(str(k))}


restore_lanes()
st.session_state.setdefault(keys.LANES, 2)
n_lanes = st.columns(4)[0].number_input("Lanes", min_value=2, max_value=4, step=1, key=keys.LANES)
names = list(CONFIGS)
lanes, errors = {}, []
cols = st.columns(int(n_lanes))
for i, col in enumerate(cols):
    with col:
        default = names[i % len(names)]
        st.session_state.setdefault(keys.lane_strategy(i), default)
        strategy = st.selectbox(f"Lane {i + 1:d}", names, key=keys.lane_strategy(i))
        with st.popover("Parameters", width="stretch"):     # the pickers stay one row high: the verdict shows
            params = sidebar.strategy_params(f"cmp{i}", strategy)
        try:
            lanes[f"{i + 1}: {strategy}"] = build_config(strategy, params, seed=settings.seed,
                                                         max_new_tokens=settings.max_new_tokens,
                                                         top_n=settings.top_n)
            st.caption(md_text(made_with.config_words(lanes[f"{i + 1}: {strategy}"])))
        except ConfigError as err:
            st.error(md_text(err))
            lanes[f"{i + 1}: {strategy}"] = None
            errors.append(i)
keep_lanes()
now = session.described(settings, {f"lane {label}": config for label, config in lanes.items()})

if st.button("Run the comparison", key=keys.COMPARE_RUN, type="primary", disabled=bool(errors)):
    lm = session.lm_or_stop(settings)
    prompt_ids = session.prompt_ids_or_stop(lm, settings)
    jobs = {label: (config, session.strategy_kwargs_or_stop(config, settings)) for label, config in lanes.items()}
    progress = st.progress(0.0, text=md_text(with_waiting("Running the lanes in lockstep…")))
    events = [0]

    def on_event(_label, _event) -> None:
        events[0] += 1
        turn = events[0] // len(jobs)
        progress.progress(min(1.0, turn / max(1, settings.max_new_tokens)),
                          text=md_text(with_waiting(f"Lockstep turn {turn}")))

    st.session_state[keys.COMPARE] = engine.run_lockstep(lm, prompt_ids, jobs, prompt_text=settings.prompt,
                                                  on_event=on_event)
    st.session_state[keys.COMPARE_MADE_WITH] = now
    progress.empty()

traces = st.session_state.get(keys.COMPARE)
if traces:
    for label, trace in traces.items():
        if trace.error:
            st.error(md_text(f"{label}: {session.shown(trace.error, settings)}"))
    traces = {label: trace for label, trace in traces.items() if trace.steps}   # refused lanes: message only


def show_verdict(traces: dict) -> None:
    """Which settings made the result (out of date when they changed), the verdict, why a lane is slower."""
    made = st.session_state.get(keys.COMPARE_MADE_WITH, {})
    stale = made_with.stale_line(made, now, "This comparison")
    if stale:
        st.warning(md_text(stale))
    else:
        st.caption(md_text("Made with: " + made_with.line(made, ("model", "prompt", "seed", "max new tokens"))))
    lines = verdict.verdict_lines(traces)
    box = st.success if all(v.identical for v in verdict.compare_verdicts(traces)) else st.info
    if lines:
        box("  \n".join(md_text(line) for line in lines))
    for line in verdict.slower_lines(traces):
        st.markdown(md_text(line))


if traces:
    show_verdict(traces)
    drafting = st.toggle("Show the drafting (rejected drafts struck through, accepted, residual and bonus marked)",
                         key=keys.COMPARE_DRAFTING)
    display.show_streams({label: trace.steps for label, trace in traces.items()}, drafting=drafting)
    st.subheader("Metrics")
    metrics = tables.metrics_table(traces)
    reference = tables.greedy_lane(traces)
    st.caption(f"speed vs greedy: tokens/s relative to lane {md_text(reference)}, time = the steps' measured timings."
               if reference else "speed vs greedy: no greedy lane to compare with — set one lane to greedy.")
    spread = verdict.range_line(traces)
    if spread:
        st.caption(md_text(spread))
    for i, part in enumerate(tables.METRICS_PARTS):
        display.table(metrics[list(part)], f"cmp.metrics{i}", f"compare-metrics-{i + 1}", words=tables.METRICS_HEADERS)
    display.plot(figures.tokens_vs_time({label: t.steps for label, t in traces.items()}), "cmp.time",
               "compare-tokens-vs-time")
    display.plot(figures.tokens_per_forward_bars(list(zip(metrics["lane"], metrics["tokens_per_forward"]))),
               "cmp.per_forward", "compare-tokens-per-forward")
    rates = {label: t.stats.per_position_acceptance for label, t in traces.items()}
    if any(rates.values()):
        counts = {label: acceptance.position_counts(t.steps) for label, t in traces.items()}
        display.plot(figures.per_position_lanes(rates, counts), "cmp.per_position", "compare-per-position-acceptance")
    held = memory.memory_figure({label: t.steps for label, t in traces.items()})
    if held is not None:
        display.plot(held, "cmp.memory", "compare-kv-cache")
