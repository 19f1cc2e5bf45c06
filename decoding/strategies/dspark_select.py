"""Stage 1 of parallel drafting: choose what to verify from a candidate lattice, draft side only.

A lattice holds, for positions k = 1..γ, K_k candidates with a token id, the drafter's probability
q_draft and a score ŝ_k(x | parent) ≈ P(x accepted | its prefix accepted). The score may depend on
the candidate chosen at k−1 (a sequential head); position 1 has one implicit parent (the last
emitted token). Nothing here looks at the target, so any plan chosen here keeps decoding exact.

- chain mode: V_k(x | parent) = ŝ_k(x | parent) · (1 + max_y V_{k+1}(y | x)), V_{γ+1} = 0, with
  back-pointers; V_1 of the chosen first candidate is the path's expected accepted length.
- tree mode: best-first, the n nodes of highest survival product (product of ŝ along the path);
  a tree's expected accepted length is the sum of its nodes' survival products (decoding.core.formulas
  holds these sums, for a chain and a tree alike).
- cost-aware size (adaptive γ): the chain length or tree budget maximizing
  (1 + E[accepted]) / (verify cost + overhead).

Numbers are whatever the caller gives (float or fractions.Fraction); nothing is rounded here.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from numbers import Real

from decoding.core.config import DSPARK_MAX_BUDGET
from decoding.core.errors import check
from decoding.core.formulas import (
    expected_accepted,
    expected_accepted_by_size,
    plan_expected_accepted,
    tokens_per_round,
)
from decoding.core.lattice import Lattice, is_real
from decoding.runtime.cost_table import CostTable


# ---------------------------------------------------------------------------------------- chain
@dataclass(frozen=True)
class ChainPlan:
    """The chain maximizing expected accepted length, with the DP table for the trace."""

    path: tuple[int, ...]                         # candidate index per position 1..L
    tokens: tuple[int, ...]
    scores: tuple[Real, ...]                      # ŝ of each path step given its parent on the path
    expected_accepted: Real                       # V_1(path[0])
    values: tuple[tuple[tuple[Real, ...], ...], ...]   # V[k][parent][j]  (L, K_{k-1} or 1, K_k)
    back: tuple[tuple[int | None, ...], ...]      # back[k][j] = argmax_y V_{k+1}(y | j); None at k = L−1

    @property
    def parents(self) -> tuple[int, ...]:
        """Parent of each node among the plan's nodes (−1 = the root, the last emitted token)."""
        return tuple(range(-1, len(self.path) - 1))


def _argmax(values) -> int:
    best = 0
    for i, v in enumerate(values):
        if v > values[best]:
            best = i
    return best


def best_chain(lattice: Lattice, length: int | None = None) -> ChainPlan:
    """Backward recursion over positions 1..length (default γ); ties go to the lower index."""
    length = lattice.gamma if length is None else length
    check(isinstance(length, int) and 1 <= length <= lattice.gamma, "length", length,
          f"must be an integer in [1, {lattice.gamma}]")
    values: list = [None] * length
    back: list = [None] * length
    for k in range(length - 1, -1, -1):
        width = len(lattice.token_ids[k])
        if k == length - 1:
            tails, back[k] = [0] * width, (None,) * width
        else:
            nxt = [_argmax(values[k + 1][j]) for j in range(width)]
            tails, back[k] = [values[k + 1][j][y] for j, y in enumerate(nxt)], tuple(nxt)
        values[k] = tuple(tuple(s * (1 + tails[j]) for j, s in enumerate(row)) for row in lattice.scores[k])
    path = [_argmax(values[0][0])]
    for k in range(1, length):
        path.append(back[k - 1][path[-1]])
    steps = tuple(lattice.score(k, path[k - 1] if k else 0, j) for k, j in enumerate(path))
    return ChainPlan(path=tuple(path), tokens=tuple(lattice.token_ids[k][j] for k, j in enumerate(path)),
                     scores=steps, expected_accepted=values[0][0][path[0]], values=tuple(values),
                     back=tuple(back))


chain_value = expected_accepted   # a chain's expected accepted length from its step scores: Σ_k Π_{i<=k} ŝ_i


# ---------------------------------------------------------------------------------------- tree
@dataclass(frozen=True)
class TreeNode:
    depth: int          # 1..γ (position in the draft)
    cand: int           # candidate index at that position
    token: int
    parent: int         # index of the parent node in TreePlan.nodes; −1 = the root
    score: Real         # ŝ given the parent
    survival: Real      # product of ŝ along the path from the root


