"""Draft sources: anything that proposes draft tokens, for DSpark's lattice and speculative decoding's chain,
and the composer that merges their trees.

Every source implements one interface (`LatticeSource`): started with the prompt, shown every target
forward the strategy runs anyway (`observe_logits`), and asked once per round (`propose`) for its candidates
after the round's root (the last emitted token), given a `SourceRequest` that holds everything the round knows
before its target forward (γ, the node budget, the trained drafters' hidden rows, prompt lookup's chain; for
speculative decoding, `chain`: how to draw a chain like the target). The request's and the answer's types
are in decoding.core.lattice. A source answers with one type, `Proposal`, in one of three forms:
- a tree (`nodes`): each node a token, its parent node (or the root) and a prior ŝ⁰ in [0, 1], the
  source's own guess that the node is accepted once its parent is; the run's `OnlineCalibration` turns
  priors into scores ŝ (token recycling, suffix matching, a draft model);
- a whole lattice (`lattice`, a LatticeDraft) whose scores the source calibrated itself, per parent: the
  trained drafters (decoding.drafters.lattice_bases: the feature head, the parallel drafter, with prompt
  lookup's chain inside), or prompt lookup's chain alone. At most one such source runs; its lattice is the base;
- to a chain request, a chain (`tokens`) drawn as the request says, with its q_draft rows where it has a
  distribution (a draft model, the feature drafter; `draws_chains`), or point-mass (prompt lookup). A source
  without distributions answers a chain request with its tree, and speculative decoding's composer
  (decoding.drafters.source_chain) walks the composed lattice into a point-mass chain.
The composer merges every tree into the base: the same token at the same depth is one cell whatever its
parent, its score under a parent cell the highest any source gave it there, and the cell lists the sources
that proposed it. Stage 1 (the DP or best-first tree) and stage 2 (the exact tree rule) are unchanged, and
every input here is known before the round's target forward, so any mix of sources keeps decoding exact.
"""
from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from decoding.core.config import DSPARK_MAX_GAMMA
from decoding.core.errors import check
from decoding.core.lattice import ROOT, Lattice, LatticeDraft, Proposal, SourceNode, SourceRequest
from decoding.core.trace_check import MAX_LATTICE_CANDIDATES

if TYPE_CHECKING:
    from decoding.runtime.models import LM

class LatticeSource(ABC):
    """A training-free or trained source of draft tokens, for DSpark's lattice and speculative decoding's
    chain. `observe_logits` sees every target forward the strategy runs anyway (the tokens it fed and the
    target's logits at each), before the next round; the other hooks serve speculative decoding's chain."""

    name: str = "source"
    prompt_rows: int = 0            # wants the target's logits at the last this many prompt positions (prefill)
    feature_layers: tuple[int, ...] = ()   # target layers whose outputs its hidden rows hold (after the LM-head input)
    span: int = 1                   # how many of the last emitted tokens' hidden rows it reads
    draws_chains: bool = False      # answers a chain request with its own chain (else a tree the composer walks)
    reads_target: bool = False      # wants the target's LM-head inputs of each verification (`observe_rows`)
    takes_lookup: bool = False      # scores its own lattice with prompt lookup's chain inside (DSpark's base)

    @property
    def parts(self) -> tuple[LatticeSource, ...]:
        """The single sources it is made of, in order (itself; a composer's: decoding.drafters.source_chain)."""
        return (self,)

    def start(self, prompt_ids: Sequence[int]) -> None:  # noqa: B027 - optional hook
        """A run begins with this prompt."""

    @abstractmethod
    def propose(self, context: Sequence[int], request: SourceRequest) -> Proposal:
        """Candidates after context[-1] (the round's root): a tree, a lattice it scored itself (the base), or
        to a chain request (`request.chain`) a chain; `Proposal()`: nothing this round. Draft side only."""

    def observe_logits(self, tokens: Sequence[int], logits: torch.Tensor) -> None:  # noqa: B027 - optional hook
        """logits (n, V): the target's logits after each of the n tokens fed (in their tree's context)."""

    def observe_rows(self, rows: torch.Tensor, first_position: int) -> None:  # noqa: B027 - optional hook
        """For a source that reads_target: the target's LM-head inputs (m, H) at positions first_position
        .. first_position + m − 1 of the kept context, every row of the verification forward up to the one
        that produced the context's last token."""

    def observe_context(self, context: Sequence[int]) -> None:  # noqa: B027 - optional hook
        """After a round: the whole context so far, the prompt and every token emitted (the last round's
        included, which no later round's `propose` sees)."""

    def declines(self, context: Sequence[int]) -> bool:
        """True where it has no chain after `context` (prompt lookup without a long enough match): the
        composer then asks the next source. It depends on the context alone, so each round stays exact."""
        return False

    def rollback(self, context: Sequence[int]) -> int:
        """After a round: drop state beyond the longest prefix of `context` it holds; positions removed."""
        return 0

    def token_ms(self, target: LM) -> dict[str, float]:
        """ms per drafted token, by source name (the cost-aware γ policy's draft cost; none: free)."""
        return {}


