"""The acceptance rules by exact enumeration over plain sequences (lists or tuples of fractions.Fraction or
floats; Fractions stay exact), torch-free so a view can show them without loading a model's code. The
engine's tensor forms of the same rules (decoding/core/acceptance.py) hand their list inputs to these
same functions; tests/test_acceptance_forms.py checks that the two forms agree on random inputs.

- the ratio rule (speculative decoding): accept a draft x ~ q_draft with min(1, p_target(x) / q_draft(x)),
  else draw from norm(max(0, p_target − q_draft));
- the tree rule (DSpark): children tried in order, each accepted with p_j(x_j), p_{j+1} = p_j with x_j
  zeroed and renormalized (`point_mass_residual`); its lossy mode accepts a child with p_target > threshold;
- each rule's distribution of the first token it emits (`speculative_exact`, `retrospective_exact`,
  `tree_exact`): the losslessness lab's exact side.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import product

RETROSPECTIVE_DRAWS = 2


# ------------------------------------------------------------------------------ the ratio rule
def acceptance_probability(p_target_x, q_draft_x):
    """Ratio rule: accept a token drafted with probability q_draft_x with min(1, p_target_x / q_draft_x).
    A point-mass drafter has q_draft_x = 1, so this is p_target_x."""
    return min(1, p_target_x / q_draft_x)


def accepted_mass(p_target: Sequence, q_draft: Sequence):
    """Σ_x min(p_target(x), q_draft(x)): the probability that a token drawn from q_draft is accepted."""
    return sum(min(p, q) for p, q in zip(p_target, q_draft))


def ratio_residual(p_target: Sequence, q_draft: Sequence) -> list:
    """After a ratio-rule rejection: norm(max(0, p_target - q_draft)) (p_target if it has no mass)."""
    weights = [max(0, p - q) for p, q in zip(p_target, q_draft)]
    total = sum(weights)
    if total <= 0:
        return p_target  # rejection had probability 0; only float round-off gets here
    return [w / total for w in weights]


# ------------------------------------------------------------------------------ the tree rule
def point_mass_residual(p_target: Sequence, token: int) -> list | None:
    """p_target with `token` zeroed and renormalized, as a new list; None when nothing is left
    (p(token) = 1: the rejection had probability 0). decoding.core.acceptance.residual documents the policy."""
    out = list(p_target)
    out[token] = out[token] * 0
    total = sum(out)
    return [v / total for v in out] if total > 0 else None


@dataclass(frozen=True)
class Branch:
    """One outcome at a node: child `accepted` (index into its children) with probability `prob`,
    or (accepted None) all children rejected and the next token drawn from `dist`."""

    prob: object
    accepted: int | None
    dist: object = None


def exact_branches(p_target, children: Sequence[int], residual=point_mass_residual) -> list[Branch]:
    """The exact rule's outcomes at one node, with their probabilities (Fractions stay exact); `residual`
    zeroes a rejected child (decoding.core.acceptance passes its tensor-aware form)."""
    branches, p_j, reach = [], p_target, 1
    for j, token in enumerate(children):
        accept = p_j[token]
        branches.append(Branch(reach * accept, j))
        reach = reach * (1 - accept)
        p_j = residual(p_j, token)
        if p_j is None:
            return branches
    branches.append(Branch(reach, None, p_j))
    return branches


def lossy_branches(p_target, children: Sequence[int], threshold, residual=point_mass_residual) -> list[Branch]:
    """LOSSY (labelled, off by default): the first child with p_target(x) > threshold is accepted
    outright (a typical-acceptance shortcut that looks at the target's verdict); otherwise the exact
    rule. threshold >= 1 never fires and gives the exact rule back."""
    for j, token in enumerate(children):
        if p_target[token] > threshold:
            return [Branch(1, j)]
    return exact_branches(p_target, children, residual)


# ------------------------------------------------------------------------------ first-token distributions
def speculative_exact(p: Sequence, q: Sequence) -> list:
    """P(next = x) = q(x) · min(1, p(x)/q(x)) + (1 − Σ_y min(p(y), q(y))) · residual(x)."""
    return _mix([(q[x], x) for x in range(len(q)) if q[x]], p, q)


def retrospective_exact(p: Sequence, q: Sequence, draws: int = RETROSPECTIVE_DRAWS) -> list:
    """`draws` drafts i.i.d. from q; the one with the largest p/q (the first on ties) is kept and judged
    by the speculative rule: enumerate every tuple of drafts."""
    support = [x for x in range(len(q)) if q[x]]
    weights = []
    for tup in product(support, repeat=draws):
        prob = 1
        for x in tup:
            prob = prob * q[x]
        weights.append((prob, max(tup, key=lambda x: (p[x] / q[x], -tup.index(x)))))
    return _mix(weights, p, q)


def _mix(drafts: Sequence[tuple], p: Sequence, q: Sequence) -> list:
    """Σ over (probability, drafted token): accept it with min(1, p/q), else draw the residual."""
    out = [0 * p[0] for _ in p]
    rest = ratio_residual(list(p), list(q))
    for prob, x in drafts:
        accept = acceptance_probability(p[x], q[x])
        out[x] += prob * accept
        for y, r in enumerate(rest):
            out[y] += prob * (1 - accept) * r
    return out


def tree_exact(p: Sequence, children: Sequence[int], threshold=None) -> list:
    """The first token a tree rule emits at a node with these children: an accepted child, or the
    residual's draw once all were rejected (the lossy mode with a threshold)."""
    rule = exact_branches(p, children) if threshold is None else lossy_branches(p, children, threshold)
    out = [0 * p[0] for _ in p]
    for branch in rule:
        if branch.accepted is not None:
            out[children[branch.accepted]] += branch.prob
        else:
            for y, r in enumerate(branch.dist):
                out[y] += branch.prob * r
    return out
