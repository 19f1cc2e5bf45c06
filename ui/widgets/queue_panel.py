"""The Lab's Queueing tab: P99 latency against load for a strategy and one k× faster per request, simulated
from one fixed service time (M/D/1) or from the decoding times measured in the Requests page's log; then the
same queue measured live on the sidebar's model (decoding/lab/queue_live.py) beside the simulation's P99 for
the service times it measured."""
from __future__ import annotations

from collections.abc import Iterator

import streamlit as st

from decoding.core.config import DSparkConfig, GreedyConfig, SpeculativeConfig
from decoding.core.live_queue import MAX_QUEUE_REQUESTS, LiveQueueConfig
from ui.views import queueing
from ui.views.text import md_text
from ui.widgets import display, engine, lab_panels, requests_panel
from ui.widgets.params import Settings

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


def queue_panel(settings: Settings) -> None:
    st.caption("One request decodes at a time, as `python -m decoding serve` does; requests arrive at random "
               "(Poisson) at a rate given as a share of the slower strategy's capacity. Simulated, seeded, 4,000 "
               "requests per point (Lindley's recursion); measured live further down.")
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
    live_panel(settings)


FASTER = {"DSpark (its default drafting)": lambda n: DSparkConfig(max_new_tokens=n),
          "Speculative, prompt lookup": lambda n: SpeculativeConfig(max_new_tokens=n, draft="lookup")}
# A prompt whose answer copies from it: drafts are accepted, so both faster strategies are (on the embedded model,
# 16 tokens, 2-core CPU: DSpark 1.75×, prompt lookup 2.1× greedy); on the sidebar's default prompt neither is.
COPYING = ("Repeat this sentence exactly: the quick brown fox jumps over the lazy dog near the quiet river bank "
           "at dawn.")
PROMPTS = ("A sentence to repeat (drafts are accepted)", "The sidebar's prompt")


def live_panel(settings: Settings) -> None:
    st.subheader("Measured live on this model")
    st.caption("Greedy and a faster strategy decode one prompt: each a few times alone (its service "
               "time), then requests arrive at seeded random (Poisson) times at the chosen share of greedy's "
               "capacity into one first-come queue that decodes one at a time — the same arrival times for both. "
               "Tens of seconds on the embedded model; other sessions on this server share the engine and make "
               "the queue longer.")
    which = st.radio("Requests' prompt", PROMPTS, key="lab.q.live.prompt", horizontal=True,
                     help=f"A strategy is faster only where its drafts are accepted. The sentence: {COPYING!r}")
    prompt = COPYING if which == PROMPTS[0] else settings.prompt
    cols = st.columns(4)
    faster = cols[0].selectbox("Faster strategy", list(FASTER), key="lab.q.live.faster")
    load = cols[1].number_input("Load (% of greedy's capacity)", 10, 200, 80, 5, key="lab.q.live.load")
    requests = cols[2].number_input("Requests per strategy", 5, MAX_QUEUE_REQUESTS, 20, key="lab.q.live.requests")
    tokens = cols[3].number_input("New tokens per request", 4, 32, 16, key="lab.q.live.tokens")
    config = lab_panels._config_or_error(lambda: LiveQueueConfig(load=load / 100, requests=int(requests)))
    if config is None:
        return
    strategies = (GreedyConfig(max_new_tokens=int(tokens)), FASTER[faster](int(tokens)))
    clicked = st.button("Measure live on this model", key="lab.q.live.run", type="primary")
    words = (("requests' prompt", which), ("faster strategy", faster), ("load", f"{load}%"),
             ("requests per strategy", config.requests), ("new tokens per request", int(tokens)), ("seed", config.seed))
    measurement = lab_panels.Measurement(("queue-live", prompt, settings.chat_template, config, strategies),
                                         config.events(len(strategies)),
                                         lambda lm: _live(lm, prompt, settings.chat_template, strategies, config),
                                         words, reads_prompt=prompt == settings.prompt, on_engine=False)
    events = lab_panels._measured(settings, measurement, clicked)
    if events is None:
        st.caption("Not measured yet for this model, prompt and these settings.")
        return
    result = events[-1]
    display.table(queueing.live_table(result), "lab.q.live.table", "queueing-live")
    st.caption(md_text(queueing.live_rates(result)))
    st.markdown(md_text(queueing.live_sentence(result)))
    display.plot(queueing.live_figure(result), "lab.q.live.fig", "queueing-live")


def _live(lm, prompt: str, chat_template: bool, strategies: tuple, config: LiveQueueConfig) -> Iterator:
    return engine.measure_queue(lm, lm.encode(prompt, chat_template=chat_template), strategies, config)
