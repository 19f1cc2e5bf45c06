"""The candidate lattice a parallel drafter proposes and the DP selection reads: per position k = 1..γ,
K_k candidates with a token id, the drafter's probability q_draft and a score ŝ_k(x | parent)."""
from __future__ import annotations

from dataclasses import dataclass
from numbers import Real

from decoding.core.config import DSPARK_MAX_GAMMA
from decoding.core.errors import check


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
