"""ui/views/acceptance.py: the verdict of each round's draft positions from a speculative or DSpark trace,
checked against the runner's per-position acceptance (vLLM's definition) on tiny runs, and cell by cell on
a hand-built round. Negative control: cutting a DSpark round's cells at its first rejection (instead of
the plan's depth) no longer agrees with the runner."""
from __future__ import annotations

import dataclasses

import pytest
from dspark_helpers import one_thread

from decoding.core.config import DSparkConfig, GreedyConfig, SpeculativeConfig
from decoding.core.trace import PlanNode
from decoding.runner import run
from ui.views import acceptance

_threads = pytest.fixture(scope="module", autouse=True)(one_thread)


@pytest.fixture(scope="module")
def dspark_trace(lm):
    from dspark_helpers import random_head

    return run(lm, [9, 40, 17, 9, 40], DSparkConfig(max_new_tokens=40, gamma=4, top_k_candidates=3, budget=8),
               drafter=random_head(lm))


@pytest.fixture(scope="module")
def spec_trace(lm):
    return run(lm, [9, 40, 17, 9, 40, 17, 9, 40, 17, 9], SpeculativeConfig(draft="lookup", gamma=4,
                                                                            max_new_tokens=40))


def shares(table):
    return tuple(table["acceptance"])


@pytest.mark.parametrize("name", ["spec_trace", "dspark_trace"])
def test_shares_are_the_runners_per_position_acceptance(request, name):
    trace = request.getfixturevalue(name)
    table = acceptance.position_table(trace.steps)
    assert len(table) > 0 and shares(table) == pytest.approx(trace.stats.per_position_acceptance)
    assert (table["accepted"] + table["rejected"] + table["not_reached"] == table["rounds"]).all()
    verdicts = {c for _, cells in acceptance.grid(trace.steps) for c in cells}
    assert acceptance.ACCEPTED in verdicts and acceptance.REJECTED in verdicts      # the run shows both


def test_cutting_at_the_rejection_disagrees_with_the_runner(dspark_trace, monkeypatch):
    right = acceptance.round_cells

    def cut_at_rejection(event):
        cells = right(event)
        return cells if cells is None else [c for c in cells if c != acceptance.NOT_REACHED]

    assert any(acceptance.NOT_REACHED in (right(e) or []) for e in dspark_trace.steps)
    monkeypatch.setattr(acceptance, "round_cells", cut_at_rejection)
    assert shares(acceptance.position_table(dspark_trace.steps)) != pytest.approx(
        dspark_trace.stats.per_position_acceptance)


def node(i, parent, depth, verdict):
    return PlanNode(i, parent, depth, 0, 5, "x", 0.5, 0.5, 0.5, None, None, verdict)


def test_a_tree_round_cell_by_cell(dspark_trace):
    """root → 1 (accepted) → 3 (rejected) → 5; node 2 a sibling of 1: depth 1 accepted, 2 rejected, 3 not
    reached."""
    event = next(e for e in dspark_trace.steps if not e.prefill)
    nodes = (node(1, 0, 1, "accepted"), node(2, 0, 1, "not_reached"), node(3, 1, 2, "rejected"),
             node(4, 1, 2, "not_reached"), node(5, 3, 3, "not_reached"))
    tree = dataclasses.replace(event, nodes=nodes, accepted_path=(1,))
    assert acceptance.round_cells(tree) == ["accepted", "rejected", "not reached"]
    assert acceptance.round_cells(dataclasses.replace(tree, accepted_path=(1, 3, 5))) == ["accepted"] * 3
    prefill = next(e for e in dspark_trace.steps if e.prefill)
    assert acceptance.round_cells(prefill) is None


def test_heatmap_rows_columns_and_marks(spec_trace):
    fig = acceptance.heatmap(spec_trace.steps)
    rows = acceptance.grid(spec_trace.steps)
    heat = fig.data[0]
    assert len(heat.z) == len(rows) and list(heat.y) == [f"round {i}" for i, _ in rows]
    first = rows[0][1]
    assert list(heat.text[0][:len(first)]) == [acceptance.MARKS[c] for c in first]
    assert [t.name for t in fig.data[1:]] == ["✓ accepted", "✗ rejected", "· not reached"]
    assert acceptance.heatmap([]) is None


