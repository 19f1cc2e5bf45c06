"""The lattice sources that score their own candidates per parent: a trained DSpark drafter (the feature
head or a parallel drafter) with prompt lookup's chain inside its lattice, and prompt lookup's chain alone
where no trained drafter runs. Either is the base the tree sources are composed onto
(decoding.drafters.lattice_source)."""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from decoding.core.draft_names import LOOKUP
from decoding.core.lattice import LatticeRequest, Proposal, SourceRequest
from decoding.drafters.lattice_lookup import boost_chain, lookup_lattice
from decoding.drafters.lattice_source import LatticeSource, labelled


class TrainedSource(LatticeSource):
    """A trained drafter's lattice over the target's hidden rows at the round's history, with prompt
    lookup's chain among its candidates, scored by the drafter's calibration and, along the chain, by
    lookup's measured rate (decoding.drafters.lattice_lookup). The drafter: a ParallelDrafter or a
    FeatureLatticeDrafter (its `kind` labels the cells it proposed: "parallel" or "feature"); the strategies
    reach it only through this source."""

    takes_lookup = True

    def __init__(self, drafter):
        self.drafter = drafter
        self.name = drafter.kind
        self.feature_layers = tuple(drafter.shape.feature_layers)
        self.span = int(drafter.span)

    def propose(self, context: Sequence[int], request: SourceRequest) -> Proposal:
        lookup = request.lookup
        ask = LatticeRequest(request.gamma, request.top_k, request.temperature,
                             tuple(lookup.tokens) if lookup else (), request.budget)
        draft = self.drafter.lattice(request.hidden, request.history, ask)
        if draft.extra:
            draft = dataclasses.replace(draft, lattice=boost_chain(draft.lattice, draft.extra, *lookup.scores))
        return Proposal(source=self.name, lattice=labelled(draft, self.name))


class LookupChainSource(LatticeSource):
    """Prompt lookup's chain as the whole base lattice: one candidate per position, scored by lookup's
    measured rate (λ_first, then λ_continuation)."""

    name = LOOKUP

    def propose(self, context: Sequence[int], request: SourceRequest) -> Proposal:
        return Proposal(source=self.name, lattice=lookup_lattice(request.lookup))
