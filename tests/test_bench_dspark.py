"""The DSpark benchmark's report: the verify-cost table line and its non-monotone note."""
from __future__ import annotations

import types

from bench import dspark


def test_non_monotone_names_the_most_inverted_pair():
    assert dspark._non_monotone([50.0, 90.0, 110.0, 80.0, 75.0]) == (
        " It is not monotone here: 3 tokens took 1.47× as long as 5, which the cost-aware size choice takes "
        "into account.")
    assert dspark._non_monotone([50.0, 60.0, 70.0]) == ""
    assert dspark._non_monotone([50.0, 49.0]) == ""          # within 5 %: noise, not worth a sentence
    assert dspark._non_monotone([50.0]) == ""


def test_render_shows_the_cost_table_above_the_contenders():
    rows = {"greedy (ours)": {"tps": [1.0], "tau": [], "acc": [], "peak": [1.0], "phases": {}}}
    args = types.SimpleNamespace(repeats=1, gammas=[4], budget=4, max_new_tokens=4, lookup=2,
                                 cost_ms=(50.0, 90.0, 80.0))
    lines = dspark.render(rows, args).splitlines()
    table = lines.index("| contender | speed vs our greedy | τ | acceptance rate | peak MiB | where the time goes |")
    assert lines[table - 2].startswith("The auto contenders' verify-cost table") and "50, 90, 80." in lines[table - 2]
    assert "2 tokens took 1.12× as long as 3" in lines[table - 2]
    args.cost_ms = None
    assert not any("verify-cost table" in line for line in dspark.render(rows, args).splitlines())


def chain_row(tau, rounds, phases):
    return {"tps": [1.0], "tau": tau, "acc": [0.1], "peak": [1.0], "phases": phases, "rounds": rounds}


def test_break_even_prices_a_round_from_the_table_and_the_runs_side_costs():
    cost_ms = (30.0, 33.0, 36.0, 42.0, 45.0)                      # verify ms for 1..5 tokens
    rows = {"dspark chain γ=4": chain_row([1.5, 1.7, 1.6], 10,
                                          {"verification": 999.0, "prefill": 50.0, "drafter": 80.0, "dp": 10.0,
                                           "cache": 10.0}),
            "dspark chain γ=8": chain_row([1.6], 5, {"drafter": 1.0})}     # 9 tokens: not in the table
    (row,) = dspark.break_even(rows, [4, 8], cost_ms)
    assert row["gamma"] == 4 and row["verify_ms"] == 45.0 and row["side_ms"] == 10.0   # (80 + 10 + 10) / 10
    assert row["tau_parity"] == 55.0 / 30.0 and row["tau_goal"] == 1.5 * 55.0 / 30.0 and row["tau_run"] == 1.6
    text = dspark.render_break_even([row])
    assert "| 4 | 45.0 | 10.0 | 1.83 | 2.75 | 1.60 |" in text and "1.5× greedy at γ = 8" in text
    assert dspark.render_break_even([]) == ""
