"""decoding/core/formulas.py, the one definition of each shared rule: exact Fraction cases against
brute-force enumeration, bit-for-bit agreement with the loops it replaced (their float order), the
recorded traces' own numbers (tests/golden, written by the code before the rules were shared), and a
negative control for each rule. Also the residual's one edge-case policy, the γ limits' one definition
each, and that the module stays importable without torch (the UI imports it)."""
from __future__ import annotations

import ast
import itertools
import json
import random
import subprocess
import sys
from fractions import Fraction as F
from pathlib import Path

import pytest
import torch

from decoding.core import config
from decoding.core.acceptance import exact_branches, residual
from decoding.core.errors import ConfigError
from decoding.core.formulas import (
    acceptance_rate,
    break_even_tau,
    cut_at_eos,
    expected_accepted,
    expected_accepted_by_size,
    needed_acceptance,
    plan_expected_accepted,
    round_metrics,
    round_ms,
    speed_vs,
    survival,
    tokens_per_round,
    uniform_chain_tokens,
)
from decoding.core.lattice import Lattice
from decoding.core.trace import DSparkRound, SpecRound, from_json
from decoding.strategies.dspark_select import best_tree, chain_value

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden"


# ------------------------------------------------------------------ expected accepted length
def enumerated_accepted(a) -> F:
    """E[accepted drafts] by enumerating every accept/reject outcome of the positions (independent,
    P(accept i) = a_i): a round accepts the drafts before its first rejection."""
    total = F(0)
    for outcome in itertools.product((True, False), repeat=len(a)):
        prob = F(1)
        for ok, p in zip(outcome, a):
            prob *= p if ok else 1 - p
        total += prob * next((i for i, ok in enumerate(outcome) if not ok), len(a))
    return total


def test_expected_accepted_exact_fractions():
    a = [F(1, 2), F(2, 3), F(3, 4)]
    assert survival(a) == [F(1, 2), F(1, 3), F(1, 4)]
    assert expected_accepted(a) == F(13, 12)                    # 1/2 + 1/3 + 1/4
    assert expected_accepted(a, 2) == F(5, 6) and expected_accepted(a, 1) == F(1, 2)
    assert expected_accepted(a, 10) == F(13, 12)                # only three given
    assert expected_accepted([]) == 0 and expected_accepted(a, 0) == 0
    assert expected_accepted_by_size(survival(a)) == [F(1, 2), F(5, 6), F(13, 12)]
    assert expected_accepted_by_size(survival(a), start=1) == [F(3, 2), F(11, 6), F(25, 12)]
    assert expected_accepted([F(1), F(1), F(1)]) == 3 and expected_accepted([F(0), F(1)]) == 0
    assert all(isinstance(v, F) for v in expected_accepted_by_size(survival(a)))


def test_expected_accepted_matches_enumeration():
    rng = random.Random(0)
    for _ in range(40):
        a = [F(rng.randint(0, 8), 8) for _ in range(rng.randint(1, 6))]
        assert expected_accepted(a) == enumerated_accepted(a), a
        for n, e in enumerate(expected_accepted_by_size(survival(a)), start=1):
            assert e == enumerated_accepted(a[:n]) == expected_accepted(a, n)
        assert plan_expected_accepted(survival(a)) == expected_accepted(a)


def test_expected_accepted_negative_control():
    """Rules that forget that a rejection ends the round give other numbers on the same case."""
    a = [F(1, 2), F(2, 3), F(3, 4)]
    truth = enumerated_accepted(a)
    assert truth == expected_accepted(a)
    assert sum(a) != truth                                       # Σ a_i: no survival product
    assert survival(a)[-1] != truth                              # Π a_i: the last survival only
    assert expected_accepted(a[::-1]) != truth                   # the positions' order matters


def test_the_sums_keep_the_float_order_of_the_loops_they_replaced():
    """Bit-for-bit: adaptive_gamma.choose_gamma summed 1 + S_1 + S_2 ... from 1.0; the what-if view
    and dspark_select.chain_value from 0; choose_tree and TreePlan added survivals left to right."""
    rng = random.Random(1)
    for _ in range(200):
        a = [rng.random() for _ in range(rng.randint(0, 12))]
        old_gamma, survive, total = [], 1.0, 1.0
        for x in a:
            survive *= x
            total += survive
            old_gamma.append(total)
        assert expected_accepted_by_size(survival(a), start=1.0) == old_gamma
        total, survive = 0.0, 1.0
        for x in a[:5]:
            survive *= x
            total += survive
        assert expected_accepted(a, 5) == total
        assert plan_expected_accepted(a) == sum(a, 0)
    assert chain_value is expected_accepted


