"""What "force this candidate and branch" forces, per strategy. Pure: events in, token lists out.

A branch is a new run that emits a forced list (every token after the prompt, up to and including
the chosen one) and continues under the same settings. The rules:
- greedy / sampling, step s: the tokens emitted before step s, then the chosen token;
- beam search, pool candidate r of step s: the candidate's whole hypothesis, i.e. the forced prefix,
  the tokens of the live beam of step s−1 it extends, then its token (beam search then starts again
  from that prefix with fresh beams);
- speculative round s, position k of the round's new tokens: the tokens emitted before the round
  (forced ones included), the round's first k new tokens (accepted drafts), then the chosen token;
- DSpark round s, depth d: the same rule with k = d − 1 (depth d is lattice position d).
Positions past what the round emitted cannot be forced (their prefix was never accepted).

What a picker shows: every rank, beam, position k and candidate counted from 1 (the glossary's "counting"), in
the glossary's words (p target, q draft, p residual, p raw), in a label short enough for its select box at
1280 px (LABEL_CHARS); a choice's full note goes in the line under the box, which wraps.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from decoding.core.errors import ConfigError, check
from decoding.core.trace_totals import emitted_ids
from ui.views.chips import visible
from ui.views.glossary import counted_from_1
from ui.views.headers import value_word

# The longest option label each select box shows whole at 1280 px (tests/test_browser_layout.py measures the boxes;
# the widest text measured, "'<jupyter_start>' (id 11) — lattice cand 0, …", takes about 8.4 px a character):
LABEL_CHARS = 42      # a round's "Token to force there", about 435 px
PLACE_CHARS = 30      # a round's position picker, about 290 px
WIDE_CHARS = 60       # greedy / sampling's and beam search's pickers, about 650 px
PIECE_CHARS = 14      # a token's text in a label, quoted, cut with "…" beyond (the note under the box has it all)


def short_piece(piece: str) -> str:
    text = repr(visible(piece))
    return text if len(text) <= PIECE_CHARS else text[: PIECE_CHARS - 2] + "…" + text[-1]


@dataclass(frozen=True)
class Choice:
    """A token the user may force at some position, with where the trace has it from."""

    token_id: int
    piece: str
    note: str                      # its sources and numbers, e.g. "emitted · p target 0.41 · draft (accepted, …)"
    tags: tuple[str, ...] = ()     # the same in a word or two each, e.g. ("emitted", "p target 0.41")

    def label(self) -> str:
        """The option's text in the select box: the token and as many of its sources as LABEL_CHARS holds (at
        least the first); the line under the box names them all."""
        text = f"{short_piece(self.piece)} — {self.tags[0] if self.tags else self.note}"
        for tag in self.tags[1:]:
            if len(text) + 2 + len(tag) > LABEL_CHARS:
                break
            text += f", {tag}"
        return text

    def detail(self) -> str:
        """The whole note, for the line under the box."""
        return f"{visible(self.piece)!r} (id {self.token_id}) — {self.note}"


def _event_at(events: Sequence, at: int, kind: str):
    if not 0 <= at < len(events):
        raise ConfigError("step", at, f"must be a recorded step in [0, {len(events)})")
    event = events[at]
    check(getattr(event, "kind", "") == kind, "step", at, f"must be a {kind} step")
    return event


def _num(x: float | None) -> str:
    return "—" if x is None else (f"{x:.3g}" if x == 0 or abs(x) >= 1e-3 else f"{x:.1e}")


def _merge(entries: Sequence[tuple[int, str, str, str]]) -> list[Choice]:
    """(token_id, piece, note, tag) in order of first appearance, one Choice per token, notes and tags joined."""
    order: list[int] = []
    pieces: dict[int, str] = {}
    notes: dict[int, list[str]] = {}
    tags: dict[int, list[str]] = {}
    for token_id, piece, note, tag in entries:
        if token_id not in notes:
            order.append(token_id)
            pieces[token_id], notes[token_id], tags[token_id] = piece, [], []
        if note not in notes[token_id]:
            notes[token_id].append(note)
        if tag not in tags[token_id]:
            tags[token_id].append(tag)
    return [Choice(t, pieces[t], " · ".join(notes[t]), tuple(tags[t])) for t in order]


# ---------------------------------------------------------------- greedy / sampling

def token_forced(events: Sequence, at: int, token_id: int) -> list[int]:
    _event_at(events, at, "token")
    return [int(t) for t in emitted_ids(events[:at])] + [int(token_id)]


# ---------------------------------------------------------------- beam search

FORCEABLE_BEAM = ("kept", "pruned")


def beam_ranks(step) -> list[int]:
    """Pool ranks that can be forced: kept and pruned candidates (finished ones are complete answers)."""
    return [r for r, c in enumerate(step.pool) if c.status in FORCEABLE_BEAM]


def token_label(step, i: int) -> str:
    """Candidate i (0-based, raw order) of a token step, as its force picker shows it: rank from 1."""
    c = step.raw_top[i]
    return f"rank {i + 1}: {short_piece(c.piece)} · p raw {_num(c.prob)}"


def beam_label(step, rank: int) -> str:
    """Pool candidate `rank` (0-based) as the picker shows it: rank and "from beam" from 1, as the pool table."""
    c = step.pool[rank]
    return (f"rank {rank + 1}: {short_piece(c.piece)} · {value_word('status', c.status)} · from beam "
            f"{counted_from_1(c.source_beam)} · score {c.score:.2f}")


def beam_forced(events: Sequence, at: int, rank: int) -> list[int]:
    """The hypothesis of pool candidate `rank` of step `at`: forced prefix + its source beam + its token."""
    step = _event_at(events, at, "beam")
    check(0 <= rank < len(step.pool), "rank", rank, f"must be a pool rank in [0, {len(step.pool)})")
    cand = step.pool[rank]
    check(cand.status in FORCEABLE_BEAM, "rank", rank,
          f"is a {cand.status} candidate; force a kept or pruned one (finished ones are complete answers)")
    prior: Sequence[int] = ()
    if at > 0:
        beams = events[at - 1].beams
        check(0 <= cand.source_beam < len(beams), "rank", rank,
              f"extends beam {cand.source_beam}, which step {at - 1} does not have")
        prior = beams[cand.source_beam].token_ids
    return [int(t) for t in step.forced_ids] + [int(t) for t in prior] + [int(cand.token_id)]


# ---------------------------------------------------------------- speculative and DSpark rounds

def _new_tokens(event) -> list[int]:
    return [int(t) for t in event.emitted[len(event.forced_ids):]]


def round_forced(events: Sequence, at: int, offset: int, token_id: int, kind: str) -> list[int]:
    """Tokens before round `at`, its forced tokens, its first `offset` new tokens, the chosen token."""
    event = _event_at(events, at, kind)
    new = _new_tokens(event)
    check(0 <= offset < len(new), "position", offset,
          f"must be one of the round's emitted positions [0, {len(new)})" if new else "has no emitted position")
    before = [int(t) for t in emitted_ids(events[:at])]
    return before + [int(t) for t in event.forced_ids] + new[:offset] + [int(token_id)]


def spec_positions(event) -> list[int]:
    """Positions k of the round's new tokens: the accepted drafts, then the residual / bonus token."""
    return list(range(len(_new_tokens(event))))


