"""The live queue (decoding/lab/queue_live.py) on a tiny model: requests sent at seeded Poisson times into one
first-come server that really decodes them. The oracle: every measured wait equals Lindley's recursion — the
one the simulation uses (ui.views.queueing.latencies) — applied to the measured service times and the actual
arrival times, within scheduling jitter; negative control: the recursion without its max(0, ·) fails the same
check wherever the server went idle. Also: first come, first served; arrivals at the seeded times, the same for
both strategies; the arrival rate set from the slower one's calibration; bad settings refused naming the
parameter. The two strategies are greedy and sampling (each one forward per token): the oracle is about the
queue, not about a speedup."""
from __future__ import annotations

import statistics

import numpy as np
import pytest

from decoding.core.config import GreedyConfig, SampleConfig
from decoding.core.errors import ConfigError
from decoding.core.live_queue import LiveQueueConfig, LiveQueueResult, QueuedRequest, ServiceSample
from decoding.lab.queue_live import arrival_offsets, measure_queue, planned_end
from ui.views.queueing import latencies

# The server's wake-up when a request arrives at an idle queue, and its bookkeeping between two requests:
# below 1 ms on a quiet machine, 8 ms measured on this 2-core one at a load average of 6.
JITTER_S = 0.02
# The client's own wake-up at an arrival time while the server decodes (it waits for the GIL, handed over every
# 5 ms, and for a core): 38 ms measured at a load average of 8. Its lateness does not enter the oracle, which
# reads the arrival the client stamped.
LATE_S = 0.1
PROMPT = [3, 9, 4, 9, 4, 9, 4, 17]
STRATEGIES = (GreedyConfig(max_new_tokens=8, top_n=3), SampleConfig(max_new_tokens=8, top_n=3, seed=1))
CONFIG = LiveQueueConfig(load=0.6, requests=8, calibration=2, seed=29)   # gaps: a long idle one, then a burst


@pytest.fixture(scope="module")
def measured(lm):
    return list(measure_queue(lm, PROMPT, STRATEGIES, CONFIG))


def lindley_waits(requests, floor: bool = True) -> np.ndarray:
    """Waits from the actual arrivals and the measured services: the simulation's recursion (floor) or the
    same without its max(0, ·) (the negative control)."""
    arrivals = np.array([r.arrival_s for r in requests])
    service = np.array([r.service_s for r in requests])
    gaps = np.diff(arrivals, prepend=arrivals[0])
    if floor:
        return latencies(service, gaps) - service
    return np.concatenate([[0.0], np.cumsum(service[:-1] - gaps[1:])])


def test_events_in_order_and_the_result_last(measured):
    assert len(measured) == CONFIG.events(2)
    assert [type(e) for e in measured[:4]] == [ServiceSample] * 4
    assert all(isinstance(e, QueuedRequest) for e in measured[4:-1])
    result = measured[-1]
    assert isinstance(result, LiveQueueResult)
    assert [s.strategy for s in result.strategies] == ["greedy", "sample"]
    assert [len(s.requests) for s in result.strategies] == [8, 8]


def test_measured_waits_follow_lindleys_recursion(measured):
    for summary in measured[-1].strategies:
        waits = np.array([r.wait_s for r in summary.requests])
        assert np.abs(waits - lindley_waits(summary.requests)).max() < JITTER_S, summary.strategy


def test_negative_control_the_recursion_without_its_floor_misses(measured):
    """The same check fails for the recursion without max(0, ·), on every queue where the server went idle."""
    for summary in measured[-1].strategies:
        requests = summary.requests
        if max(b.arrival_s - a.end_s for a, b in zip(requests, requests[1:])) > JITTER_S:
            waits = np.array([r.wait_s for r in requests])
            assert np.abs(waits - lindley_waits(requests, floor=False)).max() > JITTER_S, summary.strategy
    greedy = measured[-1].strategies[0].requests
    assert max(b.arrival_s - a.end_s for a, b in zip(greedy, greedy[1:])) > JITTER_S     # it did, at least once