def test_a_tree_is_priced_by_its_nodes_survivals():
    lat = Lattice.independent([[1, 2], [3, 4]], [[F(1, 2)] * 2] * 2, [[F(3, 4), F(1, 4)], [F(1, 2), F(1, 2)]])
    plan = best_tree(lat, 4)                # survivals 3/4, 3/8, 3/8, 1/4 (best first)
    assert [n.survival for n in plan.nodes] == [F(3, 4), F(3, 8), F(3, 8), F(1, 4)]
    assert plan.expected_accepted == F(7, 4)
    assert expected_accepted_by_size(n.survival for n in plan.nodes) == [F(3, 4), F(9, 8), F(3, 2), F(7, 4)]


# ------------------------------------------------------------------ the recorded traces agree
def golden(name: str):
    return from_json((GOLDEN / f"{name}.json").read_bytes())


SPEC_CASES = sorted(p.stem for p in GOLDEN.glob("spec_*.json"))
DSPARK_CASES = sorted(p.stem for p in GOLDEN.glob("dspark_*.json"))
CHAIN_CASES = [n for n in DSPARK_CASES
               if json.loads((GOLDEN / f"{n}.json").read_bytes())["config"]["select"] == "chain"]


@pytest.mark.parametrize("name", SPEC_CASES + DSPARK_CASES)
def test_round_metrics_reproduce_the_recorded_stats(name):
    trace = golden(name)
    if trace.strategy == "speculative":
        rounds = [e for e in trace.steps if isinstance(e, SpecRound)]
        got = round_metrics([len(r.emitted) - len(r.forced_ids) for r in rounds], [r.gamma for r in rounds],
                            [r.accepted for r in rounds], [r.gamma for r in rounds])
    else:
        rounds = [e for e in trace.steps if isinstance(e, DSparkRound) and not e.prefill]
        got = round_metrics([len(r.emitted) for r in rounds], [len(r.nodes) for r in rounds],
                            [len(r.accepted_path) for r in rounds],
                            [max((n.depth for n in r.nodes), default=0) for r in rounds])
    stats = trace.stats
    assert got["mean_accepted_length"] == stats.mean_accepted_length
    assert got["acceptance_rate"] == stats.acceptance_rate
    assert tuple(got["per_position_acceptance"]) == tuple(stats.per_position_acceptance)


def test_round_metrics_by_hand_and_negative_control():
    # rounds: (emitted, drafted, accepted, depth)
    got = round_metrics([3, 1, 2], [4, 4, 2], [2, 0, 1], [4, 4, 2])
    assert got["mean_accepted_length"] == 2.0 and got["acceptance_rate"] == 0.3
    assert got["per_position_acceptance"] == (2 / 3, 1 / 3, 0.0, 0.0)
    assert round_metrics([], [], [], []) == {} and acceptance_rate(0, 0) is None
    wrong = sum(a / d for a, d in [(2, 4), (0, 4), (1, 2)]) / 3    # mean of per-round rates
    assert wrong != got["acceptance_rate"]


def test_chain_cases_are_the_recorded_chains():
    assert {"dspark_chain", "dspark_head_chain_cost"} <= set(CHAIN_CASES) and "dspark_head" not in CHAIN_CASES


@pytest.mark.parametrize("name", CHAIN_CASES)
def test_chain_survival_reproduces_the_recorded_nodes(name):
    for event in golden(name).steps:
        if isinstance(event, DSparkRound) and event.nodes:
            assert [n.survival for n in event.nodes] == survival([n.score for n in event.nodes])


def test_cost_choice_reproduces_the_recorded_gamma_choices():
    choices = [e.gamma_choice for e in golden("spec_cost").steps if getattr(e, "gamma_choice", None)]
    assert choices
    for c in choices:
        expected = expected_accepted_by_size(survival(c.acceptance), start=1.0)
        assert tuple(expected) == c.expected_tokens
        ms = [round_ms(c.verify_ms[g], g, c.draft_ms) for g in range(1, len(expected) + 1)]
        assert tuple(m / e for m, e in zip(ms, expected)) == c.ms_per_token


def test_tokens_per_round_and_the_uniform_chain():
    """1 + E[accepted]; for one α at every position 1 + α + … + α^γ, which enumeration confirms and
    needed_acceptance inverts. Negative control: 1 + γ·α forgets that a rejection ends the round."""
    assert tokens_per_round(F(13, 12)) == F(25, 12) and tokens_per_round(0.5) == 1.5
    assert uniform_chain_tokens(F(1, 2), 3) == F(15, 8)
    assert uniform_chain_tokens(F(1), 4) == 5 and uniform_chain_tokens(F(0), 4) == 1
    for alpha in (F(1, 3), F(3, 4), F(7, 8)):
        for gamma in range(1, 6):
            assert uniform_chain_tokens(alpha, gamma) == 1 + enumerated_accepted([alpha] * gamma)
    assert uniform_chain_tokens(F(1, 2), 3) != 1 + 3 * F(1, 2)
    assert uniform_chain_tokens(needed_acceptance(2.5, 4), 4) == pytest.approx(2.5, abs=1e-8)


