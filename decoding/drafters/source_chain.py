"""Speculative decoding's drafter: every source behind one composer, asked for a chain.

A drafter is one source (decoding.drafters.lattice_source.LatticeSource) or several in order: prompt lookup,
a draft model, the feature drafter, token recycling, suffix matching. The composer (`SourceSet`) groups them:
each source that draws its own chain (`draws_chains`) is a group of its own, and each run of tree sources is
one group, their trees composed and scored by the run's online calibration. Each round the first group that
does not decline the context (prompt lookup in front declines a context without a long enough match; the
last group never declines) drafts it:
- a chain source answers with its chain: drawn from its distribution as the target draws (q_draft rows: at
  temperature > 0 the target accepts x with min(1, p_target(x) / q_draft(x)) and a rejection samples
  norm(max(0, p_target − q_draft))), or point-mass (prompt lookup);
- a group of tree sources answers with the composed lattice, walked from the root to the child of highest
  score at each depth: a point-mass chain (q_draft None), accepted with p_target(x), a rejection sampling the
  target with x removed, so the round is exact at any temperature.
The group depends on the context alone, so each round is exact under its own rule. The sources see every
verification forward's logits (`observe_logits`), a source that reads the target its LM-head inputs
(`observe_rows`), and the calibration counts each walked proposal against the tokens the round kept
(`rollback`).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from decoding.core.lattice import Proposal, SourceRequest
from decoding.drafters.lattice_source import LatticeSource, SourceSet
from decoding.runtime.models import LM


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


class SourceChainDrafter(LatticeSource):
    """Several sources as one (see the module), what speculative decoding talks to: `start`, `propose` a
    chain, `rollback` after the round, and the verification forward handed to the sources."""

    draws_chains = True

    def __init__(self, sources: Sequence[LatticeSource]):
        self.sources = SourceSet(sources)
        self.name = self.sources.name
        self._walked: int | None = None         # the context length a walked proposal was made after

    @property
    def parts(self) -> tuple[LatticeSource, ...]:
        return self.sources.sources

    @property
    def reads_target(self) -> bool:
        """Some source wants the target's LM-head inputs after each round (`observe_rows`)."""
        return any(source.reads_target for source in self.parts)

    def start(self, prompt_ids: Sequence[int]) -> None:
        self.sources.start(prompt_ids)
        self._walked = None

    def source_for(self, context: Sequence[int]) -> str:
        """The name of the source(s) that will draft after `context` (Proposal.source)."""
        return "+".join(source.name for source in self.sources.drafting(context))

    def propose(self, context: Sequence[int], request: SourceRequest) -> Proposal:
        """Up to request.gamma tokens to follow `context`, drawn as request.chain says where the drafting
        source has a distribution, else the composed lattice walked greedily."""
        group = self.sources.drafting(context)
        answer = self.sources.draft(context, request)
        if group and group[0].draws_chains:
            return answer
        self._walked = len(context)
        if answer.lattice is None:
            return Proposal(source=answer.source)
        path = greedy_walk(answer.lattice.lattice, request.gamma)
        tokens = tuple(answer.lattice.lattice.token_ids[k][j] for k, j in enumerate(path))
        return Proposal(tokens, None, (None,) * len(tokens), source=answer.source)

    def rollback(self, context: Sequence[int]) -> int:
        """After a round: a walked proposal counted against the tokens it kept; each source rolled back to
        `context`. -> positions removed from the sources' caches."""
        if self._walked is not None:
            self.sources.learn(context[self._walked:])
            self._walked = None
        self.sources.observe_context(context)
        return sum(source.rollback(context) for source in self.parts)

    def observe_logits(self, tokens: Sequence[int], logits: torch.Tensor) -> None:
        self.sources.observe_logits(tokens, logits)

    def observe_rows(self, rows: torch.Tensor, first_position: int) -> None:
        for source in self.parts:
            if source.reads_target:
                source.observe_rows(rows, first_position)

    def token_ms(self, target: LM) -> dict[str, float]:
        """ms per drafted token, by source name (the cost-aware γ policy's draft cost; lookup is free)."""
        return {name: ms for source in self.parts for name, ms in source.token_ms(target).items()}


def composed(drafter: LatticeSource) -> SourceChainDrafter:
    """A drafter as the composer: one source alone, or the composer as given."""
    return drafter if isinstance(drafter, SourceChainDrafter) else SourceChainDrafter([drafter])
