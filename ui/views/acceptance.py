"""Acceptance at a glance, from a speculative or DSpark trace alone: a heatmap of rounds × draft positions
(accepted / rejected / not reached), a table per position, and acceptance against the target's entropy
where each draft was judged. Pure (no streamlit, no torch).

A speculative round's position k is its k-th draft's verdict. A DSpark round verifies a chain or a tree;
its position k is accepted when the accepted path reaches depth k, rejected at the first depth the path
does not reach (nodes were verified there, none accepted), and not reached deeper down, as deep as the
round's plan goes. Either way a cell exists only where the round drafted that position, so the share of
accepted cells per position is the trace's per-position acceptance."""
from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import plotly.graph_objects as go

from ui.views import palette

ACCEPTED, REJECTED, NOT_REACHED = "accepted", "rejected", "not reached"
MIN_ROUNDS = 10      # a per-position rate from fewer rounds is drawn grey: a handful of rounds is no rate
CODES = {ACCEPTED: 2, REJECTED: 1, NOT_REACHED: 0}
MARKS = {ACCEPTED: "✓", REJECTED: "✗", NOT_REACHED: "·"}


def round_cells(event) -> list[str] | None:
    """The verdict per draft position of one round; None for an event that drafted nothing to verify
    (a token step, a DSpark prefill)."""
    if getattr(event, "kind", "") == "spec_round":
        return [d.verdict.replace("_", " ") for d in event.drafts if d.verdict != "recorded"] or None
    if getattr(event, "kind", "") == "dspark_round" and not event.prefill and event.nodes:
        reached = len(event.accepted_path)
        depth = max(n.depth for n in event.nodes)
        return [ACCEPTED if k <= reached else REJECTED if k == reached + 1 else NOT_REACHED
                for k in range(1, depth + 1)]
    return None


def position_counts(events: Sequence) -> list[int]:
    """Per draft position k (from 1): the rounds that drafted it, the denominator of the engine's per-position
    acceptance (a speculative round drafts γ positions, a DSpark round as deep as its plan)."""
    depths = [e.gamma if e.kind == "spec_round" else max((n.depth for n in e.nodes), default=0)
              for e in events if getattr(e, "kind", "") == "spec_round"
              or (getattr(e, "kind", "") == "dspark_round" and not e.prefill)]
    return [sum(d >= k for d in depths) for k in range(1, max(depths, default=0) + 1)]


def grid(events: Sequence) -> list[tuple[int, list[str]]]:
    """(round index, verdict per position) for every round that verified drafts, in order."""
    rows = ((event.index, round_cells(event)) for event in events)
    return [(index, cells) for index, cells in rows if cells]


def position_table(events: Sequence) -> pd.DataFrame:
    """Per draft position k (from 1, headed "k (draft position)" as in the round's table and the charts): rounds
    that drafted it, how many accepted, rejected, not reached, and the share accepted (the trace's per-position
    acceptance)."""
    rows = grid(events)
    depth = max((len(cells) for _, cells in rows), default=0)
    out = []
    for k in range(depth):
        at_k = [cells[k] for _, cells in rows if len(cells) > k]
        count = {v: at_k.count(v) for v in (ACCEPTED, REJECTED, NOT_REACHED)}
        out.append({"k": k + 1, "rounds": len(at_k), "accepted": count[ACCEPTED],
                    "rejected": count[REJECTED], "not_reached": count[NOT_REACHED],
                    "acceptance": count[ACCEPTED] / len(at_k)})
    return pd.DataFrame(out, columns=["k", "rounds", "accepted", "rejected", "not_reached", "acceptance"])


