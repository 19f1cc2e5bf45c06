"""The losslessness lab (decoding/lab/lossless.py): the next token's exact distribution under each rule, in
fractions, against p_target (the exact rules) and against the card's worked example (the retrospective plan:
(0.7, 0.3) becomes (0.85, 0.15)); the sampled rounds against those exact distributions by χ²; the χ²
arithmetic against scipy; the whole measurement on a tiny llama. The two wrong rules are the negative
controls: their exact distributions differ from p_target and their samples fail the test against it."""
from __future__ import annotations

import random
from fractions import Fraction as F

import pytest
import torch
from scipy import stats

from decoding.core.errors import ConfigError
from decoding.core.formulas import chi2_sf, chi_square
from decoding.core.measures import LOSSLESS_RULES, LosslessConfig
from decoding.lab import lossless


def random_dist(rng: random.Random, n: int, zeros: int = 0) -> list[F]:
    weights = [F(rng.randint(1, 9)) for _ in range(n)]
    for i in rng.sample(range(n), zeros):
        weights[i] = F(0)
    return [w / sum(weights) for w in weights]


def test_the_cards_worked_example():
    p, q = [F(7, 10), F(3, 10)], [F(1, 2), F(1, 2)]
    assert lossless.retrospective_exact(p, q) == [F(17, 20), F(3, 20)]
    assert lossless.speculative_exact(p, q) == p
    assert lossless.tree_exact(p, [1]) == p and lossless.tree_exact(p, [1, 0]) == p
    assert lossless.tree_exact(p, [1], threshold=F(1, 5)) == [0, 1]          # the lossy mode takes 0.3 outright


@pytest.mark.parametrize("seed", range(6))
def test_exact_rules_give_p_target_and_wrong_rules_do_not(seed):
    rng = random.Random(seed)
    p = random_dist(rng, 6, zeros=2)
    q = random_dist(rng, 6, zeros=1)
    children = rng.sample(range(6), 3)
    assert lossless.speculative_exact(p, q) == p
    assert lossless.tree_exact(p, children) == p
    assert sum(lossless.retrospective_exact(p, q)) == 1 and sum(lossless.tree_exact(p, children, F(1, 20))) == 1


def test_the_wrong_rules_move_the_distribution():
    p, q = [F(5, 10), F(3, 10), F(2, 10)], [F(2, 10), F(3, 10), F(5, 10)]
    assert lossless.total_variation(lossless.retrospective_exact(p, q), p) > 0
    assert lossless.total_variation(lossless.tree_exact(p, [2, 1], F(1, 10)), p) > 0


def samples_fit(rule: str, expected, p, q, children, n=20000) -> float:
    config = LosslessConfig(samples=n, seed=3, lossy_threshold=0.1)
    drawn = lossless.sample_rule(rule, torch.tensor(p, dtype=torch.float64), torch.tensor(q, dtype=torch.float64),
                                 children, config)
    return chi_square([drawn.count(i) for i in range(len(p))], expected)[2]


@pytest.mark.parametrize("rule", LOSSLESS_RULES)
@pytest.mark.slow
def test_the_samplers_draw_what_the_enumeration_says(rule):
    p, q = [0.5, 0.3, 0.15, 0.05], [0.1, 0.2, 0.3, 0.4]
    children = [3, 2]
    config = LosslessConfig(lossy_threshold=0.1)
    exact = lossless.exact_rule(rule, p, q, children, config)
    assert samples_fit(rule, exact, p, q, children) > 1e-3
    if rule in ("lossy", "retrospective"):                           # negative control: not p_target
        assert lossless.total_variation(exact, p) > 0.05
        assert samples_fit(rule, p, p, q, children) < 1e-9


@pytest.mark.parametrize(("statistic", "df"), [(0.3, 1), (3.84, 1), (12.0, 4), (40.0, 30), (150.0, 99), (0.01, 7)])
def test_chi2_sf_matches_scipy(statistic, df):
    assert chi2_sf(statistic, df) == pytest.approx(stats.chi2.sf(statistic, df), rel=1e-9, abs=1e-300)


def test_chi_square_pools_small_categories():
    # expected 50, 40, 4, 3, 3 (n = 100): the last three pool into one cell of 10
    statistic, dof, p_value = chi_square([55, 35, 5, 3, 2], [0.5, 0.4, 0.04, 0.03, 0.03])
    assert dof == 2 and statistic == pytest.approx(25 / 50 + 25 / 40 + 0 / 10)
    assert p_value == pytest.approx(stats.chi2.sf(statistic, 2))
    assert chi_square([3, 1], [0.9, 0.1]) == (0.0, 0, 1.0)             # nothing to test with 4 samples
    # a pooled cell still under 5 is dropped: 60, 36 and 4
    assert chi_square([60, 36, 4], [0.6, 0.36, 0.04])[1] == 1


@pytest.mark.slow
def test_measure_lossless_on_a_tiny_llama(tiny_lm):
    config = LosslessConfig(top_k=6, draft_top_k=6, candidates=2, lossy_threshold=0.05, samples=4000)
    result = lossless.measure_lossless(tiny_lm, [3, 7, 11, 2], config)
    assert 6 <= len(result.token_ids) <= 12 and sum(result.p_target) == pytest.approx(1)
    by_rule = {o.rule: o for o in result.outcomes}
    assert list(by_rule) == list(LOSSLESS_RULES)
    assert all(sum(o.counts) == 4000 for o in result.outcomes)
    for rule in ("speculative", "dspark"):
        assert by_rule[rule].tv_distance < 1e-12 and by_rule[rule].p_value > 1e-3
    for rule in ("lossy", "retrospective"):
        assert by_rule[rule].tv_distance > 0.01 and by_rule[rule].p_value < 1e-6
    assert result.candidates == tuple(sorted(range(len(result.q_draft)), key=lambda i: -result.q_draft[i])[:2])


@pytest.mark.parametrize(("kwargs", "param"), [({"samples": 0}, "samples"), ({"top_k": 0}, "top_k"),
                                               ({"temperature": 0}, "temperature"), ({"candidates": 9}, "candidates"),
                                               ({"lossy_threshold": 1}, "lossy_threshold")])
def test_bad_settings_name_the_parameter(kwargs, param):
    with pytest.raises(ConfigError) as err:
        LosslessConfig(**kwargs)
    assert err.value.param == param
