"""Streamlit widgets shared by every page: a chart (its toolbar's camera saves SVG) or a table with its
CSV download button, the output as token chips, the running metrics, and token streams side by side. What
they draw is built in ui/views (figures, tables, chips)."""
from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence

import streamlit as st

from decoding.core.trace_totals import output_ids
from ui.views import figures, glossary, headers, tables
from ui.views.chips import (
    chips_for,
    chips_html,
    emitted_text,
    first_divergence,
    last_chips,
    legend_html,
    name_forced,
    origins_present,
)
from ui.views.text import md_text


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text)[:60]


def plot(fig, key: str, filename: str) -> None:
    """Every chart of the app: projector-sized text and a title clear of the toolbar (figures.projector_layout),
    margins fixed here (figures.fixed_margins), and the toolbar's camera saving `<filename>.svg`, drawn by
    plotly.js in the browser (figures.export_config); nothing on the server."""
    fig = figures.fixed_margins(figures.projector_layout(fig))
    st.plotly_chart(fig, key=key, config=figures.export_config(_slug(filename)))


# Where a table's columns go at a projector's 1280×800 (issue 46): the row's name first (its first column among
# LEAD_FIELDS), then the columns that carry the verdict (KEY_FIELDS, in that order), then the rest as the builder
# ordered them, each that still fits TABLE_WIDTH_PX; the others in a "More columns" expander, each part led by the
# row's name again. A table of up to TALL_ROWS rows is as tall as its rows (no scrolling inside it, no hidden last
# rows).
TABLE_WIDTH_PX = 900     # the main column at 1280 px with the sidebar open is 916 px (app.py's CSS: 2rem padding)
CHAR_PX = 7.8            # the grid's 14 px Source Sans, an average glyph (digits and lower case are 6.7-7 px)
CELL_PAD_PX = 26         # a cell's padding and the header's sort/menu room
MAX_COLUMN_PX = 560      # a longer text cell is cut here (the grid does not wrap)
TALL_ROWS = 40           # up to this many rows a table is drawn whole; a longer one scrolls inside its box
LONG_TABLE_PX = 600
LEAD_FIELDS = ("quantity", "lane", "round", "step", "node", "k", "rank", "size", "phase", "bin", "n", "batch",
               "rule", "filter", "tokens")
KEY_FIELDS = ("verdict", "piece", "source", "accept_prob", "p_accept", "status", "chosen", "on_path")


def _cell_text(value) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return headers.NOT_APPLICABLE
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value)


def column_px(view, column: str) -> int:
    """About how wide the grid draws `column` of the shown table: its header or its widest cell."""
    cells = max((len(_cell_text(v)) for v in view[column].head(200)), default=0)
    return min(MAX_COLUMN_PX, int(max(len(str(column)), cells) * CHAR_PX) + CELL_PAD_PX)


def column_order(fields) -> list:
    """The lead field, the key fields, then the rest in their order."""
    lead = [next((f for f in fields if f in LEAD_FIELDS), fields[0])] if len(fields) else []
    keys_ = [f for f in KEY_FIELDS if f in fields and f not in lead]
    return lead + keys_ + [f for f in fields if f not in lead and f not in keys_]


def column_parts(df, words: Mapping[str, str] | None = None) -> list[list]:
    """The table's fields in parts that each fit TABLE_WIDTH_PX: the first part the lead and key fields and every
    later field that still fits beside them (in order; a wide one is passed over for a narrower one after it),
    each later part the lead field and the fields left, packed the same way."""
    order = column_order(list(df.columns))
    if not order:
        return [[]]
    view = headers.shown(df, words)
    widths = dict(zip(df.columns, (column_px(view, c) for c in view.columns)))
    lead, left, parts = order[0], order[1:], []
    while left or not parts:
        part, used, rest = [lead], widths[lead], []
        for field in left:
            if used + widths[field] <= TABLE_WIDTH_PX or len(part) == 1:
                part.append(field)
                used += widths[field]
            else:
                rest.append(field)
        parts.append(part)
        left = rest
    return parts


def _grid(df, key: str, words: Mapping[str, str] | None, fields: list) -> None:
    """One st.dataframe showing `fields` of the table (column_order: the first part's element keeps every
    column, for the tests that read a table whole): each column as wide as column_px says (the grid's own sizing cuts
    long text cells), small numbers formatted (headers.number_formats), as tall as its rows up to TALL_ROWS."""
    view = headers.shown(df, words)
    shown = [view.columns[list(df.columns).index(f)] for f in fields]
    formats = headers.number_formats(view)
    width = {c: column_px(view, c) if c in shown else None for c in view.columns}
    config = {c: st.column_config.NumberColumn(format=formats[c], width=width[c], help=headers.help_for(str(c)))
              if c in formats else st.column_config.Column(width=width[c], help=headers.help_for(str(c)))
              for c in view.columns}
    height = "content" if len(view) <= TALL_ROWS else LONG_TABLE_PX
    st.dataframe(view, hide_index=True, key=key, placeholder=headers.NOT_APPLICABLE, height=height,
                 column_order=shown, column_config=config or None)


