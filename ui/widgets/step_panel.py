"""The step panel on view: each step kind has its panel (STEP_PANELS, keyed by the event's `kind`), so new
strategies add theirs with register_panel; greedy / sampling's token panel is here, the others in
ui/widgets/strategy_panels.py. Numbers all come from the events."""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import streamlit as st

from decoding.core.errors import ConfigError
from ui.views import figures, tables
from ui.views.chips import token_box_html
from ui.views.headers import header, help_for
from ui.views.text import md_text
from ui.widgets import display, forcing
from ui.widgets.keys import FLASH


@dataclass(frozen=True)
class ViewContext:
    prefix: str                                        # widget-key prefix of this view
    # (step index, forced ids: every token after the prompt, the chosen one last; see ui.widgets.forcing)
    # -> branch; None in replays
    on_force: Callable[[int, Sequence[int]], None] | None = None
    events: Sequence = ()                              # the steps up to the one on view (set by show_step)


def token_panel(step, ctx: ViewContext) -> None:
    """Greedy / sampling: candidates raw vs processed, filter cuts, the draw, entropy."""
    p_chosen = math.exp(step.chosen_logprob) if math.isfinite(step.chosen_logprob) else 0.0
    cols = st.columns([1.3, 1, 0.9, 1.2, 1.5, 1])    # the entropy labels are the longest (1280 px: no overlap)
    with cols[0]:
        st.html(token_box_html(step.chosen_piece, step.chosen_id, "⚑ forced" if step.forced else ""))
    cols[1].metric("p processed", f"{p_chosen:.4f}" if p_chosen >= 1e-3 else f"{p_chosen:.1e}")
    cols[2].metric("Raw rank", f"{step.chosen_rank + 1:d}", help=md_text(help_for("raw rank")))
    raw, processed = header("entropy_raw"), header("entropy_processed")
    cols[3].metric(md_text(raw), f"{tables.nats(step.entropy_raw):.3g}", help=md_text(help_for(raw)))
    cols[4].metric(md_text(processed), f"{tables.nats(step.entropy_processed):.3g}", help=md_text(help_for(processed)))
    cols[5].metric("Draw u", "argmax" if step.draw is None else f"{step.draw:.4f}")
    display.plot(figures.probability_bars(step), f"{ctx.prefix}.bars", f"step{step.index}-candidates")
    cuts = [c for c in step.filters if c.name != "temperature" or c.value != 1.0]
    if cuts:
        st.caption("Filter cuts (mass under the temperature-scaled distribution)")
        display.table(tables.filters_table(step), f"{ctx.prefix}.filters", f"step{step.index}-filters")
    _draw_view(step, ctx)
    box, shown = display.lazy_expander("Candidates table", f"{ctx.prefix}.cands_open")
    if shown:                           # drawn only while open: a Step does not send a hidden table
        with box:
            display.table(tables.candidates_table(step), f"{ctx.prefix}.cands", f"step{step.index}-candidates")
    if ctx.on_force is not None:
        _force_widget(step, ctx)


def _draw_view(step, ctx: ViewContext) -> None:
    if step.draw is None:
        return
    fig = figures.draw_cdf(step)
    if fig is None:
        st.caption(f"Draw u = {step.draw:.4f}. The inverse CDF runs over the whole vocabulary in id order; "
                   f"the recorded top-{len(step.processed_top)} hold {figures.kept_coverage(step):.1%} of the "
                   "kept mass, so the CDF is drawn only when they hold all of it (set top-k ≤ top-N).")
        return
    display.plot(fig, f"{ctx.prefix}.draw", f"step{step.index}-draw")


def _force_widget(step, ctx: ViewContext) -> None:
    options = list(range(len(step.raw_top)))
    labels = {i: forcing.token_label(step, i) for i in options}      # rank from 1, as the candidates table
    c1, c2 = st.columns([3, 1], vertical_alignment="bottom")
    pick_key = f"{ctx.prefix}.force_pick"
    follow_step(ctx, step.index, pick_key)
    pick(c1, "Force a candidate at this step", pick_key, options, labels)
    force_button(c2, ctx, step.index, lambda: forcing.token_forced(
        ctx.events, step.index, step.raw_top[st.session_state[pick_key]].token_id),
        "The branch keeps the steps before this one, emits the chosen token here and continues")


def pick(where, label: str, key: str, options: list, labels: dict):
    """A select box whose stored value may be stale (options change with the step or the position): the first
    option then, set through the session state so that the browser shows it too. (Only dropping the stale value
    left the browser showing the old step's label, e.g. a beam candidate of step 3 over step 2's list, while
    the server took the first option.)"""
    if st.session_state.get(key) not in options:
        st.session_state[key] = options[0]
    return where.selectbox(md_text(label), options, format_func=labels.get, key=key)


def follow_step(ctx: ViewContext, at: int, *pick_keys: str) -> None:
    """Force pickers follow the step on view: a choice made at another step is dropped, never carried over
    (the same rank or position means another token at another step)."""
    seen_key = f"{ctx.prefix}.force_for"
    if st.session_state.get(seen_key) != at:
        for key in pick_keys:
            st.session_state.pop(key, None)
        st.session_state[seen_key] = at


def force_button(where, ctx: ViewContext, at: int, forced_of: Callable[[], list[int]], help: str) -> None:
    """The "Force & branch" button: on click (a callback, so the branch shows at once) it computes the
    forced ids with `forced_of` and branches at step `at`; a refusal becomes a one-line message."""
    def on_click() -> None:
        try:
            forced = forced_of()
        except ConfigError as err:
            st.session_state[FLASH] = ("error", str(err))
            return
        ctx.on_force(at, forced)

    where.button("Force & branch", key=f"{ctx.prefix}.force", on_click=on_click, help=md_text(help))


def generic_panel(step, ctx: ViewContext) -> None:
    st.info(f"No panel for step kind {md_text(repr(getattr(step, 'kind', '?')))} yet; its fields:")
    st.json({k: v for k, v in vars(step).items() if k != "timings_ms"}, expanded=False)


STEP_PANELS: dict[str, Callable[[object, ViewContext], None]] = {"token": token_panel}


def register_panel(kind: str, panel: Callable[[object, ViewContext], None]) -> None:
    STEP_PANELS[kind] = panel


def show_step(events: Sequence, cursor: int, ctx: ViewContext) -> None:
    """The panel of step `cursor`, its timing waterfall, and the running metrics up to it."""
    event = events[cursor]
    ctx = replace(ctx, events=tuple(events[: cursor + 1]))
    STEP_PANELS.get(getattr(event, "kind", ""), generic_panel)(event, ctx)
    timings = getattr(event, "timings_ms", None)
    if timings:
        display.plot(figures.timing_waterfall(timings), f"{ctx.prefix}.timing", f"step{cursor}-timing")


def show_all_steps(events: Sequence, ctx: ViewContext, name: str) -> None:
    display.table(tables.steps_table(events), f"{ctx.prefix}.steps", f"{name}-steps", words=tables.STEPS_HEADERS)
