"""What-if for speculative decoding, from a recorded trace alone (no model): expected accepted length
and tokens per target forward for other γ, from the recorded per-position acceptance probabilities.

For one round with acceptance probabilities a_1..a_γ (position i accepted given all before it were),
assuming the positions' outcomes independent given those recorded values:
    E[accepted drafts] = Σ_{k=1}^{γ} Π_{i≤k} a_i,   tokens per verification = 1 + E[accepted].
a_i is the glossary's "acceptance probability" before the draft is drawn: for a sampled trace the engine's
Σmin(p,q) = Σ_x min(p_target(x), q_draft(x)) (p_target(draft token) for a point-mass drafter, prompt
lookup); at temperature 0 the verifier accepts exactly when the draft token is the target's argmax, so a_i
is 1 or 0, the rule's own acceptance probability, as in the round's table.
"""
from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from decoding.core.formulas import acceptance_rate, expected_accepted, round_ms, tokens_per_round
from decoding.core.trace_totals import spec_metrics


def tokens_per_verification(accept_probs: Sequence[float], gamma: int) -> float:
    return tokens_per_round(expected_accepted(accept_probs, gamma))


def greedy_verified(events: Sequence) -> bool:
    """Temperature 0: the verifier compared with the argmax, so no round drew a uniform u."""
    return not any(d.u is not None for e in events for d in e.drafts)


def round_accept_probs(event, greedy: bool | None = None) -> list[float]:
    """Per-position acceptance probabilities of one recorded round, for every drafted position (also
    those beyond the verified γ and after the first rejection, which the target scored all the same).
    `greedy` (temperature 0) is read from the round itself when not given."""
    if greedy if greedy is not None else greedy_verified([event]):
        return [1.0 if d.target_top and d.token_id == d.target_top[0].token_id else 0.0 for d in event.drafts]
    return [float(d.accept_prob) for d in event.drafts]


def spec_rounds(events: Sequence) -> list:
    return [e for e in events if getattr(e, "kind", "") == "spec_round"]


def sweep(events: Sequence, gammas: Sequence[int]) -> pd.DataFrame:
    """Per γ, averaged over the recorded rounds: expected accepted drafts, tokens per target forward
    and acceptance rate. A round that recorded fewer than γ drafts counts only those (the drafter had
    no more to offer, or the budget stopped it); `short_rounds` says how many did."""
    recorded = spec_rounds(events)
    greedy = greedy_verified(recorded)
    rounds = [round_accept_probs(e, greedy) for e in recorded]
    rows = []
    for gamma in gammas:
        accepted = [expected_accepted(a, gamma) for a in rounds]
        drafted = sum(min(gamma, len(a)) for a in rounds)
        mean = sum(accepted) / len(rounds) if rounds else 0.0
        rows.append({"gamma": gamma, "expected_accepted": mean, "expected_tokens_per_forward": tokens_per_round(mean),
                     "expected_acceptance_rate": acceptance_rate(sum(accepted), drafted),
                     "short_rounds": sum(len(a) < gamma for a in rounds), "rounds": len(rounds)})
    return pd.DataFrame(rows, columns=["gamma", "expected_accepted", "expected_tokens_per_forward",
                                       "expected_acceptance_rate", "short_rounds", "rounds"])


def measured(events: Sequence) -> dict:
    """What the trace measured: tokens per verification forward (accepted + 1 per round, forced tokens
    excluded, cut at EOS/budget), acceptance rate, and the γ of its rounds."""
    rounds = spec_rounds(events)
    if not rounds:
        return {"rounds": 0, "tokens_per_forward": None, "acceptance_rate": None, "gammas": ()}
    stats = spec_metrics(rounds)
    return {"rounds": len(rounds), "tokens_per_forward": stats["mean_accepted_length"],
            "mean_accepted": sum(r.accepted for r in rounds) / len(rounds), "acceptance_rate": stats["acceptance_rate"],
            "gammas": tuple(sorted({r.gamma for r in rounds})), "gamma": max(r.gamma for r in rounds)}


