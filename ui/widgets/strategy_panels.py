"""Step panels of beam search, speculative decoding and parallel drafting (DSpark), registered with
the panel, chip and table registries on import (app.py imports this module). Numbers all come from the
events; every string from a trace is shown with st.text, escaped HTML, or escaped DOT, never as
Markdown."""
from __future__ import annotations

import streamlit as st

from decoding.runtime.paths import FEATURE_WEIGHTS, calibration_path
from ui.views import acceptance, beam, calibration, chips, dspark, glossary, headers, spec, tables, verdict
from ui.views.chips import token_box_html
from ui.views.sources import drafter_words, drafting_text
from ui.views.text import md_text
from ui.widgets import display, force_pickers, step_panel
from ui.widgets.step_panel import ViewContext

HEAD_CALIBRATION = calibration_path(FEATURE_WEIGHTS)   # DSpark's default head

# ---------------------------------------------------------------- beam

def beam_panel(step, ctx: ViewContext) -> None:
    """The beam tree over the last steps, the step's candidate pool and the finished hypotheses."""
    cols = st.columns(5)
    cols[0].metric("Step", f"{step.index:d}")
    cols[1].metric("Live beams", len(step.beams))
    cols[2].metric("Finished", len(step.finished))
    cols[3].metric("Early stop", "yes" if step.early_stop else "no",
                   help="No live beam can beat the finished set any more")
    cols[4].metric("search", "done" if step.done else "running", help=md_text(glossary.definition("search")))
    events = ctx.events or (step,)
    window = st.number_input("Steps shown in the tree", min_value=1, max_value=64, value=6, step=1,
                             key=f"{ctx.prefix}.beam_window")
    dot = beam.beam_dot(events, upto=len(events) - 1, window=int(window))
    st.caption("Boxes: candidates of each step's pool (token, cumulative score, status in words); "
               "green solid = kept, grey dashed = pruned, blue double octagon = finished; the output's path in bold.")
    st.graphviz_chart(dot)
    st.download_button("Download the tree (DOT)", dot, file_name=f"beam-step{step.index}.dot",
                       mime="text/vnd.graphviz", key=f"{ctx.prefix}.beam_dot", on_click="ignore")
    st.caption(f"Candidate pool of step {step.index:d} (top {len(step.pool)} of B×V, best first)")
    display.table(beam.pool_table(step), f"{ctx.prefix}.pool", f"beam-step{step.index}-pool", words=beam.HEADERS)
    if ctx.on_force is not None:
        force_pickers.beam_force(step, ctx)
    if step.finished:
        if step.done:             # the search ends here: its answer is the best finished hypothesis
            best = step.finished[0]
            st.success(f"Search done. The answer: the best finished hypothesis (score ÷ length penalty "
                       f"{best.normalized_score:.3f}), shown below.")
            st.text(beam.hypothesis_text(best.token_ids, beam.pieces_of(events)))
        st.caption("Finished hypotheses (best first)")
        display.table(beam.finished_table(step, events), f"{ctx.prefix}.finished",
                      f"beam-step{step.index}-finished", words=beam.HEADERS)


# ---------------------------------------------------------------- speculative

def spec_panel(event, ctx: ViewContext) -> None:
    """One round: the drafts with their numbers and verdicts, the residual or bonus token, γ and why,
    the KV rollback, and the running acceptance metrics."""
    cols = st.columns(6)
    cols[0].metric(md_text(headers.header("gamma")), f"{event.gamma:d}", help=md_text(glossary.definition("γ")))
    cols[1].metric("Accepted", f"{event.accepted:d}/{event.gamma:d}")
    cols[2].metric("Final token", md_text(event.final_kind))
    cols[3].metric("Tokens fed", f"{event.fed_tokens:d}", help="tokens in this round's single target forward")
    cols[4].metric("KV rolled back (target)", f"{event.kv_cropped_target:d}")
    cols[5].metric("KV rolled back (draft)", f"{event.kv_cropped_draft:d}")
    _nothing_accepted(event)
    st.text(f"γ = {event.gamma} — why: {event.gamma_reason}")
    st.text(f"Drafter: {drafter_words(event.drafter)}" + spec.lookup_text(event, ctx.events[:-1]))
    if event.drafting is not None:                # the first round: the run's sources and why
        st.text(drafting_text(event.drafting, speculative=True))
    if event.gamma_choice is not None:
        _gamma_choice_view(event, ctx)
    if event.drafts:
        display.plot(spec.draft_bars(event), f"{ctx.prefix}.drafts", f"round{event.index}-drafts")
        st.caption(md_text(f"Rule used — {spec.rule_text(spec.greedy_round(event))}. Acceptance probability "
                           "is this rule's chance of accepting the draft (glossary in the sidebar)."))
        display.table(spec.drafts_table(event), f"{ctx.prefix}.draft_table", f"round{event.index}-drafts")
    else:
        st.info("No drafts this round (the drafter had nothing to propose): one target token was sampled.")
    _final_view(event, ctx)
    if ctx.on_force is not None:
        force_pickers.spec_force(event, ctx)
    _running_metrics(ctx.events or (event,), ctx)


