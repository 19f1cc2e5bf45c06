"""The acceptance rules have one home (decoding/core/acceptance.py, tensors) and one list form
(decoding/core/exact_rules.py, for exact enumeration and the torch-free UI): on random inputs the two
forms give the same numbers, each list form checked by hand on Fractions. Negative controls: a residual
that skips the clamp or the renormalization, and the ratio upside down, differ from the list form on the
same inputs."""
from __future__ import annotations

from fractions import Fraction as F

import pytest
import torch

from decoding.core import acceptance, exact_rules

CASES = 40


def random_pairs(seed: int = 0, size: int = 7):
    """(p_target, q_draft) as float64 tensors, p with zeros, and as exact Fractions of the same floats."""
    gen = torch.Generator().manual_seed(seed)
    for _ in range(CASES):
        p_target = torch.rand(size, generator=gen, dtype=torch.float64)
        q_draft = torch.rand(size, generator=gen, dtype=torch.float64)
        p_target[torch.rand(size, generator=gen) < 0.3] = 0
        p_target[0] += 1e-3                                      # never all zero
        p_target, q_draft = p_target / p_target.sum(), q_draft / q_draft.sum()
        yield p_target, q_draft, [F(x) for x in p_target.tolist()], [F(x) for x in q_draft.tolist()]


def as_floats(values) -> torch.Tensor:
    return torch.tensor([float(x) for x in values], dtype=torch.float64)


def test_list_forms_by_hand():
    p_target, q_draft = [F(1, 2), F(1, 3), F(1, 6)], [F(1, 4), F(1, 4), F(1, 2)]
    assert exact_rules.acceptance_probability(F(1, 3), F(1, 4)) == 1
    assert exact_rules.acceptance_probability(F(1, 6), F(1, 2)) == F(1, 3)
    assert exact_rules.accepted_mass(p_target, q_draft) == F(2, 3)
    assert exact_rules.ratio_residual(p_target, q_draft) == [F(3, 4), F(1, 4), F(0)]
    assert exact_rules.point_mass_residual(p_target, 0) == [F(0), F(2, 3), F(1, 3)]


def test_tensor_forms_agree_with_the_list_forms():
    for p_target, q_draft, exact_p, exact_q in random_pairs():
        assert torch.allclose(acceptance.residual_distribution(p_target, q_draft),
                              as_floats(exact_rules.ratio_residual(exact_p, exact_q)), atol=1e-12)
        assert torch.allclose(acceptance.residual(p_target, 3), as_floats(exact_rules.point_mass_residual(exact_p, 3)),
                              atol=1e-12)
        assert float(acceptance.accepted_mass(p_target, q_draft)) == pytest.approx(
            float(exact_rules.accepted_mass(exact_p, exact_q)), abs=1e-12)
        rows = torch.stack([p_target, q_draft]), torch.stack([q_draft, p_target])     # (2, V) row-wise
        assert acceptance.accepted_mass(*rows).tolist() == pytest.approx(
            [float(exact_rules.accepted_mass(exact_p, exact_q))] * 2, abs=1e-12)


def test_list_inputs_reach_the_list_forms():
    p_target, q_draft = [F(1, 2), F(1, 3), F(1, 6)], [F(1, 4), F(1, 4), F(1, 2)]
    assert acceptance.residual_distribution(p_target, q_draft) == exact_rules.ratio_residual(p_target, q_draft)
    assert acceptance.residual(p_target, 1) == exact_rules.point_mass_residual(p_target, 1)
    assert acceptance.accepted_mass(p_target, q_draft) == exact_rules.accepted_mass(p_target, q_draft)


def ratio_mismatches(rule) -> int:
    """Verdicts of `rule(p_target_x, q_draft_x, generator) -> (accepted, u)` that differ from the list
    rule applied to the same draw u, over every token of every case."""
    wrong = 0
    for p_target, q_draft, exact_p, exact_q in random_pairs(1):
        gen, twin = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
        for x in range(len(exact_p)):
            ok, u = rule(float(p_target[x]), float(q_draft[x]), gen)
            assert u == float(torch.rand((), generator=twin, dtype=torch.float64))
            wrong += ok != (F(u) < exact_rules.acceptance_probability(exact_p[x], exact_q[x]))
    return wrong


def test_ratio_accepts_is_the_list_rule_on_the_same_draw():
    assert ratio_mismatches(acceptance.ratio_accepts) == 0


def test_ratio_negative_control():
    """The ratio upside down (q_draft / p_target) is caught by the same replay."""
    def upside_down(p_target_x, q_draft_x, generator):
        u = float(torch.rand((), generator=generator, dtype=torch.float64))
        return u < min(1.0, q_draft_x / p_target_x) if p_target_x else True, u

    assert ratio_mismatches(upside_down) > CASES


def test_greedy_rule_is_the_first_argmax():
    logits = torch.tensor([0.5, 2.0, 2.0, -1.0])
    assert acceptance.target_argmax(logits) == 1                      # ties: the first index, as plain greedy
    assert acceptance.greedy_accepts(1, logits) and not acceptance.greedy_accepts(2, logits)
    outcome = acceptance.greedy_round((9, 2, 1), (-1, 0, 0), torch.stack([logits, logits, logits]))
    assert outcome.accepted == (2,) and outcome.next_token == 1         # child 1 (token 2) rejected, child 2 taken


def residual_mismatches(form) -> int:
    """Cases where `form(p_target, q_draft)` (tensors) is not the list form's residual."""
    return sum(not torch.allclose(form(p_target, q_draft), as_floats(exact_rules.ratio_residual(exact_p, exact_q)),
                                  atol=1e-12)
               for p_target, q_draft, exact_p, exact_q in random_pairs(2))


def test_residual_negative_controls():
    """Forms with one slip each (no clamp at 0, no renormalization) are caught by the same comparison."""
    assert residual_mismatches(acceptance.residual_distribution) == 0
    assert residual_mismatches(lambda p, q: (p - q) / (p - q).sum()) > CASES // 2
    assert residual_mismatches(lambda p, q: (p - q).clamp_min(0)) > CASES // 2
