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
    """Every chart of the app: margins fixed here (figures.fixed_margins), and the toolbar's camera saving
    `<filename>.svg`, drawn by plotly.js in the browser (figures.export_config); nothing on the server."""
    st.plotly_chart(figures.fixed_margins(fig), key=key, config=figures.export_config(_slug(filename)))


def table(df, key: str, filename: str, label: str = "Download CSV", words: Mapping[str, str] | None = None) -> None:
    """A table in words (headers.shown: HEADERS, then the table's own `words`), "—" where a value does not
    apply, and its CSV download with the field names, made only when the button is clicked (not every rerun)."""
    view = headers.shown(df, words)
    formats = headers.number_formats(view)
    config = {c: st.column_config.NumberColumn(format=formats[c], help=headers.help_for(str(c))) if c in formats
              else st.column_config.Column(help=headers.help_for(str(c)))
              for c in view.columns if c in formats or headers.help_for(str(c))}
    st.dataframe(view, hide_index=True, key=f"{key}.df", placeholder=headers.NOT_APPLICABLE,
                 column_config=config or None)
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
