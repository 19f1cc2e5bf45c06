"""ui/views/calibration.py: which plan nodes are samples of ŝ, the reliability table and ECE per group,
the figure, and the model card's table; from hand-built rounds and from a tiny DSpark run."""
from __future__ import annotations

import dataclasses
import json
import math

import pytest
from dspark_helpers import one_thread, varied_llama

from decoding.core.formulas import calibration_error
from decoding.core.trace import PlanNode
from decoding.runner import run
from ui.views import calibration

_threads = pytest.fixture(scope="module", autouse=True)(one_thread)


def node(i, parent, depth, score, verdict, lookup=False):
    return PlanNode(i, parent, depth, 0, 5, "x", score, score, 0.5, None, None, verdict, lookup=lookup)


@pytest.fixture(scope="module")
def rounds():
    from dspark_helpers import random_head

    lm = varied_llama(seed=0)
    from decoding.core.config import DSparkConfig

    tr = run(lm, [9, 40, 17, 9, 40], DSparkConfig(max_new_tokens=30, gamma=4, top_k_candidates=3, budget=8),
             drafter=random_head(lm))
    return tr.steps


def test_samples_are_the_children_of_accepted_nodes(rounds):
    """A round: root → 1 (accepted) → 3 (rejected). Node 2, a sibling after the accepted node 1, and
    node 4, a sibling after 3, were never checked: samples that were not accepted. Node 5's parent was
    rejected: not a sample."""
    event = next(e for e in rounds if not e.prefill)
    nodes = (node(1, 0, 1, 0.9, "accepted"), node(2, 0, 1, 0.2, "not_reached"),
             node(3, 1, 2, 0.7, "rejected", lookup=True), node(4, 1, 2, 0.1, "not_reached"),
             node(5, 3, 3, 0.6, "not_reached"))
    table = calibration.samples([dataclasses.replace(event, nodes=nodes)])
    assert table["node"].tolist() == [1, 2, 3, 4]
    assert table["accepted"].tolist() == [True, False, False, False]
    assert table["source"].tolist() == ["drafter", "drafter", "prompt lookup", "drafter"]
    ece = calibration.errors(table, "position")
    assert math.isclose(ece[1], 0.5 * abs(0.9 - 1) + 0.5 * abs(0.2 - 0))      # two bins of one node
    assert math.isclose(ece["all"], calibration_error([0.9, 0.2, 0.7, 0.1], [True, False, False, False]))


def test_run_samples_table_and_figure(rounds):
    table = calibration.samples(rounds)
    expected = sum(1 for e in rounds if not e.prefill for n in e.nodes
                   if n.parent == 0 or any(m.node == n.parent and m.verdict == "accepted" for m in e.nodes))
    assert len(table) == expected > 0
    bins = calibration.reliability_table(table, "position")
    assert bins.groupby("position")["samples"].sum().to_dict() == table.groupby("position").size().to_dict()
    fig = calibration.reliability_figure(table, "source")
    assert fig.data[0].name == "perfectly calibrated" and len(fig.data) == 1 + table["source"].nunique()
    assert "ECE" in fig.layout.title.text


def test_card_table(tmp_path):
    good = tmp_path / "c.json"
    good.write_text(json.dumps({"positions": [{"position": 1, "hit_rate": 0.2, "ece_raw": 0.03, "ece_calibrated": 0.01,
                                               "a": 0.9, "b": -0.1}]}))
    assert calibration.card_table(good).to_dict("records")[0]["ece_calibrated"] == 0.01
    (tmp_path / "bad.json").write_text("{")
    assert calibration.card_table(tmp_path / "bad.json") is None
    assert calibration.card_table(tmp_path / "absent.json") is None
