"""DSpark what-if from a recorded trace: re-running the DP on the recorded lattice reproduces each
round's recorded plan and forecast, the temperature-0 replay of the recorded plan reproduces each
round's accepted length exactly (negative control: a wrong continuation does not), and the replay's
lower-bound rule is pinned by hand-worked cases."""
from __future__ import annotations

import pytest
from dspark_helpers import chain_config, one_thread, random_drafter, varied_llama

from decoding.runner import run
from decoding.strategies.dspark_select import best_chain, best_tree
from ui.views import whatif_dspark as wd

_threads = pytest.fixture(scope="module", autouse=True)(one_thread)


@pytest.fixture(scope="module")
def lm():
    return varied_llama(seed=2)


@pytest.fixture(scope="module")
def drafter(lm):
    return random_drafter(lm, gamma_max=8, seed=4)


def _trace(lm, drafter, **kw):
    return run(lm, [3, 1, 4, 1, 5], chain_config(max_new_tokens=40, **kw), drafter=drafter)


@pytest.mark.parametrize("case", [("11", [5, 6, 7], [-1, 0, 1], [5, 6], (2, False)),
                                  ("12", [5, 6], [-1, 0], [5, 6, 9], (2, True)),
                                  ("13", [5, 8], [-1, 0], [5, 6], (1, True)),
                                  ("14", [4, 5, 6], [-1, -1, 1], [5, 6, 2], (2, True)),
                                  ("15", [4], [-1], [5], (0, True))], ids=lambda c: c[0])
def test_replay_hand_worked(case):
    _, tokens, parents, known, expected = case
    assert wd.replay(tokens, parents, known) == expected


def test_chain_replay_reproduces_each_round(lm, drafter):
    trace = _trace(lm, drafter, gamma=6, top_k_candidates=2)
    rounds = wd.dspark_rounds(trace.steps)
    assert wd.greedy_rounds(rounds) and any(r.accepted_path for r in rounds) and \
        any(len(r.accepted_path) < len(r.nodes) for r in rounds)
    for r in rounds:
        lat = wd.lattice_of(r)
        plan = best_chain(lat, lat.gamma)
        assert plan.tokens == tuple(n.token_id for n in r.nodes)
        assert float(plan.expected_accepted) == pytest.approx(r.expected_accepted, rel=1e-6)
        accepted, exact = wd.replay(*wd._chain_nodes(plan), wd.known_continuation(r))
        assert exact and accepted == len(r.accepted_path)


def test_tree_replay_reproduces_each_round(lm, drafter):
    trace = _trace(lm, drafter, gamma=6, top_k_candidates=3, select="tree", budget=10)
    for r in wd.dspark_rounds(trace.steps):
        plan = best_tree(wd.lattice_of(r), len(r.nodes))
        assert plan.tokens == tuple(n.token_id for n in r.nodes)
        accepted, exact = wd.replay(plan.tokens, plan.parents, wd.known_continuation(r))
        assert exact and accepted == len(r.accepted_path)


def test_wrong_continuation_is_caught(lm, drafter):
    trace = _trace(lm, drafter, gamma=6, top_k_candidates=2)
    rounds = [r for r in wd.dspark_rounds(trace.steps) if r.accepted_path]
    mismatches = 0
    for r in rounds:
        plan = best_chain(wd.lattice_of(r))
        wrong = [t + 1 for t in wd.known_continuation(r)]            # negative control
        mismatches += wd.replay(*wd._chain_nodes(plan), wrong)[0] != len(r.accepted_path)
    assert mismatches == len(rounds) > 0


def test_sweep_table_and_measured(lm, drafter):
    trace = _trace(lm, drafter, gamma=6, top_k_candidates=2)
    table = wd.sweep(trace.steps, gammas=range(1, 7), budgets=(4, 8))
    assert list(table["plan"]) == ["chain"] * 6 + ["tree"] * 2
    at6 = table[(table["plan"] == "chain") & (table["size"] == 6)].iloc[0]
    rounds = wd.dspark_rounds(trace.steps)
    full = [r for r in rounds if len(r.lattice) == 6]
    assert 0 < len(full) < len(rounds)          # some rounds drafted a shorter lattice (near the token budget)
    assert at6["rounds"] == len(rounds) and at6["short_rounds"] == len(rounds) - len(full)
    forecast = 1 + sum(r.expected_accepted for r in rounds) / len(rounds)
    assert at6["forecast_tokens_per_forward"] == pytest.approx(forecast)
    forecast = list(table[table["plan"] == "chain"]["forecast_tokens_per_forward"])
    assert all(b >= a - 1e-9 for a, b in zip(forecast, forecast[1:]))   # longer chains never forecast less
    m = wd.measured(trace.steps)
    assert m["gamma"] == 6 and m["select"] == "chain" and m["tokens_per_forward"] >= 1
    fig = wd.sweep_figure(table, m)
    assert len(fig.data) == 5


def test_replay_at_the_runs_own_chain_is_the_measured_length_over_the_same_rounds(lm, drafter):
    """Issue 46 (What-if): the replayed chain at the run's γ averages the same rounds as the measured value, so
    it is the run's accepted length + 1 per round. Averaging only the rounds whose lattice held all γ positions
    (the old rule, kept here as the negative control) gave a different number on this trace."""
    trace = _trace(lm, drafter, gamma=6, top_k_candidates=2)
    rounds = wd.dspark_rounds(trace.steps)
    table = wd.sweep(trace.steps, gammas=(6,), budgets=())
    measured = 1 + sum(len(r.accepted_path) for r in rounds) / len(rounds)
    assert table["replayed_tokens_per_forward"].iloc[0] == pytest.approx(measured)
    full = [r for r in rounds if len(r.lattice) == 6]
    old_rule = 1 + sum(len(r.accepted_path) for r in full) / len(full)
    assert old_rule != pytest.approx(measured)
    assert wd.measured(trace.steps)["tokens_per_forward"] <= measured      # emitted: cut at EOS / the budget
    line = wd.measured_vs_replayed(trace.steps)
    assert line.startswith(f"Measured and replayed average the same {len(rounds)} rounds.")
    assert "(the run: a fixed chain length)" in line


def test_sampled_trace_has_forecast_only(lm, drafter):
    trace = _trace(lm, drafter, gamma=4, top_k_candidates=2, temperature=1.0, seed=3)
    table = wd.sweep(trace.steps, gammas=(2, 4), budgets=(4,))
    assert table["replayed_tokens_per_forward"].isna().all()
    assert table["forecast_tokens_per_forward"].notna().all()