def _nothing_accepted(event) -> None:
    """A round that accepted no draft says why, in one line (ui.views.verdict)."""
    line = verdict.nothing_accepted(event)
    if line:
        st.info(md_text(line))


def _gamma_choice_view(event, ctx: ViewContext) -> None:
    info = event.gamma_choice
    with st.expander(f"Cost-aware γ: why {info.gamma:d} (ms per expected token for each γ)"):
        st.caption(f"Verify costs from {md_text(tables.table_name(info.cost_source))}; one {md_text(info.source)} "
                   f"draft token {info.draft_ms:.2f} ms. "
                   "Acceptance of position γ (estimate): this run's estimate that position γ is accepted once the "
                   "ones before it were ((accepted + 1) / (reached + 2) over earlier rounds of this drafter).")
        display.table(spec.gamma_choice_table(info), f"{ctx.prefix}.gamma_choice", f"round{event.index}-gamma-choice",
                      words=spec.GAMMA_CHOICE_HEADERS)


def _final_view(event, ctx: ViewContext) -> None:
    if event.final_kind == "none" or event.final_id is None:
        st.caption("The round ended at EOS or the token budget before a final token.")
        return
    piece = spec._piece_of(event, event.final_id)
    c1, c2 = st.columns([1, 3])
    with c1:
        st.html(token_box_html(piece, event.final_id, "residual resample ↺" if event.final_kind == "residual"
                               else "bonus +"))
    c2.text(spec.final_tooltip(event).replace(" · ", "\n"))
    if event.final_kind == "residual" and event.residual_top:
        display.plot(spec.residual_bars(event), f"{ctx.prefix}.residual", f"round{event.index}-residual")
        with st.expander("Residual top-N table"):
            display.table(spec.residual_table(event), f"{ctx.prefix}.residual_table", f"round{event.index}-residual")
    elif event.final_kind == "residual":
        st.caption("Temperature 0: after the rejection the target's argmax is emitted.")
    with st.expander("Target's top-N where the final token was chosen"):
        display.table(spec.final_table(event), f"{ctx.prefix}.final_table", f"round{event.index}-final")


def _running_metrics(events, ctx: ViewContext) -> None:
    m = spec.spec_metrics(events)
    _metrics_row(m, f"Running metrics over rounds 0–{m['rounds'] - 1}", "accepted / drafted", "rounds",
                 f"{ctx.prefix}.per_position", "per-position-acceptance", events)


def _metrics_row(m: dict, caption: str, rate_help: str, rounds_label: str, key: str, filename: str,
                 events=()) -> None:
    """τ, acceptance rate, rounds and the per-position acceptance chart of speculative-style metrics."""
    st.caption(md_text(caption))
    cols = st.columns(3)
    tau = headers.header("tau")
    cols[0].metric(md_text(tau), f"{m['tau']:.2f}", help=md_text(glossary.definition(tau)))
    rate = m["acceptance_rate"]
    cols[1].metric("acceptance rate", "—" if rate is None else f"{rate:.1%}",
                   help=md_text(f"{glossary.definition('acceptance rate')} Here: {rate_help}."))
    cols[2].metric(md_text(rounds_label), f"{m['rounds']:d}")
    if m["per_position"]:
        counts = acceptance.position_counts(events)[:len(m["per_position"])]
        display.plot(spec.per_position_bars(m["per_position"], counts or None), key, filename)


