"""The Lab's panels: each measurement's controls, its progress bar, its result cached per model, device
and settings in the session (measured again on request), and its views (ui/views/lab.py). Each result says
which settings made it (ui/views/made_with.py); when they change, the section's last result stays on view
under an out-of-date note until Measure runs again, as the Playground's and Compare's results do."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import streamlit as st

from decoding.core.errors import ConfigError
from decoding.core.measures import (
    ALL_BATCHES,
    ALL_TOKENS,
    FEW_BATCHES,
    FEW_TOKENS,
    THROUGHPUT_BATCHES,
    CostConfig,
    LosslessConfig,
    ThroughputConfig,
)
from ui.views import acceptance, lab, lossless, made_with, memory
from ui.views.text import md_text
from ui.widgets import display, engine, keys, session
from ui.widgets.params import Settings
from ui.widgets.waiting import with_waiting

MEASURE_ERRORS = (ConfigError, RuntimeError, ValueError, MemoryError)
LAB_RESULTS = 12     # measurements a session keeps (the newest; each section's settings and model make a key)


@dataclass(frozen=True)
class Measurement:
    """One section's measurement: what its result is kept under (the section, its settings; the model is
    added), how many events it yields (for the progress bar), and how to start it on a loaded model."""
    key: tuple
    total: int
    start: Callable[[object], Iterator]
    settings: tuple = ()             # (its widgets' words, value) pairs, for the line that says what made it
    reads_prompt: bool = False       # whether it runs on the sidebar's prompt
    on_engine: bool = True           # False: it sends its own steps to the engine thread (the live queue waits
    #                                  between requests, and must not hold the engine thread while it waits)


def _made(settings: Settings, measurement: Measurement) -> dict[str, str]:
    return made_with.measured_with(model=settings.model, device=settings.device, dtype=settings.dtype,
                                   prompt=settings.prompt if measurement.reads_prompt else None,
                                   chat_template=settings.chat_template, settings=dict(measurement.settings))


def _measured(settings: Settings, measurement: Measurement, clicked: bool) -> list | None:
    """The measurement's events for the sidebar's model, with a line saying which settings made them: from
    the session's cache, or measured now when `clicked` (a progress bar per event). Not measured for these
    settings: the section's last result under an out-of-date note, else None (as when the measurement failed:
    its one-line error is shown)."""
    events = _measure(settings, measurement, clicked)
    made, now = _made(settings, measurement), st.session_state.setdefault(keys.LAB_MADE, {})
    if events is not None:
        now[measurement.key[0]] = ((*measurement.key, settings.model_key()), made)
        st.caption(md_text(f"Made with: {made_with.line(made)}."))
        return events
    old_key, old_made = now.get(measurement.key[0], (None, None))
    old = st.session_state.get(keys.LAB, {}).get(old_key)
    if old is not None:
        st.warning(md_text(made_with.stale_line(old_made, made, "The result below", "press Measure for these")
                           or "The result below was made with other model options; press Measure for these."))
    return old


def _measure(settings: Settings, measurement: Measurement, clicked: bool) -> list | None:
    """The events kept for these settings, measured first when `clicked`; None when there are none."""
    store = st.session_state.setdefault(keys.LAB, {})
    key = (*measurement.key, settings.model_key())
    if clicked:
        lm = session.lm_or_stop(settings)
        total = measurement.total
        progress = st.progress(0.0, text=md_text(with_waiting("Measuring…")))
        events = []
        try:
            source = measurement.start(lm)
            for event in engine.ENGINE.steps(source) if measurement.on_engine else source:
                events.append(event)
                progress.progress(min(1.0, len(events) / total),
                                  text=md_text(with_waiting(f"Measured {len(events)} of {total:d}")))
        except MEASURE_ERRORS as err:
            progress.empty()
            store.pop(key, None)
            st.error(md_text(session.shown(str(err).splitlines()[0] if str(err) else type(err).__name__, settings)))
            return None
        progress.empty()
        keep_newest(store, key, events)
    return store.get(key)


def keep_newest(store: dict, key, value, most: int = LAB_RESULTS) -> None:
    """store[key] = value as the newest entry, the oldest dropped beyond `most`."""
    store.pop(key, None)
    store[key] = value
    for old in list(store)[:-most]:
        del store[old]


def _config_or_error(build: Callable[[], object]):
    try:
        return build()
    except ConfigError as err:
        st.error(md_text(err))
        return None


def cost_panel(settings: Settings) -> None:
    st.subheader("Cost of a forward")
    st.caption("The model's forward timed now on the sidebar's model and device: over n new tokens after a cached "
               "prefix (what verifying n − 1 drafts costs), and over b sequences of one token each (a batch). "
               "Beside it the roofline: the least time the device's measured bandwidth and arithmetic rate allow.")
    cols = st.columns([3, 3, 1, 1])
    st.session_state.setdefault(keys.LAB_TOKENS, lab.points_text(FEW_TOKENS))
    st.session_state.setdefault(keys.LAB_BATCHES, lab.points_text(FEW_BATCHES))
    if cols[3].button("All points", key=f"{keys.LAB_COST_RUN}.all", help="n = 1 … 64 and b = 1 … 64: a minute or "
                      "more on a CPU"):
        st.session_state[keys.LAB_TOKENS] = lab.points_text(ALL_TOKENS)
        st.session_state[keys.LAB_BATCHES] = lab.points_text(ALL_BATCHES)
    tokens = cols[0].text_input("n: new tokens per forward", key=keys.LAB_TOKENS)
    batches = cols[1].text_input("b: sequences per forward", key=keys.LAB_BATCHES)
    repeats = cols[2].number_input("Repeats", min_value=1, max_value=50, value=5, key=keys.LAB_REPEATS,
                                   help=f"Timed forwards per point: the median is shown with its spread; "
                                        f"flat or steep is named only from {lab.MIN_REPEATS} repeats on")
    config = _config_or_error(lambda: CostConfig(tokens=lab.parse_points(tokens, "tokens"),
                                                 batches=lab.parse_points(batches, "batches"), repeats=int(repeats)))
    if config is None:
        return
    clicked = st.button("Measure", key=keys.LAB_COST_RUN, type="primary")
    picked = (("n", _points(config.tokens)), ("b", _points(config.batches)), ("repeats", config.repeats))
    measurement = Measurement(("cost", config), config.points, lambda lm: engine.measure_cost(lm, config), picked)
    events = _measured(settings, measurement, clicked)
    if events is None:
        st.caption("Not measured yet for this model, device and these points.")
        return
    report = lab.cost_report(events, config.prefix_tokens)
    st.markdown(lab.regime(report))
    display.plot(lab.cost_figure(report), "lab.cost", "lab-cost-of-a-forward")
    table = lab.rounded(lab.cost_table(report))
    display.table(table[lab.KEY_COST_COLUMNS], "lab.cost_table", "lab-cost-of-a-forward")
    with st.expander("The roofline's work per point (GFLOP, MB read, FLOP per byte)"):
        display.table(table, "lab.cost_table_all", "lab-cost-of-a-forward-all")
    st.markdown("**What it means for speculative decoding** — a round verifies γ drafts in one forward over γ + 1 "
                "tokens; with a drafter that costs nothing it beats greedy when it emits more tokens per round than "
                "the forward costs in one-token forwards.")
    display.table(lab.rounded(lab.speculation_table(report)), "lab.spec_table", "lab-speculation-break-even")
    st.markdown("**The device and the model**")
    display.table(lab.device_table(report), "lab.device_table", "lab-device")


def throughput_panel(settings: Settings) -> None:
    st.subheader("Throughput against latency")
    st.caption("Greedy decoding of b copies of the sidebar's prompt at once, each step timed: a batch emits b tokens "
               "per step, and every request in it waits for the whole step.")
    cols = st.columns([3, 1, 1])
    st.session_state.setdefault(keys.LAB_TP_BATCHES, lab.points_text(THROUGHPUT_BATCHES))
    if cols[2].button("All points", key=f"{keys.LAB_TP_RUN}.all", help="b = 1 … 64: a minute or more on a CPU"):
        st.session_state[keys.LAB_TP_BATCHES] = lab.points_text(ALL_BATCHES)
    batches = cols[0].text_input("b: batch sizes", key=keys.LAB_TP_BATCHES)
    steps = cols[1].number_input("Steps", min_value=1, max_value=256, value=5, key=keys.LAB_TP_STEPS)
    config = _config_or_error(lambda: ThroughputConfig(batches=lab.parse_points(batches, "batches"),
                                                       steps=int(steps)))
    if config is None:
        return
    clicked = st.button("Measure", key=keys.LAB_TP_RUN, type="primary")
    events = _measured(settings, Measurement(("throughput", settings.prompt, settings.chat_template, config),
                                             len(config.batches), lambda lm: _throughput(lm, settings, config),
                                             (("b", _points(config.batches)), ("steps", config.steps)), True),
                       clicked)
    if events is None:
        st.caption("Not measured yet for this model, device, prompt and these points.")
        return
    st.markdown(lab.tradeoff(events))
    display.plot(lab.throughput_figure(events), "lab.throughput", "lab-throughput-latency")
    display.table(lab.rounded(lab.throughput_table(events)), "lab.throughput_table", "lab-throughput-latency")


def _throughput(lm, settings: Settings, config: ThroughputConfig) -> Iterator:
    prompt_ids = lm.encode(settings.prompt, chat_template=settings.chat_template)
    return engine.measure_throughput(lm, prompt_ids, config)


def acceptance_panel(settings: Settings) -> None:
    st.subheader("Acceptance at a glance")
    st.caption("Every verification round of a speculative or DSpark trace: which draft positions were accepted, "
               "rejected, or not reached because an earlier one was rejected — where drafting pays off.")
    events = _trace_events(keys.LAB_ACC_SOURCE, settings)
    if events is None:
        return
    fig = acceptance.heatmap(events)
    if fig is None:
        st.info("This trace verified no drafts: run speculative decoding or DSpark.")
        return
    display.plot(fig, "lab.acceptance", "lab-acceptance-heatmap")
    display.table(acceptance.position_table(events), "lab.acceptance_table", "lab-acceptance-per-position")
    by_entropy = acceptance.entropy_figure(events)
    if by_entropy is None:
        st.caption("Acceptance against the target's entropy needs a trace recorded with schema 1.3 or later.")
        return
    st.caption("Where the target is sure (low entropy) a draft that agrees with it is accepted; where it hesitates, "
               "drafts are rejected more often. Each point is a draft the target judged.")
    display.plot(by_entropy, "lab.acceptance_entropy", "lab-acceptance-entropy")


def memory_panel(settings: Settings) -> None:
    st.subheader("Memory")
    st.caption("The target's KV cache after every step of a trace: it grows by one position per token and "
               "sequence, beam search holds one copy per beam, and a speculative or DSpark round holds its drafts "
               "until the rejected ones are rolled back. Compare draws one line per lane.")
    events = _trace_events(keys.LAB_MEM_SOURCE, settings)
    if events is None:
        return
    st.markdown(memory.memory_summary(events))
    fig = memory.memory_figure({"this trace": events})
    if fig is not None:
        display.plot(fig, "lab.memory", "lab-kv-cache")
        display.table(lab.rounded(memory.memory_table(events)), "lab.memory_table", "lab-kv-cache")


PLAYGROUND_RUN, REPLAYED = "the Playground's run", "the trace replayed on the Traces page"


def _trace_events(key: str, settings: Settings) -> list | None:
    """The events of the trace the user picks (the Playground's run, the trace replayed on the Traces
    page), with a line saying what made it; None, with a note, when there is neither."""
    sources = {}
    run = st.session_state.get(keys.RUN)
    if run is not None and run.events:
        sources[PLAYGROUND_RUN] = list(run.events)    # a copy: a run's last chunk may still append
    replay = st.session_state.get(keys.REPLAY)
    if replay is not None:
        sources[REPLAYED] = replay.steps
    if not sources:
        st.caption("Run something in the Playground, or replay a trace on the Traces page.")
        return None
    chosen = st.radio("Trace", list(sources), format_func=md_text, horizontal=True, key=key)
    _trace_made_with(chosen, replay, settings)
    return sources[chosen]


def _trace_made_with(chosen: str, replay, settings: Settings) -> None:
    """Which settings made the trace on view: the Playground run's (out of date once the sidebar changed: the
    Playground starts a fresh run on its next visit), or the replayed trace's own."""
    if chosen == REPLAYED:
        st.caption(md_text(f"From the replayed trace: strategy {replay.strategy}, model "
                           f"{made_with.model_name(replay.model.get('name', '—'))}, prompt "
                           f"{made_with.short(replay.prompt_text)!r}, {len(replay.steps)} steps."))
        return
    made = st.session_state.get(keys.RUN_MADE_WITH, {})
    stale = made_with.stale_line(made, session.described(settings), "The Playground's run",
                                 "run it again in the Playground") if settings.config is not None else None
    if stale:
        st.warning(md_text(stale))
    else:
        st.caption(md_text("From the Playground's run, made with: "
                           f"{made_with.line(made, ('strategy', 'seed', 'max new tokens', 'prompt'))}."))