def recorded_cost(events: Sequence) -> tuple[tuple[float, ...], dict[str, float]] | None:
    """(verify ms for 1..N tokens, draft-token ms per drafter) that a cost-policy trace recorded, or
    None for a trace of another γ policy."""
    choices = [e.gamma_choice for e in spec_rounds(events) if getattr(e, "gamma_choice", None) is not None]
    if not choices:
        return None
    return choices[0].verify_ms, {c.source: c.draft_ms for c in choices}


def with_cost(table: pd.DataFrame, events: Sequence) -> pd.DataFrame:
    """The sweep with `expected_ms_per_token` per γ when the trace recorded a cost table: summed over
    rounds, verify(drafted + 1 tokens) + drafted × that round's draft-token ms, over the expected tokens
    (drafted = γ, or fewer where the round recorded fewer). Empty beyond the table."""
    cost = recorded_cost(events)
    if cost is None:
        return table
    verify, draft_ms = cost
    recorded = spec_rounds(events)
    greedy = greedy_verified(recorded)
    rounds = [(round_accept_probs(e, greedy), draft_ms.get(e.drafter, 0.0)) for e in recorded]
    column = []
    for gamma in table["gamma"]:
        if gamma >= len(verify) or not rounds:
            column.append(None)
            continue
        ms = sum(round_ms(verify[min(gamma, len(a))], min(gamma, len(a)), d) for a, d in rounds)
        column.append(ms / sum(tokens_per_verification(a, gamma) for a, _ in rounds))
    out = table.copy()
    out["expected_ms_per_token"] = column
    return out


def cost_note(table: pd.DataFrame, events: Sequence) -> str | None:
    """For a cost-policy trace (`table` from with_cost): the γ the recorded cost table makes fastest, against
    plain greedy; None when no γ is priced."""
    priced = table.dropna(subset=["expected_ms_per_token"])
    if priced.empty:
        return None
    best = priced.loc[priced["expected_ms_per_token"].idxmin()]
    greedy_ms = recorded_cost(events)[0][0]
    return (f"With the cost table this trace recorded (expected ms per token): the fastest fixed γ would be "
            f"{int(best['gamma'])} at {best['expected_ms_per_token']:.1f} ms per token; plain greedy costs "
            f"{greedy_ms:.1f} ms per token (one 1-token forward). Bookkeeping outside the forwards is not counted.")


def max_recorded(events: Sequence) -> int:
    return max((len(e.drafts) for e in spec_rounds(events)), default=0)


MIN_ROUNDS = 10     # a point where fewer recorded rounds drafted γ tokens is drawn hollow


def sweep_figure(table: pd.DataFrame, measured_values: dict):
    """Expected tokens per target forward against γ, with the trace's measured value at its own γ; each point
    says how many recorded rounds drafted all γ tokens (n), hollow below MIN_ROUNDS."""
    import plotly.graph_objects as go

    from ui.views import palette
    from ui.views.headers import header

    full = [r - s for r, s in zip(table["rounds"], table["short_rounds"])]
    fig = go.Figure()
    fig.add_scatter(name="expected (recorded acceptance probabilities)", x=list(table["gamma"]),
                    y=list(table["expected_tokens_per_forward"]), mode="lines+markers",
                    line={"color": palette.BLUE},
                    marker={"symbol": ["circle-open" if n < MIN_ROUNDS else "circle" for n in full], "size": 9},
                    text=[f"n={n}" for n in full],
                    hovertemplate="γ %{x}: %{y:.2f} (%{text} rounds drafted all γ)<extra></extra>")
    if measured_values.get("tokens_per_forward") is not None:
        gamma = measured_values["gamma"]
        fig.add_scatter(name=f"measured in the trace (γ up to {gamma}, n={measured_values['rounds']})", x=[gamma],
                        y=[measured_values["tokens_per_forward"]], mode="markers",
                        marker={"symbol": "star", "size": 16, "color": palette.VERMILLION})
    fig.update_layout(title=f"Tokens per target forward vs γ (hollow: under {MIN_ROUNDS} rounds)",
                      xaxis={"title": header("gamma"), "dtick": 1},
                      yaxis_title=header("tokens_per_forward"), legend={"orientation": "h", "y": -0.25},
                      margin={"t": 50, "b": 10, "l": 10, "r": 10}, height=380)
    return fig
