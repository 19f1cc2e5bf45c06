"""Speculative decoding views without streamlit: chips by origin, the round's draft table and bars,
the residual's top-N, running metrics. Pure: SpecRound events in, values/figures out.

Every string from a trace (pieces, the gamma reason) is escaped before it becomes a plotly label."""
from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import plotly.graph_objects as go

from decoding.core import trace_totals
from decoding.core.trace import SpecRound
from ui.views import glossary, palette
from ui.views.acceptance import MIN_ROUNDS
from ui.views.chips import Chip, ngram_words, visible
from ui.views.figures import plot_text
from ui.views.glossary import counted_from_1
from ui.views.headers import header
from ui.views.sources import drafter_words

P, Q = header("p_target"), header("q_draft")       # the tables' words for the two distributions

VERDICT_STYLE = {   # verdict -> (colour, bar pattern, text twin)
    "accepted": (palette.GREEN, "", "✓ accepted"),
    "rejected": (palette.VERMILLION, "x", "✗ rejected"),
    "not_reached": (palette.GREY, ".", "… not reached"),
    "recorded": (palette.GREY, "/", "recorded (beyond γ)"),
}


def _num(x: float | None) -> str:
    if x is None:
        return "—"
    return f"{x:.4f}" if x == 0 or abs(x) >= 1e-3 else f"{x:.2e}"


def _piece_of(event, token_id: int) -> str:
    if token_id == event.final_id and event.final_piece:
        return event.final_piece
    for cand in tuple(event.final_top) + tuple(event.residual_top):
        if cand.token_id == token_id:
            return cand.piece
    for draft in event.drafts:
        if draft.token_id == token_id:
            return draft.piece
    return f"⟨{token_id}⟩"


def _prob_in(entries, token_id: int) -> float | None:
    return next((e.prob for e in entries if e.token_id == token_id), None)


# ---------------------------------------------------------------- chips

def greedy_round(event) -> bool:
    """Temperature 0: the verifier compared each draft with the target's argmax (no draft drew a u)."""
    return not any(d.u is not None for d in event.drafts)


def rule_probability(d, greedy: bool) -> float | None:
    """The acceptance probability under the rule the verifier used (glossary: "acceptance probability"): 1 or
    0 at temperature 0, min(1, p target ÷ q draft) for a sampled draft; None for a draft never judged."""
    if d.verdict not in ("accepted", "rejected"):
        return None
    if greedy:
        return 1.0 if d.verdict == "accepted" else 0.0
    return min(1.0, d.ratio)


def rule_text(greedy: bool) -> str:
    return glossary.RULE_GREEDY if greedy else glossary.RULE_SAMPLED


def draft_tooltip(d, round_index: int, greedy: bool | None = None) -> str:
    greedy = d.u is None if greedy is None else greedy
    parts = [f"id {d.token_id}", f"{Q} {_num(d.q_draft)}", f"{P} {_num(d.p_target)}",
             f"{header('ratio')} {_num(d.ratio)}", f"u {_num(d.u)}",
             f"{header('accept_prob')} {_num(rule_probability(d, greedy))}",
             f"draft position {d.index + 1}", f"round {round_index}"]
    return " · ".join(parts)


def spec_chips(event) -> list[Chip]:
    """Forced tokens, accepted drafts, the rejected draft (shown struck through, not emitted), then
    the residual resample or the bonus token; cut where the round's emitted tokens end (EOS, budget)."""
    chips = [Chip(_piece_of(event, t), "forced", f"id {t} · forced by you · round {event.index}", event.index)
             for t in event.forced_ids]
    new = list(event.emitted[len(event.forced_ids):])
    for d in event.drafts[: event.accepted]:
        if not new:
            return chips
        chips.append(Chip(d.piece, "accepted", draft_tooltip(d, event.index), event.index))
        new.pop(0)
    if event.accepted < len(event.drafts) and event.drafts[event.accepted].verdict == "rejected":
        d = event.drafts[event.accepted]
        why = "not the target's argmax" if d.u is None else "u ≥ ratio"
        chips.append(Chip(d.piece, "rejected", f"{draft_tooltip(d, event.index)} · {why}: rejected",
                          event.index, emitted=False))
    if new and event.final_kind in ("residual", "bonus") and event.final_id is not None:
        chips.append(Chip(_piece_of(event, event.final_id), event.final_kind, final_tooltip(event), event.index))
    return chips


