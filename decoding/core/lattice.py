"""The candidate lattice a parallel drafter proposes and the DP selection reads: per position k = 1..γ,
K_k candidates with a token id, the drafter's probability q_draft and a score ŝ_k(x | parent); and the types
of the draft-source interface (decoding.drafters.lattice_source.LatticeSource): what a round asks of a
source (`SourceRequest`, with `ChainDraw` for a chain and `LookupInput` for prompt lookup's chain, and
`LatticeRequest` for a trained drafter's lattice) and what a source answers, one type (`Proposal`): a chain,
a tree of `SourceNode`s, or a `LatticeDraft` it scored itself."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Real
from typing import TYPE_CHECKING

from decoding.core.config import DSPARK_MAX_GAMMA
from decoding.core.errors import check
from decoding.core.trace import LookupMatch

if TYPE_CHECKING:
    import torch

    from decoding.core.processors import Pipeline


def is_real(value) -> bool:
    """A real number (int, float, Fraction), not a bool and not NaN."""
    return isinstance(value, Real) and not isinstance(value, bool) and value == value


def _tuplify(rows, depth: int):
    if depth == 0:
        return rows
    return tuple(_tuplify(r, depth - 1) for r in rows)


@dataclass(frozen=True)
class Lattice:
    """Candidates per position. token_ids[k][j], q_draft[k][j]: candidate j at position k+1.
    scores[k][parent][j] = ŝ_{k+1}(candidate j | candidate `parent` at position k); scores[0] has a
    single row (the implicit parent). Plain Python numbers (pass tensor.tolist()); lists are
    accepted and stored as tuples."""

    token_ids: tuple[tuple[int, ...], ...]                 # (γ, K_k)
    q_draft: tuple[tuple[Real, ...], ...]                  # (γ, K_k)
    scores: tuple[tuple[tuple[Real, ...], ...], ...]       # (γ, K_{k-1} or 1, K_k)

    def __post_init__(self):
        object.__setattr__(self, "token_ids", _tuplify(self.token_ids, 2))
        object.__setattr__(self, "q_draft", _tuplify(self.q_draft, 2))
        object.__setattr__(self, "scores", _tuplify(self.scores, 3))
        gamma = len(self.token_ids)
        check(1 <= gamma <= DSPARK_MAX_GAMMA, "gamma", gamma, f"must be an integer in [1, {DSPARK_MAX_GAMMA}]")
        check(len(self.q_draft) == gamma and len(self.scores) == gamma, "lattice", gamma,
              "token_ids, q_draft and scores must have one entry per position")
        for k in range(gamma):
            self._check_position(k)

    def _check_position(self, k: int) -> None:
        tokens = self.token_ids[k]
        check(len(tokens) >= 1, "top_k_candidates", len(tokens), f"must be >= 1 (position {k + 1})")
        check(all(isinstance(t, int) and t >= 0 for t in tokens), "token_ids", tokens,
              f"must be token ids >= 0 (position {k + 1})")
        check(len(set(tokens)) == len(tokens), "token_ids", tokens,
              f"candidates at position {k + 1} must be distinct tokens")
        check(len(self.q_draft[k]) == len(tokens) and all(is_real(v) and 0 <= v <= 1
                                                          for v in self.q_draft[k]),
              "q_draft", self.q_draft[k], f"must be {len(tokens)} probabilities (position {k + 1})")
        parents = 1 if k == 0 else len(self.token_ids[k - 1])
        rows = self.scores[k]
        check(len(rows) == parents and all(len(r) == len(tokens) for r in rows), "scores",
              f"<position {k + 1}>", f"must be a ({parents}, {len(tokens)}) table (parents x candidates)")
        check(all(is_real(s) and 0 <= s <= 1 for r in rows for s in r), "scores", rows,
              f"must be numbers in [0, 1] (position {k + 1})")

    @classmethod
    def independent(cls, token_ids, q_draft, scores) -> Lattice:
        """A lattice whose scores do not depend on the parent: scores[k][j] (γ, K_k)."""
        full = [[tuple(scores[0])]] + [[tuple(scores[k])] * len(token_ids[k - 1])
                                       for k in range(1, len(token_ids))]
        return cls(token_ids, q_draft, full)

    @property
    def gamma(self) -> int:
        return len(self.token_ids)

    def score(self, k: int, parent: int, j: int) -> Real:
        """ŝ at 0-based position k of candidate j given candidate `parent` at k−1 (ignored at k=0)."""
        return self.scores[k][0 if k == 0 else parent][j]


# ------------------------------------------------------------------------------ the draft-source interface's types
@dataclass(frozen=True)
class LatticeRequest:
    """What a DSpark round asks its drafter for: γ positions of top-K candidates at `temperature`, with
    `extra` (prompt lookup's chain) among them; `budget`: the most tree nodes the plan may take (None: a
    chain), which lets a drafter stop once deeper positions cannot enter the plan."""

    gamma: int
    top_k: int
    temperature: float = 0.0
    extra: tuple[int, ...] = ()
    budget: int | None = None


@dataclass(frozen=True)
class LatticeDraft:
    """The lattice plus what the trace shows: per position and parent, the confidence c_k(parent);
    per position given an extra token (prompt lookup's), that token's candidate index."""

    lattice: Lattice
    confidence: tuple[tuple[float, ...], ...]     # (γ, K_{k-1} or 1)
    extra: tuple[int, ...] = ()                   # candidate index of extra[k] at position k+1
    own: tuple[int, ...] = ()                     # per position, how many of the first cells the drafter
    #                                               proposed itself (the rest: extra's); () = all of them
    sources: tuple[tuple[tuple[str, ...], ...], ...] = ()   # per position and cell, who proposed it
    #                                               (decoding.drafters.lattice_source; () = not labelled)


ROOT = -1


@dataclass(frozen=True)
class SourceNode:
    token: int
    parent: int                 # index of the parent node in the tree's nodes; ROOT: the round's root
    prior: float                # ŝ⁰ in [0, 1]: the source's guess that it is accepted once its parent is
    q_draft: float = 0.0        # the source's probability of the token, for display (0: it has none)


@dataclass(frozen=True)
class LookupInput:
    """One round's prompt lookup (decoding.drafters.lattice_lookup): the proposed tokens, where they matched,
    and (λ_first, λ_continuation)."""

    tokens: tuple[int, ...]
    match: LookupMatch | None
    scores: tuple[float, float]


@dataclass(frozen=True)
class ChainDraw:
    """How a chain request wants its tokens drawn: like the target, through its `pipeline` (the argmax when
    `greedy`) with the run's `generator`; stop after a token whose q_draft is below `stop_below`."""

    pipeline: Pipeline
    greedy: bool
    generator: torch.Generator
    stop_below: float | None = None


@dataclass(frozen=True)
class Proposal:
    """A source's answer to one round (`LatticeSource.propose`), in one of three forms:
    - a chain, to a chain request: up to `gamma` `tokens`, with the q_draft rows they were drawn from
      (processed by the request's pipeline) where the source has a distribution (None: point mass);
    - a tree (`nodes` not None, maybe empty): candidates after the round's root, parents before children,
      each with a prior ŝ⁰ the run's calibration turns into a score;
    - a `lattice` the source scored itself, per parent (a trained drafter's, or prompt lookup's chain).
    `Proposal()`: nothing this round. `source` names who proposed it ("" = the run's drafter)."""

    tokens: tuple[int, ...] = ()
    q_draft: torch.Tensor | None = None        # (n, V) processed draft probabilities; None: point mass
    draft_draws: tuple[float | None, ...] = ()  # u that sampled each token (None for argmax)
    lookup: LookupMatch | None = None
    source: str = ""
    nodes: tuple[SourceNode, ...] | None = None     # a tree; None: not one
    lattice: LatticeDraft | None = None             # a lattice the source scored itself

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def empty(self) -> bool:
        """Nothing proposed: no chain, no tree node, no lattice."""
        return not self.tokens and not self.nodes and self.lattice is None

    def depths(self) -> list[int]:
        """A tree's node depths (1: a child of the root)."""
        out: list[int] = []
        for node in self.nodes or ():
            out.append(1 if node.parent == ROOT else out[node.parent] + 1)
        return out


@dataclass(frozen=True)
class SourceRequest:
    """What a round asks of its sources: at most `max_nodes` tree nodes, at most `gamma` deep; for a
    lattice source, `top_k` candidates per position at `temperature` (a tree `budget`: the most nodes the
    plan may take, None: a chain), the round's `history` (the last emitted tokens, the root last) with the
    target's `hidden` rows that produced them (len(history), F), and prompt lookup's chain (`lookup`); for
    speculative decoding, `chain`: a chain of at most `gamma` tokens drawn as it says."""

    gamma: int
    max_nodes: int
    top_k: int = 1
    temperature: float = 0.0
    budget: int | None = None
    history: Sequence[int] = ()
    hidden: torch.Tensor | None = None
    lookup: LookupInput | None = None
    chain: ChainDraw | None = None