# ------------------------------------------------------------------------------ calibration
DEPTH_BUCKETS = 4               # depths 1, 2, 3 and 4+ are counted apart
PRIOR_BUCKETS = 5               # priors in [0, .2), [.2, .4), … [.8, 1]
PRIOR_WEIGHT = 4.0              # the prior counts as this many tries


@dataclass
class OnlineCalibration:
    """ŝ = (hits + w·ŝ⁰) / (tries + w) per (source, depth, prior bucket), counted over the run's earlier
    rounds: a node is tried when its parent matched the tokens the round emitted (the root always does),
    and hit when its own token matched too; a node the plan did not verify is counted all the same."""

    counts: dict

    @classmethod
    def empty(cls) -> OnlineCalibration:
        return cls({})

    @staticmethod
    def key(source: str, depth: int, prior: float) -> tuple[str, int, int]:
        return source, min(depth, DEPTH_BUCKETS), min(int(prior * PRIOR_BUCKETS), PRIOR_BUCKETS - 1)

    def score(self, source: str, depth: int, prior: float) -> float:
        tries, hits = self.counts.get(self.key(source, depth, prior), (0, 0))
        return (hits + PRIOR_WEIGHT * prior) / (tries + PRIOR_WEIGHT)

    def scores(self, tree: Proposal) -> list[float]:
        return [self.score(tree.source, d, n.prior) for n, d in zip(tree.nodes, tree.depths())]

    def update(self, tree: Proposal, emitted: Sequence[int]) -> None:
        """Count the tree's nodes against the tokens the round emitted (see the class)."""
        for node, depth, hit in tried(tree, emitted):
            self.count(tree.source, depth, node.prior, hit)

    def count(self, source: str, depth: int, prior: float, hit: bool) -> None:
        key = self.key(source, depth, prior)
        tries, hits = self.counts.get(key, (0, 0))
        self.counts[key] = (tries + 1, hits + hit)


def tried(tree: Proposal, emitted: Sequence[int]) -> list[tuple[SourceNode, int, bool]]:
    """(node, depth, hit) for every node whose parent path equals emitted[:depth − 1]."""
    matched = {ROOT}
    out = []
    for i, (node, depth) in enumerate(zip(tree.nodes, tree.depths())):
        if node.parent in matched and depth <= len(emitted):
            hit = node.token == emitted[depth - 1]
            out.append((node, depth, hit))
            if hit:
                matched.add(i)
    return out