# ---------------------------------------------------------------- dspark

def dspark_panel(event, ctx: ViewContext) -> None:
    """One parallel-drafting round: the lattice with the chosen chain/tree over it, stage 1 (the
    DP or best-first selection, the cost-aware size), stage 2 (each verified node's verdict), the
    token after the accepted path, the run's phase breakdown and acceptance metrics."""
    if event.prefill:
        _dspark_prefill(event)
    elif not event.lattice:
        st.info("No drafts this round (one token left in the budget or the context): a plain target step.")
        _dspark_stage2(event, ctx)
    else:
        _dspark_header(event)
        _nothing_accepted(event)
        _dspark_drawing(event, ctx)
        _dspark_stage1(event, ctx)
        _dspark_stage2(event, ctx)
        if ctx.on_force is not None:
            force_pickers.dspark_force(event, ctx)
    _dspark_running(ctx.events or (event,), ctx)


def _dspark_drawing(event, ctx: ViewContext) -> None:
    """A tree round as a tree (the lattice one click away); a chain round on its lattice."""
    if event.select == "tree" and event.nodes:
        view = st.radio("Draw the round as", list(dspark.DRAWINGS), horizontal=True, key=f"{ctx.prefix}.ds_view",
                        format_func=dspark.DRAWINGS.get)
        if view == "tree":
            st.graphviz_chart(dspark.tree_dot(event))
            st.caption(dspark.TREE_CAPTION)
            return
    value = st.radio("Colour the lattice by", list(dspark.VALUE_LABELS), format_func=dspark.VALUE_LABELS.get,
                     horizontal=True, key=f"{ctx.prefix}.ds_value")
    display.plot(dspark.lattice_figure(event, value), f"{ctx.prefix}.lattice", f"round{event.index}-lattice")
    st.caption("Markers: ● accepted, ✗ rejected, ○ not reached (also in colour), ■ the last emitted token; "
               "the thick solid line is the accepted path, dotted lines the rest of the plan. Hover a cell "
               "for ŝ and the confidence per parent.")


def _dspark_prefill(event) -> None:
    st.info("Prefill: one forward over the prompt (and any forced tokens) gives the first token and the "
            "hidden state the drafter starts from. No drafts in this step.")
    c1, c2 = st.columns([1, 3])
    with c1:
        st.html(token_box_html(dspark.piece_of(event, event.next_token), event.next_token, "from the prefill"))
    c2.metric("Tokens fed", f"{event.fed_tokens:d}")
    if event.drafting is not None:
        st.text(drafting_text(event.drafting))


def _dspark_header(event) -> None:
    cols = st.columns(6)
    cols[0].metric("Selection", md_text(event.select))
    cols[1].metric("Positions (γ)", len(event.lattice))
    cols[2].metric("Verified nodes", len(event.nodes))
    cols[3].metric("Accepted", f"{len(event.accepted_path)}/{len(event.nodes)}")
    cols[4].metric(md_text(headers.header("expected_accepted")), f"{event.expected_accepted:.2f}",
                   help=md_text(f"Stage 1's forecast. {glossary.definition('expected accepted')}"))
    cols[5].metric("Next token", md_text(event.next_from))
    if event.lossy:
        st.warning("LOSSY mode: a candidate is accepted outright when p target exceeds the threshold, so the "
                   "output no longer follows the target's distribution exactly.")


