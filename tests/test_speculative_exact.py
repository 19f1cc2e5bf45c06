"""Exactness by enumeration: a tabular toy target and draft (3 tokens, next-token tables that depend
on the last token), exact fractions over every random branch of the speculative procedure written
against the engine's own acceptance functions (decoding.core.acceptance) and γ policies. The
distribution of the first L emitted tokens must equal the target's exactly, for every gamma 1..8 and
every gamma policy (heuristic and confidence change gamma between rounds). Deliberately wrong residuals
must fail the same check."""
from __future__ import annotations

import functools
from fractions import Fraction as F
from itertools import product

import pytest

from decoding.core.acceptance import acceptance_probability, accepted_mass, residual_distribution
from decoding.core.acceptance import residual as point_mass_residual
from decoding.drafters.lookup import lookup_continuation
from decoding.runtime.cost_table import CostTable
from decoding.strategies.adaptive_gamma import AcceptanceCounts, choose_gamma, confidence_cut, heuristic_next

V = 3
START = 0  # last token of the prompt
P_TARGET = {0: [F(1, 2), F(1, 3), F(1, 6)], 1: [F(1, 5), F(0), F(4, 5)], 2: [F(3, 7), F(3, 7), F(1, 7)]}
Q_DRAFT = {0: [F(1, 4), F(1, 4), F(1, 2)], 1: [F(1, 3), F(1, 3), F(1, 3)], 2: [F(0), F(9, 10), F(1, 10)]}
POINT_DRAFT = {0: 2, 1: 1, 2: 0}  # a deterministic drafter (token 1 after 1 has p_target = 0)
THRESHOLD = F(2, 5)
POLICIES = ("fixed", "heuristic", "confidence", "cost")


@functools.cache
def target_distribution(length: int) -> dict[tuple[int, ...], F]:
    out = {}
    for seq in product(range(V), repeat=length):
        mass, last = F(1), START
        for t in seq:
            mass, last = mass * P_TARGET[last][t], t
        out[seq] = mass
    return out


TOY_COST = CostTable(verify_ms=(10.0, 11.0, 12.0, 19.0, 20.0, 21.0, 22.0, 23.0, 24.0), source="toy")
TOY_DRAFT_MS = {"model": 1.0, "lookup": 0.0}


