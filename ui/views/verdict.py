"""What a comparison and a round come to, in one line each. Pure: traces and events in, sentences out.

- Compare's verdict: each lane against lane 1 (as the lanes' divergence marks and the metrics table do), by
  chips.first_divergence, the one definition of where two outputs part; tokens are counted from 1.
- Why a lane is slower than greedy, in plain-token units: a plain token is greedy's mean measured step
  (its first step, which holds the prompt's prefill, left out, and the same for every lane).
- How far one run pins a lane's speed vs greedy: a seeded bootstrap over each lane's steps.
- Why a speculative or DSpark round accepted nothing.
"""
from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from decoding.core.formulas import speed_vs
from decoding.core.trace_totals import emitted_count
from ui.views import spec
from ui.views.chips import chips_for, first_divergence, visible
from ui.views.dspark import piece_of as dspark_piece_of
from ui.views.tables import running_metrics


@dataclass(frozen=True)
class LaneVerdict:
    label: str
    identical: bool        # token-identical to the reference lane (the reference itself: True)
    line: str              # one sentence in words


def reference_lane(traces: Mapping[str, object]) -> str | None:
    """The lane the others are held against: the first."""
    return next(iter(traces), None)


def reference_name(label: str, trace) -> str:
    return "greedy" if trace.strategy == "greedy" else f"lane {label}"


def emitted_pieces(steps: Sequence) -> list[str]:
    """The text of each emitted token, in output order (rejected drafts left out)."""
    return [chip.piece for chip in chips_for(steps) if chip.emitted] if steps else []


def _quoted(pieces: Sequence[str], at: int) -> str:
    return repr(visible(pieces[at])) if at < len(pieces) else "the end"


def _why_differs(trace) -> str:
    """Why a lane need not match greedy ("" where it should)."""
    if trace.strategy == "beam":
        return " — beam search keeps the likeliest sequence, not the likeliest next token"
    temperature = trace.config.get("temperature", 0.0) or 0.0
    if temperature > 0:
        return f" — it samples at temperature {temperature:g}, so it need not match"
    return ""


def lane_verdict(label: str, trace, reference_label: str, reference) -> LaneVerdict:
    """One lane against the reference: token-identical, or where it diverges with both tokens."""
    name = reference_name(reference_label, reference)
    ours, theirs = list(trace.output_ids), list(reference.output_ids)
    at = first_divergence(theirs, ours)
    if at is None:
        return LaneVerdict(label, True, f"{label}: token-identical to {name} ({len(ours)} tokens).")
    mine, other = emitted_pieces(trace.steps), emitted_pieces(reference.steps)
    return LaneVerdict(label, False, f"{label}: diverges from {name} at token {at + 1} "
                                     f"({_quoted(mine, at)} here, {_quoted(other, at)} in {name})"
                                     f"{_why_differs(trace)}.")


def compare_verdicts(traces: Mapping[str, object]) -> list[LaneVerdict]:
    """Every lane but the reference against it (in lane order)."""
    ref = reference_lane(traces)
    if ref is None:
        return []
    return [lane_verdict(label, t, ref, traces[ref]) for label, t in traces.items() if label != ref]


def verdict_lines(traces: Mapping[str, object]) -> list[str]:
    """One line for all when every lane matches the reference, else one line per lane."""
    verdicts = compare_verdicts(traces)
    if not verdicts:
        return []
    ref = reference_lane(traces)
    if all(v.identical for v in verdicts):
        name = reference_name(ref, traces[ref])
        n = len(traces[ref].output_ids)
        return [f"All {len(traces)} lanes emitted the same {n} tokens: token-identical to {name}."]
    return [v.line for v in verdicts]


# ---------------------------------------------------------------- slower than greedy

def _step_ms(step) -> float:
    return sum(getattr(step, "timings_ms", {}).values())


def _steady(steps: Sequence) -> list:
    """The steps after the first (which holds the prompt's prefill), or all when there is only one."""
    return list(steps[1:]) if len(steps) > 1 else list(steps)


def plain_token_ms(greedy_trace) -> float:
    """One plain (greedy) token's measured time: greedy's mean step, prefill left out."""
    steps = _steady(greedy_trace.steps)
    return sum(_step_ms(s) for s in steps) / len(steps) if steps else 0.0


def rate(trace) -> float:
    """Tokens per second of measured step time: the same rate as Compare's "speed vs greedy" column
    (tables.running_metrics), so the sentence and the table give one number."""
    return running_metrics(trace.steps)["tokens_per_s"]


SLOWER_BELOW = 0.95      # a lane is called slower below this speed vs greedy (lockstep lanes differ by a few % alone)


def slower_line(label: str, trace, greedy_trace) -> str | None:
    """For a lane slower than greedy (below SLOWER_BELOW of its speed): what its rounds (steps) cost against
    what they emitted, in plain tokens. None when it is not slower or there is nothing to measure."""
    plain, ours, theirs = plain_token_ms(greedy_trace), rate(trace), rate(greedy_trace)
    steps = _steady(trace.steps)
    if plain <= 0 or ours <= 0 or theirs <= 0 or ours >= SLOWER_BELOW * theirs or not steps or trace is greedy_trace:
        return None
    unit = "round" if trace.strategy in ("speculative", "dspark") else "step"
    cost = sum(_step_ms(s) for s in steps) / len(steps) / plain
    emitted = sum(emitted_count(s) for s in steps) / len(steps)
    return (f"{label} is slower than greedy ({speed_vs(ours, theirs):.2f}×): a {unit} cost {cost:.2f} plain tokens of "
            f"time and emitted {emitted:.2f} tokens on average ({len(steps)} {unit}s after the first; a plain "
            f"token = greedy's mean step, {plain:.0f} ms).")


