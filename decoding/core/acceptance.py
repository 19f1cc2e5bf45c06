"""The acceptance rules' one home, in the engine's tensor forms (their list forms, for exact enumeration
and the torch-free UI, are decoding/core/exact_rules.py, to which list inputs are handed):

- the chain rules of speculative decoding: at temperature 0 accept while the draft token is the target's
  argmax (`greedy_accepts`); above it accept a draft x with min(1, p_target(x) / q_draft(x))
  (`ratio_accepts`), after a rejection draw from norm(max(0, p_target − q_draft)) (`residual_distribution`),
  or for a point-mass draft (q_draft(x) = 1, prompt lookup) from p_target with x zeroed (`residual`);
- stage 2 acceptance over a draft tree of deterministic distinct candidates (exact), its
  temperature-0 form, and a labelled lossy mode.

Tree convention (shared with decoding/strategies/tree_verify.py): node 0 is the root, the last emitted token (not yet
in the cache); nodes 1.. are drafts; parents[i] < i, parents[0] = −1. `p_target_at(i)` (or row i of
a (q, V) tensor) is the target's processed distribution of the token after node i's path.

Exact rule at a node with children x_1..x_m in order: p_1 = p_target; accept x_j with probability
p_j(x_j); on rejection p_{j+1} = p_j with x_j zeroed and renormalized; if all are rejected, sample
the next token from p_{m+1}; an accepted child is recursed into; a leaf emits a bonus token from
its p_target. The emitted token at every node is then distributed exactly as p_target, whatever the
children are, as long as they were chosen without looking at the target.

Distributions are sequences indexable by token id: lists/tuples of fractions.Fraction or floats (for
exact enumeration) or 1-D torch tensors (in the engine).
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from decoding.core import exact_rules
from decoding.core.errors import check
from decoding.core.exact_rules import Branch, acceptance_probability
from decoding.core.token_step import sample_inverse_cdf


# ------------------------------------------------------------------------------ the chain rules
def target_argmax(logits) -> int:
    """The token plain greedy decoding picks from a (V,) row: the argmax, the first index on ties."""
    return int(torch.argmax(logits))


def greedy_accepts(token: int, logits) -> bool:
    """Temperature 0: a draft token is accepted exactly when it is the target's argmax."""
    return token == target_argmax(logits)


def ratio_accepts(p_target_x: float, q_draft_x: float, generator: torch.Generator) -> tuple[bool, float]:
    """The ratio rule for one draft token: draw u ~ U[0, 1) (float64, from `generator`) and accept when
    u < min(1, p_target_x / q_draft_x) (decoding.core.exact_rules.acceptance_probability). -> (accepted, u)."""
    u = float(torch.rand((), generator=generator, dtype=torch.float64))
    return u < acceptance_probability(p_target_x, q_draft_x), u


def accepted_mass(p_target, q_draft):
    """sum_x min(p_target(x), q_draft(x)): the probability that a drafted position is accepted (row-wise
    for (n, V) tensors)."""
    if isinstance(p_target, torch.Tensor):
        return torch.minimum(p_target, q_draft).sum(-1)
    return exact_rules.accepted_mass(p_target, q_draft)


def residual_distribution(p_target, q_draft):
    """After a ratio-rule rejection: norm(max(0, p_target - q_draft)) (p_target if it has no mass); lists
    go to decoding.core.exact_rules.ratio_residual."""
    if not isinstance(p_target, torch.Tensor):
        return exact_rules.ratio_residual(p_target, q_draft)
    weights = (p_target - q_draft).clamp_min(0)  # (V,)
    total = weights.sum()
    if total <= 0:
        return p_target  # rejection had probability 0; only float round-off gets here
    return weights / total


def children_of(parents: Sequence[int]) -> list[list[int]]:
    """Children lists (in node order) of a flattened tree; validates parents[i] < i."""
    check(len(parents) >= 1 and parents[0] == -1, "parents", tuple(parents[:3]),
          "node 0 must be the root (parent −1)")
    kids: list[list[int]] = [[] for _ in parents]
    for i, parent in enumerate(parents[1:], start=1):
        check(0 <= parent < i, "parents", tuple(parents), f"node {i} needs a parent among nodes 0..{i - 1}")
        kids[parent].append(i)
    return kids


def residual(p_target, token: int):
    """After rejecting a point-mass proposal `token` (a tree sibling here, a prompt-lookup draft in
    speculative decoding): p_target with `token` zeroed and renormalized. A list/tuple in gives a list
    out (Fractions stay exact), a 1-D tensor (V,) a new tensor; the input is left unchanged.

    Edge case, one policy: when nothing is left (every bit of mass was on `token`, i.e. p(token) = 1)
    the result is None. The rejection then has probability 0: exact enumeration stops there, and the
    samplers never get there, since they only reject a token with p(token) < 1 and a distribution
    that was divided by its own sum holds exactly 1.0 wherever all other entries are 0."""
    if isinstance(p_target, torch.Tensor):
        out = p_target.clone()  # (V,)
        out[token] = 0
        total = out.sum()
        return out / total if total > 0 else None
    return exact_rules.point_mass_residual(p_target, token)


# ------------------------------------------------------------------------------ exact branches
def exact_branches(p_target, children: Sequence[int]) -> list[Branch]:
    """The exact rule's outcomes at one node (decoding.core.exact_rules.exact_branches, lists or tensors)."""
    return exact_rules.exact_branches(p_target, children, residual)


def lossy_branches(p_target, children: Sequence[int], threshold) -> list[Branch]:
    """LOSSY (labelled, off by default): decoding.core.exact_rules.lossy_branches, lists or tensors."""
    return exact_rules.lossy_branches(p_target, children, threshold, residual)


