"""A trace's totals from its steps: the new token ids, the target forwards and vLLM's speculative
metrics. The runner records them (decoding.runner.assemble), the loader checks a recorded trace
against them (decoding.core.trace_check) and the views count tokens with them, so all use these
definitions (torch-free: the UI imports this module). Steps are read by attribute,
dispatched by their `kind`, so this module needs nothing from trace.py.
"""
from __future__ import annotations

from collections.abc import Sequence

from decoding.core.formulas import round_metrics


def emitted_count(step) -> int:
    """Tokens one step adds to its run: its emitted tokens (forced ones included), one for a token step;
    one for a beam step too (every live hypothesis grows by one position)."""
    return len(step.emitted) if hasattr(step, "emitted") else 1


def emitted_ids(steps: Sequence) -> list[int]:
    """New tokens of strategies whose steps each emit tokens in order (all but beam search)."""
    out: list[int] = []
    for step in steps:
        out.extend(step.emitted if hasattr(step, "emitted") else (step.chosen_id,))
    return out


def beam_output_ids(steps: Sequence) -> list[int]:
    """New tokens of a beam trace: the forced prefix, then the best finished hypothesis (or, for a run
    stopped before any finished, the best live beam)."""
    if not steps:
        return []
    last = steps[-1]
    if last.finished:
        best = last.finished[0].token_ids
    else:
        best = last.beams[0].token_ids if last.beams else ()
    return list(last.forced_ids) + list(best)


def output_ids(steps: Sequence) -> list[int]:
    """A run's new tokens (forced ones included), by the kind of its steps."""
    return beam_output_ids(steps) if steps and steps[0].kind == "beam" else emitted_ids(steps)


def target_forwards(steps: Sequence) -> int:
    """Every target forward, the prefill included (one per step unless it says otherwise)."""
    return sum(getattr(step, "target_forwards", 1) for step in steps)


def spec_metrics(rounds: Sequence) -> dict:
    """vLLM's definitions over speculative rounds: tokens per verification forward (forced tokens
    excluded), accepted / drafted, per-position rates."""
    return round_metrics([len(r.emitted) - len(r.forced_ids) for r in rounds], [r.gamma for r in rounds],
                         [r.accepted for r in rounds], [r.gamma for r in rounds])


def dspark_metrics(rounds: Sequence) -> dict:
    """vLLM's definitions over the drafting rounds (prefill excluded): tokens emitted per verification
    forward, accepted / drafted nodes, per depth k the fraction of rounds (that drafted depth k)
    whose accepted path reached k."""
    rounds = [r for r in rounds if not r.prefill]
    return round_metrics([len(r.emitted) for r in rounds], [len(r.nodes) for r in rounds],
                         [len(r.accepted_path) for r in rounds],
                         [max((n.depth for n in r.nodes), default=0) for r in rounds])


ROUND_METRICS = {"spec_round": spec_metrics, "dspark_round": dspark_metrics}
METRIC_NAMES = ("mean_accepted_length", "acceptance_rate", "per_position_acceptance")


def metrics(steps: Sequence) -> dict:
    """The speculative metrics of a run's steps ({} for strategies without drafting rounds, or no rounds)."""
    rule = ROUND_METRICS.get(steps[0].kind) if steps else None
    return rule(steps) if rule is not None else {}