def table(df, key: str, filename: str, label: str = "Download CSV", words: Mapping[str, str] | None = None) -> None:
    """A table in words (headers.shown: HEADERS, then the table's own `words`), "—" where a value does not
    apply, its key columns first and the columns that do not fit a projector's width in a "More columns"
    expander (column_parts); its CSV download (every column, the field names) made only when the button is
    clicked (not every rerun)."""
    parts = column_parts(df, words)
    _grid(df, f"{key}.df", words, parts[0])
    if len(parts) > 1:
        with st.expander(f"More columns ({sum(len(p) - 1 for p in parts[1:])})"):
            for i, part in enumerate(parts[1:], start=1):     # only its columns: a long table is sent once whole
                _grid(df[part], f"{key}.df{i}", words, part)
    st.download_button(md_text(label), lambda: df.to_csv(index=False), file_name=f"{_slug(filename)}.csv",
                       mime="text/csv", key=f"{key}.csv", on_click="ignore")


def glossary_expander() -> None:
    """Every quantity the app shows, with its one definition (ui/views/glossary.py); drawn only while open,
    so a closed glossary costs a rerun nothing."""
    box, is_open = lazy_expander("Glossary: what each quantity means", "ds.glossary_open")
    if is_open:
        with box:
            for term in glossary.sorted_terms():
                st.markdown(f"**{md_text(term.name)}**: {md_text(term.definition)}")


def lazy_expander(label: str, key: str):
    """An expander whose content is drawn only while it is open (opening it reruns the fragment or page):
    a closed one costs the rerun and the browser nothing. -> (container, open)."""
    box = st.expander(md_text(label), key=key, on_change="rerun")
    return box, bool(box.open)


def show_chips(events: Sequence, current_step: int | None = None, diverge_at: int | None = None,
               legend: Sequence[str] | None = None, keep: int | None = None) -> None:
    """The output as chips; the legend lists the origins present unless `legend` names them. `keep`:
    only the last chips (a long run in progress redraws them every chunk), with a note of the rest."""
    chips = chips_for(events)
    st.html(legend_html(legend if legend is not None else origins_present(chips)))
    shown, note = last_chips(chips, keep if diverge_at is None else None)
    st.html(chips_html(shown, current_step=current_step, diverge_at=diverge_at, prefix=note))


def show_metrics(events: Sequence) -> None:
    m = tables.running_metrics(events)
    cols = st.columns(4)
    cols[0].metric("Tokens", f"{m['tokens']:d}")
    cols[1].metric("Target forwards", f"{m['target_forwards']:d}")
    cols[2].metric("Model time", f"{m['model_ms']:.0f} ms", help=md_text(glossary.definition("model time")))
    cols[3].metric("Tokens/s", f"{m['tokens_per_s']:.1f}", help=md_text(glossary.definition("tokens/s")))


def show_streams(lanes: dict[str, Sequence], legend: Sequence[str] | None = None,
                 piece_of: Callable[[int], str] | None = None, drafting: bool = True) -> None:
    """Token streams side by side; each lane after the first marks its first divergence from the first.
    `piece_of` (token id -> text) names forced tokens whose events carry no text for them. Without
    `drafting`, each lane is its emitted text only (chips.emitted_text: no rejected drafts, no marks)."""
    shape = (lambda chips: chips) if drafting else emitted_text
    if legend is None:
        legend = origins_present([c for events in lanes.values() for c in shape(chips_for(events))])
    st.html(legend_html(legend))
    labels = list(lanes)
    base = output_ids(lanes[labels[0]]) if labels else []
    cols = st.columns(len(labels))
    for col, label in zip(cols, labels):
        stream = output_ids(lanes[label])
        diverge = first_divergence(base, stream) if label != labels[0] else None
        chips = shape(chips_for(lanes[label]))
        if piece_of is not None:
            chips = name_forced(chips, stream, piece_of)
        with col:
            mark = f" — diverges at token {diverge + 1:d}" if diverge is not None else ""   # counted from 1
            st.markdown(f"**{md_text(label)}**" + mark)
            st.html(chips_html(chips, diverge_at=diverge))