Rule = Callable[[object, Sequence[int]], list[Branch]]


def round_distribution(tokens: Sequence[int], parents: Sequence[int], p_target_at: Callable[[int], object],
                       rule: Rule = exact_branches) -> dict[tuple[int, ...], object]:
    """Exact distribution of the tokens one verification round emits (accepted drafts, then the
    residual or bonus token), by enumerating every branch of `rule` at every node."""
    kids = children_of(parents)
    out: dict[tuple[int, ...], object] = defaultdict(int)

    def emit(prefix, prob, dist):
        for token, mass in enumerate(dist):
            if mass:
                out[prefix + (token,)] += prob * mass

    def walk(node: int, prefix: tuple[int, ...], prob) -> None:
        p_target = p_target_at(node)
        if not kids[node]:
            emit(prefix, prob, p_target)
            return
        for branch in rule(p_target, [tokens[c] for c in kids[node]]):
            if not branch.prob:
                continue
            if branch.accepted is None:
                emit(prefix, prob * branch.prob, branch.dist)
            else:
                child = kids[node][branch.accepted]
                walk(child, prefix + (tokens[child],), prob * branch.prob)

    walk(0, (), 1)
    return dict(out)


def total_variation(dist_a: dict, dist_b: dict):
    """½ Σ |a − b| over the union of outcomes (exact with Fractions)."""
    keys = set(dist_a) | set(dist_b)
    return sum((abs(dist_a.get(k, 0) - dist_b.get(k, 0)) for k in keys), 0) / 2


# ------------------------------------------------------------------------------ sampled (engine)
@dataclass(frozen=True)
class NodeCheck:
    """One verified draft node: its token, the target's probability of it at its parent, the
    probability it was accepted with (p_j(x_j) after earlier siblings' rejections) and the draw."""

    node: int
    token: int
    p_target: float
    p_accept: float
    draw: float | None        # None at temperature 0 or when the lossy shortcut fired
    accepted: bool


@dataclass(frozen=True)
class RoundOutcome:
    accepted: tuple[int, ...]     # accepted draft nodes, root excluded, in path order
    next_token: int               # residual / bonus / argmax token emitted after them
    next_from: str                # "residual" | "bonus" | "argmax"
    next_draw: float | None
    checks: tuple[NodeCheck, ...]  # every child examined, in order
    emitted: tuple[int, ...]       # tokens of the accepted nodes, then next_token


def _finish(accepted, tokens, next_token, next_from, draw, checks) -> RoundOutcome:
    emitted = tuple(tokens[n] for n in accepted) + (int(next_token),)
    return RoundOutcome(tuple(accepted), int(next_token), next_from, draw, tuple(checks), emitted)


def _try_children(p_node: torch.Tensor, kids, tokens, generator, lossy_threshold, checks):
    """Walk one node's children with the exact (or lossy) rule; return (child or None, p_{m+1})."""
    if lossy_threshold is not None:
        for child in kids:
            if float(p_node[tokens[child]]) > lossy_threshold:
                checks.append(NodeCheck(child, tokens[child], float(p_node[tokens[child]]), 1.0, None, True))
                return child, None
    p_j = p_node
    for child in kids:
        token = tokens[child]
        accept = float(p_j[token])
        u = float(torch.rand((), generator=generator, dtype=torch.float64))
        ok = u < accept or accept >= 1.0
        checks.append(NodeCheck(child, token, float(p_node[token]), accept, u, ok))
        if ok:
            return child, None
        p_j = residual(p_j, token)
    return None, p_j


def sample_round(tokens: Sequence[int], parents: Sequence[int], p_target: torch.Tensor,
                 generator: torch.Generator, lossy_threshold: float | None = None) -> RoundOutcome:
    """One verification round, sampled. p_target: (q, V) processed target probabilities, row i for
    the token after node i. Every acceptance draw and the final token's draw come from `generator`.
    lossy_threshold (LOSSY, off by default): accept a child outright when p_target(x) > threshold."""
    check(lossy_threshold is None or (isinstance(lossy_threshold, (int, float)) and 0 < lossy_threshold <= 1),
          "lossy_threshold", lossy_threshold, "must be a number in (0, 1] (or None: exact)")
    kids = children_of(parents)
    p_rows = p_target.double()  # (q, V)
    node, accepted, checks = 0, [], []
    while True:
        p_node = p_rows[node] / p_rows[node].sum()  # (V,)
        if not kids[node]:
            token, u = sample_inverse_cdf(p_node, generator)
            return _finish(accepted, tokens, token, "bonus", u, checks)
        child, rest = _try_children(p_node, kids[node], tokens, generator, lossy_threshold, checks)
        if child is None:
            token, u = sample_inverse_cdf(rest, generator)
            return _finish(accepted, tokens, token, "residual", u, checks)
        accepted.append(child)
        node = child


def greedy_round(tokens: Sequence[int], parents: Sequence[int], logits: torch.Tensor) -> RoundOutcome:
    """Temperature 0: at each node accept the child equal to the target's argmax (first index on
    ties, as plain greedy); otherwise, or at a leaf, emit that argmax. logits: (q, V)."""
    kids = children_of(parents)
    node, accepted, checks = 0, [], []
    while True:
        best = target_argmax(logits[node])
        p_node = torch.softmax(logits[node].double(), -1)  # (V,) shown in the trace only
        match = None
        for child in kids[node]:
            ok = tokens[child] == best
            checks.append(NodeCheck(child, tokens[child], float(p_node[tokens[child]]), float(ok), None, ok))
            if ok:
                match = child
                break
        if match is None:
            return _finish(accepted, tokens, best, "bonus" if not kids[node] else "argmax", None, checks)
        accepted.append(match)
        node = match