def final_tooltip(event) -> str:
    parts = [f"id {event.final_id}"]
    if event.final_kind == "residual":
        parts.append(f"from norm(max(0, {P} − {Q}))" if event.residual_top else "target after a rejection")
        parts.append(f"{header('p_residual')} {_num(_prob_in(event.residual_top, event.final_id))}")
    else:
        parts.append(f"bonus: all {event.gamma} drafts accepted" if event.gamma else "no drafts: the target alone")
    parts.append(f"{P} {_num(_prob_in(event.final_top, event.final_id))}")
    parts.append(f"u {_num(event.final_draw)}" if event.final_draw is not None else "argmax (T=0)")
    parts.append(f"round {event.index}")
    return " · ".join(parts)


def lookup_text(event, before: Sequence = ()) -> str:
    """Where prompt lookup found the round's drafts (empty for another drafter), after "Drafter: …"; the
    matched tokens in words from the steps `before` the round (chips.ngram_words)."""
    if event.lookup is None:
        return ""
    m = event.lookup
    return (f" · matched the text's last {len(m.ngram)} token(s) {ngram_words(m.ngram, before)} earlier at "
            f"position {counted_from_1(m.match_position)}; drafts copied from position "
            f"{counted_from_1(m.continuation_start)}")


# ---------------------------------------------------------------- tables

DRAFT_COLUMNS = ["k", "piece", "verdict", "accept_prob", "p_target", "q_draft", "ratio", "u", "sum_min",
                 "token_id"]


def drafts_table(event) -> pd.DataFrame:
    """One row per draft, k from 1: its verdict, the acceptance probability under the rule used (1 or 0 at
    temperature 0), p target, q draft, the ratio and u (sampled), and the engine's Σmin(p,q) (sampled only:
    at temperature 0 it is not the rule, so the column is left empty)."""
    greedy = greedy_round(event)
    rows = [{"k": d.index + 1, "piece": visible(d.piece), "verdict": d.verdict,
             "accept_prob": rule_probability(d, greedy), "p_target": d.p_target, "q_draft": d.q_draft,
             "ratio": None if greedy else d.ratio, "u": d.u, "sum_min": None if greedy else d.accept_prob,
             "token_id": d.token_id} for d in event.drafts]
    return pd.DataFrame(rows, columns=DRAFT_COLUMNS)


def residual_table(event) -> pd.DataFrame:
    rows = [{"rank": i, "token_id": e.token_id, "piece": visible(e.piece), "p_residual": e.prob,
             "p_target": _prob_in(event.final_top, e.token_id), "chosen": e.token_id == event.final_id}
            for i, e in enumerate(event.residual_top, start=1)]
    return pd.DataFrame(rows, columns=["rank", "token_id", "piece", "p_residual", "p_target", "chosen"])


def final_table(event) -> pd.DataFrame:
    """Target's processed top-N where the final (residual or bonus) token was chosen."""
    rows = [{"rank": i, "token_id": c.token_id, "piece": visible(c.piece), "p_target": c.prob,
             "chosen": c.token_id == event.final_id} for i, c in enumerate(event.final_top, start=1)]
    return pd.DataFrame(rows, columns=["rank", "token_id", "piece", "p_target", "chosen"])


