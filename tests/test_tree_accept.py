"""Exactness of the tree acceptance rule by enumeration (tabular toy target and drafter, Fractions):
the first N tokens emitted over all rounds are distributed exactly as the target's, for chains of
every γ <= 8 and for trees under budgets, with candidates chosen from draft-side information only.
Negative controls that must fail: the retrospective plan (DSpark Appendix A), the lossy threshold
mode, and a rule that forgets to renormalize after a rejection."""
from __future__ import annotations

import random
from fractions import Fraction

import pytest
import torch
from tree_support import retrospective_branches, toy_pair

from decoding.core.acceptance import (
    Branch,
    greedy_round,
    lossy_branches,
    residual,
    round_distribution,
    sample_round,
    total_variation,
)
from decoding.lab.toy import MarkovTable, draft_lattice, random_table, speculative_sequences, target_sequences
from decoding.strategies.dspark_select import best_chain, best_tree, flat_tree

F = Fraction


def chain_plan(draft: MarkovTable, gamma: int, k: int):
    return lambda last: flat_tree(last, best_chain(draft_lattice(draft, last, gamma, k)))


def tree_plan(draft: MarkovTable, gamma: int, k: int, budget: int):
    return lambda last: flat_tree(last, best_tree(draft_lattice(draft, last, gamma, k), budget))


def unnormalized_branches(p_target, children):
    """WRONG on purpose: after a rejection, the next sibling is accepted with its original p_target."""
    branches, reach, rest = [], F(1), list(p_target)
    for j, token in enumerate(children):
        branches.append(Branch(reach * p_target[token], j))
        reach *= 1 - p_target[token]
        rest[token] = F(0)
    return branches + [Branch(reach, None, [v / sum(rest) for v in rest])]


# ------------------------------------------------------------------------------ one node
@pytest.mark.parametrize("children", [[0], [2], [0, 1], [3, 1], [1, 0, 2], [0, 1, 2, 3]])
def test_one_node_emits_the_target_distribution(children):
    p_target = [F(1, 10), F(2, 5), F(3, 10), F(1, 5)]
    tokens, parents = [9] + children, [-1] + [0] * len(children)
    leaf = [F(1, 4)] * 4          # after an accepted child: a bonus token, uniform
    dist = round_distribution(tokens, parents, lambda i: p_target if i == 0 else leaf)
    first = {}
    for seq, w in dist.items():
        first[seq[0]] = first.get(seq[0], 0) + w
    assert first == dict(enumerate(p_target))
    assert sum(dist.values()) == 1


def test_residual_zeroes_and_renormalizes():
    assert residual([F(1, 2), F(1, 4), F(1, 4)], 0) == [0, F(1, 2), F(1, 2)]
    assert residual([F(1), F(0)], 0) is None
    out = residual(torch.tensor([0.5, 0.25, 0.25]), 1)
    assert torch.allclose(out, torch.tensor([2 / 3, 0.0, 1 / 3]))


# ------------------------------------------------------------------------------ full enumeration
@pytest.mark.parametrize("gamma", range(1, 9))
@pytest.mark.parametrize("k", [1, 2])
def test_chain_rounds_are_exact(gamma, k):
    target, draft = toy_pair(gamma * 10 + k)
    length = gamma + 1 if k == 1 else min(gamma + 1, 7)
    got = speculative_sequences(target, 0, length, chain_plan(draft, gamma, k))
    assert got == target_sequences(target, 0, length)


@pytest.mark.parametrize("gamma,budget", [(1, 2), (2, 3), (3, 5), (4, 4), (5, 8), (6, 6), (7, 9), (8, 12)])
def test_tree_rounds_are_exact(gamma, budget):
    target, draft = toy_pair(100 + gamma)
    got = speculative_sequences(target, 1, 6, tree_plan(draft, gamma, 2, budget))
    assert got == target_sequences(target, 1, 6)