def heatmap(events: Sequence) -> go.Figure | None:
    """Rounds (rows, first at the top) × draft positions (columns), one colour and one mark per verdict;
    None when the trace verified no drafts."""
    rows = grid(events)
    if not rows:
        return None
    depth = max(len(cells) for _, cells in rows)
    z = [[CODES[c] for c in cells] + [None] * (depth - len(cells)) for _, cells in rows]
    text = [[MARKS[c] for c in cells] + [""] * (depth - len(cells)) for _, cells in rows]
    scale = [[0.0, palette.GREY], [0.33, palette.GREY], [0.34, palette.VERMILLION], [0.66, palette.VERMILLION],
             [0.67, palette.GREEN], [1.0, palette.GREEN]]
    fig = go.Figure(go.Heatmap(z=z, x=[f"k={k}" for k in range(1, depth + 1)], y=[f"round {i}" for i, _ in rows],
                               text=text, texttemplate="%{text}", colorscale=scale, zmin=0, zmax=2, showscale=False,
                               xgap=1, ygap=1, hovertemplate="%{y}, %{x}: %{text}<extra></extra>"))
    for verdict, color in ((ACCEPTED, palette.GREEN), (REJECTED, palette.VERMILLION), (NOT_REACHED, palette.GREY)):
        fig.add_scatter(x=[None], y=[None], mode="markers", name=f"{MARKS[verdict]} {verdict}",
                        marker={"color": color, "symbol": "square", "size": 12})
    fig.update_layout(title=f"Acceptance per round and draft position ({len(rows)} rounds)",
                      xaxis={"title": "draft position k", "side": "top"},
                      yaxis={"autorange": "reversed", "title": ""}, plot_bgcolor="white",
                      height=min(900, 140 + 18 * len(rows)), legend={"orientation": "h", "y": -0.05},
                      margin={"t": 80, "b": 10, "l": 10, "r": 10})
    return fig


# ---------------------------------------------------------------- acceptance against the target's entropy
ENTROPY_BINS = 8


def entropy_samples(events: Sequence) -> pd.DataFrame:
    """One row per judged draft (accepted or rejected; a draft not reached was never compared): the
    target's entropy (nats, raw distribution) where it was judged, its position, and whether it was accepted.
    Rounds recorded before schema 1.3 have no entropy and give no rows."""
    rows = []
    for event in events:
        kind = getattr(event, "kind", "")
        judged = (event.drafts if kind == "spec_round" else event.nodes if kind == "dspark_round" else ())
        for item in judged:
            if item.verdict in ("accepted", "rejected") and item.target_entropy is not None:
                position = item.index + 1 if kind == "spec_round" else item.depth
                rows.append({"round": event.index, "position": position, "entropy": item.target_entropy,
                             "accepted": item.verdict == "accepted"})
    return pd.DataFrame(rows, columns=["round", "position", "entropy", "accepted"])


def binned_mean(xs: Sequence[float], hits: Sequence[bool], bins: int = ENTROPY_BINS) -> list[tuple[float, float, int]]:
    """Equal-width bins over [min x, max x]: (bin centre, share of hits, count) for every non-empty bin."""
    if not xs:
        return []
    low, high = min(xs), max(xs)
    width = (high - low) / bins or 1.0
    sums: dict[int, list] = {}
    for x, hit in zip(xs, hits):
        b = min(int((x - low) / width), bins - 1)
        acc = sums.setdefault(b, [0, 0])
        acc[0] += bool(hit)
        acc[1] += 1
    return [(low + (b + 0.5) * width, h / n, n) for b, (h, n) in sorted(sums.items())]


def entropy_figure(events: Sequence) -> go.Figure | None:
    """Each judged draft at (entropy, accepted 1 / rejected 0), a little spread vertically so that the
    points do not hide each other, and the binned share accepted as a line; None without samples."""
    table = entropy_samples(events)
    if table.empty:
        return None
    spread = [((i * 37) % 11 - 5) * 0.012 for i in range(len(table))]     # fixed, so the chart is reproducible
    fig = go.Figure()
    for verdict, hit, color, symbol in ((ACCEPTED, True, palette.GREEN, "circle"),
                                        (REJECTED, False, palette.VERMILLION, "x")):
        part = [(e, float(hit) + s) for e, a, s in zip(table["entropy"], table["accepted"], spread) if a == hit]
        fig.add_scatter(x=[e for e, _ in part], y=[y for _, y in part], mode="markers",
                        name=f"{MARKS[verdict]} {verdict}", marker={"color": color, "symbol": symbol, "size": 6,
                                                                    "opacity": 0.6})
    bins = binned_mean(table["entropy"].tolist(), table["accepted"].tolist())
    fig.add_scatter(x=[c for c, _, _ in bins], y=[m for _, m, _ in bins], mode="lines+markers",
                    name="share accepted (binned)", line={"color": palette.BLUE, "width": 3},
                    text=[f"{n} drafts" for *_, n in bins],
                    hovertemplate="entropy %{x:.2f}: %{y:.2f} (%{text})<extra></extra>")
    fig.update_layout(title="Acceptance against the target's entropy where each draft was judged",
                      xaxis_title="target entropy (nats)", yaxis={"title": "accepted", "range": [-0.15, 1.15]},
                      legend={"orientation": "h", "y": -0.25}, height=380, margin={"t": 50, "b": 10, "l": 10, "r": 10})
    return fig
