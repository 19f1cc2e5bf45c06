"""Is DSpark's ŝ calibrated? A reliability diagram from the trace alone: every plan node whose parent
was accepted (the root's children included) is one sample, its score ŝ against whether it was accepted.
A node after an accepted sibling was never checked but lies off the accepted path all the same, so it
counts as not accepted: ŝ claims the chance a node ends on the accepted path given its parent did.
Grouped per draft position or per source (the drafter, or prompt lookup's chain), in equal-width bins,
with the expected calibration error (decoding.core.formulas). The model card's held-out table comes
from the head's calibration file. Pure: DSparkRound events in, tables and figures out."""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go

from decoding.core.formulas import CALIBRATION_BINS, calibration_error, reliability_bins
from ui.views import palette
from ui.views.figures import plot_text
from ui.views.headers import header
from ui.views.sources import source_text

SAMPLE_COLUMNS = ["round", "node", "position", "source", "score", "accepted"]
GROUP_COLORS = (palette.BLUE, palette.ORANGE, palette.GREEN, palette.VERMILLION, palette.PURPLE, palette.SKY,
                palette.YELLOW, palette.BLACK)
SYMBOLS = ("circle", "square", "diamond", "triangle-up", "x", "star", "hexagon", "cross")


def samples(events: Sequence) -> pd.DataFrame:
    """One row per plan node whose parent was accepted: (round, node, position, source, ŝ, accepted)."""
    rows = []
    for e in events:
        if getattr(e, "kind", "") != "dspark_round" or e.prefill:
            continue
        on_path = {0} | {n.node for n in e.nodes if n.verdict == "accepted"}
        rows += [{"round": e.index, "node": n.node, "position": n.depth, "source": source_text(n),
                  "score": float(n.score), "accepted": n.verdict == "accepted"}
                 for n in e.nodes if n.parent in on_path]
    return pd.DataFrame(rows, columns=SAMPLE_COLUMNS)


def reliability_table(table: pd.DataFrame, by: str) -> pd.DataFrame:
    """Per group (`by`: "position" or "source") and bin: mean ŝ, acceptance rate, samples."""
    rows = []
    for group, part in table.groupby(by, sort=True):
        for b, mean, rate, n in reliability_bins(part["score"].tolist(), part["accepted"].tolist()):
            rows.append({by: group, "bin": f"{b / CALIBRATION_BINS:.1f}–{(b + 1) / CALIBRATION_BINS:.1f}",
                         "mean_score": mean, "acceptance": rate, "samples": n})
    return pd.DataFrame(rows, columns=[by, "bin", "mean_score", "acceptance", "samples"])


def errors(table: pd.DataFrame, by: str) -> dict:
    """ECE per group and over all samples ("all"); None where there are none."""
    out = {group: calibration_error(part["score"].tolist(), part["accepted"].tolist())
           for group, part in table.groupby(by, sort=True)}
    return {**out, "all": calibration_error(table["score"].tolist(), table["accepted"].tolist())}


def reliability_figure(table: pd.DataFrame, by: str) -> go.Figure:
    """Mean ŝ (x) against the measured acceptance (y) per bin, one line per group (colour and marker
    shape), marker area by samples; the diagonal is perfect calibration."""
    bins, ece = reliability_table(table, by), errors(table, by)
    fig = go.Figure(go.Scatter(x=[0, 1], y=[0, 1], mode="lines", name="perfectly calibrated",
                               line={"color": palette.GREY, "dash": "dash"}))
    for i, (group, part) in enumerate(bins.groupby(by, sort=True)):
        label = f"{by} {group}" if by == "position" else plot_text(str(group))   # a source name comes from the trace
        fig.add_trace(go.Scatter(
            x=list(part["mean_score"]), y=list(part["acceptance"]), mode="lines+markers",
            name=f"{label} (ECE {ece[group]:.3f}, {int(part['samples'].sum())} nodes)",
            line={"color": GROUP_COLORS[i % len(GROUP_COLORS)]},
            marker={"symbol": SYMBOLS[i % len(SYMBOLS)], "size": [6 + min(18, n ** 0.5 * 2) for n in part["samples"]]},
            customdata=list(part["samples"]), hovertemplate="ŝ %{x:.3f} → accepted %{y:.3f} (%{customdata} nodes)"))
    overall = ece["all"]
    title = "Reliability of ŝ over the run so far" + (f" (ECE {overall:.3f})" if overall is not None else "")
    fig.update_layout(title=title, xaxis={"title": "ŝ (mean in bin)", "range": [0, 1]},
                      yaxis={"title": header("acceptance"), "range": [0, 1.02]}, height=420,
                      margin={"t": 50, "b": 40, "l": 50, "r": 10}, legend={"font": {"size": 11}})
    return fig


def card_table(path: Path) -> pd.DataFrame | None:
    """The held-out calibration table of a head's calibration file (None when there is none)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        rows = data["positions"]
        return pd.DataFrame([{"position": r["position"], "hit_rate": r["hit_rate"], "ece_raw": r["ece_raw"],
                              "ece_calibrated": r["ece_calibrated"], "a": r["a"], "b": r["b"]} for r in rows])
    except (OSError, ValueError, KeyError, TypeError):
        return None