def _dspark_stage1(event, ctx: ViewContext) -> None:
    st.subheader("Stage 1 — selection (draft side only)")
    display.table(dspark.summary_table(event, ctx.events[:-1]), f"{ctx.prefix}.ds_summary",
                  f"round{event.index}-selection")
    if event.dp is not None:
        st.caption("DP values V_k(x | parent) = ŝ_k(x | parent) · (1 + max_y V_{k+1}(y | x)); best next "
                   "candidate = the argmax y at k+1; candidates count from 1 (1 = the drafter's top), parent 0 = "
                   "the last emitted token; ŝ = ŝ_k(x | parent).")
        display.table(dspark.dp_table(event), f"{ctx.prefix}.ds_dp", f"round{event.index}-dp")
    else:
        st.caption("Tree mode: the nodes of highest survival (product of ŝ along the path), best first; "
                   "their survival products are in the verdicts table below.")
    if event.size is not None:
        display.plot(dspark.size_figure(event.size, event.select), f"{ctx.prefix}.ds_size", f"round{event.index}-size")
        overhead = (f"; round overhead {event.size.overhead_ms:.1f} ms (drafting, selection, acceptance, "
                    "cache)") if event.size.overhead_ms else ""
        st.text(f"Cost table: {tables.table_name(event.size.cost_source)}{overhead}")
        with st.expander("Cost table and expected rate per size"):
            display.table(dspark.size_table(event.size), f"{ctx.prefix}.ds_size_table", f"round{event.index}-sizes",
                          words=dspark.SIZE_HEADERS)
            display.table(dspark.cost_table(event.size), f"{ctx.prefix}.ds_cost", f"round{event.index}-cost-table")
    else:
        st.caption("No cost table: the chain length / tree budget is fixed (pick a cost table under the sidebar's "
                   "Advanced for adaptive γ).")


def _dspark_stage2(event, ctx: ViewContext) -> None:
    st.subheader("Stage 2 — verification (one target forward, exact rule)")
    st.caption("Nodes count from 1 in plan order; parent 0 = the last emitted token; candidate = the node's place "
               "at its depth, 1 = the drafter's top.")
    display.table(dspark.verdicts_table(event), f"{ctx.prefix}.ds_verdicts", f"round{event.index}-verdicts")
    c1, c2 = st.columns([1, 3])
    with c1:
        st.html(token_box_html(dspark.piece_of(event, event.next_token), event.next_token, event.next_from))
    c2.text(dspark.next_tooltip(event).replace(" · ", "\n"))


def _dspark_running(events, ctx: ViewContext) -> None:
    m = dspark.dspark_metrics(events)
    _metrics_row(m, f"Running metrics over {m['rounds']} drafting round(s)", "accepted / verified nodes",
                 "rounds", f"{ctx.prefix}.ds_per_position", "dspark-per-position-acceptance", events)
    phases = dspark.phase_table(events)
    if len(phases):
        display.plot(dspark.phase_bars(phases), f"{ctx.prefix}.ds_phases", "dspark-phase-shares")
        with st.expander("Phase totals table"):
            display.table(phases, f"{ctx.prefix}.ds_phase_table", "dspark-phases")
    _dspark_calibration(events, ctx)


def _dspark_calibration(events, ctx: ViewContext) -> None:
    """ŝ against the measured acceptance over the run so far, per position or per source."""
    table = calibration.samples(events)
    with st.expander(f"Calibration of ŝ ({len(table)} nodes whose parent was accepted)"):
        if not len(table):
            st.caption("No drafted node yet.")
            return
        by = st.radio("Group by", ["position", "source"], horizontal=True, key=f"{ctx.prefix}.ds_cal_by")
        display.plot(calibration.reliability_figure(table, by), f"{ctx.prefix}.ds_cal", f"dspark-reliability-{by}")
        display.table(calibration.reliability_table(table, by), f"{ctx.prefix}.ds_cal_table",
                      f"dspark-reliability-{by}")
        card = calibration.card_table(HEAD_CALIBRATION)
        if card is not None:
            st.caption("Held out, before any run: the shipped feature head's calibration (its model card; drafter "
                       "= feature). its hit rate is over its top-4 candidates per position.")
            display.table(card, f"{ctx.prefix}.ds_cal_card", "feature-head-calibration")


# ---------------------------------------------------------------- registration

step_panel.register_panel("beam", beam_panel)
chips.register_sequence_chips("beam", beam.beam_chips)
tables.register_rows("beam", beam.beam_row)

step_panel.register_panel("spec_round", spec_panel)
chips.register_chips("spec_round", spec.spec_chips)
tables.register_rows("spec_round", spec.spec_row)

step_panel.register_panel("dspark_round", dspark_panel)
chips.register_chips("dspark_round", dspark.dspark_chips)
tables.register_rows("dspark_round", dspark.dspark_row)
