"""Beam search, one BeamStep event per step, with the rules of transformers' generate(num_beams=B).

The rules (transformers 5.24, GenerationMixin._beam_search), reproduced step by step:
- scores are log_softmax of the float32 logits, added to each live beam's summed score; at the first
  step only beam 0 is live (the others start at -1e9);
- a pool of K = max(2, 1 + #EOS ids)·B candidates is the top-K of the flattened B×V scores;
- a candidate "stops" if its token is an EOS id or the sequence reaches the length limit; a stopped
  candidate is finalized only if it ranks in the top B of the pool, with the score
  sum / (new tokens, the final one included) ** length_penalty, and the B best finalized are kept;
- the next live beams are the B best candidates that did not stop;
- the search ends when every pool candidate stops (the length limit), when early_stopping=True and B
  hypotheses have finished, or when the improvement heuristic fires: with B hypotheses finished, the
  best live score / (new tokens so far) ** length_penalty is no better than the worst finished one
  (once it fires it stays on);
- the output is the best finished hypothesis (at the length limit the top-B pool candidates are
  finalized, so there always is one).
Forced tokens (a prefix imposed after the prompt) are appended to the prompt: they are scored as
context, not as new tokens, and lead the output ids. The length limit is max_new_tokens after the
forced prefix, or the model's context, whichever comes first. Beam search uses no sampling
processors, so the log-softmax output is used as is.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

import torch

from decoding.core.config import BeamConfig
from decoding.core.trace import BeamCandidate, BeamHypothesis, BeamStep, LiveBeam
from decoding.core.trace_totals import beam_output_ids as output_ids  # noqa: F401  (the runner's and views' name)
from decoding.runtime.models import LM, Timer, kv_memory

NEG = -1.0e9   # generate's "very large negative" score for dead rows and masked candidates


@dataclass
class _Search:
    """Mutable state of one search. `pool_factor` and `count_prompt` exist only for the negative
    controls in the tests (a pool of B instead of 2·B; the prompt counted in the length)."""

    lm: LM
    prompt_len: int
    length_limit: int                       # absolute sequence length at which every candidate stops
    config: BeamConfig
    pool_factor: int | None = None
    count_prompt: bool = False
    forced: tuple[int, ...] = ()            # the imposed prefix, recorded on every step
    scores: torch.Tensor | None = None      # (B,) float32 summed log-probs of the live beams
    tokens: list[tuple[int, ...]] = field(default_factory=list)  # new tokens of each live beam
    finished: list[BeamHypothesis] = field(default_factory=list)  # best first, at most B
    improvable: bool = True                 # the early-stop heuristic has not fired

    @property
    def num_beams(self) -> int:
        return self.config.num_beams

    @property
    def pool_size(self) -> int:
        factor = self.pool_factor or max(2, 1 + len(self.lm.eos_ids))
        return factor * self.num_beams

    def norm_length(self, new_tokens: int) -> int:
        return new_tokens + (self.prompt_len if self.count_prompt else 0)


@dataclass(frozen=True)
class _Pool:
    """The ranked candidate pool of one step as tensors. (K,) each."""

    scores: torch.Tensor       # float32 cumulative scores
    source: torch.Tensor       # long, source live beam
    token: torch.Tensor        # long
    logprob: torch.Tensor      # float32
    stops: torch.Tensor        # bool: EOS or the length limit
    normalized: torch.Tensor   # float32 scores / length ** length_penalty


def decode(lm: LM, prompt_ids: Sequence[int], config: BeamConfig, *, generator: torch.Generator,
           forced: Sequence[int] = ()) -> Iterator[BeamStep]:
    """Yield one BeamStep per step until the search is done. `generator` is unused (beam search is
    deterministic); it is accepted for the common strategy signature."""
    return _decode(lm, prompt_ids, config, forced=forced)


def _decode(lm: LM, prompt_ids: Sequence[int], config: BeamConfig, *, forced: Sequence[int] = (),
            _pool_factor: int | None = None, _count_prompt: bool = False) -> Iterator[BeamStep]:
    context = [int(t) for t in prompt_ids] + [int(t) for t in forced]
    limit = min(len(context) + config.max_new_tokens, lm.context_length)
    if forced and (len(context) >= limit or forced[-1] in lm.eos_ids):
        yield _forced_only(lm, len(context), config, forced)
        return
    if len(context) >= limit:
        return
    search = _Search(lm, len(context), limit, config, pool_factor=_pool_factor, count_prompt=_count_prompt,
                     forced=tuple(int(t) for t in forced))
    search.scores = torch.full((config.num_beams,), NEG, dtype=torch.float32, device=lm.device)  # (B,)
    search.scores[0] = 0.0
    search.tokens = [()] * config.num_beams
    cache = lm.new_cache()
    feed = torch.tensor([context], dtype=torch.long, device=lm.device)  # (1, T)
    for index in range(limit - len(context)):
        timer = Timer(lm)
        logprobs = _step_logprobs(lm, feed, cache).expand(config.num_beams, -1)  # (B, V)
        timer.lap("prefill" if index == 0 else "forward")
        pool = _make_pool(search, logprobs, index)
        keep = _next_beams(search, pool)
        admitted = _update_finished(search, pool, index)
        old_tokens = search.tokens
        _advance(search, pool, keep)
        done = _update_done(search, pool, index)
        timer.lap("processing")
        if not done:
            _reorder(cache, pool.source[keep], first=index == 0)
            feed = pool.token[keep].unsqueeze(1)  # (B, 1)
        timer.lap("cache")
        event = _event(search, pool, keep, admitted, old_tokens, index, done)
        yield replace(event, timings_ms=timer.done(), kv=kv_memory(cache))
        if done:
            return


def _step_logprobs(lm: LM, feed: torch.Tensor, cache) -> torch.Tensor:
    """One batched forward of the live beams' last tokens (of the prompt, one row, at step 0);
    log_softmax of the last position's float32 logits. (rows, V)"""
    with lm.lock, torch.inference_mode():
        out = lm.model(input_ids=feed, **{lm.cache_kw: cache}, use_cache=True, logits_to_keep=1)
    return torch.log_softmax(lm.check_logits(out.logits[:, -1, :].float()), dim=-1)  # (rows, V)