@dataclass(frozen=True)
class TreePlan:
    """Best-first nodes, parents always before children; the first n nodes are the best n-tree."""

    nodes: tuple[TreeNode, ...]

    @property
    def expected_accepted(self) -> Real:
        return plan_expected_accepted(n.survival for n in self.nodes)

    @property
    def tokens(self) -> tuple[int, ...]:
        return tuple(n.token for n in self.nodes)

    @property
    def parents(self) -> tuple[int, ...]:
        return tuple(n.parent for n in self.nodes)

    def prefix(self, n: int) -> TreePlan:
        return TreePlan(self.nodes[:n])


def best_tree(lattice: Lattice, budget: int) -> TreePlan:
    """The `budget` nodes of highest survival product (a connected tree: ŝ <= 1 makes survival
    non-increasing along a path, and a child enters the heap only once its parent is taken)."""
    check(isinstance(budget, int) and 1 <= budget <= DSPARK_MAX_BUDGET, "budget", budget,
          f"must be an integer in [1, {DSPARK_MAX_BUDGET}]")
    heap: list = []
    counter = 0

    def push(depth: int, parent_node: int, parent_cand: int, parent_survival) -> None:
        nonlocal counter
        for j in range(len(lattice.token_ids[depth - 1])):
            s = lattice.score(depth - 1, parent_cand, j)
            heapq.heappush(heap, (-(parent_survival * s), counter, depth, j, parent_node, s))
            counter += 1

    push(1, -1, 0, 1)
    nodes: list[TreeNode] = []
    while heap and len(nodes) < budget:
        neg, _, depth, j, parent, s = heapq.heappop(heap)
        nodes.append(TreeNode(depth, j, lattice.token_ids[depth - 1][j], parent, s, -neg))
        if depth < lattice.gamma:
            push(depth + 1, len(nodes) - 1, j, -neg)
    return TreePlan(tuple(nodes))


# ---------------------------------------------------------------------------------- cost-aware
@dataclass(frozen=True)
class SizeChoice:
    """Adaptive γ: expected accepted length and tokens/s for every size tried (sizes 1..N)."""

    size: int                                # chosen chain length or tree budget
    expected_accepted: tuple[float, ...]     # per size 1..N
    cost_ms: tuple[float, ...]               # verify(size + 1 tokens) + overhead, per size
    tokens_per_s: tuple[float, ...]          # (1 + E[accepted]) / cost, per size


def _choose(expected: list, cost: CostTable, overhead_ms: float) -> SizeChoice:
    check(is_real(overhead_ms) and overhead_ms >= 0, "overhead_ms", overhead_ms, "must be a number >= 0")
    costs = [cost.ms(size + 1) + float(overhead_ms) for size in range(1, len(expected) + 1)]
    rates = [1000.0 * tokens_per_round(float(e)) / c for e, c in zip(expected, costs)]
    return SizeChoice(size=_argmax(rates) + 1, expected_accepted=tuple(float(e) for e in expected),
                      cost_ms=tuple(costs), tokens_per_s=tuple(rates))


def choose_chain(lattice: Lattice, cost: CostTable, overhead_ms: float = 0.0,
                 max_length: int | None = None) -> tuple[ChainPlan, SizeChoice]:
    """Re-solve the chain DP for every length 1..max_length and keep the length with the most
    expected tokens per second. A chain of L drafts is verified in one forward of L + 1 tokens
    (the last emitted token, not yet in the cache, plus the drafts)."""
    top = lattice.gamma if max_length is None else max_length
    plans = [best_chain(lattice, n) for n in range(1, top + 1)]
    choice = _choose([p.expected_accepted for p in plans], cost, overhead_ms)
    return plans[choice.size - 1], choice


def choose_tree(lattice: Lattice, cost: CostTable, max_budget: int,
                overhead_ms: float = 0.0) -> tuple[TreePlan, SizeChoice]:
    """Best-first once up to max_budget; its first n nodes are the best n-node tree, so every
    budget is priced from one run. Verified in one forward of n + 1 tokens."""
    plan = best_tree(lattice, max_budget)
    choice = _choose(expected_accepted_by_size(n.survival for n in plan.nodes), cost, overhead_ms)
    return plan.prefix(choice.size), choice


def flat_tree(root_token: int, plan: ChainPlan | TreePlan) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(tokens, parents) for verification: node 0 is the root (the last emitted token, not yet in
    the cache), plan node i becomes node i + 1; parents before children."""
    return (int(root_token),) + plan.tokens, (-1,) + tuple(p + 1 for p in plan.parents)
