"""What-if for DSpark, from a recorded trace alone (no model): other chain lengths γ and tree budgets.

Each recorded round holds its lattice (candidates per position with the drafter's calibrated scores ŝ),
so the stage-1 DP can be re-run for any γ' ≤ the recorded γ or any budget; that gives the drafter's
own **forecast** of accepted tokens (Σ of survival products). At temperature 0 the trace also knows the
target's greedy continuation for `accepted + 1` tokens after each round's root (the accepted path and
the final argmax token), so re-verifying another chain or tree is an exact **replay** as long as it
leaves that known stretch by a mismatch; a plan that matches the whole stretch accepted at least that
many (counted as a lower bound, reported in `lower_bound_rounds`).

Every row averages over all the recorded rounds, as the measured value does: a round whose lattice is shorter
than a chain's γ' plays its whole lattice (counted in `short_rounds`), as speculative what-if counts a round's
recorded drafts. (Averaging only the rounds long enough for γ' compared the rounds where the drafter drafted far,
the easy ones, with the run's every round: a replayed τ of 5.0 against a measured 3.1 on one run.) At the plan
the run used, the replay is the run's own accepted length, round by round.
"""
from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from decoding.core.formulas import tokens_per_round
from decoding.core.lattice import Lattice
from decoding.strategies.dspark_select import best_chain, best_tree


def dspark_rounds(events: Sequence) -> list:
    return [e for e in events if getattr(e, "kind", "") == "dspark_round" and not e.prefill and e.lattice]


def lattice_of(event) -> Lattice:
    """The recorded lattice: scores[k][parent][j] = cell j's ŝ given candidate `parent` at k−1."""
    cols = event.lattice
    token_ids = [[c.token_id for c in col.cells] for col in cols]
    q_draft = [[min(max(c.q_draft, 0.0), 1.0) for c in col.cells] for col in cols]
    scores = [[[min(max(col.cells[j].scores[p], 0.0), 1.0) for j in range(len(col.cells))]
               for p in range(len(col.cells[0].scores))] for col in cols]
    return Lattice(token_ids, q_draft, scores)


def greedy_rounds(rounds: Sequence) -> bool:
    """Temperature 0: no node drew a uniform and every round's final token was the target's argmax."""
    return bool(rounds) and all(n.draw is None for r in rounds for n in r.nodes) and \
        all(r.next_from in ("argmax", "bonus") and r.next_draw is None for r in rounds)


def known_continuation(event) -> list[int]:
    """The target's greedy tokens after the round's root that the trace knows (temperature 0)."""
    by_node = {n.node: n for n in event.nodes}
    return [by_node[i].token_id for i in event.accepted_path] + [event.next_token]


def replay(tokens: Sequence[int], parents: Sequence[int], known: Sequence[int]) -> tuple[int, bool]:
    """Greedy re-verification of a plan (nodes with parents, −1 = root) against the known continuation:
    (accepted nodes, exact). Not exact when the plan still had a child matching past the known stretch."""
    current, accepted = -1, 0
    for depth, want in enumerate(known):
        child = next((i for i, (t, p) in enumerate(zip(tokens, parents)) if p == current and t == want), None)
        if child is None:
            return accepted, True
        current, accepted = child, accepted + 1
        if depth == len(known) - 1:
            has_more = any(p == current for p in parents)
            return accepted, not has_more
    return accepted, True


def _chain_nodes(plan) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return plan.tokens, tuple(range(-1, len(plan.tokens) - 1))


def sweep(events: Sequence, gammas: Sequence[int], budgets: Sequence[int]) -> pd.DataFrame:
    """Rows per plan (chain γ' / tree budget): forecast and (temperature 0) replayed tokens per target
    forward, averaged over every recorded round (a chain longer than a round's lattice plays the whole lattice
    there: `short_rounds`)."""
    rounds = dspark_rounds(events)
    greedy = greedy_rounds(rounds)
    lattices = [lattice_of(r) for r in rounds]
    knowns = [known_continuation(r) for r in rounds] if greedy else []
    plans = [("chain", g, lambda lat, g=g: best_chain(lat, min(g, lat.gamma))) for g in gammas]
    plans += [("tree", b, lambda lat, b=b: best_tree(lat, b)) for b in budgets]
    rows = []
    for mode, size, make in plans:
        forecast, replayed, lower, n, short = 0.0, 0.0, 0, 0, 0
        for i, lat in enumerate(lattices):
            plan = make(lat)
            n += 1
            short += mode == "chain" and lat.gamma < size
            forecast += float(plan.expected_accepted)
            if greedy:
                tokens, parents = _chain_nodes(plan) if mode == "chain" else (plan.tokens, plan.parents)
                acc, exact = replay(tokens, parents, knowns[i])
                replayed += acc
                lower += not exact
        rows.append({"plan": mode, "size": size, "rounds": n, "short_rounds": short,
                     "forecast_tokens_per_forward": tokens_per_round(forecast / n) if n else None,
                     "replayed_tokens_per_forward": tokens_per_round(replayed / n) if greedy and n else None,
                     "lower_bound_rounds": lower if greedy else None})
    return pd.DataFrame(rows, columns=["plan", "size", "rounds", "forecast_tokens_per_forward",
                                       "replayed_tokens_per_forward", "lower_bound_rounds", "short_rounds"])