def spec_row(event) -> dict:
    final = _piece_of(event, event.final_id) if event.final_id is not None else ""
    return {"round": event.index, "position": counted_from_1(event.position), "drafter": drafter_words(event.drafter),
            "gamma": event.gamma,
            "accepted": event.accepted, "final_kind": event.final_kind, "final_piece": visible(final),
            "emitted": len(event.emitted), "fed_tokens": event.fed_tokens,
            "kv_cropped_target": event.kv_cropped_target, "kv_cropped_draft": event.kv_cropped_draft,
            "gamma_reason": event.gamma_reason, "ms": sum(event.timings_ms.values())}


GAMMA_CHOICE_HEADERS = {"ms_per_token": "ms per expected token"}
GAMMA_CHOICE_COLUMNS = ["gamma", "tokens_verified", "verify_ms", "draft_ms", "acceptance_k", "expected_tokens",
                        "round_ms", "ms_per_token", "chosen"]


def gamma_choice_table(info) -> pd.DataFrame:
    """Cost-aware γ: per γ, the verify cost of γ + 1 tokens, γ draft tokens, the estimated acceptance
    of position γ, the expected tokens, the round's ms and ms per expected token; the chosen γ marked."""
    rows = []
    for g, (expected, per_token) in enumerate(zip(info.expected_tokens, info.ms_per_token), start=1):
        rows.append({"gamma": g, "tokens_verified": g + 1, "verify_ms": info.verify_ms[g],
                     "draft_ms": g * info.draft_ms, "acceptance_k": info.acceptance[g - 1],
                     "expected_tokens": expected, "round_ms": per_token * expected, "ms_per_token": per_token,
                     "chosen": g == info.gamma})
    return pd.DataFrame(rows, columns=GAMMA_CHOICE_COLUMNS)


def spec_metrics(events: Sequence) -> dict:
    """τ (tokens per verification forward), acceptance rate, per-position acceptance (vLLM's
    definitions, decoding.core.trace_totals' spec_metrics, as the engine's spec_stats) over the rounds so far."""
    stats = trace_totals.spec_metrics([e for e in events if isinstance(e, SpecRound)])
    return {"tau": stats.get("mean_accepted_length", 0.0), "acceptance_rate": stats.get("acceptance_rate"),
            "per_position": tuple(stats.get("per_position_acceptance", ())),
            "rounds": sum(1 for e in events if getattr(e, "kind", "") == "spec_round")}


# ---------------------------------------------------------------- figures

def draft_bars(event) -> go.Figure:
    """Per draft position: q_draft and p_target of the drafted token, the ratio, and u; the verdict
    as colour, bar pattern and a text label."""
    labels = [plot_text(f"k={d.index + 1}: {visible(d.piece)!r}") for d in event.drafts]
    fig = go.Figure()
    if any(d.q_draft is not None for d in event.drafts):
        fig.add_bar(name=Q, x=labels, y=[d.q_draft for d in event.drafts], marker_color=palette.SKY,
                    hovertemplate=f"%{{x}}<br>{Q} %{{y:.4f}}<extra></extra>")
    styles = [VERDICT_STYLE.get(d.verdict, VERDICT_STYLE["recorded"]) for d in event.drafts]
    fig.add_bar(name=f"{P} (bar colour = verdict)", x=labels, y=[d.p_target for d in event.drafts],
                marker={"color": [s[0] for s in styles], "pattern": {"shape": [s[1] for s in styles]}},
                text=[s[2] for s in styles], textposition="outside", cliponaxis=False,
                hovertemplate=f"%{{x}}<br>{P} %{{y:.4f}}<extra></extra>")
    if any(d.u is not None for d in event.drafts):
        fig.add_scatter(name=f"{header('accept_prob')} min(1, p/q) (right axis)", x=labels,
                        y=[min(1.0, d.ratio) for d in event.drafts],
                        mode="markers", yaxis="y2", marker={"symbol": "diamond", "size": 11, "color": palette.BLACK})
        fig.add_scatter(name=f"u: accept if u < {header('accept_prob')} (right axis)", x=labels,
                        y=[d.u for d in event.drafts],
                        mode="markers", yaxis="y2", marker={"symbol": "x", "size": 11, "color": palette.ORANGE})
        fig.update_layout(yaxis2={"title": header("accept_prob"), "overlaying": "y", "side": "right",
                                  "range": [0, 1.05], "dtick": 0.25, "showgrid": False})
        rule = f"sampled: accept while u < {header('ratio')}"
    else:   # temperature 0: the verifier compares with the target's argmax
        fig.add_bar(name=f"{P} of the target's argmax", x=labels,
                    y=[d.target_top[0].prob if d.target_top else None for d in event.drafts],
                    marker={"color": "white", "line": {"color": palette.BLUE, "width": 1.5}})
        rule = "temperature 0: accept while the draft is the target's argmax"
    peak = max([d.p_target for d in event.drafts] + [d.q_draft or 0 for d in event.drafts] + [0.0])
    fig.update_layout(barmode="group", title=f"Round {event.index}: {event.gamma} draft(s) verified, "
                      f"{event.accepted} accepted ({rule})",
                      yaxis={"title": "probability", "range": [0, 1.15] if peak > 0.2 else None},
                      legend={"orientation": "h", "y": -0.3}, margin={"t": 50, "b": 10, "l": 10, "r": 10}, height=400)
    return fig


