"""Speculative decoding's cost-aware γ (gamma_policy "cost"): the counts and the choice (pure), and
runs on tiny models — greedy identity, the choice recorded in the trace, tables and draft costs
profiled once and cached, bad input. Exactness by enumeration: test_speculative_exact (policy cost)."""
from __future__ import annotations

from pathlib import Path

import pytest
from spec_helpers import PROMPTS, N, divergence, draft, target  # noqa: F401  (draft, target: fixtures)

from decoding import runner
from decoding.core.config import GreedyConfig, SpeculativeConfig
from decoding.core.errors import ConfigError
from decoding.core.trace import from_json, to_json, without_timings
from decoding.runtime import cost_table as cost_module
from decoding.runtime.cost_table import CostTable
from decoding.strategies.adaptive_gamma import AcceptanceCounts, choose_gamma, reason

TABLE = CostTable(verify_ms=(10.0, 11.0, 12.0, 19.0, 20.0, 21.0, 22.0), source="test")


def test_counts_follow_rounds():
    counts = AcceptanceCounts()
    counts.update(drafted=3, accepted=1)        # position 0 accepted, 1 rejected, 2 not reached
    counts.update(drafted=2, accepted=2)        # both accepted
    assert counts.reached == [2, 2, 0] and counts.accepted == [2, 1, 0]
    assert counts.estimate(0) == 3 / 4 and counts.estimate(1) == 2 / 4 and counts.estimate(2) == 1 / 2
    assert counts.estimate(7) == 1 / 2         # never drafted: the prior


def test_choice_on_a_table():
    """With no history (a = 1/2 everywhere): γ 1 gives 1.5 tokens for 11 + 1 ms, γ 2 1.75 for 12 + 2,
    γ 3 1.875 for 19 + 3: γ 1 (8.0 ms per token) beats γ 2 (8.0 ms: the tie goes to the smaller)."""
    info = choose_gamma(AcceptanceCounts(), TABLE, 1.0, 3, "d")
    assert info.expected_tokens == (1.5, 1.75, 1.875)
    assert info.ms_per_token == pytest.approx((12 / 1.5, 14 / 1.75, 22 / 1.875))
    assert (info.gamma == 1 and info.source == "d" and info.cost_source == "test"
            and info.verify_ms == TABLE.verify_ms[:4])
    free = choose_gamma(AcceptanceCounts(), TABLE, 0.0, 3)          # prompt lookup: drafting is free
    assert free.gamma == 2                                            # 12 / 1.75 < 11 / 1.5
    confident = AcceptanceCounts([50, 50, 50, 50, 50, 50], [49, 49, 49, 49, 49, 49])
    assert choose_gamma(confident, TABLE, 1.0, 6).gamma == 6          # a ≈ 0.96: the dear forwards pay
    assert "γ=1" in reason(info) and "d" in reason(info)


def cost_config(**kw) -> SpeculativeConfig:
    return SpeculativeConfig(**{"max_new_tokens": N, "draft": "d", "gamma": 6, "gamma_policy": "cost", **kw})


@pytest.fixture
def table_file(tmp_path):
    path = tmp_path / "table.json"
    TABLE.save(path)
    return str(path)


@pytest.mark.parametrize("draft_name", ["d", "lookup", "lookup+d"])
def test_greedy_identity_and_trace(target, draft, draft_name, table_file, tmp_path, monkeypatch):
    monkeypatch.setenv("DECODESCOPE_CACHE", str(tmp_path))
    for prompt in PROMPTS:
        expected = runner.run(target, prompt, GreedyConfig(max_new_tokens=N)).output_ids
        trace = runner.run(target, prompt, cost_config(draft=draft_name, cost_table=table_file), drafter=draft)
        assert trace.error is None
        assert not divergence(target, prompt, expected, trace.output_ids)
        for r in trace.steps[:-1]:
            info = r.gamma_choice
            assert info is not None and info.gamma >= r.gamma and info.cost_source == Path(table_file).name
            assert info.source == r.drafter and r.gamma_reason.startswith(f"cost: γ={info.gamma}")
            assert info.draft_ms == 0.0 if r.drafter == "lookup" else info.draft_ms > 0
        assert without_timings(from_json(to_json(trace))) == without_timings(trace)


def test_choices_follow_the_runs_acceptance(target, draft, table_file, tmp_path, monkeypatch):
    """Each round's recorded estimates are the counts of the earlier rounds of the same drafter."""
    monkeypatch.setenv("DECODESCOPE_CACHE", str(tmp_path))
    trace = runner.run(target, PROMPTS[0], cost_config(cost_table=table_file), drafter=draft)
    counts = AcceptanceCounts()
    for r in trace.steps[:-1]:
        assert r.gamma_choice.acceptance == tuple(counts.estimate(i) for i in range(6))
        counts.update(r.gamma, r.accepted)


def test_auto_table_and_draft_cost_are_profiled_once(target, draft, tmp_path, monkeypatch):
    monkeypatch.setenv("DECODESCOPE_CACHE", str(tmp_path))
    calls = []
    real = cost_module.profile_verify_cost
    monkeypatch.setattr(cost_module, "profile_verify_cost",
                        lambda lm, n, **kw: calls.append((lm.name, n)) or real(lm, n, **kw))
    first = runner.run(target, PROMPTS[0], cost_config(), drafter=draft)
    second = runner.run(target, PROMPTS[0], cost_config(), drafter=draft)
    assert sorted(calls) == sorted([(target.name, 17), (draft.name, 1)])
    assert first.steps[0].gamma_choice.cost_source == "auto: " + cost_module.auto_cost_path(target).name
    assert str(tmp_path) not in to_json(first)                 # a trace a user downloads names no server folder
    assert first.output_ids == second.output_ids
    assert [r.gamma_choice.gamma for r in first.steps[:-1]] == [r.gamma_choice.gamma for r in second.steps[:-1]]


def test_bad_cost_table(target, draft, tmp_path):
    with pytest.raises(ConfigError) as err:
        SpeculativeConfig(cost_table="auto")                         # without the cost policy
    assert err.value.param == "cost_table" and "'fixed'" in str(err.value) and "\n" not in str(err.value)
    short = tmp_path / "short.json"
    CostTable(verify_ms=(10.0, 11.0)).save(short)
    trace = runner.run(target, PROMPTS[0], cost_config(cost_table=str(short)), drafter=draft)   # as DSpark's
    assert trace.stop_reason == "error" and not trace.steps
    assert trace.error.startswith("cost_table=") and "covers 2 tokens; this run verifies up to 7" in trace.error