def test_speed_vs():
    """tokens/s ÷ the reference's tokens/s (the speed vs greedy of Compare, the verdict and the benchmarks);
    None without a reference speed. Negative control: the ratio the other way round."""
    assert speed_vs(30.0, 20.0) == 1.5 and speed_vs(0.0, 20.0) == 0.0
    assert speed_vs(30.0, 0.0) is None and speed_vs(30.0, -1.0) is None
    assert speed_vs(30.0, 20.0) != 20.0 / 30.0


@pytest.mark.parametrize("name", SPEC_CASES)
def test_whatif_measures_the_recorded_tau(name):
    """The what-if page's measured tokens per forward and acceptance rate are the trace's τ and rate (vLLM's
    definitions), bit for bit the loop they replaced."""
    from ui.views import whatif

    steps = golden(name).steps
    rounds = [e for e in steps if isinstance(e, SpecRound)]
    got = whatif.measured(steps)
    assert got["tokens_per_forward"] == sum(len(r.emitted) - len(r.forced_ids) for r in rounds) / len(rounds)
    assert got["tokens_per_forward"] == golden(name).stats.mean_accepted_length
    assert got["acceptance_rate"] == golden(name).stats.acceptance_rate


def test_break_even_tau():
    assert break_even_tau(60.0, 40.0) == 1.5 and break_even_tau(60.0, 40.0, 1.2) == pytest.approx(1.8)
    assert round_ms(50.0, 4, 2.5) == 60.0 and round_ms(50.0, 4, 0.0) == 50.0


# ------------------------------------------------------------------ the end of the answer
EOS = frozenset({5, 9})


def old_truncate(emitted, room, eos_ids):            # decoding/strategies/dspark.py before
    out = []
    for token in list(emitted)[:room]:
        out.append(int(token))
        if token in eos_ids:
            break
    return tuple(out)


def old_new_tokens(new, budget, eos_ids):            # Speculator._new_tokens before: cut, then the budget
    new = list(new)
    for i, token in enumerate(new):
        if token in eos_ids:
            new = new[:i + 1]
            break
    return tuple(new[:max(budget, 0)])


def test_cut_at_eos_cases():
    assert cut_at_eos([1, 5, 2, 5], {5}) == (1, 5)
    assert cut_at_eos([1, 2], {5}) == (1, 2) and cut_at_eos([], {5}) == ()
    assert cut_at_eos([1, 2, 5, 3], EOS, 2) == (1, 2) and cut_at_eos([1, 2, 5, 3], EOS, 3) == (1, 2, 5)
    assert cut_at_eos([9, 1], EOS, 0) == () and cut_at_eos([9, 1], EOS, -2) == ()
    assert cut_at_eos(torch.tensor([3, 9, 4]).tolist(), EOS) == (3, 9)
    assert all(type(t) is int for t in cut_at_eos((True, 2), EOS))


def test_cut_at_eos_is_each_old_cut():
    """The three cuts it replaces (dspark's truncate, speculative's _new_tokens, runner's until_eos)
    agree with it everywhere, and cutting and limiting commute."""
    rng = random.Random(2)
    for _ in range(500):
        tokens = [rng.randint(0, 10) for _ in range(rng.randint(0, 8))]
        limit = rng.randint(-1, 9)
        got = cut_at_eos(tokens, EOS, limit)
        assert got == old_new_tokens(tokens, limit, EOS)
        if limit >= 0:
            assert got == old_truncate(tokens, limit, EOS)
        assert got == cut_at_eos(cut_at_eos(tokens, EOS), EOS, limit)
        until_eos = []
        for token in tokens:
            until_eos.append(int(token))
            if token in EOS:
                break
        assert list(cut_at_eos(tokens, EOS)) == until_eos


def test_cut_at_eos_negative_control():
    """A cut that drops the EOS, or one that keeps going to the last EOS, is another rule."""
    tokens = [1, 5, 2, 9, 3]
    assert cut_at_eos(tokens, EOS) == (1, 5)
    assert tuple(tokens[:tokens.index(5)]) != cut_at_eos(tokens, EOS)
    assert tuple(tokens[:4]) != cut_at_eos(tokens, EOS)


# ------------------------------------------------------------------ the residual: one policy
def test_residual_zeroes_and_renormalizes():
    assert residual([F(1, 2), F(1, 3), F(1, 6)], 0) == [F(0), F(2, 3), F(1, 3)]
    p = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)
    out = residual(p, 1)
    assert torch.equal(out, torch.tensor([2 / 3, 0.0, 1 / 3], dtype=torch.float64))
    assert torch.equal(p, torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64))   # input unchanged