def lossless_panel(settings: Settings) -> None:
    st.subheader("Losslessness")
    st.caption("The next token after the sidebar's prompt: the target's distribution p target under the settings "
               "below, a draft distribution q draft (the same model under the draft's temperature and top-k — any "
               "draft would do, the exact rules do not care), and what each acceptance rule makes of them: computed "
               "exactly, and sampled in seeded rounds of the engine's own code with a χ² test against p target. "
               f"Cut-off (significance level): {lossless.SIGNIFICANCE:g} — a p-value below it says the samples "
               "disagree with p target.")
    cols = st.columns(4)
    temperature = cols[0].number_input("Temperature", 0.05, 10.0, 1.0, 0.1, key=keys.LAB_LL_TEMP)
    top_k = cols[1].number_input("Top-k", 1, 50, 8, key=keys.LAB_LL_TOPK)
    draft_temperature = cols[2].number_input("Draft temperature", 0.05, 10.0, 2.0, 0.1, key=keys.LAB_LL_DTEMP)
    draft_top_k = cols[3].number_input("Draft top-k", 1, 50, 8, key=keys.LAB_LL_DTOPK)
    cols = st.columns(4)
    candidates = cols[0].number_input("DSpark candidates", 1, 8, 2, key=keys.LAB_LL_CANDS)
    threshold = cols[1].number_input("Lossy threshold", 0.01, 0.99, 0.1, 0.01, key=keys.LAB_LL_THRESHOLD)
    samples = cols[2].number_input("Samples per rule", 0, 100_000, 2000, 500, key=keys.LAB_LL_SAMPLES)
    seed = cols[3].number_input("Seed", 0, 2**31, 0, key=keys.LAB_LL_SEED)
    config = _config_or_error(lambda: LosslessConfig(
        temperature=float(temperature), top_k=int(top_k), draft_temperature=float(draft_temperature),
        draft_top_k=int(draft_top_k), candidates=int(candidates), lossy_threshold=float(threshold),
        samples=int(samples), seed=int(seed)))
    if config is not None:
        clicked = st.button("Measure", key=keys.LAB_LL_RUN, type="primary")
        events = _measured(settings, Measurement(("lossless", settings.prompt, settings.chat_template, config), 1,
                                                 lambda lm: _lossless(lm, settings, config), _lossless_words(config),
                                                 True), clicked)
        if events is None:
            st.caption("Not measured yet for this model, device, prompt and these settings.")
        else:
            result = events[0]
            display.table(lab.rounded(lossless.rules_table(result)), "lab.lossless_table", "lab-losslessness")
            display.plot(lossless.distribution_figure(result), "lab.lossless_exact", "lab-losslessness-exact")
            display.plot(lossless.samples_figure(result), "lab.lossless_samples", "lab-losslessness-samples")
    st.markdown("**The worked example** (the DSpark paper's Appendix A, computed now in fractions): p target = "
                "(0.7, 0.3) over tokens A and B, q draft = (0.5, 0.5). A plan that keeps, of two drafts, the one "
                "the target will like better has looked at the verdict: it moves p target to (0.85, 0.15).")
    display.table(lossless.worked_example(), "lab.lossless_example", "lab-losslessness-worked-example")


def _lossless_words(config: LosslessConfig) -> tuple:
    """The losslessness settings under their widgets' words."""
    return (("temperature", config.temperature), ("top-k", config.top_k),
            ("draft temperature", config.draft_temperature), ("draft top-k", config.draft_top_k),
            ("DSpark candidates", config.candidates), ("lossy threshold", config.lossy_threshold),
            ("samples per rule", config.samples), ("seed", config.seed))


def _points(points) -> str:
    return ", ".join(str(p) for p in points)


def _lossless(lm, settings: Settings, config: LosslessConfig) -> Iterator:
    prompt_ids = lm.encode(settings.prompt, chat_template=settings.chat_template)
    yield engine.measure_lossless(lm, prompt_ids, config)