def measured(events: Sequence) -> dict:
    """The trace's own numbers: tokens per target forward (forced tokens excluded), γ and plan mode."""
    rounds = dspark_rounds(events)
    if not rounds:
        return {"rounds": 0, "tokens_per_forward": None, "gamma": 0, "select": None}
    emitted = sum(len(r.emitted) - len(r.forced_ids) for r in rounds)
    return {"rounds": len(rounds), "tokens_per_forward": emitted / len(rounds),
            "gamma": max(len(r.lattice) for r in rounds), "select": rounds[0].select,
            "nodes": max(len(r.nodes) for r in rounds)}


def measured_vs_replayed(events: Sequence) -> str | None:
    """One line on why the measured value and a replayed plan of the run's size can still differ: rounds cut
    at the end of text or the token budget, and a plan sized round by round; None without a replay (sampled)."""
    rounds = dspark_rounds(events)
    if not greedy_rounds(rounds):
        return None
    cut = sum(len(r.emitted) - len(r.forced_ids) < len(r.accepted_path) + 1 for r in rounds)
    sizes = sorted({r.size.size for r in rounds if r.size is not None})
    what = "chain length" if rounds[0].select == "chain" else "tree budget"
    sized = f"a fixed {what}" if not sizes else f"{what} {sizes[0]} in every round" if len(sizes) == 1 else \
        f"{what} {sizes[0]}–{sizes[-1]}, sized round by round by the cost table"
    return (f"Measured and replayed average the same {len(rounds)} rounds. Measured counts the tokens the run "
            f"kept ({cut} round(s) cut at the end of text or the token budget); a replayed plan has one size in "
            f"every round and counts what it would accept (the run: {sized}).")


MIN_ROUNDS = 10     # a point from fewer recorded rounds is drawn hollow: too few rounds to read


def sweep_figure(table: pd.DataFrame, measured_values: dict):
    """Forecast and replayed tokens per target forward: chain γ' on the left panel's axis, tree budget on the
    right panel's (two quantities, two axes), with the rounds that held the whole plan behind each point (n); a
    point where fewer than MIN_ROUNDS did is hollow."""
    from plotly.subplots import make_subplots

    from ui.views import palette
    from ui.views.headers import header

    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.06)
    styles = {"forecast": ("circle", "solid"), "replayed": ("square", "dot")}
    for col, (mode, color) in enumerate((("chain", palette.BLUE), ("tree", palette.ORANGE)), start=1):
        part = table[table["plan"] == mode]
        for what, (symbol, dash) in styles.items():
            values = f"{what}_tokens_per_forward"
            if part.empty or part[values].isna().all():
                continue
            full = [n - s for n, s in zip(part["rounds"], part["short_rounds"])]   # rounds that held the whole plan
            fig.add_scatter(name=f"{mode} — {what}", x=list(part["size"]), y=list(part[values]),
                            mode="lines+markers", line={"color": color, "dash": dash},
                            marker={"symbol": [f"{symbol}-open" if n < MIN_ROUNDS else symbol for n in full],
                                    "size": 9},
                            text=[f"n={n}" for n in full],
                            hovertemplate="size %{x}: %{y:.2f} (%{text} rounds held the whole plan)<extra></extra>",
                            row=1, col=col)
    if measured_values.get("tokens_per_forward") is not None:
        chain = measured_values["select"] == "chain"
        size = measured_values["gamma"] if chain else measured_values["nodes"]
        fig.add_scatter(name=f"measured ({measured_values['select']}, size {size}, n={measured_values['rounds']})",
                        x=[size], y=[measured_values["tokens_per_forward"]], mode="markers",
                        marker={"symbol": "star", "size": 16, "color": palette.VERMILLION},
                        row=1, col=1 if chain else 2)
    fig.update_xaxes(title_text=header("gamma"), dtick=1, row=1, col=1)
    fig.update_xaxes(title_text="tree budget", row=1, col=2)
    fig.update_yaxes(title_text=header("expected_tokens_per_forward"), row=1, col=1)
    fig.update_layout(title=f"Tokens per target forward (hollow: under {MIN_ROUNDS} rounds)",
                      legend={"orientation": "h", "y": -0.25},
                      margin={"t": 50, "b": 10, "l": 10, "r": 10}, height=400)
    return fig