SPEED_DRAWS = 400         # resamples behind a speed range
SPEED_LEVEL = 0.90        # the middle share of the resampled ratios a range covers


def _resampled_rate(steps: Sequence, rng: random.Random) -> float:
    """Tokens per ms of `steps` with its steady steps drawn again with replacement (the first, which holds
    the prefill, kept as it was)."""
    first, rest = steps[0], _steady(steps)
    drawn = [first] + [rng.choice(rest) for _ in rest] if len(steps) > 1 else [first]
    ms = sum(_step_ms(s) for s in drawn)
    return sum(emitted_count(s) for s in drawn) / ms if ms > 0 else 0.0


def speed_range(trace, greedy_trace, draws: int = SPEED_DRAWS, seed: int = 0) -> tuple[float, float] | None:
    """How far one run pins down a lane's speed vs greedy: the middle SPEED_LEVEL of the ratio when each
    lane's steps are resampled (a bootstrap, seeded, so a page shows the same range on every rerun). None
    with fewer than 3 steps in either lane."""
    if len(trace.steps) < 3 or len(greedy_trace.steps) < 3:
        return None
    rng = random.Random(seed)
    ratios = []
    for _ in range(draws):
        ours, theirs = _resampled_rate(trace.steps, rng), _resampled_rate(greedy_trace.steps, rng)
        if theirs > 0:
            ratios.append(ours / theirs)
    if not ratios:
        return None
    ratios.sort()
    cut = int(len(ratios) * (1 - SPEED_LEVEL) / 2)
    return ratios[cut], ratios[len(ratios) - 1 - cut]


def range_line(traces: Mapping[str, object]) -> str | None:
    """Compare's speeds with their uncertainty, one run per lane, in one sentence; None without a greedy lane
    or another lane to range."""
    greedy = next((t for t in traces.values() if t.strategy == "greedy"), None)
    if greedy is None:
        return None
    ranges = {label: speed_range(t, greedy) for label, t in traces.items() if t is not greedy}
    parts = [f"{label} {band[0]:.2f}–{band[1]:.2f}×" for label, band in ranges.items() if band]
    if not parts:
        return None
    return (f"One run per lane: resampling each lane's steps puts speed vs greedy at {', '.join(parts)} "
            f"({SPEED_LEVEL:.0%} of {SPEED_DRAWS} resamples); a range that holds 1 shows no measured difference.")


def slower_lines(traces: Mapping[str, object]) -> list[str]:
    greedy = next((t for t in traces.values() if t.strategy == "greedy"), None)
    if greedy is None:
        return []
    lines = [slower_line(label, t, greedy) for label, t in traces.items()]
    return [line for line in lines if line]


# ---------------------------------------------------------------- a round that accepts nothing

def _spec_nothing(event) -> str | None:
    if event.accepted or not event.drafts or event.drafts[0].verdict != "rejected" or event.final_id is None:
        return None
    first, chosen = event.drafts[0], repr(visible(spec._piece_of(event, event.final_id)))
    proposed = repr(visible(first.piece))
    if first.u is None:
        return (f"Nothing accepted: the draft's first token was not the target's choice: {proposed} proposed, "
                f"{chosen} chosen.")
    return (f"Nothing accepted: the draft's first token {proposed} was rejected (draw u = {first.u:.3f} above "
            f"p target ÷ q draft = {first.ratio:.3f}); {chosen} was drawn from the residual instead.")


def _dspark_nothing(event) -> str | None:
    if event.prefill or event.accepted_path or not event.nodes or event.next_from not in ("residual", "argmax"):
        return None
    first = [n for n in event.nodes if n.depth == 1]
    chosen = repr(visible(dspark_piece_of(event, event.next_token)))
    proposed = ", ".join(repr(visible(n.piece)) for n in first)
    if all(n.draw is None for n in first):
        if len(first) == 1:
            return (f"Nothing accepted: the draft's first token was not the target's choice: {proposed} proposed, "
                    f"{chosen} chosen.")
        return (f"Nothing accepted: none of the {len(first)} candidates drafted for the first position ({proposed}) "
                f"was the target's choice, {chosen}.")
    return (f"Nothing accepted: the candidate(s) drafted for the first position ({proposed}) were rejected by "
            f"their draws; {chosen} was drawn from the residual instead.")


def nothing_accepted(event) -> str | None:
    """One line on why a speculative or DSpark round accepted no draft; None for any other round."""
    kind = getattr(event, "kind", "")
    if kind == "spec_round":
        return _spec_nothing(event)
    if kind == "dspark_round":
        return _dspark_nothing(event)
    return None


def branched_line(index: int, forced: Sequence[int], events: Sequence) -> str:
    """The flash after "Force & branch": the forced token by its text (from the branch's emitted chips; `forced`
    is every token after the prompt, the chosen one last) and its id."""
    pieces = [chip.piece for chip in chips_for(events) if chip.emitted]
    at = len(forced) - 1
    token = f"{visible(pieces[at])!r} (id {forced[-1]})" if 0 <= at < len(pieces) else f"id {forced[-1]}"
    return (f"Branched at step {index}: {token} forced as token {len(forced)} of the text (tokens count from 1), "
            "the text before it kept as it was.")
