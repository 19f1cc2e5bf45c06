"""The first-come queue: each request is one unit of work on the engine thread
(decoding/runtime/engine_thread.py), all under one owner, so requests decode one at a time in the order
they came; each request's timeline (arrival, start, every token, end) is read on the clock there."""
from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

from decoding.core.config import BaseConfig
from decoding.core.errors import ConfigError
from decoding.runtime.engine_thread import ENGINE

OWNER = "decodescope-serve"          # the engine thread's queue for every request: first come, first served


class Busy(Exception):
    """The queue is full: the request is refused (429)."""


@dataclass
class Timeline:
    """A request's moments on the server's clock (time.perf_counter, seconds)."""

    arrived: float
    started: float | None = None
    tokens: list[float] = field(default_factory=list)    # each moment that added tokens to the answer
    ended: float | None = None

    def summary(self) -> dict:
        """queue_s, ttft_s (None: no token), itl_s (between the moments that added tokens) and e2e_s."""
        gaps = [round(b - a, 6) for a, b in zip(self.tokens, self.tokens[1:])]
        first = round(self.tokens[0] - self.arrived, 6) if self.tokens else None
        return {"queue_s": round(self.started - self.arrived, 6), "ttft_s": first, "itl_s": gaps,
                "e2e_s": round(self.ended - self.arrived, 6)}


class Outbox:
    """Items from the engine thread to the request's coroutine, in order."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop, self.queue = loop, asyncio.Queue()

    def put(self, item: tuple) -> None:
        self._loop.call_soon_threadsafe(self.queue.put_nowait, item)


@dataclass
class Job:
    """One request's work: decode `ids` under `config`. The outbox gets ("tokens", ids) as they come,
    then ("done", trace), ("refused", line) or ("failed", line)."""

    request_id: str
    ids: Sequence[int]
    config: BaseConfig
    prompt_text: str
    outbox: Outbox
    timeline: Timeline
    stop: threading.Event = field(default_factory=threading.Event)
    future: Future | None = None


def event_ids(event) -> list[int]:
    """The ids one step added to the answer (a beam step: none until the search ends)."""
    if event.kind == "beam":
        return []
    return list(event.emitted) if hasattr(event, "emitted") else [event.chosen_id]


class Worker:
    """Runs jobs one at a time: `decode(job)` on the engine thread, then `record(job, trace)`."""

    def __init__(self, decode: Callable, record: Callable, max_waiting: int):
        self._decode, self._record, self.max_waiting = decode, record, max_waiting
        self._lock = threading.Lock()
        self.waiting = 0            # queued, not started
        self.running = 0            # decoding now (0 or 1)

    def submit(self, job: Job) -> None:
        with self._lock:
            if self.waiting + self.running >= self.max_waiting:
                raise Busy(f"queue: {self.waiting + self.running} requests are queued or decoding "
                           f"(at most {self.max_waiting}); try again later")
            self.waiting += 1
        ENGINE.enable()             # once; again only if something disabled it (a test)
        job.future = ENGINE.submit(OWNER, self._work, job)
        job.future.add_done_callback(lambda f: self._cancelled(f) if f.cancelled() else None)

    def cancel(self, job: Job) -> None:
        """The client left: a queued job is dropped, a running one stops after its current step."""
        job.stop.set()
        if job.future is not None:
            job.future.cancel()

    def _cancelled(self, _future) -> None:
        with self._lock:
            self.waiting -= 1

    def _work(self, job: Job) -> None:
        with self._lock:
            self.waiting, self.running = self.waiting - 1, self.running + 1
        job.timeline.started = time.perf_counter()
        try:
            trace = self._decode(job)
        except ConfigError as err:
            job.outbox.put(("refused", str(err)))
            return
        except Exception as err:             # one line, no server path: the type alone
            job.outbox.put(("failed", f"internal error: {type(err).__name__}"))
            return
        finally:
            job.timeline.ended = time.perf_counter()
            with self._lock:
                self.running -= 1
        self._record(job, trace)          # before the reply: a client that reads /metrics next finds its request
        job.outbox.put(("done", trace))
