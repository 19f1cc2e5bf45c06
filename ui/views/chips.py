"""Token chips as HTML. Every piece and every string from a trace is untrusted: it goes through
html.escape before it reaches the page."""
from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from ui.views.palette import ORIGINS


@dataclass(frozen=True)
class Chip:
    piece: str
    origin: str          # a key of ORIGINS
    tooltip: str         # plain text (escaped when drawn)
    step: int            # index of the event that emitted it
    emitted: bool = True  # False for a chip shown but not in the output (a rejected draft)


def _fmt_prob(logprob: float) -> str:
    return f"{math.exp(logprob):.4f}" if math.isfinite(logprob) else "0"


def token_chips(event) -> list[Chip]:
    """Chips of a greedy/sampling TokenStep: one token, from the target or forced."""
    parts = [f"id {event.chosen_id}", f"p processed {_fmt_prob(event.chosen_logprob)}",
             f"p raw {_fmt_prob(event.chosen_raw_logprob)}", f"raw rank {event.chosen_rank + 1}"]
    if event.draw is not None:
        parts.append(f"u {event.draw:.4f}")
    parts.append(f"step {event.index}")
    origin = "forced" if event.forced else "target"
    return [Chip(event.chosen_piece, origin, " · ".join(parts), event.index)]


CHIP_BUILDERS: dict[str, Callable[[object], list[Chip]]] = {"token": token_chips}


def register_chips(kind: str, builder: Callable[[object], list[Chip]]) -> None:
    CHIP_BUILDERS[kind] = builder


SEQUENCE_CHIPS: dict[str, Callable[[Sequence], list[Chip]]] = {}


def register_sequence_chips(kind: str, builder: Callable[[Sequence], list[Chip]]) -> None:
    """For strategies whose output is not the concatenation of per-step tokens (beam search: the best
    hypothesis): `builder` gets all the events and returns the chips of the whole output."""
    SEQUENCE_CHIPS[kind] = builder


def chips_for(events: Sequence) -> list[Chip]:
    sequence = SEQUENCE_CHIPS.get(getattr(events[-1], "kind", "")) if events else None
    if sequence is not None:
        return sequence(events)
    out: list[Chip] = []
    for i, event in enumerate(events):
        builder = CHIP_BUILDERS.get(getattr(event, "kind", ""))
        if builder is None:
            out.append(Chip(f"<{getattr(event, 'kind', '?')}>", "target", "no chip view for this step kind", i))
        else:
            out.extend(builder(event))
    return out


def ngram_words(ngram: Sequence[int], before: Sequence) -> str:
    """Prompt lookup's matched n-gram, which is always the text's last n tokens before the round: their text
    from the emitted chips of the steps `before` it ("' three one'"), or the ids while they are in the prompt."""
    n = len(ngram)
    pieces = [chip.piece for chip in chips_for(before) if chip.emitted] if n and before else []
    if n and len(pieces) >= n:
        return repr(visible("".join(pieces[-n:])))
    return "ids " + ", ".join(str(t) for t in ngram)


def name_forced(chips: Sequence[Chip], stream: Sequence[int], piece_of: Callable[[int], str]) -> list[Chip]:
    """Forced chips drawn as ⟨id⟩ (events that carry no text for their forced tokens: beam search,
    DSpark, some speculative rounds) get `piece_of(id)`. The emitted chips are matched to `stream`,
    the emitted token ids, by position; a chip whose text is not ⟨that id⟩ is left alone."""
    out, emitted = [], 0
    for chip in chips:
        token = stream[emitted] if chip.emitted and emitted < len(stream) else None
        emitted += chip.emitted
        if chip.origin == "forced" and token is not None and chip.piece == f"⟨{token}⟩":
            chip = replace(chip, piece=piece_of(token))
        out.append(chip)
    return out


def emitted_text(chips: Sequence[Chip]) -> list[Chip]:
    """The output as text: emitted chips only (no rejected drafts), each drawn as the target's (accepted,
    residual, bonus alike) but forced ones, which stay marked."""
    return [chip if chip.origin == "forced" else replace(chip, origin="target") for chip in chips if chip.emitted]


def visible(piece: str) -> str:
    """Make whitespace-only differences visible: newline and tab get a glyph."""
    return piece.replace("\n", "↵").replace("\t", "⇥") or "∅"


