"""Lattice sources as speculative decoding's drafter: the composed lattice walked greedily into one chain.

The same tree sources DSpark composes (decoding.drafters.lattice_source) propose after the context; their
candidates are merged and scored by the run's online calibration, and the chain follows, from the root,
the child of highest score at each depth. The chain is point-mass (q_draft None): the target accepts a
token with p_target(x) and a rejection samples the target with x removed, so the round is exact at any
temperature. The sources see every verification forward's logits (`observe_logits`), and the calibration
counts each round's proposal against the tokens the round kept (`rollback`).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from decoding.drafters.base import Drafter, DraftRequest, Proposal
from decoding.drafters.lattice_source import LatticeSource, SourceRequest, SourceSet

CHAIN_NODES = 24            # candidates the sources propose per round before the walk


def greedy_walk(lattice, length: int) -> list[int]:
    """Candidate indices from position 1 on, each the child of highest score under the one before
    (ties: the lower index); stops at `length` or where no child scores above 0."""
    path: list[int] = []
    for k in range(min(length, lattice.gamma)):
        parent = path[-1] if path else 0
        scores = lattice.scores[k][parent]
        best = max(range(len(scores)), key=lambda j: (scores[j], -j))
        if scores[best] <= 0:
            break
        path.append(best)
    return path


class SourceChainDrafter(Drafter):
    """Speculative decoding's drafter over tree sources (`--draft recycling`)."""

    def __init__(self, sources: Sequence[LatticeSource]):
        self.sources = SourceSet(sources)
        self.name = "+".join(s.name for s in self.sources.sources)
        self._start: int | None = None          # the context length the pending proposal was made after

    def start(self, prompt_ids: Sequence[int]) -> None:
        self.sources.start(prompt_ids)
        self._start = None

    def propose(self, context: Sequence[int], request: DraftRequest) -> Proposal:
        draft = self.sources.draft(context, SourceRequest(request.max_tokens, CHAIN_NODES))
        self._start = len(context)
        if draft is None:
            return Proposal((), source=self.name)
        path = greedy_walk(draft.lattice, request.max_tokens)
        tokens = tuple(draft.lattice.token_ids[k][j] for k, j in enumerate(path))
        return Proposal(tokens, None, (None,) * len(tokens), source=self.name)

    def rollback(self, context: Sequence[int]) -> int:
        """After a round: count the round's proposal against the tokens it kept; nothing to crop."""
        if self._start is not None:
            self.sources.learn(context[self._start:])
            self._start = None
        return 0

    def observe_logits(self, tokens: Sequence[int], logits: torch.Tensor) -> None:
        self.sources.observe(tokens, logits)
