"""Tabular toy models for exact checks: a Markov target and drafter over a tiny vocabulary with
fractions.Fraction entries, a draft-side candidate lattice, and the exact distribution of the first
N tokens emitted by speculative rounds (memoized), to compare with the target's own distribution."""
from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

from decoding.core.acceptance import Rule, exact_branches, round_distribution
from decoding.core.lattice import Lattice

Plan = Callable[[int], tuple[tuple[int, ...], tuple[int, ...]]]   # last token -> (tokens, parents)


@dataclass(frozen=True)
class MarkovTable:
    """rows[last][next]: probability of `next` after `last` (each row sums to 1)."""

    rows: tuple[tuple[Fraction, ...], ...]

    @property
    def vocab(self) -> int:
        return len(self.rows)

    def top(self, dist, k: int) -> list[int]:
        return sorted(range(self.vocab), key=lambda t: (-dist[t], t))[:k]


def random_table(rng: random.Random, vocab: int, denom: int = 12) -> MarkovTable:
    rows = []
    for _ in range(vocab):
        weights = [rng.randint(1, denom) for _ in range(vocab)]
        rows.append(tuple(Fraction(w, sum(weights)) for w in weights))
    return MarkovTable(tuple(rows))


def draft_lattice(draft: MarkovTable, last: int, gamma: int, k: int) -> Lattice:
    """Top-k of the drafter's marginal at each position; ŝ_k(x | parent) = draft(x | parent's token)."""
    marginal = list(draft.rows[last])
    tokens, q_draft = [], []
    for _ in range(gamma):
        cands = draft.top(marginal, k)
        tokens.append(cands)
        q_draft.append([marginal[t] for t in cands])
        marginal = [sum(marginal[a] * draft.rows[a][b] for a in range(draft.vocab)) for b in range(draft.vocab)]
    scores = [[[draft.rows[last][x] for x in tokens[0]]]]
    scores += [[[draft.rows[parent][x] for x in tokens[pos]] for parent in tokens[pos - 1]]
               for pos in range(1, gamma)]
    return Lattice(tokens, q_draft, scores)


def target_sequences(target: MarkovTable, last: int, length: int) -> dict[tuple[int, ...], Fraction]:
    """The target's own distribution of the next `length` tokens."""
    out = {(): Fraction(1)}
    for _ in range(length):
        out = {seq + (t,): w * target.rows[seq[-1] if seq else last][t]
               for seq, w in out.items() for t in range(target.vocab)}
    return out


def speculative_sequences(target: MarkovTable, last: int, length: int, plan: Plan,
                          rule: Rule = exact_branches) -> dict[tuple[int, ...], Fraction]:
    """Exact distribution of the first `length` tokens emitted by repeated verification rounds:
    each round verifies plan(last) with `rule` and emits accepted drafts plus one token."""
    memo: dict = {}

    def rounds(prev: int, left: int) -> dict:
        if left == 0:
            return {(): Fraction(1)}
        if (prev, left) not in memo:
            tokens, parents = plan(prev)
            one = round_distribution(tokens, parents, lambda i: target.rows[tokens[i]], rule)
            out: dict = {}
            for emitted, w in one.items():
                head = emitted[:left]
                for tail, v in rounds(head[-1], left - len(head)).items():
                    out[head + tail] = out.get(head + tail, 0) + w * v
            memo[(prev, left)] = out
        return memo[(prev, left)]

    return rounds(last, length)