class Procedure:
    """The speculative procedure as a branching process over exact masses. Between rounds the state
    is (emitted, policy state): γ for heuristic, every drafter's acceptance counts for cost."""

    def __init__(self, length, gamma, policy, point_mass=False, residual=None, pm_residual=None):
        self.length, self.gamma0, self.policy, self.point_mass = length, gamma, policy, point_mass
        self.residual = residual or residual_distribution
        self.pm_residual = pm_residual or point_mass_residual
        self.gammas_chosen: set = set()

    def distribution(self) -> dict[tuple[int, ...], F]:
        """Mass of every emitted sequence of `length` tokens, over all random branches."""
        self.result: dict = {}
        first = () if self.policy == "cost" else self.gamma0
        level = {((), first): F(1)}  # between rounds: (emitted, policy state) -> mass
        while level:
            nxt: dict = {}
            for (emitted, state), mass in level.items():
                rem = self.length - len(emitted)
                self._round(emitted, state, rem - 1, mass, nxt)
            level = nxt
        return self.result

    def _plan(self, emitted, k):
        """(drafts at position i, k, source): the round's drafter as a function of (i, last, p_target)
        giving (x, q_x, residual) branches, how many drafts it proposes (at most k), and its name."""
        return (lambda i, last, p_target: self._drafts(last, p_target)), k, "model"

    def _gamma(self, state, source) -> int:
        if self.policy != "cost":
            return state
        counts = dict(state).get(source, ((), ()))
        choice = choose_gamma(AcceptanceCounts(list(counts[0]), list(counts[1])), TOY_COST,
                              TOY_DRAFT_MS[source], self.gamma0, source)
        self.gammas_chosen.add(choice.gamma)
        return choice.gamma

    def _next(self, state, gamma, drafted, accepted, source):
        """The policy state after a round that verified `drafted` drafts and accepted `accepted`."""
        if self.policy == "heuristic":
            return heuristic_next(gamma, accepted, drafted)
        if self.policy != "cost":
            return self.gamma0
        table = dict(state)
        reached, acc = table.get(source, ((), ()))
        counts = AcceptanceCounts(list(reached), list(acc))
        counts.update(drafted, accepted)
        table[source] = counts.key()
        return tuple(sorted(table.items()))

    def _round(self, emitted, state, room, mass, nxt) -> None:
        """Expand one round over all draft/accept/residual branches; room = drafts the budget allows."""
        source = self._plan(emitted, room)[2]
        gamma = self._gamma(state, source)
        drafts, k, _ = self._plan(emitted, min(gamma, room))
        stack = [(emitted, 0, False, mass)]   # (emitted, accepted drafts so far, stopped, mass)
        while stack:
            w, i, stopped, m = stack.pop()
            last = w[-1] if w else START
            p_target = P_TARGET[last]
            if i == k or stopped:
                for t in range(V):  # bonus token from p_target
                    self._finish(nxt, w + (t,), self._next(state, gamma, i, i, source), m * p_target[t])
                continue
            for x, q_x, residual, *rule_q in drafts(i, last, p_target):   # rule_q: q the verifier uses
                accept = acceptance_probability(p_target[x], rule_q[0] if rule_q else q_x)
                if accept > 0:
                    stop = self.policy == "confidence" and q_x < THRESHOLD  # stop after this draft
                    stack.append((w + (x,), i + 1, stop, m * q_x * accept))
                if accept < 1:
                    for t in range(V):
                        self._finish(nxt, w + (t,), self._next(state, gamma, k, i, source),
                                     m * q_x * (1 - accept) * residual[t])

    def _drafts(self, last, p_target):
        if self.point_mass:
            x = POINT_DRAFT[last]
            yield x, F(1), self.pm_residual(p_target, x)
            return
        q_draft = Q_DRAFT[last]
        residual = self.residual(p_target, q_draft)
        for x in range(V):
            if q_draft[x] > 0:
                yield x, q_draft[x], residual

    def _finish(self, nxt, emitted, state_next, mass) -> None:
        if mass == 0:
            return
        assert len(emitted) <= self.length
        if len(emitted) == self.length:
            self.result[emitted] = self.result.get(emitted, 0) + mass
            return
        key = (emitted, state_next)
        nxt[key] = nxt.get(key, 0) + mass


def length_for(gamma: int) -> int:
    """Long enough for a full first round plus more rounds, capped for speed (3^9 sequences)."""
    return min(gamma + 3, 9)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("gamma", range(1, 9))
@pytest.mark.slow
def test_ratio_rule_is_exact(gamma, policy):
    length = length_for(gamma)
    got = Procedure(length, gamma, policy).distribution()
    assert sum(got.values()) == 1
    assert got == {s: m for s, m in target_distribution(length).items() if m}


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("gamma", range(1, 9))
def test_point_mass_rule_is_exact(gamma, policy):
    length = length_for(gamma)
    got = Procedure(length, gamma, policy, point_mass=True).distribution()
    assert got == {s: m for s, m in target_distribution(length).items() if m}


@pytest.mark.parametrize("gamma", [1, 4])
def test_residual_replaced_by_target_fails(gamma):
    length = length_for(gamma)
    wrong = Procedure(length, gamma, "fixed", residual=lambda p_target, q_draft: p_target)
    assert wrong.distribution() != target_distribution(length)


@pytest.mark.parametrize("gamma", [1, 4])
def test_point_mass_without_zeroing_fails(gamma):
    length = length_for(gamma)
    wrong = Procedure(length, gamma, "fixed", point_mass=True, pm_residual=lambda p_target, x: p_target)
    assert wrong.distribution() != {s: m for s, m in target_distribution(length).items() if m}