def _reorder(cache, sources: torch.Tensor, first: bool) -> None:
    """Give each next live beam its source's cache rows; after the prefill the single prompt row is
    copied to all B rows (every source is then beam 0, or a copy of it)."""
    if first:
        sources = torch.zeros_like(sources)  # (B,)
    cache.reorder_cache(sources)


def _make_pool(search: _Search, logprobs: torch.Tensor, index: int) -> _Pool:
    vocab = logprobs.shape[-1]
    total = (logprobs + search.scores[:, None]).reshape(-1)  # (B*V,)
    scores, flat = torch.topk(total, k=search.pool_size)  # (K,)
    source, token = flat // vocab, flat % vocab
    eos = torch.tensor(sorted(search.lm.eos_ids), dtype=torch.long, device=token.device)
    at_limit = search.prompt_len + index + 1 >= search.length_limit
    stops = torch.isin(token, eos) | at_limit  # (K,)
    length = search.norm_length(index + 1)
    normalized = scores / (length ** search.config.length_penalty)  # (K,)
    return _Pool(scores, source, token, logprobs[source, token], stops, normalized)


def _next_beams(search: _Search, pool: _Pool) -> torch.Tensor:
    """Pool ranks of the B best candidates that did not stop. (B,)"""
    masked = pool.scores + pool.stops.to(torch.float32) * NEG  # (K,)
    return torch.topk(masked, k=search.num_beams).indices


def _update_finished(search: _Search, pool: _Pool, index: int) -> set[int]:
    """Merge this step's finalized candidates (stopped, in the top B, while adding is allowed) into the
    B best finished hypotheses; return the pool ranks that entered."""
    num_beams = search.num_beams
    full = search.config.early_stopping and len(search.finished) == num_beams
    if full or not search.improvable:
        return set()
    top_b = torch.arange(pool.scores.shape[0], device=pool.scores.device) < num_beams  # (K,)
    finalize = pool.stops & top_b
    candidate = pool.normalized + (~finalize).to(torch.float32) * NEG  # (K,)
    held = [h.normalized_score for h in search.finished] + [NEG] * (num_beams - len(search.finished))
    merged = torch.cat([torch.tensor(held, dtype=torch.float32, device=candidate.device), candidate])
    chosen = torch.topk(merged, k=num_beams).indices.tolist()
    kept, admitted = [], set()
    for i in chosen:
        if i < num_beams and i < len(search.finished):
            kept.append(search.finished[i])
        elif i >= num_beams and bool(finalize[i - num_beams]):
            admitted.add(i - num_beams)
            kept.append(_hypothesis(search, pool, i - num_beams, index))
    search.finished = kept
    return admitted


