"""The Lab's pure views on hand-made measurements: the tables' arithmetic, the sentences that read them
(flat against steep, where throughput flattens), the figures' series, and parsing the points a user types."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest
from page_support import RATES, SHAPE, report, results

from decoding.core.errors import ConfigError
from decoding.core.measures import ForwardTime
from ui.views import lab


# 100 MB of weights, 1 GB/s and 10 GFLOP/s: reading the weights takes 100 ms, a token's products 5 ms
def test_cost_table_rows_follow_the_roofline():
    table = lab.cost_table(report({1: 120.0, 9: 150.0}, {4: 130.0}))
    one = table.iloc[0]
    flops_1 = 2 * 25_000_000 + 4 * 4 * 64 * 11
    bytes_1 = 100_000_000 + 11 * SHAPE.kv_bytes_per_token
    assert one["gflop"] == pytest.approx(flops_1 / 1e9)
    assert one["roofline_ms"] == pytest.approx(1000 * bytes_1 / 1e9)          # reading dominates
    assert one["bound_by"] == "memory" and one["roofline_share"] == pytest.approx(one["roofline_ms"] / 120)
    nine = table.iloc[1]
    assert nine["ms_per_token"] == pytest.approx(150 / 9)
    assert list(table["forward"]) == [lab.AXIS_NAMES["tokens"]] * 2 + [lab.AXIS_NAMES["batch"]]


def test_speculation_table_gives_the_break_even():
    table = lab.speculation_table(report({1: 100.0, 3: 150.0, 9: 400.0}))
    assert list(table["gamma"]) == [2, 8]
    two = table.iloc[0]
    assert two["verify_ratio"] == 1.5 and two["tau_to_beat_greedy"] == 1.5
    assert 1 + two["acceptance_needed"] + two["acceptance_needed"] ** 2 == pytest.approx(1.5, abs=1e-6)
    assert table.iloc[1]["tau_to_beat_greedy"] == 4.0


def test_speculation_table_marks_an_unreachable_break_even():
    table = lab.speculation_table(report({1: 100.0, 2: 250.0}))       # γ = 1 would need 2.5 tokens per round
    assert math.isnan(table.iloc[0]["acceptance_needed"])


def test_regime_says_flat_or_steep():
    flat = lab.regime(report({1: 100.0, 9: 110.0}))
    assert "**flat**" in flat and "1.10×" in flat and "8 drafts" in flat
    steep = lab.regime(report({1: 100.0, 8: 160.0, 16: 300.0}))       # closest to 9: n = 8
    assert "**steep**" in steep and "1.60×" in steep and "7 drafts" in steep
    assert "roofline" in steep
    assert "Measure n = 1" in lab.regime(report({4: 100.0}))


def test_device_table_names_the_ridge():
    table = lab.device_table(report({1: 100.0}))
    ridge = table.set_index("quantity").loc["ridge"]
    assert ridge["value"] == "10.0 FLOP/byte"
    assert "compute-bound at n = " in ridge["how"]


def test_cost_figure_draws_both_axes_the_roofline_and_the_floor():
    fig = lab.cost_figure(report({1: 100.0, 4: 120.0}, {2: 110.0}))
    names = [t.name for t in fig.data]
    assert names[0].startswith("measured: n new") and names[1].startswith("measured: b seq")
    assert names[2].startswith("roofline")
    assert list(fig.data[0].x) == [1, 4] and list(fig.data[1].y) == [110.0]
    assert "100.0 ms" in fig.layout.annotations[0].text            # 100 MB at 1 GB/s


def test_throughput_table_and_tradeoff():
    table = lab.throughput_table(results())
    assert list(table["batch"]) == [1, 4, 16]
    assert table.iloc[1]["tokens_per_s"] == pytest.approx(1000 * 8 / 250)
    assert table.iloc[2]["throughput_vs_first"] == pytest.approx((1000 * 32 / 920) / 10)
    text = lab.tradeoff(results())
    assert "10.0 → 34.8 tokens/s" in text and "100 → 460 ms" in text
    assert "flattens from b = 4" in text            # 32.0 → 34.8 over two doublings: under 10 % each
    assert "at least two" in lab.tradeoff(results()[:1])


def test_throughput_figure_has_bars_and_two_latency_lines():
    fig = lab.throughput_figure(results())
    assert [t.type for t in fig.data] == ["bar", "scatter", "scatter"]
    assert fig.data[1].yaxis == "y2" and list(fig.data[0].x) == ["1", "4", "16"]


@pytest.mark.parametrize(("text", "values"), [("1, 2, 4", (1, 2, 4)), (" 3 5,9 ", (3, 5, 9)), ("0", (0,))])
def test_parse_points(text, values):
    assert lab.parse_points(text, "tokens") == values


@pytest.mark.parametrize("text", ["", " , ", "1, two", "1.5"])
def test_parse_points_names_the_parameter(text):
    with pytest.raises(ConfigError) as err:
        lab.parse_points(text, "batches")
    assert err.value.param == "batches"


def test_rounded_shows_the_digits_a_timing_supports():
    table = lab.rounded(lab.cost_table(report({1: 123.456789})))
    assert table.iloc[0]["measured_ms"] == 123.5 and table.iloc[0]["ms_per_token"] == 123.5
    assert table.iloc[0]["gflop"] == 0.05
    assert table.iloc[0]["mb_read"] == 100.0 and table.iloc[0]["bound_by"] == "memory"
    assert lab.cost_table(report({1: 123.456789})).iloc[0]["measured_ms"] == 123.456789     # builders keep all


def _noisy(times_by_n: dict[int, tuple[float, ...]]) -> lab.CostReport:
    return lab.cost_report([RATES, SHAPE, *(ForwardTime("tokens", n, t) for n, t in times_by_n.items())], 10)


def test_regime_names_a_verdict_only_when_the_spread_allows_it():
    """Issue 46: n = 1 at 100–134 ms and n = 9 at 128–141 ms was called "steep"; the repeats allow 0.96× to
    1.41×, on both sides of the line, so no verdict is named. Tight repeats keep theirs; one repeat gives none."""
    noisy = lab.regime(_noisy({1: (100.0, 110.0, 134.0), 9: (128.0, 135.0, 141.0)}))
    assert "**steep**" not in noisy and "**flat**" not in noisy and "too noisy" in noisy and "0.96×" in noisy
    tight = lab.regime(_noisy({1: (100.0, 101.0, 102.0), 9: (160.0, 161.0, 162.0)}))
    assert "**steep**" in tight and "1.57× to 1.62×" in tight
    once = lab.regime(_noisy({1: (100.0,), 9: (160.0,)}))
    assert "**steep**" not in once and "no spread to judge by" in once


def test_the_cost_table_and_figure_show_the_spread():
    measured = _noisy({1: (100.0, 110.0, 134.0), 9: (128.0, 135.0, 141.0)})
    table = lab.cost_table(measured).set_index("n")
    assert table.loc[1, "measured_ms"] == 110.0 and table.loc[1, "spread_ms"] == 34.0
    assert (table["repeats"] == 3).all()
    error = lab.cost_figure(measured).data[0].error_y
    assert list(error.array) == [24.0, 6.0] and list(error.arrayminus) == [10.0, 7.0]


def test_the_ridge_is_named_only_as_firmly_as_the_rates_allow():
    firm = lab.ridge_text(report({1: 100.0}))
    assert firm.startswith("a forward turns compute-bound at n = ")
    loose = replace(RATES, flops_per_s_low=RATES.flops_per_s / 4)
    early, late = lab.ridge_range(replace(report({1: 100.0}), rates=loose))
    assert early < late
    text = lab.ridge_text(replace(report({1: 100.0}), rates=loose))
    assert f"between n = {early} and n = {late}" in text and "spread" in text
