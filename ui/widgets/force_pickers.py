""""Force & branch" widgets of the beam, speculative and DSpark step panels (charts cannot be
clicked in tests, so a choice is made in select boxes beside them). What gets forced is
ui.widgets.forcing's rule; the branch itself is made by the view context's on_force (the playground's
stepper.force)."""
from __future__ import annotations

import streamlit as st

from ui.views.text import md_text
from ui.widgets import forcing
from ui.widgets.step_panel import ViewContext, follow_step, force_button, pick

BEAM_HELP = ("Forces the chosen candidate's whole hypothesis: the tokens of the beam it extends (as they "
             "stood after the previous step), then its token. Beam search then starts again from that prefix "
             "with fresh beams, so the branch shows what the search finds from this hypothesis on. Kept and "
             "pruned candidates are offered; finished ones are already complete answers.")
SPEC_HELP = ("The branch emits the tokens before this round, the round's accepted tokens before the chosen "
             "position, then the chosen token, and continues with speculative decoding from there. Offered "
             "at each position: the emitted token, the draft, the target's processed top-N (p target) and, "
             "at a rejection, the residual's top-N.")
DSPARK_HELP = ("The branch emits the tokens before this round, the accepted path's tokens above the chosen "
               "depth, then the chosen token, and continues with parallel drafting from there. Offered at "
               "each depth: the emitted token and the lattice's candidates at that position (DSpark rounds "
               "record no target top-N; a verified candidate shows its p target and verdict).")


def beam_force(step, ctx: ViewContext) -> None:
    ranks = forcing.beam_ranks(step)
    if not ranks:
        st.caption("Nothing to force at this step: every candidate finished.")
        return
    events = ctx.events or (step,)
    c1, c2 = st.columns([3, 1], vertical_alignment="bottom")
    pick_key = f"{ctx.prefix}.force_pick"
    at = len(events) - 1          # ctx.events ends with the step on view
    follow_step(ctx, at, pick_key)
    pick(c1, "Force a candidate (its hypothesis) at this step", pick_key, ranks,
          {r: forcing.beam_label(step, r) for r in ranks})
    force_button(c2, ctx, at, lambda: forcing.beam_forced(events, at, st.session_state[pick_key]), BEAM_HELP)


def spec_force(event, ctx: ViewContext) -> None:
    positions = forcing.spec_positions(event)
    if not positions:
        st.caption("Nothing to force in this round: it emitted no new token.")
        return
    _round_force(event, ctx, positions, {k: forcing.spec_position_label(event, k) for k in positions},
                 lambda k: forcing.spec_choices(event, k), forcing.spec_forced, "Position in the round", SPEC_HELP)


def dspark_force(event, ctx: ViewContext) -> None:
    depths = forcing.dspark_depths(event)
    if not depths:
        return
    _round_force(event, ctx, depths, {d: forcing.dspark_depth_label(event, d) for d in depths},
                 lambda d: forcing.dspark_choices(event, d), forcing.dspark_forced, "Draft position k (depth)",
                 DSPARK_HELP)


def _round_force(event, ctx, places: list[int], place_labels: dict, choices_at, forced_of, place_label: str,
                 help: str) -> None:
    """Two select boxes (where in the round, which token there) and the button."""
    st.caption("Force a token in this round and branch; the original run stays to compare.")
    c1, c2, c3 = st.columns([2, 3, 1], vertical_alignment="bottom")
    at_key, pick_key = f"{ctx.prefix}.force_at", f"{ctx.prefix}.force_pick"
    events = ctx.events or (event,)
    at = len(events) - 1          # ctx.events ends with the round on view
    follow_step(ctx, at, at_key, pick_key)
    place = pick(c1, place_label, at_key, places, place_labels)
    if st.session_state.get(f"{pick_key}.place") != place:     # another position: its own tokens
        st.session_state.pop(pick_key, None)
        st.session_state[f"{pick_key}.place"] = place
    choices = choices_at(place)
    chosen = pick(c2, "Token to force there", pick_key, list(range(len(choices))),
                  {i: c.label() for i, c in enumerate(choices)})
    if chosen is not None:                # the whole note, which the option's label shortens
        st.caption(md_text(f"Chosen: {choices[chosen].detail()}"))

    def forced() -> list[int]:
        where = st.session_state[at_key]
        return forced_of(events, at, where, choices_at(where)[st.session_state[pick_key]].token_id)

    force_button(c3, ctx, at, forced, help)
