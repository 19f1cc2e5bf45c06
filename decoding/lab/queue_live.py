"""The queueing lesson measured live: requests sent at seeded Poisson times (wall clock) into one first-come
server that decodes one at a time, the real decode (decoding.runner.run) on the loaded model.

First each strategy decodes the prompt once untimed (a drafter loads, caches warm) and `calibration` times
timed: the slower (first) strategy's mean service time sets the arrival rate, `load` / that mean. Then per
strategy, at the same seeded arrival times: a client thread puts each request in a FIFO queue when its time
comes (that moment is its arrival), and the server — the caller's thread, whose every decoding step goes to
the engine thread when the app has it on (decoding/runtime/engine_thread.py) — takes the oldest (its start),
decodes it and notes its end. The client only sleeps and enqueues; the server idles outside the engine
thread, so other callers' steps take turns with this queue's (and make it longer).

What it shows is Lindley's recursion in the flesh: wait_{n+1} = max(0, wait_n + service_n − gap_{n+1})."""
from __future__ import annotations

import itertools
import queue
import statistics
import threading
import time
from collections.abc import Generator, Iterator, Sequence

import torch

from decoding.core.config import BaseConfig
from decoding.core.errors import check
from decoding.core.live_queue import LiveQueueConfig, LiveQueueResult, QueuedRequest, QueueSummary, ServiceSample
from decoding.runner import check_inputs, run

LEAD_S = 0.05          # from starting the client to the first arrival: the thread is up before it


def arrival_offsets(rate: float, requests: int, seed: int) -> tuple[float, ...]:
    """Poisson arrival times at `rate` per second, seconds from the first (at 0): exponential gaps of mean
    1 / rate drawn from a generator seeded with `seed`."""
    check(rate > 0, "rate", rate, "must be > 0 requests per second")
    gen = torch.Generator(device="cpu").manual_seed(seed)
    gaps = torch.empty(requests - 1, dtype=torch.float64).exponential_(rate, generator=gen)    # (n − 1,)
    return (0.0, *itertools.accumulate(gaps.tolist()))


def decode(lm, prompt_ids: Sequence[int], config: BaseConfig) -> float:
    """One request decoded to the end: its wall time in seconds; a run that fails raises its one line."""
    start = time.perf_counter()
    trace = run(lm, prompt_ids, config)
    took = time.perf_counter() - start
    if trace.stop_reason == "error":
        raise RuntimeError(trace.error)
    return took


def planned_end(offsets: Sequence[float], service_s: float) -> float:
    """When the last request would end if each took `service_s` (Lindley's recursion on ends)."""
    end = 0.0
    for arrival in offsets:
        end = max(end, arrival) + service_s
    return end


def _client(inbox: queue.Queue, t0: float, offsets: Sequence[float], stop: threading.Event) -> None:
    """Put (index, arrival moment) in `inbox` at t0 + each offset, then None; sooner None once `stop` is set."""
    for index, offset in enumerate(offsets):
        if stop.wait(max(0.0, t0 + offset - time.perf_counter())):
            break
        inbox.put((index, time.perf_counter()))
    inbox.put(None)


def serve(lm, prompt_ids: Sequence[int], config: BaseConfig, offsets: Sequence[float], deadline: float
          ) -> Iterator[QueuedRequest]:
    """The queue of one strategy: requests arrive at `offsets` (seconds after the start), the caller's
    thread serves them oldest first, one at a time, and yields each as it ends; none is taken after
    `deadline` (time.perf_counter)."""
    inbox: queue.Queue = queue.Queue()
    stop = threading.Event()
    t0 = time.perf_counter() + LEAD_S
    client = threading.Thread(target=_client, args=(inbox, t0, offsets, stop), name="decodescope-queue-client",
                              daemon=True)
    client.start()
    try:
        while (item := inbox.get()) is not None and time.perf_counter() < deadline:
            index, arrived = item
            started = time.perf_counter()
            decode(lm, prompt_ids, config)
            yield QueuedRequest(config.strategy, index, arrived - t0, started - t0, time.perf_counter() - t0)
    finally:
        stop.set()
        client.join()


def _calibrate(lm, prompt_ids: Sequence[int], config: BaseConfig, times: int, limit_s: float, deadline: float
               ) -> Iterator[ServiceSample]:
    decode(lm, prompt_ids, config)                       # warm-up: loads a drafter, fills the caches
    for _ in range(times):
        yield ServiceSample(config.strategy, decode(lm, prompt_ids, config))
        check(time.perf_counter() < deadline, "time_limit_s", limit_s,
              "was spent timing the strategies alone, before any queue: the machine is busy or the model slow; "
              "ask fewer new tokens per request")


def _check_time(config: LiveQueueConfig, offsets: Sequence[float], means: Sequence[float], left_s: float) -> None:
    planned = sum(planned_end(offsets, mean) for mean in means)
    check(planned <= left_s, "requests", config.requests,
          f"at load {config.load:g} would take about {planned:.0f} s of queueing here, more than the "
          f"{max(0.0, left_s):.0f} s left of the limit of {config.time_limit_s:g} s: ask fewer requests or a "
          "higher load")


def _calibrate_all(lm, prompt_ids: Sequence[int], strategies: Sequence[BaseConfig], config: LiveQueueConfig,
                   deadline: float) -> Generator[ServiceSample, None, dict[str, tuple[float, ...]]]:
    """Yields each timed request; returns each strategy's service times."""
    calibrated = {}
    for strategy in strategies:
        samples = []
        for sample in _calibrate(lm, prompt_ids, strategy, config.calibration, config.time_limit_s, deadline):
            samples.append(sample.service_s)
            yield sample
        calibrated[strategy.strategy] = tuple(samples)
    return calibrated


def measure_queue(lm, prompt_ids: Sequence[int], strategies: Sequence[BaseConfig],
                  config: LiveQueueConfig | None = None) -> Iterator:
    """Each calibration request (ServiceSample), each queued request (QueuedRequest) as it ends, then the
    LiveQueueResult. `strategies`: the slower one first (its capacity sets the load), each a different strategy."""
    config = config or LiveQueueConfig()
    names = [s.strategy for s in strategies]
    check(len(names) >= 2 and len(set(names)) == len(names), "strategies", names,
          "must be two or more different strategies, the slower first")
    for strategy in strategies:
        check_inputs(lm, prompt_ids, strategy.max_new_tokens)
    deadline = time.perf_counter() + config.time_limit_s
    calibrated = yield from _calibrate_all(lm, prompt_ids, strategies, config, deadline)
    means = [statistics.mean(calibrated[n]) for n in names]
    rate = config.load / means[0]
    offsets = arrival_offsets(rate, config.requests, config.seed)
    _check_time(config, offsets, means, deadline - time.perf_counter())
    summaries = []
    for strategy in strategies:
        served = []
        for request in serve(lm, prompt_ids, strategy, offsets, deadline):
            served.append(request)
            yield request
        summaries.append(QueueSummary(strategy.strategy, calibrated[strategy.strategy], tuple(served)))
    yield LiveQueueResult(config, rate, tuple(summaries))