def test_pure_functions_on_fractions():
    p_target, q_draft = [F(1, 2), F(1, 3), F(1, 6)], [F(1, 4), F(1, 4), F(1, 2)]
    assert acceptance_probability(F(1, 3), F(1, 4)) == 1
    assert acceptance_probability(F(1, 6), F(1, 2)) == F(1, 3)
    assert accepted_mass(p_target, q_draft) == F(1, 4) + F(1, 4) + F(1, 6)
    assert residual_distribution(p_target, q_draft) == [F(3, 4), F(1, 4), F(0)]
    assert point_mass_residual(p_target, 0) == [F(0), F(2, 3), F(1, 3)]
    assert confidence_cut([0.9, 0.3, 0.8], 0.4) == 2 and confidence_cut([0.9, 0.8], 0.4) == 2
    assert heuristic_next(5, 5, 5) == 7 and heuristic_next(5, 2, 5) == 4 and heuristic_next(1, 0, 1) == 1


# ---------------------------------------------------------------- prompt lookup, else the draft model

PROMPT = (2, 1, START)  # the toy prompt: its last token START occurs nowhere earlier (first round: model)


class LookupThenModel(Procedure):
    """decoding.drafters.lookup.LookupThenDraftDrafter: each round drafts prompt lookup's continuation of
    the context (point mass) when the context's last n-gram occurred earlier, else Q_DRAFT.
    `lookup_rule(p_target, x, last)` gives a lookup token's (q_x, residual)."""

    def __init__(self, length, gamma, policy, lookup_rule=None):
        super().__init__(length, gamma, policy)
        self.lookup_rule = lookup_rule or (lambda p_target, x, last: (F(1), point_mass_residual(p_target, x)))
        self.rounds = {"lookup": 0, "model": 0}

    def _plan(self, emitted, k):
        cont, _ = lookup_continuation(PROMPT + emitted, 2, k)
        if not cont:
            return super()._plan(emitted, k)
        rule = self.lookup_rule
        return (lambda i, last, p_target: [(cont[i], *rule(p_target, cont[i], last))]), len(cont), "lookup"

    def _round(self, emitted, state, room, mass, nxt) -> None:
        self.rounds[self._plan(emitted, room)[2]] += 1
        super()._round(emitted, state, room, mass, nxt)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("gamma", range(1, 9))
@pytest.mark.slow
def test_lookup_then_model_is_exact(gamma, policy):
    length = length_for(gamma)
    procedure = LookupThenModel(length, gamma, policy)
    got = procedure.distribution()
    assert procedure.rounds["lookup"] > 0 and procedure.rounds["model"] > 0   # both drafters were used
    assert got == {s: m for s, m in target_distribution(length).items() if m}


@pytest.mark.parametrize("gamma", [1, 4])
def test_lookup_tokens_under_the_ratio_rule_fail(gamma):
    """Negative control: lookup's tokens (proposed with certainty) verified as if the draft model had
    sampled them — ratio rule and residual with the model's q_draft — is not exact."""
    length = length_for(gamma)

    def ratio_rule(p_target, x, last):
        q_model = Q_DRAFT[last][x] or p_target[x]       # q_draft 0: the ratio is infinite, accept
        return F(1), residual_distribution(p_target, Q_DRAFT[last]), q_model

    wrong = LookupThenModel(length, gamma, "fixed", lookup_rule=ratio_rule)
    assert wrong.distribution() != {s: m for s, m in target_distribution(length).items() if m}


@pytest.mark.parametrize("procedure", [Procedure, LookupThenModel])
@pytest.mark.slow
def test_cost_policy_changes_gamma_between_rounds(procedure):
    """The cost policy's enumeration above is not a fixed γ in disguise: its choice moves with the
    acceptance counts of earlier rounds (toy table: 1-3 tokens cheap, 4+ dear)."""
    run = procedure(length_for(6), 6, "cost")
    assert run.distribution() == {s: m for s, m in target_distribution(length_for(6)).items() if m}
    assert len(run.gammas_chosen) >= 2, run.gammas_chosen