def spec_position_label(event, k: int) -> str:
    """Position k (0-based) of the round's new tokens as the picker shows it: k from 1, as the charts."""
    new = _new_tokens(event)
    what = "accepted" if k < event.accepted else event.final_kind
    piece = event.drafts[k].piece if k < event.accepted else (event.final_piece or f"⟨{new[k]}⟩")
    return f"k={k + 1}: {short_piece(piece)} · {what}"


def spec_choices(event, k: int) -> list[Choice]:
    """What the trace has at position k: the emitted token, the draft there, the target's processed
    top-N there (p_target), and at a rejection the residual's top-N."""
    new = _new_tokens(event)
    check(0 <= k < len(new), "position", k, f"must be in [0, {len(new)})")
    draft = event.drafts[k] if k < len(event.drafts) else None
    entries = [(new[k], _spec_piece(event, new[k], draft), "emitted", "emitted")]
    if draft is not None:
        verdict = value_word("verdict", "accepted" if k < event.accepted else draft.verdict)
        entries.append((draft.token_id, draft.piece, f"draft ({verdict}, q draft {_num(draft.q_draft)})",
                        f"draft, {verdict}"))
    target_top = draft.target_top if draft is not None and draft.target_top else ()
    if k == event.accepted and event.final_top:
        target_top = event.final_top
    entries += [(c.token_id, c.piece, f"p target {_num(c.prob)}", f"p target {_num(c.prob)}") for c in target_top]
    if k == event.accepted:
        entries += [(e.token_id, e.piece, f"p residual {_num(e.prob)}", f"p residual {_num(e.prob)}")
                    for e in event.residual_top]
    return _merge(entries)


