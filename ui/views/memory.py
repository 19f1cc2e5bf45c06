"""The KV cache's size over a run, from the trace's `kv` records (schema 1.3): a table per step and a
chart with one line per trace, held bytes against the tokens emitted so far, with speculative and
DSpark rounds' peaks during verification. Pure (no streamlit, no torch)."""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd
import plotly.graph_objects as go

from decoding.core.trace_totals import emitted_count
from ui.views import palette
from ui.views.figures import plot_text

MB = 1e6


def memory_table(events: Sequence) -> pd.DataFrame:
    """One row per step that recorded its cache: tokens emitted so far, what the cache held after the step,
    and for verification rounds its peak and what the rollback freed (MB; empty without a record)."""
    rows, emitted = [], 0
    for event in events:
        emitted += emitted_count(event)
        kv = getattr(event, "kv", None)
        if kv is None:
            continue
        rows.append({"step": event.index, "tokens_emitted": emitted, "tokens_held": kv.tokens,
                     "sequences": kv.sequences, "held_mb": kv.bytes / MB,
                     "peak_mb": kv.peak_bytes / MB if kv.peak_bytes is not None else None,
                     "freed_mb": kv.freed_bytes / MB})
    return pd.DataFrame(rows, columns=["step", "tokens_emitted", "tokens_held", "sequences", "held_mb", "peak_mb",
                                       "freed_mb"])


def memory_figure(lanes: Mapping[str, Sequence]) -> go.Figure | None:
    """Held MB against tokens emitted, one line per lane (colour and dash by lane); a lane's peaks as
    open triangles of its colour. None when no lane recorded its cache (traces before schema 1.3)."""
    fig = go.Figure()
    for i, (label, events) in enumerate(lanes.items()):
        table = memory_table(events)
        if table.empty:
            continue
        color, dash = palette.LANE_COLORS[i % 4], palette.LANE_DASHES[i % 4]
        fig.add_scatter(x=table["tokens_emitted"].tolist(), y=table["held_mb"].tolist(), mode="lines+markers",
                        name=plot_text(label),
                        line={"color": color, "dash": dash, "shape": "hv"},
                        hovertemplate="%{x} tokens: %{y:.2f} MB held<extra>" + plot_text(label) + "</extra>")
        peaks = table.dropna(subset=["peak_mb"])
        if not peaks.empty and (peaks["freed_mb"] > 0).any():
            fig.add_scatter(x=peaks["tokens_emitted"].tolist(), y=peaks["peak_mb"].tolist(), mode="markers",
                            name=plot_text(f"{label}: peak in verification"),
                            marker={"color": color, "symbol": "triangle-up-open", "size": 9},
                            hovertemplate="%{x} tokens: %{y:.2f} MB at the peak<extra>" + plot_text(label) + "</extra>")
    if not fig.data:
        return None
    fig.update_layout(title="KV cache held", xaxis_title="tokens emitted", yaxis={"title": "MB", "rangemode": "tozero"},
                      legend={"orientation": "h", "y": -0.25}, height=380, margin={"t": 50, "b": 10, "l": 10, "r": 10})
    return fig


def human_bytes(n: float) -> str:
    """1,536 -> '1.5 kB', 3,320,000 -> '3.32 MB' (decimal units, as the table's MB)."""
    for unit, size, digits in (("GB", 1e9, 2), ("MB", 1e6, 2), ("kB", 1e3, 1)):
        if n >= size:
            return f"{n / size:.{digits}f} {unit}"
    return f"{n:.0f} B"


def memory_summary(events: Sequence) -> str:
    """One sentence: the cache at the end, its peak, and what rollbacks freed over the run."""
    table = memory_table(events)
    if table.empty:
        return "This trace records no KV cache sizes (they are recorded from trace schema 1.3 on)."
    last = table.iloc[-1]
    text = (f"After {int(last['tokens_emitted'])} tokens the cache holds {human_bytes(last['held_mb'] * MB)} "
            f"({int(last['tokens_held'])} positions × {int(last['sequences'])} sequence"
            f"{'s' if last['sequences'] != 1 else ''}).")
    peaks = table["peak_mb"].dropna()
    if not peaks.empty:
        text += (f" Verification raised it to {human_bytes(peaks.max() * MB)} at most; rolling back rejected "
                 f"drafts freed {human_bytes(table['freed_mb'].sum() * MB)} over "
                 f"{int((table['freed_mb'] > 0).sum())} rounds.")
    return text
