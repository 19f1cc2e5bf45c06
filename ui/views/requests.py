"""The Requests page's views (pure, no streamlit, no torch): records of `python -m decoding serve`'s request
log checked into `Served` rows, latency percentiles per strategy (decoding.core.formulas.percentile, the
one bench/serve.py uses), a latency histogram per strategy on shared bins, the requests sorted by end to end,
and the acceptance of drafting rounds (accepted-length histogram, per-position acceptance, vLLM's meanings)."""
from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from decoding.core.formulas import percentile
from decoding.serve.trace_log import rounds as trace_rounds
from ui.views import palette

NA = "—"
MAX_RECORD_BYTES = 50 * 1024 * 1024       # one record (its trace included)
MAX_RECORDS = 2000
PERCENTILES = (50, 90, 99)
# One colour (Okabe-Ito, ui/views/palette.py) and one bar pattern per strategy, in the order the log names them.
SERIES_COLORS = (palette.BLUE, palette.ORANGE, palette.GREEN, palette.VERMILLION, palette.PURPLE, palette.SKY,
                 palette.YELLOW, palette.BLACK)
SERIES_PATTERNS = ("", "/", ".", "x", "-", "|", "+", "\\")
MEASURES = {"queue_s": "Queue", "ttft_s": "Time to first token", "itl_s": "Inter-token latency",
            "e2e_s": "End to end"}


class RequestLogError(ValueError):
    """A record that is not a request-log record: one line naming the file and the field."""


@dataclass(frozen=True)
class Served:
    """One served request's timing (seconds) and drafting rounds ((drafted, accepted) per round)."""

    source: str
    request_id: str
    strategy: str
    finish: str
    completion_tokens: int | None
    queue_s: float
    ttft_s: float | None
    itl_s: tuple[float, ...]
    e2e_s: float
    rounds: tuple[tuple[int, int], ...]


def _seconds(value, name: str, field: str, optional: bool = False) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise RequestLogError(f"{name}: {field}={str(value)[:40]!r} is not a time in seconds >= 0")
    return float(value)


def _text(record: dict, name: str, field: str) -> str:
    value = record.get(field)
    if not isinstance(value, str) or not value or len(value) > 200:
        raise RequestLogError(f"{name}: {field}={str(value)[:40]!r} is not a short text")
    return value


def _rounds(value, name: str) -> tuple[tuple[int, int], ...]:
    ok = isinstance(value, list) and all(
        isinstance(r, list) and len(r) == 2 and all(type(v) is int for v in r) and 0 <= r[1] <= r[0] for r in value)
    if not ok:
        raise RequestLogError(f"{name}: rounds is not a list of [drafted, accepted] pairs")
    return tuple((d, a) for d, a in value)


def parse_record(record, name: str) -> Served:
    """A listing's entry or a whole record (file `name`) checked; RequestLogError names the bad field."""
    if not isinstance(record, dict):
        raise RequestLogError(f"{name}: a record is a JSON object, not {type(record).__name__}")
    timing = record.get("timing")
    if not isinstance(timing, dict):
        raise RequestLogError(f"{name}: timing is missing or not an object")
    gaps = timing.get("itl_s")
    if not isinstance(gaps, list):
        raise RequestLogError(f"{name}: timing.itl_s is not a list")
    rounds = record["rounds"] if "rounds" in record else trace_rounds(record.get("trace"))
    tokens = record.get("completion_tokens")
    return Served(name, _text(record, name, "id"), _text(record, name, "strategy"),
                  record.get("finish_reason") if isinstance(record.get("finish_reason"), str) else NA,
                  tokens if type(tokens) is int and tokens >= 0 else None,
                  _seconds(timing.get("queue_s"), name, "timing.queue_s"),
                  _seconds(timing.get("ttft_s"), name, "timing.ttft_s", optional=True),
                  tuple(_seconds(g, name, "timing.itl_s[]") for g in gaps),
                  _seconds(timing.get("e2e_s"), name, "timing.e2e_s"), _rounds(rounds, name))


def _values(rows: Sequence[Served], key: str) -> list[float]:
    if key == "itl_s":
        return [g for r in rows for g in r.itl_s]
    return [v for r in rows if (v := getattr(r, key)) is not None]


def by_strategy(rows: Sequence[Served]) -> dict[str, list[Served]]:
    out: dict[str, list[Served]] = {}
    for row in rows:
        out.setdefault(row.strategy, []).append(row)
    return out