def _hypothesis(search: _Search, pool: _Pool, rank: int, index: int) -> BeamHypothesis:
    token = int(pool.token[rank])
    tokens = search.tokens[int(pool.source[rank])] + (token,)
    return BeamHypothesis(token_ids=tokens, score=float(pool.scores[rank]),
                          normalized_score=float(pool.normalized[rank]), step=index,
                          eos=token in search.lm.eos_ids)


def _advance(search: _Search, pool: _Pool, keep: torch.Tensor) -> None:
    search.scores = (pool.scores + pool.stops.to(torch.float32) * NEG)[keep]  # (B,)
    search.tokens = [search.tokens[int(pool.source[r])] + (int(pool.token[r]),) for r in keep.tolist()]


def _update_done(search: _Search, pool: _Pool, index: int) -> bool:
    """generate's stopping test after a step: the improvement heuristic (sticky; while fewer than B
    hypotheses have finished it compares with -1e9), all finished, or no valid continuation."""
    length = search.norm_length(index + 1)
    best_live = float(search.scores[0] / (length ** search.config.length_penalty))  # float32 value
    full = len(search.finished) == search.num_beams
    worst = search.finished[-1].normalized_score if full else NEG
    search.improvable = search.improvable and best_live > worst
    all_finished = search.config.early_stopping and full
    return (not search.improvable) or all_finished or bool(pool.stops.all())


def _statuses(search: _Search, pool: _Pool, keep: torch.Tensor, admitted: set[int]) -> list[str]:
    kept = set(keep.tolist())
    out = []
    for rank, (stop, token) in enumerate(zip(pool.stops.tolist(), pool.token.tolist())):
        if stop and rank < search.num_beams:
            out.append("finished" if rank in admitted else "finished_dropped")
        elif stop and token in search.lm.eos_ids:
            out.append("eos_not_top")
        elif rank in kept and not stop:
            out.append("kept")
        else:
            out.append("pruned")
    return out


def _event(search: _Search, pool: _Pool, keep: torch.Tensor, admitted: set[int],
           old_tokens: list[tuple[int, ...]], index: int, done: bool) -> BeamStep:
    lm = search.lm
    statuses = _statuses(search, pool, keep, admitted)
    rows = zip(pool.source.tolist(), pool.token.tolist(), pool.logprob.tolist(), pool.scores.tolist(),
               pool.normalized.tolist(), statuses)
    candidates = tuple(BeamCandidate(src, tok, lm.piece(tok), lp, sc, ns, st)
                       for src, tok, lp, sc, ns, st in rows)
    live = [r for r in keep.tolist() if not bool(pool.stops[r])]
    beams = tuple(LiveBeam(parent=int(pool.source[r]), token_id=int(pool.token[r]),
                           piece=lm.piece(int(pool.token[r])),
                           token_ids=old_tokens[int(pool.source[r])] + (int(pool.token[r]),),
                           score=float(pool.scores[r])) for r in live)
    all_finished = search.config.early_stopping and len(search.finished) == search.num_beams
    return BeamStep(index=index, position=search.prompt_len + index, num_beams=search.num_beams,
                    pool=candidates, beams=beams, finished=tuple(search.finished),
                    early_stop=not search.improvable, all_finished=all_finished, done=done,
                    forced_ids=search.forced)


def _forced_only(lm: LM, position: int, config: BeamConfig, forced: Sequence[int]) -> BeamStep:
    """The one step of a search whose forced prefix already ends the answer (an EOS, or no room left):
    no forward, no candidates; the output is the forced prefix."""
    return BeamStep(index=0, position=position, num_beams=config.num_beams, pool=(), beams=(), finished=(),
                    early_stop=True, all_finished=False, done=True, forced_ids=tuple(int(t) for t in forced),
                    target_forwards=0)
