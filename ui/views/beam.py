"""Beam search views without streamlit: the beam tree as Graphviz DOT, the candidate pool as a table,
the best hypothesis as chips, one steps-table row per step. Pure: BeamStep events in, values out.

Tree layout: the prompt is the root; at step s every pool candidate hangs under the live beam of
step s-1 it extends (`source_beam`). Live beam j of a step is the j-th candidate with status "kept"
in that step's pool (both are ranked best first), which is how the tree is linked up.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd

from ui.views import palette
from ui.views.chips import Chip, visible
from ui.views.glossary import counted_from_1

# status -> (fill colour, border style, shape, text twin)
STATUS_STYLE = {
    "kept": (palette.GREEN, "solid", "box", "kept"),
    "pruned": (palette.GREY, "dashed", "box", "pruned"),
    "finished": (palette.BLUE, "bold", "doubleoctagon", "finished"),
    "finished_dropped": (palette.PURPLE, "dashed", "octagon", "finished, dropped"),
    "eos_not_top": (palette.VERMILLION, "dotted", "octagon", "EOS below top B"),
}


# ---------------------------------------------------------------- tree walking

def kept(step) -> list:
    """The pool candidates that became the step's live beams, in beam order."""
    return [c for c in step.pool if c.status == "kept"]


def _finished_rank(step, hyp) -> int | None:
    """Pool rank of the candidate that entered as finished hypothesis `hyp` at its step."""
    last = hyp.token_ids[-1] if hyp.token_ids else None
    for rank, cand in enumerate(step.pool):
        if cand.status == "finished" and cand.token_id == last and math.isclose(cand.score, hyp.score,
                                                                                 rel_tol=1e-6, abs_tol=1e-6):
            return rank
    return None


def path_back(events: Sequence, step_index: int, rank: int) -> list[tuple[int, int]]:
    """(step, pool rank) of every candidate from step 0 to candidate `rank` of step `step_index`."""
    out = [(step_index, rank)]
    source = events[step_index].pool[rank].source_beam
    for s in range(step_index - 1, -1, -1):
        kept_ranks = [r for r, c in enumerate(events[s].pool) if c.status == "kept"]
        if source >= len(kept_ranks):
            break
        out.append((s, kept_ranks[source]))
        source = events[s].pool[kept_ranks[source]].source_beam
    return out[::-1]


def best_path(events: Sequence) -> list[tuple[int, int]]:
    """The path of the trace's output after the last event: the best finished hypothesis if any, else
    the best live beam (the rule of decoding.strategies.beam.output_ids)."""
    if not events:
        return []
    last = events[-1]
    if last.finished:
        hyp = last.finished[0]
        if 0 <= hyp.step < len(events):
            rank = _finished_rank(events[hyp.step], hyp)
            if rank is not None:
                return path_back(events, hyp.step, rank)
        return []
    if last.beams:
        kept_ranks = [r for r, c in enumerate(last.pool) if c.status == "kept"]
        return path_back(events, len(events) - 1, kept_ranks[0]) if kept_ranks else []
    return []


# ---------------------------------------------------------------- chips

def beam_chips(events: Sequence) -> list[Chip]:
    """The best hypothesis so far as chips (forced prefix first); each token's step is where it was
    chosen, its tooltip the token's log-probability and the running score."""
    if not events:
        return []
    chips = [Chip(f"⟨{t}⟩", "forced", f"id {t} · forced prefix", 0) for t in events[-1].forced_ids]
    for s, rank in best_path(events):
        cand = events[s].pool[rank]
        status = STATUS_STYLE.get(cand.status, (cand.status,))[-1]         # in words: "EOS below top B"
        tip = (f"id {cand.token_id} · logprob {cand.logprob:.4f} · score {cand.score:.4f} · "
               f"normalized {cand.normalized_score:.4f} · pool rank {rank + 1} · {status} · step {s}")
        chips.append(Chip(cand.piece, "target", tip, s))
    return chips


# ---------------------------------------------------------------- tables

HEADERS = {"score": "score (sum of log p)"}     # the page's words where beam's fields differ from headers.HEADERS
POOL_COLUMNS = ["rank", "source_beam", "token_id", "piece", "logprob", "score", "normalized_score", "status"]


def pool_table(step) -> pd.DataFrame:
    """The step's pool, best first: rank and the live beam each candidate extends both counted from 1."""
    rows = [{"rank": r, "source_beam": counted_from_1(c.source_beam), "token_id": c.token_id, "piece": visible(c.piece),
             "logprob": c.logprob, "score": c.score, "normalized_score": c.normalized_score, "status": c.status}
            for r, c in enumerate(step.pool, start=1)]
    return pd.DataFrame(rows, columns=POOL_COLUMNS)


def pieces_of(events: Sequence) -> dict[int, str]:
    """Token id -> its text, from every step's candidate pool (each token of a hypothesis was a candidate)."""
    return {c.token_id: c.piece for e in events for c in e.pool}


