"""The queueing lesson (Lab, "Queueing"): one server decoding one request at a time (as `python -m decoding
serve` does), requests arriving at random (Poisson) — an M/D/1 queue when every request takes the same
time, M/G/1 when service times are drawn from measured ones. Simulated with Lindley's recursion, seeded:
wait_{n+1} = max(0, wait_n + service_n − gap_{n+1}); a request's latency is its wait plus its service.
A strategy k× faster per request lowers the load ρ by k as well, and the wait grows like ρ/(1−ρ): near the
slower strategy's capacity the P99 falls by far more than k; past the faster one's capacity both grow
without bound."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from decoding.core.formulas import percentile
from ui.views import palette

NA = "—"


@dataclass(frozen=True)
class QueueSetup:
    """`service_s`: the measured (or one fixed) service times of the slower strategy, seconds; `speedup`:
    how many times faster per request the other one is; `loads`: arrival rates as fractions of the slower
    strategy's capacity (1 / its mean service time)."""

    service_s: tuple[float, ...]
    speedup: float
    loads: tuple[float, ...]
    requests: int = 4000
    seed: int = 0

    def __post_init__(self):
        if not self.service_s or min(self.service_s) <= 0:
            raise ValueError(f"service_s={self.service_s[:3]} must be times > 0")
        if not self.speedup >= 1:
            raise ValueError(f"speedup={self.speedup} must be >= 1")
        if not self.loads or min(self.loads) <= 0:
            raise ValueError(f"loads={self.loads} must be > 0")


def latencies(service: np.ndarray, gaps: np.ndarray) -> np.ndarray:
    """Each request's wait + service in a first-come queue with one server (Lindley's recursion);
    `gaps[i]` is the time between arrivals i−1 and i (gaps[0] unused)."""
    wait, out = 0.0, np.empty_like(service)
    for i, s in enumerate(service):
        if i:
            wait = max(0.0, wait + service[i - 1] - gaps[i])
        out[i] = wait + s
    return out


def simulate(setup: QueueSetup, load: float, faster: bool) -> np.ndarray:
    """Latencies of `setup.requests` requests at `load`; the same arrivals and draws for both strategies."""
    rng = np.random.default_rng(setup.seed)
    measured = np.asarray(setup.service_s, dtype=float)
    mean = measured.mean()
    gaps = rng.exponential(mean / load, size=setup.requests)
    service = rng.choice(measured, size=setup.requests) / (setup.speedup if faster else 1.0)
    return latencies(service, gaps)


def p99_table(setup: QueueSetup) -> pd.DataFrame:
    """Per load: P99 latency of each strategy (ms) and how many times lower the faster one's is; "—"
    where a strategy's load is 1 or more (its queue grows without bound: no steady P99)."""
    rows = []
    for load in setup.loads:
        slow = percentile(simulate(setup, load, False), 99) if load < 1 else None
        fast = percentile(simulate(setup, load, True), 99) if load / setup.speedup < 1 else None
        rows.append({"Load (of the slower strategy's capacity)": f"{load:.0%}",
                     "P99, slower (ms)": NA if slow is None else f"{slow * 1000:,.0f}",
                     "P99, faster (ms)": NA if fast is None else f"{fast * 1000:,.0f}",
                     "P99 lower by": NA if slow is None or fast is None else f"{slow / fast:.1f}×"})
    return pd.DataFrame(rows)


def p99_figure(setup: QueueSetup) -> go.Figure:
    fig = go.Figure()
    for faster, name in ((False, "slower strategy"), (True, f"{setup.speedup:g}× faster per request")):
        cap = setup.speedup if faster else 1.0
        loads = [x for x in setup.loads if x / cap < 1]
        p99 = [percentile(simulate(setup, x, faster), 99) * 1000 for x in loads]
        fig.add_scatter(x=[x * 100 for x in loads], y=p99, mode="lines+markers", name=name,
                        line={"color": palette.LANE_COLORS[faster], "dash": palette.LANE_DASHES[faster]})
    fig.update_layout(height=340, margin={"l": 10, "r": 10, "t": 30, "b": 10},
                      title="P99 latency against load (one request decoding at a time)",
                      xaxis_title="Load (% of the slower strategy's capacity)", yaxis_title="P99 latency (ms)")
    return fig


def measured_service(rows: Sequence, strategy: str) -> tuple[float, ...]:
    """A request log's decoding times (end to end − queue) of one strategy, seconds."""
    return tuple(r.e2e_s - r.queue_s for r in rows if r.strategy == strategy and r.e2e_s > r.queue_s)


# ---------------------------------------------------------------- measured live (decoding/lab/queue_live.py)
def simulated_p99(service_s: Sequence[float], rate: float, requests: int = 4000, seed: int = 0) -> float | None:
    """The simulation's P99 latency (s) for requests drawn from `service_s` arriving at `rate` per second;
    None where that load is 1 or more (no steady P99)."""
    load = rate * float(np.mean(service_s))
    if not load < 1:
        return None
    setup = QueueSetup(tuple(service_s), 1.0, (load,), requests=requests, seed=seed)
    return percentile(simulate(setup, load, False), 99)


