"""The live queue's settings and records as plain data (decoding/lab/queue_live.py measures them): requests
sent at seeded Poisson times into one first-come server that decodes one at a time, each request's arrival,
start and end on the wall clock. No torch, so the app can read them."""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from numbers import Real

from decoding.core.errors import check, check_number
from decoding.core.formulas import percentile

MAX_QUEUE_REQUESTS = 40        # requests per strategy: a measurement stays within tens of seconds
MAX_QUEUE_LOAD = 2.0           # past the slower strategy's capacity, so where a speedup stops helping shows too


@dataclass(frozen=True)
class LiveQueueConfig:
    """`load`: the arrival rate as a share of the slower (first) strategy's capacity, 1 / its mean service
    time measured just before; `requests` per strategy, every strategy's at the same seeded times;
    `calibration`: timed requests per strategy before the queue (after one untimed warm-up);
    `time_limit_s`: a measurement planned to take longer is refused, one running longer stops sending."""
    load: float = 0.8
    requests: int = 20
    calibration: int = 3
    seed: int = 0
    time_limit_s: float = 240.0

    def __post_init__(self):
        check(isinstance(self.load, Real) and not isinstance(self.load, bool) and 0 < self.load <= MAX_QUEUE_LOAD,
              "load", self.load, f"must be a number in (0, {MAX_QUEUE_LOAD:g}]")
        for name, low, most in (("requests", 5, MAX_QUEUE_REQUESTS), ("calibration", 1, 10)):
            value = getattr(self, name)
            check(isinstance(value, int) and not isinstance(value, bool) and low <= value <= most, name, value,
                  f"must be an integer in [{low}, {most}]")
        check(isinstance(self.seed, int) and not isinstance(self.seed, bool) and self.seed >= 0, "seed", self.seed,
              "must be an integer >= 0")
        check_number("time_limit_s", self.time_limit_s, 0.0, above=True, below=3600.0)

    def events(self, strategies: int) -> int:
        """Events a measurement of `strategies` yields: each calibration request, each queued one, the result."""
        return strategies * (self.calibration + self.requests) + 1


@dataclass(frozen=True)
class ServiceSample:
    """One request timed alone before the queue (calibration)."""
    strategy: str
    service_s: float


@dataclass(frozen=True)
class QueuedRequest:
    """One request of the queue, seconds from the queue's start (its first planned arrival)."""
    strategy: str
    index: int               # its place in the order of arrival
    arrival_s: float         # when the client put it in the queue
    start_s: float           # when the server took it
    end_s: float             # when its decoding ended

    @property
    def wait_s(self) -> float:
        return self.start_s - self.arrival_s

    @property
    def service_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def latency_s(self) -> float:
        return self.end_s - self.arrival_s


@dataclass(frozen=True)
class QueueSummary:
    """One strategy's queue: its calibration times and every request it served."""
    strategy: str
    calibrated_s: tuple[float, ...]
    requests: tuple[QueuedRequest, ...]

    @property
    def service_mean_s(self) -> float:
        return statistics.mean(r.service_s for r in self.requests)

    @property
    def arrival_rate(self) -> float:
        """Requests per second as they arrived: (n − 1) over the time from the first arrival to the last."""
        span = self.requests[-1].arrival_s - self.requests[0].arrival_s
        return (len(self.requests) - 1) / span if span > 0 else float("inf")

    @property
    def load(self) -> float:
        """ρ as measured: the arrival rate times the mean service time."""
        return self.arrival_rate * self.service_mean_s

    def latency_s(self, q: float) -> float:
        """The q-th percentile (0..100) of the requests' latencies (wait + service)."""
        return percentile([r.latency_s for r in self.requests], q)


@dataclass(frozen=True)
class LiveQueueResult:
    config: LiveQueueConfig
    arrival_rate: float                      # requests per second asked: load / the slower one's calibrated mean
    strategies: tuple[QueueSummary, ...]     # the slower first