def test_a_queue_formed(measured):
    """Some request waited behind another (else the oracle would only check waits of 0)."""
    assert max(r.wait_s for r in measured[-1].strategies[0].requests) > JITTER_S


def test_first_come_first_served_one_at_a_time(measured):
    for summary in measured[-1].strategies:
        requests = summary.requests
        assert [r.index for r in requests] == list(range(len(requests)))
        assert all(r.arrival_s <= r.start_s < r.end_s for r in requests)
        assert all(a.end_s <= b.start_s for a, b in zip(requests, requests[1:]))   # never two at once


def test_arrivals_at_the_seeded_times_the_same_for_both(measured):
    result = measured[-1]
    offsets = arrival_offsets(result.arrival_rate, CONFIG.requests, CONFIG.seed)
    for summary in result.strategies:
        late = np.array([r.arrival_s for r in summary.requests]) - np.array(offsets)
        assert late.min() > -0.002 and late.max() < LATE_S, summary.strategy


def test_the_arrival_rate_is_the_load_over_the_slower_ones_service(measured):
    result = measured[-1]
    assert result.arrival_rate == pytest.approx(0.6 / statistics.mean(result.strategies[0].calibrated_s))
    assert [e.strategy for e in measured[:4]] == ["greedy", "greedy", "sample", "sample"]


def test_arrival_offsets_are_seeded_poisson():
    a = arrival_offsets(2.0, 20_000, 3)
    assert a == arrival_offsets(2.0, 20_000, 3) and a != arrival_offsets(2.0, 20_000, 4)
    gaps = np.diff(a)
    assert a[0] == 0.0 and (gaps > 0).all()
    assert gaps.mean() == pytest.approx(0.5, rel=0.03)
    assert gaps.std() == pytest.approx(0.5, rel=0.05)          # exponential: its spread equals its mean
    assert np.median(gaps) == pytest.approx(0.5 * np.log(2), rel=0.05)


def test_planned_end_by_hand():
    assert planned_end((0.0, 0.5, 3.0), 1.0) == 4.0       # the second waits 0.5 s, the third finds it idle


@pytest.mark.parametrize("kwargs, param", [({"load": 0}, "load"), ({"load": 2.5}, "load"),
                                           ({"load": "x"}, "load"), ({"requests": 41}, "requests"),
                                           ({"requests": 4}, "requests"), ({"calibration": 0}, "calibration"),
                                           ({"seed": -1}, "seed"), ({"time_limit_s": 0}, "time_limit_s")])
def test_bad_settings_are_refused_by_name(kwargs, param):
    with pytest.raises(ConfigError) as err:
        LiveQueueConfig(**kwargs)
    assert str(err.value).startswith(param) and "\n" not in str(err.value)


def test_two_of_the_same_strategy_are_refused(lm):
    with pytest.raises(ConfigError, match="^strategies"):
        next(measure_queue(lm, PROMPT, (GreedyConfig(max_new_tokens=4), GreedyConfig(max_new_tokens=8))))


def test_a_queue_longer_than_the_time_limit_is_refused_before_it_starts(lm):
    config = LiveQueueConfig(load=0.01, requests=40, calibration=1, time_limit_s=10)   # 3,900 services planned
    events = measure_queue(lm, PROMPT, STRATEGIES, config)
    with pytest.raises(ConfigError, match="^requests.*fewer requests"):
        list(events)


def test_calibration_past_the_time_limit_stops_with_one_line(lm):
    config = LiveQueueConfig(calibration=3, time_limit_s=1e-6)
    with pytest.raises(ConfigError, match="^time_limit_s=1e-06 is invalid: was spent timing the strategies alone"):
        list(measure_queue(lm, PROMPT, STRATEGIES, config))


def test_no_request_is_taken_past_the_deadline(lm):
    import time

    from decoding.lab.queue_live import serve

    assert list(serve(lm, PROMPT, STRATEGIES[0], (0.0, 0.001, 0.002), time.perf_counter())) == []
    assert len(list(serve(lm, PROMPT, STRATEGIES[0], (0.0, 0.001), time.perf_counter() + 60))) == 2
