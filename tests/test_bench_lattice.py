"""The drafting-cost benchmark's pieces on a tiny llama: the two drafters differ only in parent_mlp,
each case is timed for both next to the target forward, and the table shows the ratio."""
from __future__ import annotations

from argparse import Namespace

from dspark_helpers import varied_llama

from bench.lattice import drafters, measure, parse_cases, render


def test_drafters_differ_only_in_the_parent_block():
    pair = drafters(varied_llama(), {"gamma_max": 4, "rank": 8, "trunk": 32, "width": 16}, vocab=40)
    assert pair["parent_mlp"].parent_in is not None and pair["plain"].parent_in is None
    assert pair["plain"].shape == pair["parent_mlp"].shape.__class__(**{**vars(pair["parent_mlp"].shape),
                                                                         "parent_mlp": False})
    assert len(pair["plain"].vocab_ids) == 40


def test_measure_and_table():
    rows = measure(varied_llama(), parse_cases("3x2,2x1"), repeats=5,
                   shape_args={"gamma_max": 4, "rank": 8, "trunk": 32, "width": 16}, vocab=40)
    assert [(r["gamma"], r["k"]) for r in rows] == [(3, 2), (2, 1)]
    assert all(r["plain"] > 0 and r["parent_mlp"] > 0 and r["forward"] > 0 for r in rows)
    text = render([{"gamma": 8, "k": 2, "plain": 16.0, "parent_mlp": 38.0, "forward": 90.0}],
                  Namespace(repeats=30, cases="8x2"))
    assert "| 8 | 2 | 16.0 | 38.0 | 2.38 | 90.0 |" in text and "--repeats 30 --cases 8x2" in text
