"""Shared step bookkeeping: turn one position's logits into a TokenStep (top-N only, no full-vocab
copies to Python), and choose tokens by argmax or inverse-CDF sampling with a recorded draw."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from decoding.core.processors import Applied, MinP, Pipeline, Temperature, TopK, TopP
from decoding.core.trace import Candidate, FilterCut, TokenStep


def entropy(logits: torch.Tensor) -> float:
    """Entropy in nats of softmax(logits) over the finite entries. (V,)"""
    return entropy_of_logp(torch.log_softmax(logits, dim=-1))


def entropy_of_logp(logp: torch.Tensor) -> float:
    """Entropy in nats from log-probabilities; -inf entries contribute 0. (V,)"""
    return float(-(logp.exp() * logp.nan_to_num(neginf=0.0)).sum())


def row_entropies(logits: torch.Tensor) -> list[float]:
    """Entropy in nats of softmax of each row, -inf entries contributing 0. (n, V) -> n floats"""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return (-(logp.exp() * logp.nan_to_num(neginf=0.0)).sum(-1)).tolist()


def sample_inverse_cdf(probs: torch.Tensor, generator: torch.Generator) -> tuple[int, float]:
    """Draw u ~ U[0,1) from `generator` (on the CPU, so draws do not depend on the device) and return
    the first token whose cumulative probability exceeds u. A zero-probability token is never chosen."""
    u = float(torch.rand((), generator=generator, dtype=torch.float64))
    cdf = probs.double().cumsum(-1)  # (V,)
    idx = int(torch.searchsorted(cdf, torch.tensor([u * float(cdf[-1])], dtype=torch.float64,
                                                   device=cdf.device), right=True))
    return min(idx, probs.shape[-1] - 1), u


def filter_cuts(pipeline: Pipeline, raw: torch.Tensor, applied: Applied) -> tuple[FilterCut, ...]:
    """Describe each processor's threshold, removed count and removed (temperature-scaled) mass, from
    the stages apply_tracked recorded (no processor is run again)."""
    if not pipeline.steps:
        return ()
    scaled_probs = applied.scaled.softmax(-1)  # (V,)
    cuts, kept = [], int(raw.numel())
    for i, proc in enumerate(pipeline.steps):
        logits_in = raw if i == 0 else applied.stages[i - 1]
        if isinstance(proc, Temperature):
            cuts.append(FilterCut("temperature", proc.value, None, 0.0, 0, kept))
            continue
        removed = applied.removed_by == (i + 1)
        count = int(removed.sum())
        kept -= count
        threshold = _threshold(proc, logits_in, applied.stages[i])
        cuts.append(FilterCut(proc.name, float(proc.value), threshold,
                              float(scaled_probs[removed].sum()), count, kept))
    return tuple(cuts)


def _threshold(proc, logits_in: torch.Tensor, logits_out: torch.Tensor) -> float | None:
    """top_k: the k-th logit; top_p: the mass kept of its input; min_p: the probability floor."""
    kept = logits_out != float("-inf")
    if isinstance(proc, TopK):
        return float(logits_out[kept].min())
    if isinstance(proc, TopP):
        return float(logits_in.softmax(-1)[kept].sum())
    if isinstance(proc, MinP):
        return float(proc.value * logits_in.softmax(-1).max())
    return None


def candidates(lm, ids: torch.Tensor, logits: torch.Tensor, probs: torch.Tensor,
               removed_by: torch.Tensor | None, names: tuple[str, ...]) -> tuple[Candidate, ...]:
    """Candidates for token `ids` (N,) with their logits/probs; removed ones named by filter."""
    ids_l = ids.tolist()
    logit_l = logits[ids].tolist()
    prob_l = probs[ids].tolist()
    rem_l = removed_by[ids].tolist() if removed_by is not None else [0] * len(ids_l)
    return tuple(Candidate(t, lm.piece(t), lg, pr, names[r - 1] if r else None)
                 for t, lg, pr, r in zip(ids_l, logit_l, prob_l, rem_l))


@dataclass(frozen=True)
class Scored:
    """One position's logits: raw (V,), the pipeline, and what it did (applied.logits (V,))."""

    raw: torch.Tensor
    pipeline: Pipeline
    applied: Applied


@dataclass(frozen=True)
class Choice:
    """The token taken at a position, the uniform draw that chose it (None: argmax) and whether it was
    imposed (a forced token)."""

    token: int
    draw: float | None = None
    forced: bool = False


def token_step(lm, *, index: int, position: int, scored: Scored, choice: Choice, top_n: int) -> TokenStep:
    """Build the trace event for one position."""
    raw, pipeline, applied, chosen = scored.raw, scored.pipeline, scored.applied, choice.token
    raw_logp = torch.log_softmax(raw, -1)  # (V,)
    proc_logp = raw_logp if not pipeline.steps else torch.log_softmax(applied.logits, -1)  # (V,)
    top = torch.topk(raw, min(top_n, raw.shape[-1])).indices  # (N,)
    names = tuple(p.name for p in pipeline.steps)
    raw_c = candidates(lm, top, raw, raw_logp.exp(), None, names)
    proc_c = candidates(lm, top, applied.logits, proc_logp.exp(), applied.removed_by, names)
    return TokenStep(
        index=index, position=position, raw_top=raw_c, processed_top=proc_c,
        filters=filter_cuts(pipeline, raw, applied),
        entropy_raw=entropy_of_logp(raw_logp), entropy_processed=entropy_of_logp(proc_logp),
        chosen_id=chosen, chosen_piece=lm.piece(chosen),
        chosen_logprob=float(proc_logp[chosen]), chosen_raw_logprob=float(raw_logp[chosen]),
        chosen_rank=int((raw > raw[chosen]).sum()), draw=choice.draw, forced=choice.forced)