def _seconds(value: float | None) -> str:
    """Seconds to three significant digits (a tiny model's 0.0183 s and the embedded model's 0.912 s alike)."""
    return NA if value is None else f"{value:#.3g}"


def live_table(result) -> pd.DataFrame:
    """Per strategy of a LiveQueueResult: its mean service time, the load ρ it ran at, its measured P50 and
    P99 latency and the simulation's P99 for its measured service times at the measured arrival rate."""
    rows = []
    for s in result.strategies:
        served = len(s.requests) >= 2
        service = [r.service_s for r in s.requests]
        rows.append({"Strategy": s.strategy,
                     "Service, mean (s)": _seconds(s.service_mean_s if served else None),
                     "Load ρ": f"{s.load:.0%}" if served else NA,
                     "P50 measured (s)": _seconds(s.latency_s(50) if served else None),
                     "P99 measured (s)": _seconds(s.latency_s(99) if served else None),
                     "P99 simulated (s)": _seconds(simulated_p99(service, s.arrival_rate) if served else None),
                     "Requests": len(s.requests)})
    return pd.DataFrame(rows)


def live_rates(result) -> str:
    """The arrival rate asked (from the slower strategy timed alone) and the one the requests arrived at."""
    slow = result.strategies[0]
    alone = sum(slow.calibrated_s) / len(slow.calibrated_s)
    arrived = (f"; they arrived at {slow.arrival_rate:#.3g} per second (a random stream of "
               f"{len(slow.requests)} requests)" if len(slow.requests) >= 2 else "")
    return (f"Arrival rate asked: {result.arrival_rate:#.3g} requests per second, {result.config.load:.0%} of "
            f"{slow.strategy}'s capacity as timed alone ({_seconds(alone)} s per request){arrived}.")


def live_sentence(result) -> str:
    """What the student sees, in words: the faster strategy's P99 ratio against its per-request speedup."""
    slow, fast = result.strategies[0], result.strategies[-1]
    if min(len(slow.requests), len(fast.requests)) < 2:
        return "Too few requests were served before the time limit to compare the two queues."
    speedup = slow.service_mean_s / fast.service_mean_s
    each = f"{_seconds(fast.service_mean_s)} s against {_seconds(slow.service_mean_s)} s"
    if speedup < 1:
        return (f"Per request, {fast.strategy} was not faster than {slow.strategy} here ({each}), so the queue has no "
                "speedup to multiply: try the other faster strategy, or a prompt it speeds up.")
    ratio = slow.latency_s(99) / fast.latency_s(99)
    words = (f"Per request, {fast.strategy} was {speedup:.2f}× as fast as {slow.strategy} ({each}); in the queue at "
             f"{slow.load:.0%} of {slow.strategy}'s capacity its P99 latency was {ratio:.2f}× lower "
             f"({_seconds(fast.latency_s(99))} s against {_seconds(slow.latency_s(99))} s)")
    return words + _verdict(fast, speedup, ratio) + _spread_note(result.strategies)


def _spread_note(strategies) -> str:
    """A warning when a strategy's service times spread widely (the slowest over twice the median): something
    else was using the machine while it decoded."""
    for s in strategies:
        service = sorted(r.service_s for r in s.requests)
        if service[-1] > 2 * percentile(service, 50):
            return (f" Beware: {s.strategy}'s requests took from {_seconds(service[0])} s to {_seconds(service[-1])} "
                    "s to decode — something else was using the machine; measure again for a cleaner comparison.")
    return ""


def _verdict(fast, speedup: float, ratio: float) -> str:
    if fast.load >= 1:
        return (f": past {fast.strategy}'s own capacity (ρ {fast.load:.0%}) both queues grow with every request, the "
                "P99 says mostly how many were sent, and only more servers or batching help.")
    if ratio > 1.05 * speedup:
        return (": more than its per-request speedup, because waiting behind others shrank by more than each "
                "request's own decoding did.")
    if ratio >= speedup / 1.05:
        return ": about its per-request speedup — at this load few requests waited behind others."
    return (f": less than its per-request speedup — with {len(fast.requests)} requests the P99 is nearly the slowest "
            "one, and one unlucky request decides it.")


def live_figure(result) -> go.Figure:
    """Each request's latency against its arrival time, one line per strategy: the queue building and draining."""
    fig = go.Figure()
    for i, s in enumerate(result.strategies):
        fig.add_scatter(x=[r.arrival_s for r in s.requests], y=[r.latency_s for r in s.requests],
                        mode="lines+markers", name=s.strategy,
                        line={"color": palette.LANE_COLORS[i % 4], "dash": palette.LANE_DASHES[i % 4]})
    fig.update_layout(height=320, margin={"l": 10, "r": 10, "t": 30, "b": 10},
                      title="Each request's latency, measured live (same arrival times)",
                      xaxis_title="Arrival (s after the first)", yaxis_title="Latency (s, wait + decoding)")
    return fig
