"""The queueing lesson's maths: Lindley's recursion by hand, the simulated M/D/1 mean wait against the
Pollaczek–Khinchine formula (negative control: the exponential-service M/M/1 value it must not match), and
the P99 table's verdicts: near capacity the P99 falls by more than the speedup, past capacity it is "—"."""
from __future__ import annotations

import numpy as np
import pytest
from requests_support import served

from ui.views import queueing as q


def test_lindley_by_hand():
    service = np.array([1.0, 1.0, 1.0])
    assert list(q.latencies(service, np.array([0.0, 2.0, 2.0]))) == [1.0, 1.0, 1.0]      # never waits
    assert list(q.latencies(service, np.array([0.0, 0.5, 0.5]))) == [1.0, 1.5, 2.0]      # waits pile up


def test_simulated_md1_mean_wait_is_pollaczek_khinchines():
    setup = q.QueueSetup((1.0,), 1.0, (0.5,), requests=40_000, seed=3)
    wait = (q.simulate(setup, 0.5, False) - 1.0).mean()
    rho = 0.5
    assert wait == pytest.approx(rho / (2 * (1 - rho)), rel=0.1)          # M/D/1: 0.5 s
    assert wait != pytest.approx(rho / (1 - rho), rel=0.3)                # M/M/1's 1.0 s: not this queue


def test_p99_falls_by_more_than_the_speedup_near_capacity_and_stops_past_it():
    setup = q.QueueSetup((1.0,), 1.5, (0.2, 0.9, 1.1, 1.6), requests=4000)
    table = q.p99_table(setup)
    ratios = table["P99 lower by"]
    assert float(ratios[1].rstrip("×")) > 1.5 * 2 > float(ratios[0].rstrip("×"))
    assert table["P99, slower (ms)"][2] == q.NA and table["P99, faster (ms)"][2] != q.NA
    assert table["P99, faster (ms)"][3] == q.NA and ratios[3] == q.NA


def test_measured_service_is_decoding_time_of_one_strategy():
    rows = [served("a", 1.0, queue=0.25), served("b", 2.0), served("a", 0.5, queue=0.5)]
    assert q.measured_service(rows, "a") == (0.75,)


@pytest.mark.parametrize("kwargs", [{"service_s": ()}, {"service_s": (0.0,)}, {"speedup": 0.5}, {"loads": (0,)}])
def test_a_bad_setup_is_refused(kwargs):
    with pytest.raises(ValueError):
        q.QueueSetup(**{"service_s": (1.0,), "speedup": 1.5, "loads": (0.5,), **kwargs})


# ---------------------------------------------------------------- the live measurement's table and words
def _summary(name: str, services, arrivals):
    """A QueueSummary served first come, first served (starts by Lindley's recursion)."""
    from decoding.core.live_queue import QueuedRequest, QueueSummary

    requests, free = [], 0.0
    for i, (s, a) in enumerate(zip(services, arrivals)):
        start = max(a, free)
        free = start + s
        requests.append(QueuedRequest(name, i, a, start, free))
    return QueueSummary(name, (services[0],), tuple(requests))


def _result(slow_s: float, fast_s: float, gap_s: float, n: int = 20):
    from decoding.core.live_queue import LiveQueueConfig, LiveQueueResult

    arrivals = [i * gap_s for i in range(n)]
    return LiveQueueResult(LiveQueueConfig(load=slow_s / gap_s), 1 / gap_s,
                           (_summary("greedy", [slow_s] * n, arrivals), _summary("dspark", [fast_s] * n, arrivals)))


def test_live_table_in_words_with_the_simulation_beside():
    table = q.live_table(_result(0.9, 0.6, 1.0))
    assert list(table.columns) == ["Strategy", "Service, mean (s)", "Load ρ", "P50 measured (s)", "P99 measured (s)",
                                   "P99 simulated (s)", "Requests"]
    assert list(table["Load ρ"]) == ["90%", "60%"]
    assert list(table["P99 measured (s)"]) == ["0.900", "0.600"]      # evenly spaced: nobody waits
    assert float(table["P99 simulated (s)"][0]) > 0.9                # Poisson arrivals do wait


