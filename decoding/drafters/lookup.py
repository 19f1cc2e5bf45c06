"""Prompt lookup: draft the continuation of an earlier occurrence of the context's last n-gram (point-mass
drafts, free to make), alone or in front of another source."""
from __future__ import annotations

from collections.abc import Sequence

from decoding.core.errors import check
from decoding.core.lattice import Proposal, SourceRequest
from decoding.core.trace import LookupMatch
from decoding.drafters.lattice_source import LatticeSource
from decoding.drafters.source_chain import SourceChainDrafter


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


class PromptLookupDrafter(LatticeSource):
    """Copies the continuation of an earlier occurrence of the last n-gram: a point-mass chain. With
    `min_ngram` above 1 (in front of another source) it declines a context without a match that long."""

    name = "lookup"
    draws_chains = True

    def __init__(self, max_ngram: int = 2, eos_ids: frozenset[int] = frozenset(), min_ngram: int = 1):
        check(isinstance(max_ngram, int) and max_ngram >= 1, "lookup_max_ngram", max_ngram,
              "must be an integer >= 1")
        self.max_ngram, self.eos_ids, self.min_ngram = max_ngram, eos_ids, min(min_ngram, max_ngram)
        self._searched: tuple[tuple[int, ...], LookupMatch | None] | None = None   # (context, its match)

    def start(self, prompt_ids: Sequence[int]) -> None:
        self._searched = None

    def propose(self, context: Sequence[int], request: SourceRequest) -> Proposal:
        tokens, match = self._continuation(context, request.gamma)
        if match is None:
            return Proposal(())
        return Proposal(tokens, None, (None,) * len(tokens), match, source=self.name)

    def declines(self, context: Sequence[int]) -> bool:
        return not self._continuation(context, 1)[0]

    def _continuation(self, context: Sequence[int], max_tokens: int):
        """(tokens, match): the n-gram search runs once per context (the composer's `declines` and the
        round's `propose` share it)."""
        key = tuple(context)
        if self._searched is None or self._searched[0] != key:
            self._searched = (key, find_lookup(context, self.max_ngram, 1, min_ngram=self.min_ngram))
        match = self._searched[1]
        if match is None:
            return (), None
        return lookup_continuation(context, self.max_ngram, max_tokens, self.eos_ids, match=match)


# The hybrid drafts by lookup only where an n-gram of this many tokens matches (fewer when the lookup's
# max n-gram is smaller): a match of one token (a comma, "the") predicts little (docs/experiments.md).
HYBRID_MIN_NGRAM = 2


class LookupThenDraftDrafter(SourceChainDrafter):
    """Prompt lookup in the rounds where the context has an n-gram match of at least `min_ngram` tokens
    (free, point-mass drafts), the other source(s) in the others: a draft model, the feature drafter, or
    tree sources walked into a chain. Which one drafts depends on the context alone, so each round stays
    exact under its own rule; a draft model catches up on the tokens of lookup rounds when next used."""

    def __init__(self, lookup: PromptLookupDrafter, model: LatticeSource | Sequence[LatticeSource],
                 min_ngram: int = HYBRID_MIN_NGRAM):
        first = PromptLookupDrafter(lookup.max_ngram, lookup.eos_ids, min_ngram)
        super().__init__([first, *(model if isinstance(model, Sequence) else [model])])
        self.min_ngram = first.min_ngram
