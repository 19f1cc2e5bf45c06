"""Prompt lookup: draft the continuation of an earlier occurrence of the context's last n-gram (point-mass
drafts, free to make), alone or in front of a draft model."""
from __future__ import annotations

from collections.abc import Sequence

import torch

from decoding.core.errors import check
from decoding.core.trace import LookupMatch
from decoding.drafters.base import Drafter, DraftRequest, Proposal
from decoding.drafters.draft_model import DraftModelDrafter
from decoding.runtime.models import LM


def find_lookup(context: Sequence[int], max_ngram: int, max_tokens: int, latest: bool = False,
                min_ngram: int = 1) -> LookupMatch | None:
    """transformers' PromptLookupCandidateGenerator search: n-gram sizes from the largest down (to
    min_ngram); for each, the leftmost earlier occurrence of the context's last n tokens that has a
    continuation. latest=True prefers the most recent occurrence whose continuation has max_tokens tokens
    (falling back to the leftmost): the text being copied is usually the nearest one."""
    length = len(context)
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        ngram = tuple(context[length - n:])
        recent = range(length - n - max_tokens, -1, -1) if latest else ()   # full continuations, newest first
        for idx in (*recent, *range(length - n)):
            if tuple(context[idx:idx + n]) == ngram:
                return LookupMatch(ngram=ngram, match_position=idx, continuation_start=idx + n)
    return None


def lookup_continuation(context: Sequence[int], max_ngram: int, max_tokens: int, eos_ids=frozenset(),
                        latest: bool = False, match: LookupMatch | None = None, min_ngram: int = 1
                        ) -> tuple[tuple[int, ...], LookupMatch | None]:
    """(tokens, match): up to max_tokens tokens after find_lookup's match (or the `match` given, found
    earlier on this context), cut before an EOS."""
    if match is None and max_tokens >= 1:
        match = find_lookup(context, max_ngram, max_tokens, latest, min_ngram)
    if match is None or max_tokens < 1:
        return (), None
    start = match.continuation_start
    tokens = [int(t) for t in context[start:start + max_tokens]]
    cut = next((i for i, t in enumerate(tokens) if t in eos_ids), len(tokens))
    return tuple(tokens[:cut]), match


class PromptLookupDrafter(Drafter):
    """Copies the continuation of an earlier occurrence of the last n-gram (a point-mass drafter)."""

    name = "lookup"
    has_distributions = False

    def __init__(self, max_ngram: int = 2, eos_ids: frozenset[int] = frozenset()):
        check(isinstance(max_ngram, int) and max_ngram >= 1, "lookup_max_ngram", max_ngram,
              "must be an integer >= 1")
        self.max_ngram = max_ngram
        self.eos_ids = eos_ids

    def propose(self, context: Sequence[int], request: DraftRequest) -> Proposal:
        tokens, match = lookup_continuation(context, self.max_ngram, request.max_tokens, self.eos_ids)
        if match is None:
            return Proposal(())
        return Proposal(tokens, None, (None,) * len(tokens), match, source=self.name)


# The hybrid drafts by lookup only where an n-gram of this many tokens matches (fewer when the lookup's
# max n-gram is smaller): a match of one token (a comma, "the") predicts little (docs/experiments.md).
HYBRID_MIN_NGRAM = 2


class LookupThenDraftDrafter(Drafter):
    """Prompt lookup in the rounds where the context has an n-gram match of at least `min_ngram` tokens
    (free, point-mass drafts), the draft model in the others. Which one drafts depends on the context
    alone, so each round stays exact under its own rule; the draft model catches up on the tokens of
    lookup rounds when next used."""

    has_distributions = True

    def __init__(self, lookup: PromptLookupDrafter, model: DraftModelDrafter, min_ngram: int = HYBRID_MIN_NGRAM):
        self.lookup, self.model = lookup, model
        self.min_ngram = min(min_ngram, lookup.max_ngram)
        self.name = f"{lookup.name}+{model.name}"
        self._searched: tuple[int, LookupMatch | None] | None = None   # (context length, its match)

    def start(self, prompt_ids: Sequence[int]) -> None:
        self.lookup.start(prompt_ids)
        self.model.start(prompt_ids)
        self._searched = None

    def propose(self, context: Sequence[int], request: DraftRequest) -> Proposal:
        tokens, match = self._continuation(context, request.max_tokens)
        if tokens:
            return Proposal(tokens, None, (None,) * len(tokens), match, source=self.lookup.name)
        return self.model.propose(context, request)

    def rollback(self, context: Sequence[int]) -> int:
        return self.model.rollback(context)

    def source_for(self, context: Sequence[int]) -> str:
        return self.lookup.name if self._continuation(context, 1)[0] else self.model.name

    def _continuation(self, context: Sequence[int], max_tokens: int):
        """Prompt lookup's continuation; the n-gram search runs once per context (a run's context only
        grows, so its length names it): source_for and propose of one round share it."""
        if self._searched is None or self._searched[0] != len(context):
            self._searched = (len(context), find_lookup(context, self.lookup.max_ngram, 1, min_ngram=self.min_ngram))
        match = self._searched[1]
        if match is None:
            return (), None
        return lookup_continuation(context, self.lookup.max_ngram, max_tokens, self.lookup.eos_ids, match=match)

    def draft_models(self) -> dict[str, LM]:
        return self.model.draft_models()

    @property
    def reads_target(self) -> bool:
        return self.model.reads_target

    def observe(self, head_input: torch.Tensor, context_length: int) -> None:
        self.model.observe(head_input, context_length)

    def observe_rows(self, rows: torch.Tensor, first_position: int) -> None:
        self.model.observe_rows(rows, first_position)

    def observe_logits(self, tokens: Sequence[int], logits: torch.Tensor) -> None:
        self.model.observe_logits(tokens, logits)

    def token_ms(self, target: LM) -> dict[str, float]:
        return self.model.token_ms(target)