def test_live_table_past_capacity_has_no_simulated_p99():
    table = q.live_table(_result(1.2, 0.8, 1.0))
    assert table["P99 simulated (s)"][0] == q.NA and table["P99 simulated (s)"][1] != q.NA
    assert float(table["P99 measured (s)"][0]) > 1.2 * 3              # the queue grew with each request


def test_simulated_p99_is_none_at_or_past_capacity():
    assert q.simulated_p99([1.0], 1.0) is None
    assert q.simulated_p99([1.0], 0.5) == pytest.approx(q.percentile(q.simulate(
        q.QueueSetup((1.0,), 1.0, (0.5,)), 0.5, False), 99))


def test_live_sentence_names_the_ratio_against_the_speedup():
    near = q.live_sentence(_result(1.2, 0.8, 1.0))
    assert "1.50× as fast" in near and "past dspark's own capacity" not in near
    assert "more than its per-request speedup" in near                        # greedy's queue piled up
    idle = q.live_sentence(_result(0.3, 0.2, 1.0))
    assert "about its per-request speedup" in idle
    past = q.live_sentence(_result(1.8, 1.2, 1.0))
    assert "past dspark's own capacity" in past
    slower = q.live_sentence(_result(0.5, 0.6, 1.0))
    assert "dspark was not faster than greedy here (0.600 s against 0.500 s)" in slower


def test_live_figure_one_line_per_strategy_in_the_palette():
    from ui.views import palette

    fig = q.live_figure(_result(0.9, 0.6, 1.0))
    assert [t.name for t in fig.data] == ["greedy", "dspark"]
    assert [t.line.color for t in fig.data] == list(palette.LANE_COLORS[:2])


def test_live_headers_and_axis_titles_are_glossary_terms():
    from ui.views import glossary, headers

    plain = frozenset(headers.HEADERS.values())
    result = _result(0.9, 0.6, 1.0)
    fig = q.live_figure(result)
    labels = [*q.live_table(result).columns, fig.layout.xaxis.title.text, fig.layout.yaxis.title.text]
    assert [x for x in labels if not (glossary.is_term(x, plain) or glossary.is_term(x.lower(), plain))] == []
    assert not glossary.is_term("p99 guessed (s)", plain)                    # negative control: not every label passes


def test_a_queue_cut_short_by_the_time_limit_shows_dashes():
    from dataclasses import replace

    result = _result(0.9, 0.6, 1.0)
    cut = replace(result, strategies=(result.strategies[0], replace(result.strategies[1], requests=())))
    table = q.live_table(cut)
    assert list(table.iloc[1]) == ["dspark", q.NA, q.NA, q.NA, q.NA, q.NA, 0]
    assert q.live_sentence(cut).startswith("Too few requests were served")


def test_live_rates_say_what_was_asked_and_what_arrived():
    line = q.live_rates(_result(0.9, 0.6, 2.0))
    assert line == ("Arrival rate asked: 0.500 requests per second, 45% of greedy's capacity as timed alone (0.900 s "
                    "per request); they arrived at 0.500 per second (a random stream of 20 requests).")


def test_live_sentence_warns_when_service_times_spread():
    from dataclasses import replace

    result = _result(0.9, 0.6, 1.0)
    assert "Beware" not in q.live_sentence(result)
    greedy = result.strategies[0]
    slow_one = replace(greedy.requests[3], end_s=greedy.requests[3].start_s + 2.0)
    noisy = replace(result, strategies=(replace(greedy, requests=(*greedy.requests[:3], slow_one,
                                                                  *greedy.requests[4:])), result.strategies[1]))
    assert q.live_sentence(noisy).endswith("Beware: greedy's requests took from 0.900 s to 2.00 s to decode — "
                                           "something else was using the machine; measure again for a cleaner "
                                           "comparison.")