def residual_bars(event) -> go.Figure:
    labels = [plot_text(f"{e.token_id}: {visible(e.piece)!r}") for e in event.residual_top]
    colors = [palette.PURPLE if e.token_id == event.final_id else palette.GREY for e in event.residual_top]
    fig = go.Figure()
    fig.add_bar(name=header("p_residual"), x=labels, y=[e.prob for e in event.residual_top], marker_color=colors,
                hovertemplate=f"%{{x}}<br>{header('p_residual')} %{{y:.4f}}<extra></extra>")
    targets = [_prob_in(event.final_top, e.token_id) for e in event.residual_top]
    fig.add_scatter(name=P, x=labels, y=targets, mode="markers",
                    marker={"symbol": "diamond", "size": 10, "color": palette.BLUE})
    fig.update_layout(title=f"Residual norm(max(0, {P} − {Q})): top-N (resampled token in purple)",
                      yaxis_title="probability", legend={"orientation": "h", "y": -0.3},
                      margin={"t": 50, "b": 10, "l": 10, "r": 10}, height=360)
    return fig


def per_position_bars(per_position: Sequence[float], counts: Sequence[int] | None = None,
                      min_rounds: int = MIN_ROUNDS) -> go.Figure:
    """Per-position acceptance with the rounds behind each bar (n) on it; a bar from fewer than `min_rounds`
    rounds is grey and hatched, and the title states the minimum."""
    counts = list(counts) if counts is not None else [None] * len(per_position)
    xs = [f"k={k + 1}" for k in range(len(per_position))]
    few = [n is not None and n < min_rounds for n in counts]
    fig = go.Figure(go.Bar(
        x=xs, y=list(per_position), marker={"color": [palette.GREY if f else palette.GREEN for f in few],
                                            "pattern": {"shape": ["/" if f else "" for f in few]}},
        text=[f"{a:.2f}" + ("" if n is None else f" (n={n})") for a, n in zip(per_position, counts)],
        textposition="outside", cliponaxis=False,
        hovertemplate="%{x}: %{y:.2f} (%{text})<extra></extra>"))
    note = f"; grey: fewer than {min_rounds} rounds" if any(few) else ""
    fig.update_layout(title=f"Per-position acceptance (n = rounds that drafted k{note})",
                      xaxis_title=header("k"), yaxis={"title": header("acceptance"), "range": [0, 1.15]},
                      margin={"t": 50, "b": 10, "l": 10, "r": 10}, height=300)
    return fig