CSS = """<style>
.ds-chips{line-height:2.1;font-family:ui-monospace,Menlo,Consolas,monospace;font-size:0.95rem}
.ds-chip{display:inline-block;white-space:pre;padding:0 2px;margin:2px 1px;border-radius:3px;line-height:1.5}
.ds-chip sup{font-size:0.65rem;margin-left:1px}
.ds-chip.ds-current{outline:2px solid #000;outline-offset:1px}
.ds-chip.ds-rejected{text-decoration:line-through}
.ds-diverge{display:inline-block;white-space:nowrap;font-weight:bold;color:#D55E00;margin:0 4px}
.ds-legend span.ds-chip{margin-right:8px}
</style>"""


def _chip_style(origin_name: str) -> str:
    origin = ORIGINS[origin_name]
    return (f"background:{origin.color}22;border-bottom:3px {origin.line} {origin.color}")


def chip_html(chip: Chip, current: bool = False) -> str:
    origin = ORIGINS.get(chip.origin, ORIGINS["target"])
    classes = ["ds-chip", f"ds-origin-{origin.name}"] + (["ds-current"] if current else [])
    if origin.name == "rejected":
        classes.append("ds-rejected")
    mark = f"<sup>{html.escape(origin.mark)}</sup>" if origin.mark else ""
    tip = html.escape(f"{origin.label} · {chip.tooltip}", quote=True)
    return (f'<span class="{" ".join(classes)}" style="{_chip_style(origin.name)}" '
            f'title="{tip}" data-step="{int(chip.step)}">{html.escape(visible(chip.piece))}{mark}</span>')


def chips_html(chips: Sequence[Chip], current_step: int | None = None, diverge_at: int | None = None,
               prefix: str = "") -> str:
    """The whole stream; `diverge_at` (an index into the emitted tokens; chips of tokens not emitted,
    like rejected drafts, do not count) gets a visible marker before it."""
    body = [f'<span class="ds-prefix">{html.escape(prefix)}</span>'] if prefix else []
    emitted = 0
    for chip in chips:
        if diverge_at is not None and chip.emitted and emitted == diverge_at:
            body.append('<span class="ds-diverge" title="first divergence">⟂ diverges</span>')
            diverge_at = None
        emitted += chip.emitted
        body.append(chip_html(chip, current=current_step is not None and chip.step == current_step))
    return CSS + f'<div class="ds-chips">{"".join(body)}</div>'


def last_chips(chips: Sequence[Chip], keep: int | None) -> tuple[list[Chip], str]:
    """The last `keep` chips and a note of how many come before them ("" when all are kept)."""
    if keep is None or len(chips) <= keep:
        return list(chips), ""
    return list(chips[-keep:]), f"… {len(chips) - keep} earlier chips, all shown when the run stops "


def token_box_html(piece: str, token_id: int, note: str = "") -> str:
    """A token shown large, with its id (st.metric would render Markdown from the piece)."""
    extra = f" · {html.escape(note)}" if note else ""
    return (CSS + '<div class="ds-token"><div style="font-size:0.85rem">Token</div>'
            f'<div class="ds-chips" style="font-size:1.6rem;white-space:nowrap;overflow:hidden;'
            f'text-overflow:ellipsis" title="{html.escape(repr(piece), quote=True)}">'
            f'{html.escape(repr(visible(piece)))}</div>'
            f'<div style="font-size:0.8rem;color:#555">id {int(token_id)}{extra}</div></div>')


def origins_present(chips: Sequence[Chip], always: Sequence[str] = ("target",)) -> list[str]:
    """Legend entries: the origins among the chips (plus `always`), in the palette's order."""
    names = set(always) | {c.origin for c in chips}
    return [name for name in ORIGINS if name in names]


def legend_html(origins: Sequence[str] = ("target", "forced")) -> str:
    items = []
    for name in origins:
        origin = ORIGINS[name]
        mark = f"<sup>{html.escape(origin.mark)}</sup>" if origin.mark else ""
        items.append(f'<span class="ds-chip ds-origin-{name}" style="{_chip_style(name)}">'
                     f'{html.escape(origin.label)}{mark}</span>')
    return CSS + f'<div class="ds-legend ds-chips">{"".join(items)}</div>'


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first position where two token streams differ (None if one is a prefix of the
    other and they have equal length)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))