def test_residual_edge_case_is_none_and_only_exact_enumeration_reaches_it():
    """All mass on the rejected token: None. The rejection has probability 0, so exact enumeration
    stops there (no rejected-all branch) ..."""
    assert residual([F(0), F(1), F(0)], 1) is None
    assert residual(torch.tensor([0.0, 1.0]), 1) is None
    branches = exact_branches([F(0), F(1), F(0)], [1, 2])
    assert [(b.prob, b.accepted) for b in branches] == [(1, 0)]
    # ... and a sampler cannot get there: it rejects only p(token) < 1, and a distribution divided by
    # its own sum (softmax, p / p.sum()) holds exactly 1.0 wherever every other entry is 0.
    for dtype in (torch.float32, torch.float64):
        for mask in ([0.0] + [float("-inf")] * 7, [3.0] + [-200.0] * 7, [-1e4] * 3 + [80.0] + [-1e4] * 4):
            logits = torch.tensor(mask, dtype=dtype)
            p = torch.softmax(logits, -1)
            token = int(p.argmax())
            if bool((p[torch.arange(len(p)) != token] == 0).all()):
                assert float(p[token]) == 1.0
            q = p / p.sum()
            assert float(q[token]) == 1.0 or bool((q[torch.arange(len(q)) != token] > 0).any())


def test_residual_negative_control():
    """Not renormalizing, or falling back to p_target, differs on an ordinary case."""
    p = [F(1, 2), F(1, 4), F(1, 4)]
    assert residual(p, 0) == [F(0), F(1, 2), F(1, 2)]
    assert residual(p, 0) != [F(0), F(1, 4), F(1, 4)] and residual(p, 0) != p


# ------------------------------------------------------------------ one limit, one definition
def test_each_gamma_limit_has_one_definition():
    assert config.SPEC_MAX_GAMMA == 32 and config.DSPARK_MAX_GAMMA == 16 and config.DSPARK_MAX_BUDGET == 256
    config.SpeculativeConfig(gamma=config.SPEC_MAX_GAMMA)
    with pytest.raises(ConfigError, match=r"\[1, 32\]"):
        config.SpeculativeConfig(gamma=config.SPEC_MAX_GAMMA + 1)
    config.DSparkConfig(gamma=config.DSPARK_MAX_GAMMA)
    with pytest.raises(ConfigError, match=r"\[1, 16\]"):
        config.DSparkConfig(gamma=config.DSPARK_MAX_GAMMA + 1)
    n = config.DSPARK_MAX_GAMMA
    Lattice.independent([[1]] * n, [[0.5]] * n, [[0.5]] * n)
    with pytest.raises(ConfigError, match=r"\[1, 16\]"):
        Lattice.independent([[1]] * (n + 1), [[0.5]] * (n + 1), [[0.5]] * (n + 1))
    lat = Lattice.independent([[1, 2]] * 8, [[0.5, 0.5]] * 8, [[0.5, 0.5]] * 8)
    assert len(best_tree(lat, config.DSPARK_MAX_BUDGET).nodes) == config.DSPARK_MAX_BUDGET
    with pytest.raises(ConfigError, match=r"\[1, 256\]"):
        best_tree(lat, config.DSPARK_MAX_BUDGET + 1)


def test_limits_are_not_written_again():
    """The engine's sources name the limits; no other `MAX_GAMMA = <number>` or `MAX_BUDGET = <number>`."""
    found = []
    for path in (ROOT / "decoding").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
                for target in node.targets:
                    if isinstance(target, ast.Name) and ("MAX_GAMMA" in target.id or "MAX_BUDGET" in target.id):
                        found.append(f"{path.relative_to(ROOT)}:{target.id}")
    assert sorted(found) == ["decoding/core/config.py:DSPARK_MAX_BUDGET", "decoding/core/config.py:DSPARK_MAX_GAMMA",
                             "decoding/core/config.py:SPEC_MAX_GAMMA"]


# ------------------------------------------------------------------ the UI may import it
@pytest.mark.parametrize(("module", "allowed"), [
    ("formulas", {"__future__", "collections", "math"}),
    ("roofline", {"__future__", "dataclasses"}),
    ("measures", {"__future__", "dataclasses", "statistics", "decoding"}),
    ("trace_totals", {"__future__", "collections", "decoding"}),
])
def test_pure_core_modules_import_no_torch(module, allowed):
    """The formulas, the roofline, the Lab's measurement records and the trace totals are read by the UI and
    notebooks."""
    path = ROOT / "decoding" / "core" / f"{module}.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported <= allowed, imported
    code = f"import sys, decoding.core.{module}; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)