def test_wide_tree_on_vocab_four_is_exact():
    target, draft = toy_pair(7, vocab=4)
    got = speculative_sequences(target, 2, 5, tree_plan(draft, 4, 3, 10))
    assert got == target_sequences(target, 2, 5)


# ------------------------------------------------------------------------------ negative controls
def test_paper_example_retrospective_plan_is_lossy():
    """DSpark Appendix A's number: target (0.7, 0.3) becomes (0.85, 0.15). Construction used here:
    a sampled draft q_draft = (½, ½); the plan admits x only if the verifier's ratio rule would
    accept it for sure (p_target(x) >= q_draft(x)), otherwise drafts nothing and the target samples."""
    p_target, q_draft = (F(7, 10), F(3, 10)), (F(1, 2), F(1, 2))
    retro = [F(0), F(0)]
    for x in (0, 1):
        if p_target[x] >= q_draft[x]:
            retro[x] += q_draft[x]
        else:
            for y in (0, 1):
                retro[y] += q_draft[x] * p_target[y]
    assert tuple(retro) == (F(85, 100), F(15, 100))
    # The draw-based variant (admit x iff its draw u < p/q succeeds, else the target samples) is lossy
    # too, while the exact ratio rule with its residual gives the target back.
    draw_based, exact = [F(0), F(0)], [F(0), F(0)]
    resid = [max(F(0), p_target[y] - q_draft[y]) for y in (0, 1)]
    for x in (0, 1):
        ratio = min(F(1), p_target[x] / q_draft[x])
        draw_based[x] += q_draft[x] * ratio
        exact[x] += q_draft[x] * ratio
        for y in (0, 1):
            draw_based[y] += q_draft[x] * (1 - ratio) * p_target[y]
            exact[y] += q_draft[x] * (1 - ratio) * resid[y] / sum(resid)
    assert tuple(draw_based) == (F(16, 25), F(9, 25))
    assert tuple(exact) == p_target


@pytest.mark.parametrize("gamma", [1, 3, 8])
def test_retrospective_plan_fails_the_enumeration(gamma):
    target, draft = toy_pair(gamma * 10 + 2)
    length = min(gamma + 1, 6)
    got = speculative_sequences(target, 0, length, chain_plan(draft, gamma, 2), retrospective_branches)
    assert total_variation(got, target_sequences(target, 0, length)) > F(1, 100)


def test_unnormalized_rule_fails_the_enumeration():
    target, draft = toy_pair(5)
    got = speculative_sequences(target, 0, 5, tree_plan(draft, 3, 2, 6), unnormalized_branches)
    assert total_variation(got, target_sequences(target, 0, 5)) > 0


LOSSY_THRESHOLDS = [F(1, 5), F(3, 10), F(2, 5), F(1, 2)]


@pytest.mark.parametrize("threshold", LOSSY_THRESHOLDS)
def test_lossy_threshold_mode_fails_and_is_measured(threshold):
    target, draft = toy_pair(3)
    rule = lambda p, children: lossy_branches(p, children, threshold)  # noqa: E731
    got = speculative_sequences(target, 0, 5, chain_plan(draft, 4, 2), rule)
    tv = total_variation(got, target_sequences(target, 0, 5))
    assert tv > 0, f"lossy threshold {threshold} should move the distribution"


def test_lossy_threshold_one_is_the_exact_rule():
    target, draft = toy_pair(3)
    rule = lambda p, children: lossy_branches(p, children, 1)  # noqa: E731
    got = speculative_sequences(target, 0, 5, chain_plan(draft, 4, 2), rule)
    assert got == target_sequences(target, 0, 5)


def test_total_variation():
    assert total_variation({(0,): F(1)}, {(1,): F(1)}) == 1
    assert total_variation({(0,): F(1, 2), (1,): F(1, 2)}, {(0,): F(1)}) == F(1, 2)


# ------------------------------------------------------------------------------ engine side
def _tensor_rows(table: MarkovTable, tokens) -> torch.Tensor:
    return torch.tensor([[float(v) for v in table.rows[t]] for t in tokens])  # (q, V)


