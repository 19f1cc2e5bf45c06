"""One thread for all of the engine's tensor work in a process whose callers come from many threads.

Why: on the CPU build of torch every thread that runs a parallel region (a matrix product, most ops on
a large tensor) gets an OpenMP team of its own, and while two teams live every team is slower: measured
on 2 cores, a one-token forward of the embedded model took 30 ms in the thread that loaded it, 52–59 ms
in any other thread, and 53 ms in the first thread again once a second thread had run one matrix
product (still two seconds later). Streamlit runs each rerun in a thread that ends with it, so one
browser session mostly escapes this; two sessions stepping at once do not: two greedy runs of 48
tokens in two threads took 5.4 s together, 3.2 s through the engine thread. The app enables it at
start-up; then loading, warming up and every step of every run go through `call`, one team does all
the work, and calls from many threads queue here one step at a time (the model's lock serialised each
forward anyway). Disabled — the default, for the command line, the benchmarks and code that drives the
engine from one thread — `call` just calls.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


class EngineThread:
    def __init__(self, name: str = "decodescope-engine"):
        self.name = name
        self._pool: ThreadPoolExecutor | None = None
        self._ident: int | None = None
        self._guard = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self._pool is not None

    def enable(self) -> None:
        """Start the thread (once; later calls do nothing)."""
        with self._guard:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self.name,
                                                initializer=self._note_ident)

    def disable(self) -> None:
        """Let the thread finish what it was given and stop; later calls run in their caller's thread."""
        with self._guard:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
        self._ident = None

    def _note_ident(self) -> None:
        self._ident = threading.get_ident()

    def on_it(self) -> bool:
        return threading.get_ident() == self._ident

    def call(self, fn: Callable[..., T], *args, **kwargs) -> T:
        """fn(*args, **kwargs) on the engine thread (directly when disabled or already on it); its
        exceptions, StopIteration included, are raised here."""
        if self._pool is None or self.on_it():
            return fn(*args, **kwargs)
        return self._pool.submit(fn, *args, **kwargs).result()

    def steps(self, gen: Iterator[T]) -> Iterator[T]:
        """`gen` advanced on the engine thread one event at a time, so that other callers take turns
        between events (`gen` itself when disabled)."""
        return gen if self._pool is None else self._stepped(gen)

    def _stepped(self, gen: Iterator[T]) -> Iterator[T]:
        while True:
            try:
                event = self.call(next, gen)
            except StopIteration:
                return
            yield event


ENGINE = EngineThread()