# ------------------------------------------------------------------------------ composer
class _Cells:
    """The lattice being composed: per position, token -> cell index, the cells' q and sources, and the
    scores by (parent cell, cell)."""

    def __init__(self, base: LatticeDraft | None):
        self.tokens: list[list[int]] = []
        self.q: list[list[float]] = []
        self.sources: list[list[tuple[str, ...]]] = []
        self.scores: list[dict[tuple[int, int], float]] = []
        self.confidence: list[tuple[float, ...]] = []
        if base is not None:
            self._take_base(base)

    def _take_base(self, base: LatticeDraft) -> None:
        lat = base.lattice
        for k in range(lat.gamma):
            self.tokens.append(list(lat.token_ids[k]))
            self.q.append([float(v) for v in lat.q_draft[k]])
            self.sources.append(list(base.sources[k]))
            self.scores.append({(p, j): float(s) for p, row in enumerate(lat.scores[k]) for j, s in enumerate(row)})
            self.confidence.append(tuple(base.confidence[k]))

    def cell(self, depth: int, token: int, source: str, q: float) -> int | None:
        """The cell of `token` at `depth` (1-based), added when missing; None when the position is full."""
        k = depth - 1
        if k == len(self.tokens):
            self.tokens.append([]), self.q.append([]), self.sources.append([]), self.scores.append({})
            self.confidence.append(())
        row = self.tokens[k]
        if token in row:
            j = row.index(token)
            if source not in self.sources[k][j]:
                self.sources[k][j] = self.sources[k][j] + (source,)
            self.q[k][j] = max(self.q[k][j], q)
            return j
        if len(row) >= MAX_LATTICE_CANDIDATES:
            return None
        row.append(token), self.q[k].append(q), self.sources[k].append((source,))
        return len(row) - 1

    def raise_score(self, depth: int, parent: int, j: int, score: float) -> None:
        key = (0 if depth == 1 else parent, j)
        table = self.scores[depth - 1]
        table[key] = max(table.get(key, 0.0), score)

    def draft(self, extra: tuple[int, ...], own: tuple[int, ...]) -> LatticeDraft:
        widths = [1] + [len(row) for row in self.tokens]
        scores = [[[min(1.0, max(0.0, self.scores[k].get((p, j), 0.0))) for j in range(widths[k + 1])]
                   for p in range(widths[k])] for k in range(len(self.tokens))]
        confidence = tuple(tuple(conf) + (0.0,) * (widths[k] - len(conf)) for k, conf in enumerate(self.confidence))
        lattice = Lattice(self.tokens, [[min(1.0, max(0.0, v)) for v in row] for row in self.q], scores)
        return LatticeDraft(lattice, confidence, extra, own, tuple(tuple(row) for row in self.sources))


def labelled(draft: LatticeDraft, name: str) -> LatticeDraft:
    """A trained drafter's lattice with each cell's sources: `name` for the cells it proposed itself,
    "lookup" for prompt lookup's (both where lookup's token was among the drafter's own)."""
    lat = draft.lattice
    own = draft.own or tuple(len(row) for row in lat.token_ids)
    sources = []
    for k, row in enumerate(lat.token_ids):
        lookup_at = draft.extra[k] if k < len(draft.extra) else None
        sources.append(tuple(((name,) if j < own[k] else ()) + (("lookup",) if j == lookup_at else ())
                             for j in range(len(row))))
    return dataclasses.replace(draft, own=own, sources=tuple(sources))


def compose(base: LatticeDraft | None, trees: Sequence[Proposal], scores: Sequence[Sequence[float]],
            gamma: int) -> LatticeDraft | None:
    """The base lattice (labelled, or none) with every tree's nodes added at their depth (at most gamma),
    each under its parent's cell with its calibrated score (`scores[i]` for trees[i], node by node);
    None when nothing was proposed."""
    cells = _Cells(base)
    gamma = min(gamma, DSPARK_MAX_GAMMA)
    for tree, tree_scores in zip(trees, scores):
        at: list[int | None] = []
        for node, depth, score in zip(tree.nodes, tree.depths(), tree_scores):
            parent = None if node.parent == ROOT else at[node.parent]
            if depth > gamma or (node.parent != ROOT and parent is None):
                at.append(None)
                continue
            j = cells.cell(depth, int(node.token), tree.source, float(node.q_draft))
            if j is not None:
                cells.raise_score(depth, parent or 0, j, float(score))
            at.append(j)
    if not cells.tokens or not cells.tokens[0]:
        return None
    if base is None:
        return cells.draft((), tuple(0 for _ in cells.tokens))
    own = base.own + (0,) * (len(cells.tokens) - len(base.own))
    return cells.draft(base.extra, own)


