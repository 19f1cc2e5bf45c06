"""Streamlit views of a trace's events. Each step kind has its panel (STEP_PANELS, keyed by the event's
`kind`), so new strategies add theirs with register_panel. Numbers all come from the events."""
from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import streamlit as st

from decoding.core.errors import ConfigError
from ui import figures, forcing, tables
from ui.chips import (
    chips_for,
    chips_html,
    first_divergence,
    last_chips,
    legend_html,
    name_forced,
    origins_present,
    token_box_html,
    visible,
)
from ui.keys import FLASH
from ui.svg import figure_svg


@dataclass(frozen=True)
class ViewContext:
    prefix: str                                        # widget-key prefix of this view
    # (step index, forced ids: every token after the prompt, the chosen one last; see ui.forcing)
    # -> branch; None in replays
    on_force: Callable[[int, Sequence[int]], None] | None = None
    events: Sequence = ()                              # the steps up to the one on view (set by show_step)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text)[:60]


def plot(fig, key: str, filename: str) -> None:
    """A plotly chart with margins fixed here (figures.fixed_margins): its modebar's camera saves PNG;
    the button under it saves SVG, drawn by ui/svg.py only when clicked (kaleido is not installed, so
    plotly cannot export offline)."""
    st.plotly_chart(figures.fixed_margins(fig), key=key, config={"displaylogo": False,
                                          "toImageButtonOptions": {"format": "png", "filename": _slug(filename),
                                                                   "scale": 2}})
    st.download_button("SVG", lambda: figure_svg(fig), file_name=f"{_slug(filename)}.svg", mime="image/svg+xml",
                       key=f"{key}.svg", on_click="ignore", type="tertiary", icon=":material/download:",
                       help="Download this chart as SVG (PNG: the camera in the chart's toolbar)")


def table(df, key: str, filename: str, label: str = "Download CSV") -> None:
    st.dataframe(df, hide_index=True, key=f"{key}.df")
    st.download_button(label, df.to_csv(index=False), file_name=f"{_slug(filename)}.csv", mime="text/csv",
                       key=f"{key}.csv", on_click="ignore")


def show_chips(events: Sequence, current_step: int | None = None, diverge_at: int | None = None,
               legend: Sequence[str] | None = None, keep: int | None = None) -> None:
    """The output as chips; the legend lists the origins present unless `legend` names them. `keep`:
    only the last chips (a long run in progress redraws them every chunk), with a note of the rest."""
    chips = chips_for(events)
    st.html(legend_html(legend if legend is not None else origins_present(chips, ("target", "forced"))))
    shown, note = last_chips(chips, keep if diverge_at is None else None)
    st.html(chips_html(shown, current_step=current_step, diverge_at=diverge_at, prefix=note))


def show_metrics(events: Sequence) -> None:
    m = tables.running_metrics(events)
    cols = st.columns(4)
    cols[0].metric("Tokens", m["tokens"])
    cols[1].metric("Target forwards", m["target_forwards"])
    cols[2].metric("Model time", f"{m['model_ms']:.0f} ms")
    cols[3].metric("Tokens/s", f"{m['tokens_per_s']:.1f}")


# ---------------------------------------------------------------- per-step panels

def token_panel(step, ctx: ViewContext) -> None:
    """Greedy / sampling: candidates raw vs processed, filter cuts, the draw, entropy."""
    p_chosen = math.exp(step.chosen_logprob) if math.isfinite(step.chosen_logprob) else 0.0
    cols = st.columns(6)
    with cols[0]:
        st.html(token_box_html(step.chosen_piece, step.chosen_id, "⚑ forced" if step.forced else ""))
    cols[1].metric("p processed", f"{p_chosen:.4f}" if p_chosen >= 1e-3 else f"{p_chosen:.1e}")
    cols[2].metric("Raw rank", step.chosen_rank)
    cols[3].metric("Entropy raw", f"{step.entropy_raw:.3g}", help="nats, before any processing")
    cols[4].metric("Entropy processed", f"{step.entropy_processed:.3g}", help="nats, after the filters")
    cols[5].metric("Draw u", "argmax" if step.draw is None else f"{step.draw:.4f}")
    plot(figures.probability_bars(step), f"{ctx.prefix}.bars", f"step{step.index}-candidates")
    cuts = [c for c in step.filters if c.name != "temperature" or c.value != 1.0]
    if cuts:
        st.caption("Filter cuts (mass under the temperature-scaled distribution)")
        table(tables.filters_table(step), f"{ctx.prefix}.filters", f"step{step.index}-filters")
    _draw_view(step, ctx)
    with st.expander("Candidates table"):
        table(tables.candidates_table(step), f"{ctx.prefix}.cands", f"step{step.index}-candidates")
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
    plot(fig, f"{ctx.prefix}.draw", f"step{step.index}-draw")


def _force_widget(step, ctx: ViewContext) -> None:
    options = list(range(len(step.raw_top)))
    labels = {i: f"{i}: {visible(c.piece)!r} (id {c.token_id}, raw p {c.prob:.3g})"
              for i, c in enumerate(step.raw_top)}
    c1, c2 = st.columns([3, 1], vertical_alignment="bottom")
    pick_key = f"{ctx.prefix}.force_pick"
    c1.selectbox("Force a candidate at this step", options, format_func=labels.get, key=pick_key)
    force_button(c2, ctx, step.index, lambda: forcing.token_forced(
        ctx.events, step.index, step.raw_top[st.session_state[pick_key]].token_id),
        "The branch keeps the steps before this one, emits the chosen token here and continues")


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

    where.button("Force & branch", key=f"{ctx.prefix}.force", on_click=on_click, help=help)


def generic_panel(step, ctx: ViewContext) -> None:
    st.info(f"No panel for step kind {getattr(step, 'kind', '?')!r} yet; its fields:")
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
        plot(figures.timing_waterfall(timings), f"{ctx.prefix}.timing", f"step{cursor}-timing")


def show_all_steps(events: Sequence, ctx: ViewContext, name: str) -> None:
    table(tables.steps_table(events), f"{ctx.prefix}.steps", f"{name}-steps")


def show_streams(lanes: dict[str, Sequence], legend: Sequence[str] | None = None,
                 piece_of: Callable[[int], str] | None = None) -> None:
    """Token streams side by side; each lane after the first marks its first divergence from the first.
    `piece_of` (token id -> text) names forced tokens whose events carry no text for them."""
    if legend is None:
        legend = origins_present([c for events in lanes.values() for c in chips_for(events)], ("target", "forced"))
    st.html(legend_html(legend))
    labels = list(lanes)
    base = tables.emitted_stream(lanes[labels[0]]) if labels else []
    cols = st.columns(len(labels))
    for col, label in zip(cols, labels):
        stream = tables.emitted_stream(lanes[label])
        diverge = first_divergence(base, stream) if label != labels[0] else None
        chips = chips_for(lanes[label])
        if piece_of is not None:
            chips = name_forced(chips, stream, piece_of)
        with col:
            st.markdown(f"**{label}**" + (f" — diverges at token {diverge}" if diverge is not None else ""))
            st.html(chips_html(chips, diverge_at=diverge))
