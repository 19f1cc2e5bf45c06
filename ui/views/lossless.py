"""The losslessness lab's views: the next token's distribution under each rule beside p_target, the
sampled rounds' histogram, a verdict table with the total-variation distance and the χ² p-value, and the
design card's worked example computed live. Pure (no streamlit)."""
from __future__ import annotations

from fractions import Fraction

import pandas as pd
import plotly.graph_objects as go

from decoding.core.exact_rules import retrospective_exact, speculative_exact, tree_exact
from decoding.core.measures import LOSSLESS, LosslessResult
from ui.views import palette
from ui.views.figures import plot_text
from ui.views.headers import header

RULE_NAMES = {"speculative": "speculative (ratio rule)", "dspark": "DSpark (tree rule)",
              "lossy": "DSpark lossy mode", "retrospective": "retrospective plan"}
RULE_STYLE = {"speculative": (palette.BLUE, ""), "dspark": (palette.GREEN, "/"),
              "lossy": (palette.VERMILLION, "x"), "retrospective": (palette.PURPLE, ".")}
SIGNIFICANCE = 0.001       # the cut-off: a p-value below it says the samples are not drawn from p_target


def agrees(p_value: float) -> bool:
    """Whether the χ² test finds the samples consistent with p_target at the cut-off (SIGNIFICANCE)."""
    return p_value >= SIGNIFICANCE


def test_words(p_value: float) -> str:
    """The χ² test in one phrase, the cut-off stated: "p = 0.021 ≥ 0.001: agree"."""
    return (f"p = {p_value:.2g} ≥ {SIGNIFICANCE:g}: agree" if agrees(p_value)
            else f"p = {p_value:.2g} < {SIGNIFICANCE:g}: disagree")


def _labels(result: LosslessResult) -> list[str]:
    return [plot_text(f"{piece!r}") for piece in result.pieces]


def rules_table(result: LosslessResult) -> pd.DataFrame:
    """One row per rule: the verdict, the exact distance to p_target (to 1e-6: below it is float round-off),
    and the χ² test of the seeded rounds (the p-value as text, 3 significant digits: it spans 300 decades)."""
    n = sum(result.outcomes[0].counts) if result.outcomes else 0
    return pd.DataFrame([{
        "rule": RULE_NAMES[o.rule], "verdict": _verdict(o.tv_distance, o.p_value),
        "claims_lossless": LOSSLESS[o.rule], "tv_distance_exact": round(o.tv_distance, 6), "samples": n,
        "chi2": o.chi2, "dof": o.dof, "p_value": f"{o.p_value:.3g}"} for o in result.outcomes])


def _verdict(distance: float, p_value: float) -> str:
    """The rule's verdict: the exact enumeration first, then the samples' χ² test against the cut-off, in
    the same words as the samples chart's legend (test_words)."""
    moved = distance > 1e-9
    test = test_words(p_value)
    if not moved and agrees(p_value):
        return f"lossless: exactly p target, and the samples agree ({test})"
    if moved and not agrees(p_value):
        return f"lossy: moves the distribution, and the samples show it ({test})"
    if moved:
        return f"lossy by the enumeration; the samples are too few to show it ({test})"
    return (f"exact by the enumeration; the samples fall outside ({test}: a 1-in-{round(1 / SIGNIFICANCE)} "
            "chance, or a bug)")


def distribution_figure(result: LosslessResult) -> go.Figure:
    """p_target (outlined), q_draft (grey) and each rule's exact distribution of the next token."""
    labels = _labels(result)
    fig = go.Figure()
    fig.add_bar(x=labels, y=list(result.p_target), name=f"{header('p_target')} (plain sampling)",
                marker={"color": "white", "line": {"color": palette.BLACK, "width": 2}})
    fig.add_bar(x=labels, y=list(result.q_draft), name=header("q_draft"), marker={"color": palette.GREY})
    for o in result.outcomes:
        color, pattern = RULE_STYLE[o.rule]
        fig.add_bar(x=labels, y=list(o.exact), name=f"{RULE_NAMES[o.rule]} (TV {o.tv_distance:.3f})",
                    marker={"color": color, "pattern": {"shape": pattern}})
    fig.update_layout(barmode="group", title="The next token: exact distribution under each rule",
                      yaxis={"title": "probability", "rangemode": "tozero"}, legend={"orientation": "h", "y": -0.3},
                      height=420, margin={"t": 50, "b": 10, "l": 10, "r": 10})
    return fig


def samples_figure(result: LosslessResult) -> go.Figure:
    """Each rule's share of the seeded rounds per token, markers over p_target's bars."""
    labels = _labels(result)
    fig = go.Figure()
    fig.add_bar(x=labels, y=list(result.p_target), name=header("p_target"), marker={"color": palette.SKY})
    symbols = {"speculative": "circle", "dspark": "diamond", "lossy": "x", "retrospective": "triangle-up"}
    for o in result.outcomes:
        n = sum(o.counts) or 1
        fig.add_scatter(x=labels, y=[c / n for c in o.counts], mode="markers",
                        name=f"{RULE_NAMES[o.rule]} ({test_words(o.p_value)})",
                        marker={"color": RULE_STYLE[o.rule][0], "symbol": symbols[o.rule], "size": 10})
    rounds = sum(result.outcomes[0].counts) if result.outcomes else 0
    fig.update_layout(title=f"{rounds} seeded rounds per rule; χ² test, cut-off (significance level) "
                            f"{SIGNIFICANCE:g}",
                      yaxis={"title": "share of rounds", "rangemode": "tozero"}, legend={"orientation": "h", "y": -0.3},
                      height=400, margin={"t": 50, "b": 10, "l": 10, "r": 10})
    return fig


def worked_example() -> pd.DataFrame:
    """The design card's case, computed now by the same functions: p_target (0.7, 0.3), q_draft (0.5, 0.5),
    DSpark's candidate the second token, the lossy mode's threshold 0.2."""
    p, q = [Fraction(7, 10), Fraction(3, 10)], [Fraction(1, 2), Fraction(1, 2)]
    rows = {f"{header('p_target')} (plain sampling)": p, "speculative (ratio rule)": speculative_exact(p, q),
            "DSpark (tree rule), candidate B": tree_exact(p, [1]),
            "DSpark lossy mode, threshold 0.2": tree_exact(p, [1], Fraction(1, 5)),
            "retrospective plan (two drafts, best ratio)": retrospective_exact(p, q)}
    return pd.DataFrame([{"rule": name, "P(A)": str(dist[0]), "P(B)": str(dist[1]),
                          "tv_distance": str(sum(abs(a - b) for a, b in zip(dist, p)) / 2)}
                         for name, dist in rows.items()])