class SourceSet:
    """The composer: a run's sources with the trees' calibration, as DSpark's decoder and speculative
    decoding's chain drafter (decoding.drafters.source_chain) both use them: `start` with the prompt,
    `observe_logits` every target forward, `draft` a round, then `learn` from the tokens the round emitted
    and `observe_context` the context they extend.

    The sources form groups, in order: each source that draws its own chain (`draws_chains`) alone, each run
    of the others together. A round is drafted by the first group that does not decline its context (the
    last never does; DSpark's sources are all one group): a chain source's answer, or every tree of the
    group composed onto its lattice source's base."""

    def __init__(self, sources: Sequence[LatticeSource]):
        self.sources = tuple(sources)
        self.name = "+".join(source.name for source in self.sources)
        self.groups = chain_groups(self.sources)
        self.calibration = OnlineCalibration.empty()
        self.pending: tuple[Proposal, ...] = ()       # this round's trees, until `learn`

    @property
    def prompt_rows(self) -> int:
        """The most prompt positions any source wants the logits of at the prefill."""
        return max([0] + [source.prompt_rows for source in self.sources])

    @property
    def feature_layers(self) -> tuple[int, ...]:
        """The target layers whose outputs the hidden rows must hold (a trained drafter's; () otherwise)."""
        return next((s.feature_layers for s in self.sources if s.feature_layers), ())

    @property
    def span(self) -> int:
        """How many of the last emitted tokens' hidden rows the sources read."""
        return max([1] + [source.span for source in self.sources])

    def start(self, prompt_ids: Sequence[int]) -> None:
        self.calibration, self.pending = OnlineCalibration.empty(), ()
        for source in self.sources:
            source.start(prompt_ids)

    def observe_logits(self, tokens: Sequence[int], logits: torch.Tensor) -> None:
        for source in self.sources:
            source.observe_logits(tokens, logits)

    def drafting(self, context: Sequence[int]) -> tuple[LatticeSource, ...]:
        """The group that drafts after `context`: the first that does not decline it (the last never does)."""
        return next((g for g in self.groups[:-1] if not (g[0].draws_chains and g[0].declines(context))),
                    self.groups[-1] if self.groups else ())

    def draft(self, context: Sequence[int], request: SourceRequest) -> Proposal:
        """The drafting group's proposal after context[-1]: a chain source's answer, or the lattice of every
        source's, the trees composed onto the base lattice and scored by the run (no lattice when nothing was
        proposed), named by the group."""
        group = self.drafting(context)
        if group and group[0].draws_chains:
            self.pending = ()
            return group[0].propose(context, request)
        proposals = [source.propose(context, request) for source in group]
        bases = [p.lattice for p in proposals if p.lattice is not None]
        check(len(bases) <= 1, "drafter", self.name,
              "may hold at most one source that scores its own lattice (a trained drafter)")
        self.pending = tuple(p for p in proposals if p.nodes is not None)
        lattice = bases[0] if bases else None
        if self.pending:
            lattice = compose(lattice, self.pending, [self.calibration.scores(tree) for tree in self.pending],
                              request.gamma)
        return Proposal(source="+".join(source.name for source in group), lattice=lattice)

    def learn(self, emitted: Sequence[int]) -> None:
        """Count the round's trees against the tokens it emitted (OnlineCalibration)."""
        for tree in self.pending:
            self.calibration.update(tree, emitted)
        self.pending = ()

    def observe_context(self, context: Sequence[int]) -> None:
        """After a round: the whole context so far, to every source (LatticeSource.observe_context)."""
        for source in self.sources:
            source.observe_context(context)


def chain_groups(sources: Sequence[LatticeSource]) -> tuple[tuple[LatticeSource, ...], ...]:
    """The sources in order, each that draws its own chain alone and each run of the others as one group."""
    out: list[tuple[LatticeSource, ...]] = []
    for source in sources:
        if out and not source.draws_chains and not out[-1][0].draws_chains:
            out[-1] += (source,)
        else:
            out.append((source,))
    return tuple(out)