def hypothesis_text(token_ids: Sequence[int], pieces: dict[int, str]) -> str:
    return visible("".join(pieces.get(t, f"⟨{t}⟩") for t in token_ids))


def finished_table(step, events: Sequence = ()) -> pd.DataFrame:
    """The finished hypotheses, best first (rank from 1), each with its text (from `events`' pools)."""
    pieces = pieces_of(events or (step,))
    rows = [{"rank": i, "text": hypothesis_text(h.token_ids, pieces), "tokens": len(h.token_ids),
             "score": h.score, "normalized_score": h.normalized_score, "finished_at_step": h.step, "eos": h.eos}
            for i, h in enumerate(step.finished, start=1)]
    return pd.DataFrame(rows, columns=["rank", "text", "normalized_score", "tokens", "score", "finished_at_step",
                                       "eos"])


def beam_row(step) -> dict:
    counts = {s: sum(c.status == s for c in step.pool) for s in STATUS_STYLE}
    best = step.beams[0] if step.beams else None
    return {"step": step.index, "position": counted_from_1(step.position), "live_beams": len(step.beams),
            "best_live_piece": visible(best.piece) if best else "", "best_live_score": best.score if best else None,
            "finished": len(step.finished), **{f"n_{s}": n for s, n in counts.items()},
            "early_stop": step.early_stop, "done": step.done, "ms": sum(step.timings_ms.values())}


# ---------------------------------------------------------------- DOT

def dot_escape(text: str) -> str:
    """A string safe inside a double-quoted DOT label: backslashes and quotes escaped (so Graphviz's
    \\n, \\l, \\N sequences cannot be triggered), control characters shown as code points."""
    out = []
    for ch in visible(text):
        if ch == "\\":
            out.append("\\\\")
        elif ch == '"':
            out.append('\\"')
        elif ord(ch) < 32 or ord(ch) == 127:
            out.append(f"U+{ord(ch):04X}")
        else:
            out.append(ch)
    return "".join(out)


def _node(node_id: str, label_lines: Sequence[str], status: str, on_path: bool) -> str:
    color, style, shape, _ = STATUS_STYLE.get(status, STATUS_STYLE["pruned"])
    label = "\\n".join(dot_escape(line) for line in label_lines)
    width = 3 if on_path else 1
    fill = f"{color}55" if status != "pruned" else "#FFFFFF"
    return (f'  {node_id} [label="{label}", shape={shape}, style="filled,{style}", fillcolor="{fill}", '
            f'color="{color}", penwidth={width}];')


# Graphviz sizes in points, drawn at 4/3 px each: 10 pt text is 13.3 px on the page at natural size.
TREE_LAYOUT = ("  rankdir=LR;", "  nodesep=0.08;", "  ranksep=0.22;",
               '  node [fontname="sans-serif", fontsize=10, margin="0.05,0.02", width=0.3, height=0.3];')


def beam_dot(events: Sequence, upto: int | None = None, window: int = 8) -> str:
    """The beam tree of steps [upto-window+1, upto] as DOT, left to right (a step per column: the pruned
    candidates pile up downwards, so the width is the window's steps), compact (TREE_LAYOUT) so that six steps
    fit a projector's main column at natural size (the chart scales a wider SVG down, and its text with it).
    Candidates: the token (escaped), its score and a status twin in words; the output's path in bold."""
    if not events:
        return "digraph beam {}"
    upto = len(events) - 1 if upto is None else min(upto, len(events) - 1)
    first = max(0, upto - window + 1)
    path = set(best_path(events[: upto + 1]))
    lines = ["digraph beam {", *TREE_LAYOUT, '  edge [color="#777777"];']
    root = "prompt" if first == 0 else f"s{first - 1}"
    lines.append(f'  {root} [label="{"prompt" if first == 0 else f"step {first - 1} beams"}", shape=plaintext];')
    for s in range(first, upto + 1):
        step = events[s]
        kept_ranks = {}
        if s > first:
            kept_ranks = dict(enumerate(r for r, c in enumerate(events[s - 1].pool) if c.status == "kept"))
        for rank, cand in enumerate(step.pool):
            node = f"s{s}c{rank}"
            text = STATUS_STYLE.get(cand.status, STATUS_STYLE["pruned"])[3]
            lines.append(_node(node, [repr(visible(cand.piece)), f"{cand.score:.3f}", text], cand.status,
                               (s, rank) in path))
            if s == first:
                parent = root
            else:
                parent = f"s{s - 1}c{kept_ranks[cand.source_beam]}" if cand.source_beam in kept_ranks else root
            bold = (s, rank) in path and (s == first or (s - 1, kept_ranks.get(cand.source_beam)) in path)
            lines.append(f"  {parent} -> {node}" + (" [penwidth=3, color=\"#000000\"];" if bold else ";"))
    lines.append("}")
    return "\n".join(lines)