def _ms(value: float | None) -> str:
    return NA if value is None else f"{value * 1000:,.1f}"


def _num(seconds: float) -> float:
    return round(seconds * 1000, 1)


def table_height(rows: int, cap: int = 40) -> int:
    """Pixels for a table showing up to `cap` rows without scrolling inside itself."""
    return 35 * (min(rows, cap) + 1) + 3


def percentile_table(rows: Sequence[Served]) -> pd.DataFrame:
    """Per strategy and measure: how many values and their P50 / P90 / P99 in milliseconds."""
    out = []
    for strategy, group in by_strategy(rows).items():
        for key, word in MEASURES.items():
            values = _values(group, key)
            cells = {f"P{q} (ms)": _ms(percentile(values, q) if values else None) for q in PERCENTILES}
            out.append({"Strategy": strategy, "Measure": word, "Requests": len(group),
                        "Values": len(values), **cells})
    return pd.DataFrame(out)


def shared_edges(values: Sequence[float], bins: int = 20) -> np.ndarray:
    """Bin edges over every strategy's values at once, so the strategies' bars are comparable: numpy's "auto"
    rule (the larger of Sturges' and Freedman-Diaconis' bin counts), at most `bins` bins, so that a few requests
    do not spread over mostly empty bins too thin to read."""
    values = np.asarray(values, dtype=float)
    edges = np.histogram_bin_edges(values, bins="auto")
    return edges if len(edges) - 1 <= bins else np.histogram_bin_edges(values, bins=bins)


def latency_histogram(rows: Sequence[Served], key: str = "e2e_s", bins: int = 20) -> go.Figure:
    """One bar series per strategy, counts of `key` on the same bins (milliseconds), side by side in each bin;
    each strategy a colour of the project's palette and a pattern, so the legend does not rest on colour."""
    every = _values(rows, key)
    fig = go.Figure()
    if not every:
        return fig
    edges = shared_edges(every, bins) * 1000
    centers = (edges[:-1] + edges[1:]) / 2
    for n, (strategy, group) in enumerate(by_strategy(rows).items()):
        counts, _ = np.histogram(np.asarray(_values(group, key)) * 1000, bins=edges)
        shown = html.escape(strategy)          # plotly draws a name's markup: a log's text is escaped
        color, pattern = SERIES_COLORS[n % len(SERIES_COLORS)], SERIES_PATTERNS[n % len(SERIES_PATTERNS)]
        fig.add_bar(x=centers.tolist(), y=counts.tolist(), name=shown,
                    marker={"color": color, "pattern": {"shape": pattern, "fillmode": "overlay", "fgcolor": "white",
                                                        "solidity": 0.3}},
                    hovertemplate=f"{shown}: %{{y}} in %{{x:.1f}} ms<extra></extra>")
    fig.update_layout(barmode="group", bargap=0.15, bargroupgap=0.0, height=320,
                      margin={"l": 10, "r": 10, "t": 30, "b": 10}, title=f"{MEASURES[key]} per strategy",
                      xaxis_title=f"{MEASURES[key]} (ms, bin centre)", yaxis_title="Values (count)")
    peak = max(max(bar.y) for bar in fig.data)
    fig.update_yaxes(tick0=0, dtick=max(1, math.ceil(peak / 5)), rangemode="tozero")      # whole counts
    return fig


def timing_line(row: Served) -> str:
    """One request's timing in words, shown above its trace: where its time went."""
    decoding = row.e2e_s - row.queue_s
    return (f"Served request {row.request_id} ({row.strategy}): end to end {_ms(row.e2e_s)} ms = queue "
            f"{_ms(row.queue_s)} ms + decoding {_ms(decoding)} ms; time to first token {_ms(row.ttft_s)} ms; "
            f"{len(row.itl_s) + (row.ttft_s is not None)} steps added tokens.")


# The clickable table at 1280×800: the columns that answer "queue or decoding?"; the rest behind an expander.
MAIN_COLUMNS = ("Request", "Strategy", "End to end (ms)", "Queue (ms)", "Decoding (ms)", "Tokens",
                "Accepted / drafted")


