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