# ---------------------------------------------------------------- the target's entropy where a draft was judged
def greedy_entropy_at(lm, prompt, trace):
    """The greedy run's raw entropy per absolute position (temperature 0: the same tokens as the trace)."""
    greedy = run(lm, prompt, GreedyConfig(max_new_tokens=len(trace.output_ids)))
    assert greedy.output_ids == trace.output_ids
    return {s.position: s.entropy_raw for s in greedy.steps}


def test_spec_entropy_is_greedys_at_the_same_position(lm, spec_trace):
    by_position = greedy_entropy_at(lm, list(spec_trace.prompt_ids), spec_trace)
    checked = 0
    for r in spec_trace.steps:
        for d in r.drafts[:r.accepted + 1]:         # the context of these is the greedy run's
            if r.position + d.index in by_position and d.verdict in ("accepted", "rejected"):
                assert d.target_entropy == pytest.approx(by_position[r.position + d.index], abs=1e-4)
                checked += 1
    assert checked >= 5
    # negative control: one position later is another distribution
    r = next(r for r in spec_trace.steps if r.accepted >= 1)
    assert r.drafts[0].target_entropy != pytest.approx(by_position[r.position + 1], abs=1e-4)


def test_dspark_node_entropy_is_greedys_at_its_parent(lm, dspark_trace):
    by_position = greedy_entropy_at(lm, list(dspark_trace.prompt_ids), dspark_trace)
    checked = 0
    for r in dspark_trace.steps[1:]:
        path = {0, *r.accepted_path}
        for n in r.nodes:
            if n.parent in path and r.position + n.depth - 1 in by_position:
                assert n.target_entropy == pytest.approx(by_position[r.position + n.depth - 1], abs=1e-4)
                checked += 1
    assert checked >= 5


def test_entropy_samples_and_figure(spec_trace):
    table = acceptance.entropy_samples(spec_trace.steps)
    judged = [d for r in spec_trace.steps for d in r.drafts if d.verdict in ("accepted", "rejected")]
    assert len(table) == len(judged) and table["accepted"].sum() == sum(d.verdict == "accepted" for d in judged)
    fig = acceptance.entropy_figure(spec_trace.steps)
    assert [t.name for t in fig.data] == ["✓ accepted", "✗ rejected", "share accepted (binned)"]
    assert sum(int(t.split()[0]) for t in fig.data[2].text) == len(table)
    old = [dataclasses.replace(r, drafts=tuple(dataclasses.replace(d, target_entropy=None) for d in r.drafts))
           for r in spec_trace.steps]
    assert acceptance.entropy_figure(old) is None


def test_binned_mean():
    # bins [0, 2) and [2, 4]: 2.0 opens the second bin, 4.0 (the maximum) closes it
    assert acceptance.binned_mean([0.0, 1.0, 2.0, 4.0], [True, False, False, False], bins=2) == \
        [(1.0, 0.5, 2), (3.0, 0.0, 2)]
    assert acceptance.binned_mean([1.5, 1.5], [True, False], bins=4) == [(2.0, 0.5, 2)]
    assert acceptance.binned_mean([], []) == []


@pytest.mark.parametrize("name", ["spec_trace", "dspark_trace"])
def test_position_counts_are_the_per_position_denominators(request, name):
    """n beside each per-position bar (issue 46) is the number of rounds that drafted that position: the
    table's `rounds` column, and rate × n is a whole number of accepted rounds."""
    trace = request.getfixturevalue(name)
    counts = acceptance.position_counts(trace.steps)
    rates = trace.stats.per_position_acceptance
    assert len(counts) == len(rates) and counts == acceptance.position_table(trace.steps)["rounds"].tolist()
    assert all(abs(r * n - round(r * n)) < 1e-9 for r, n in zip(rates, counts))


def test_per_position_bars_show_n_and_grey_the_few():
    from ui.views import palette, spec

    fig = spec.per_position_bars([0.5, 1.0], [12, 1])
    bar = fig.data[0]
    assert list(bar.text) == ["0.50 (n=12)", "1.00 (n=1)"]
    assert list(bar.marker.color) == [palette.GREEN, palette.GREY]
    assert f"fewer than {acceptance.MIN_ROUNDS} rounds" in fig.layout.title.text
    plenty = spec.per_position_bars([0.5, 0.4], [12, 10])            # negative control: none below the minimum
    assert list(plenty.data[0].marker.color) == [palette.GREEN] * 2 and "grey" not in plenty.layout.title.text