def requests_table(rows: Sequence[Served]) -> pd.DataFrame:
    """Every request, slowest end to end first, in ms ("Mean gap": the mean time between two steps that added
    tokens; "First token": time to first token)."""
    out = []
    for row in rows:
        drafted = sum(d for d, _ in row.rounds)
        accepted = sum(a for _, a in row.rounds)
        out.append({"Request": row.request_id, "Strategy": row.strategy, "End to end (ms)": _num(row.e2e_s),
                    "Queue (ms)": _num(row.queue_s), "Decoding (ms)": _num(row.e2e_s - row.queue_s),
                    "First token (ms)": _ms(row.ttft_s),
                    "Mean gap (ms)": _ms(sum(row.itl_s) / len(row.itl_s)) if row.itl_s else NA,
                    "Accepted / drafted": f"{accepted} / {drafted}" if row.rounds else NA,
                    "Tokens": NA if row.completion_tokens is None else str(row.completion_tokens),
                    "Finish": row.finish})
    table = pd.DataFrame(out)
    return table.sort_values("End to end (ms)", ascending=False, kind="stable") if out else table


# -- acceptance (the same meanings as vLLM's counters; shared with the engine telemetry import) -------------

@dataclass(frozen=True)
class Acceptance:
    """Drafting rounds counted as vLLM counts them: `per_pos[k]` = rounds whose first k+1 drafts were all
    accepted."""

    source: str
    drafts: int
    draft_tokens: int
    accepted: int
    per_pos: tuple[int, ...]


def acceptance_of(rounds: Sequence[tuple[int, int]], source: str) -> Acceptance:
    rounds = [r for r in rounds if r[0] > 0]
    per_pos = [0] * max((d for d, _ in rounds), default=0)
    for _, accepted in rounds:
        for k in range(accepted):
            per_pos[k] += 1
    return Acceptance(source, len(rounds), sum(d for d, _ in rounds), sum(a for _, a in rounds), tuple(per_pos))


def accepted_length_counts(acc: Acceptance) -> list[int]:
    """Rounds that accepted exactly L drafts, L = 0 .. len(per_pos), from the cumulative per-position counts."""
    at_least = [acc.drafts, *acc.per_pos, 0]
    return [at_least[i] - at_least[i + 1] for i in range(len(at_least) - 1)]


def acceptance_figure(acc: Acceptance) -> go.Figure:
    """Left: rounds by accepted length; right: per-position acceptance (fraction of rounds)."""
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=("Rounds by drafts accepted (count)",
                                                        "Acceptance by draft position (fraction of rounds)"))
    counts = accepted_length_counts(acc)
    fig.add_bar(x=list(range(len(counts))), y=counts, row=1, col=1, showlegend=False, marker_color=palette.BLUE,
                hovertemplate="%{y} rounds accepted %{x} drafts<extra></extra>")
    rates = [n / acc.drafts if acc.drafts else 0.0 for n in acc.per_pos]
    fig.add_bar(x=list(range(1, len(rates) + 1)), y=rates, row=1, col=2, showlegend=False, marker_color=palette.GREEN,
                hovertemplate="position %{x}: %{y:.2f}<extra></extra>")
    fig.update_xaxes(title_text="Drafts accepted in the round", dtick=1, row=1, col=1)
    fig.update_xaxes(title_text="Draft position k (from 1)", dtick=1, row=1, col=2)
    fig.update_yaxes(title_text="Rounds (count)", row=1, col=1)
    fig.update_yaxes(title_text="Acceptance (fraction)", range=[0, 1], row=1, col=2)
    # the subplot titles sit above the plots: below the band plotly's toolbar takes (figures.TOOLBAR_PX)
    fig.update_layout(height=324, margin={"l": 10, "r": 10, "t": 64, "b": 10})
    return fig


def acceptance_line(acc: Acceptance) -> str:
    """What the source counted, in words; "—" for what it does not export (SGLang: drafts proposed;
    llama.cpp: rounds)."""
    if not (acc.drafts or acc.draft_tokens):
        return f"{acc.source}: no drafting rounds"
    rate = f"{acc.accepted / acc.draft_tokens:.2f}" if acc.draft_tokens else NA
    tau = f"{1 + acc.accepted / acc.drafts:.2f}" if acc.drafts else NA
    rounds = f"{acc.drafts:,}" if acc.drafts else NA
    proposed = f"{acc.draft_tokens:,}" if acc.draft_tokens else NA
    return (f"{acc.source}: {rounds} rounds, {proposed} drafts proposed, {acc.accepted:,} accepted "
            f"(acceptance rate {rate}, mean accepted length τ {tau})")
