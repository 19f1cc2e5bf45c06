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
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from decoding.core.errors import ConfigError, check
from decoding.runner import emitted_ids
from ui.views.chips import visible


@dataclass(frozen=True)
class Choice:
    """A token the user may force at some position, with where the trace has it from."""

    token_id: int
    piece: str
    note: str          # its sources and numbers, e.g. "emitted · p_target 0.41 · draft"

    def label(self) -> str:
        return f"{visible(self.piece)!r} (id {self.token_id}) — {self.note}"


def _event_at(events: Sequence, at: int, kind: str):
    if not 0 <= at < len(events):
        raise ConfigError("step", at, f"must be a recorded step in [0, {len(events)})")
    event = events[at]
    check(getattr(event, "kind", "") == kind, "step", at, f"must be a {kind} step")
    return event


def _num(x: float | None) -> str:
    return "—" if x is None else (f"{x:.3g}" if x == 0 or abs(x) >= 1e-3 else f"{x:.1e}")


def _merge(entries: Sequence[tuple[int, str, str]]) -> list[Choice]:
    """(token_id, piece, note) in order of first appearance, one Choice per token, notes joined."""
    order: list[int] = []
    pieces: dict[int, str] = {}
    notes: dict[int, list[str]] = {}
    for token_id, piece, note in entries:
        if token_id not in notes:
            order.append(token_id)
            pieces[token_id], notes[token_id] = piece, []
        if note not in notes[token_id]:
            notes[token_id].append(note)
    return [Choice(t, pieces[t], " · ".join(notes[t])) for t in order]


# ---------------------------------------------------------------- greedy / sampling

def token_forced(events: Sequence, at: int, token_id: int) -> list[int]:
    _event_at(events, at, "token")
    return [int(t) for t in emitted_ids(events[:at])] + [int(token_id)]


# ---------------------------------------------------------------- beam search

FORCEABLE_BEAM = ("kept", "pruned")


def beam_ranks(step) -> list[int]:
    """Pool ranks that can be forced: kept and pruned candidates (finished ones are complete answers)."""
    return [r for r, c in enumerate(step.pool) if c.status in FORCEABLE_BEAM]


def beam_label(step, rank: int) -> str:
    c = step.pool[rank]
    return (f"rank {rank}: {visible(c.piece)!r} (id {c.token_id}) · {c.status} · extends beam {c.source_beam} · "
            f"score {c.score:.3f}")


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
    new = _new_tokens(event)
    what = "accepted draft" if k < event.accepted else f"{event.final_kind} token"
    piece = event.drafts[k].piece if k < event.accepted else (event.final_piece or f"⟨{new[k]}⟩")
    return f"k={k + 1}: {visible(piece)!r} (id {new[k]}, {what})"       # k from 1 on screen, as the charts


def spec_choices(event, k: int) -> list[Choice]:
    """What the trace has at position k: the emitted token, the draft there, the target's processed
    top-N there (p_target), and at a rejection the residual's top-N."""
    new = _new_tokens(event)
    check(0 <= k < len(new), "position", k, f"must be in [0, {len(new)})")
    draft = event.drafts[k] if k < len(event.drafts) else None
    entries = [(new[k], _spec_piece(event, new[k], draft), "emitted")]
    if draft is not None:
        verdict = "accepted" if k < event.accepted else draft.verdict
        entries.append((draft.token_id, draft.piece,
                        f"draft ({verdict.replace('_', ' ')}, q draft {_num(draft.q_draft)})"))
    target_top = draft.target_top if draft is not None and draft.target_top else ()
    if k == event.accepted and event.final_top:
        target_top = event.final_top
    entries += [(c.token_id, c.piece, f"p target {_num(c.prob)}") for c in target_top]
    if k == event.accepted:
        entries += [(e.token_id, e.piece, f"residual p {_num(e.prob)}") for e in event.residual_top]
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
    new = _new_tokens(event)
    what = "accepted draft" if d <= len(event.accepted_path) else f"next token ({event.next_from})"
    return f"depth {d}: {visible(_dspark_piece(event, new[d - 1], d))!r} (id {new[d - 1]}, {what})"


def dspark_choices(event, d: int) -> list[Choice]:
    """What the trace has at depth d: the emitted token, then the lattice's candidates at position d
    with q_draft (and p_target / verdict where the plan verified that token under the accepted path).
    DSpark rounds record no target top-N, so the lattice is the menu."""
    check(d in dspark_depths(event), "depth", d, f"must be one of {dspark_depths(event)}")
    token = _new_tokens(event)[d - 1]
    parent = event.accepted_path[d - 2] if d >= 2 else 0
    verified = {n.token_id: n for n in event.nodes if n.depth == d and n.parent == parent}
    entries = [(token, _dspark_piece(event, token, d), "emitted")]
    for c in event.lattice[d - 1].cells:
        note = f"lattice cand {c.cand}, q draft {_num(c.q_draft)}"
        node = verified.get(c.token_id)
        if node is not None:
            note += f", verified: p target {_num(node.p_target)}, {node.verdict.replace('_', ' ')}"
        entries.append((c.token_id, c.piece, note))
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
