"""Recorded traces (tests/golden/, see its cases.py) reproduce apart from timing fields: every strategy and
drafter, greedy and sampled, forced branches and a lockstep comparison, on the embedded model. A refactor
that changes a token, a probability beyond float noise, a count or a field's name fails here."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from app_support import assert_same
from golden.cases import CASES, HERE, LOCKSTEP, record_case, record_lockstep

from decoding import from_json, to_json, without_timings

pytestmark = pytest.mark.real


def portable(value):
    """The fixed cost table's path as its file name, wherever it appears (the config, each round's cost
    source): the recording machine's checkout directory is not behaviour, and CI replays from another."""
    if isinstance(value, dict):
        return {k: portable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [portable(v) for v in value]
    if isinstance(value, str) and value.endswith("tests/golden/cost.json"):
        return Path(value).name
    return value


def recorded(name: str):
    return portable(without_timings(from_json((HERE / f"{name}.json").read_bytes())))


def again(trace):
    return portable(without_timings(from_json(to_json(trace))))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_trace_reproduces(real_lm, case):
    assert_same(again(record_case(real_lm, case)), recorded(case.name))


def test_lockstep_reproduces(real_lm):
    traces = record_lockstep(real_lm)
    stored = [portable(without_timings(from_json(json.dumps(t)))) for t in
              json.loads((HERE / "lockstep.json").read_text(encoding="utf-8"))]
    assert list(traces) == list(LOCKSTEP)
    for trace, old in zip(traces.values(), stored):
        assert_same(again(trace), old)


def test_fixture_covers_every_strategy_and_drafter():
    strategies = {c.strategy for c in CASES}
    drafts = {c.params.get("draft") for c in CASES if c.strategy == "speculative"}
    assert strategies == {"greedy", "sample", "beam", "speculative", "dspark"}
    assert drafts == {"lookup", "shallow", "feature", "lookup+feature"}
    assert {c.strategy for c in CASES if c.forced} >= {"greedy", "speculative", "dspark"}
    assert {c.params.get("select", "chain") for c in CASES if c.strategy == "dspark"} == {"chain", "tree"}


def test_a_changed_rule_fails_the_comparison(real_lm):
    """Negative control: the same run with another seed (a sampled case) or one more token differs."""
    case = next(c for c in CASES if c.name == "spec_lookup_sampled")
    other = type(case)(case.name, case.strategy, {**case.params, "seed": 99})
    with pytest.raises(AssertionError):
        assert_same(again(record_case(real_lm, other)), recorded(case.name))