def _spec_piece(event, token_id: int, draft) -> str:
    if draft is not None and draft.token_id == token_id:
        return draft.piece
    if token_id == event.final_id and event.final_piece:
        return event.final_piece
    for c in tuple(event.final_top) + tuple(event.residual_top):
        if c.token_id == token_id:
            return c.piece
    return f"⟨{token_id}⟩"


def spec_forced(events: Sequence, at: int, k: int, token_id: int) -> list[int]:
    return round_forced(events, at, k, token_id, "spec_round")


def dspark_depths(event) -> list[int]:
    """Depths d (1-based) of a drafting round's new tokens that have lattice candidates to force."""
    if event.prefill:
        return []
    return [d for d in range(1, len(_new_tokens(event)) + 1) if d <= len(event.lattice)]


def dspark_depth_label(event, d: int) -> str:
    """Depth d (= draft position k) as the picker shows it, in the speculative picker's form."""
    new = _new_tokens(event)
    what = "accepted" if d <= len(event.accepted_path) else event.next_from
    return f"k={d}: {short_piece(_dspark_piece(event, new[d - 1], d))} · {what}"


def dspark_choices(event, d: int) -> list[Choice]:
    """What the trace has at depth d: the emitted token, then the lattice's candidates at position d
    with q_draft (and p_target / verdict where the plan verified that token under the accepted path).
    DSpark rounds record no target top-N, so the lattice is the menu."""
    check(d in dspark_depths(event), "depth", d, f"must be one of {dspark_depths(event)}")
    token = _new_tokens(event)[d - 1]
    parent = event.accepted_path[d - 2] if d >= 2 else 0
    verified = {n.token_id: n for n in event.nodes if n.depth == d and n.parent == parent}
    entries = [(token, _dspark_piece(event, token, d), "emitted", "emitted")]
    for c in event.lattice[d - 1].cells:
        j = counted_from_1(c.cand)
        note, tag = f"lattice candidate {j}, q draft {_num(c.q_draft)}", f"candidate {j}"
        node = verified.get(c.token_id)
        if node is not None:
            verdict = value_word("verdict", node.verdict)
            note += f", verified: p target {_num(node.p_target)}, {verdict}"
            tag += f", {verdict}"
        entries.append((c.token_id, c.piece, note, tag))
    return _merge(entries)


def _dspark_piece(event, token_id: int, d: int) -> str:
    if d <= len(event.lattice):
        for c in event.lattice[d - 1].cells:
            if c.token_id == token_id:
                return c.piece
    if token_id == event.next_token and event.next_piece:
        return event.next_piece
    return f"⟨{token_id}⟩"


def dspark_forced(events: Sequence, at: int, d: int, token_id: int) -> list[int]:
    event = _event_at(events, at, "dspark_round")
    check(d in dspark_depths(event), "depth", d, f"must be one of {dspark_depths(event)}")
    return round_forced(events, at, d - 1, token_id, "dspark_round")