@pytest.mark.slow
def test_sampled_round_matches_the_enumeration():
    """Frequencies of sample_round over 6000 seeded rounds lie within 0.03 total variation of the
    exact round distribution; the lossy sampled mode (exact TV 0.89 from it here) lies far outside."""
    target, draft = toy_pair(11, vocab=4)
    tokens, parents = flat_tree(0, best_tree(draft_lattice(draft, 0, 3, 2), 5))
    rows = _tensor_rows(target, tokens)
    exact = round_distribution(tokens, parents, lambda i: target.rows[tokens[i]])
    lossy = round_distribution(tokens, parents, lambda i: target.rows[tokens[i]],
                               lambda p, c: lossy_branches(p, c, F(1, 5)))
    assert total_variation(exact, lossy) > F(1, 10)

    def empirical(threshold):
        gen, counts = torch.Generator().manual_seed(0), {}
        for _ in range(6000):
            out = sample_round(tokens, parents, rows, gen, lossy_threshold=threshold)
            counts[out.emitted] = counts.get(out.emitted, 0) + 1
        return {seq: F(c, 6000) for seq, c in counts.items()}

    assert total_variation(empirical(None), exact) < F(3, 100)
    assert total_variation(empirical(0.2), exact) > F(1, 10)


def test_sampled_round_records_checks_and_is_reproducible():
    target, draft = toy_pair(4, vocab=4)
    tokens, parents = flat_tree(1, best_tree(draft_lattice(draft, 1, 3, 3), 6))
    rows = _tensor_rows(target, tokens)
    first = sample_round(tokens, parents, rows, torch.Generator().manual_seed(3))
    again = sample_round(tokens, parents, rows, torch.Generator().manual_seed(3))
    assert first == again
    assert first.emitted == tuple(tokens[n] for n in first.accepted) + (first.next_token,)
    assert [c.node for c in first.checks if c.accepted] == list(first.accepted)
    for check in first.checks:
        assert check.accepted == (check.draw < check.p_accept)


def _greedy_rounds(logits, draft, last, n, round_fn):
    out = []
    while len(out) < n:
        tokens, parents = flat_tree(last, best_tree(draft_lattice(draft, last, 4, 2), 6))
        out.extend(round_fn(tokens, parents, logits[list(tokens)]).emitted)
        last = out[-1]
    return out[:n]


def test_greedy_rounds_equal_plain_greedy():
    """Temperature 0 over many rounds: token-identical to the target's argmax chain; a wrong rule
    (accept the first child of every node unchecked) is not."""
    torch.manual_seed(0)
    logits = torch.randn(6, 6)  # (V, V) Markov target logits: row = last token
    target_greedy, last = [], 2
    for _ in range(20):
        last = int(torch.argmax(logits[last]))
        target_greedy.append(last)
    draft = random_table(random.Random(1), 6)
    assert _greedy_rounds(logits, draft, 2, 20, greedy_round) == target_greedy

    def unchecked(tokens, parents, rows):
        path = [0]
        while (kids := [i for i, p in enumerate(parents) if p == path[-1]]):
            path.append(kids[0])
        bonus = int(torch.argmax(rows[path[-1]]))
        return type("R", (), {"emitted": tuple(tokens[i] for i in path[1:]) + (bonus,)})

    assert _greedy_rounds(logits, draft, 2, 20, unchecked) != target_greedy


def test_bad_lossy_threshold_and_tree():
    from decoding.core.errors import ConfigError

    rows = torch.full((2, 3), 1 / 3)
    for bad in (0, 1.5, "x"):
        with pytest.raises(ConfigError, match="lossy_threshold"):
            sample_round([0, 1], [-1, 0], rows, torch.Generator(), lossy_threshold=bad)
    with pytest.raises(ConfigError, match="parents"):
        sample_round([0, 1], [-1, 1], rows, torch.Generator())
