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

The app also leaves one core to its own server and browser (`threads_beside_ui`): an OpenMP team waits
for its slowest thread at every barrier, so a team as wide as the machine stalls whenever the page's
rendering takes a core. Measured on 2 cores, Run to end on the embedded model in the app (200 tokens,
model time): greedy 26–50 s with two threads, 15–18 s with one (8.8 s on the command line, nothing else
running); DSpark 90–183 s against 24 s. `OMP_NUM_THREADS`, when set, is left to decide. Loading a
model runs alone and takes all the threads again (`call_wide`).
"""
from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import torch

T = TypeVar("T")


def threads_beside_ui(default: int | None = None, env: Mapping[str, str] = os.environ) -> int | None:
    """Torch threads for a process that shares the CPU with its UI: one fewer than `default` (torch's
    count when None; at least one); None when OMP_NUM_THREADS is set (the user chose, torch follows it)."""
    if env.get("OMP_NUM_THREADS"):
        return None
    return max(1, (torch.get_num_threads() if default is None else default) - 1)


class EngineThread:
    def __init__(self, name: str = "decodescope-engine"):
        self.name = name
        self._pool: ThreadPoolExecutor | None = None
        self._ident: int | None = None
        self._guard = threading.Lock()
        self._threads_before: int | None = None
        self.threads: int | None = None      # torch threads on the engine thread (None: not enabled)

    @property
    def enabled(self) -> bool:
        return self._pool is not None

    def enable(self, threads: int | None = None) -> None:
        """Start the thread (once; later calls do nothing); `threads`: torch's thread count from then on
        (None: unchanged; `disable` puts back the count it replaced)."""
        with self._guard:
            if self._pool is None:
                if threads is not None:
                    self._threads_before = torch.get_num_threads()
                self.threads = threads if threads is not None else torch.get_num_threads()
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self.name,
                                                initializer=self._start, initargs=(threads,))

    def disable(self) -> None:
        """Let the thread finish what it was given and stop; later calls run in their caller's thread."""
        with self._guard:
            pool, self._pool = self._pool, None
            before, self._threads_before = self._threads_before, None
            self.threads = None
        if pool is not None:
            pool.shutdown(wait=True)
        if before is not None:
            torch.set_num_threads(before)
        self._ident = None

    def _start(self, threads: int | None) -> None:
        """On the new thread: note it, and set its torch thread count there (torch keeps the count per
        thread once a thread has computed; threads started later take the last count set anywhere)."""
        self._ident = threading.get_ident()
        if threads is not None:
            torch.set_num_threads(threads)

    def on_it(self) -> bool:
        return threading.get_ident() == self._ident

    def call(self, fn: Callable[..., T], *args, **kwargs) -> T:
        """fn(*args, **kwargs) on the engine thread (directly when disabled or already on it); its
        exceptions, StopIteration included, are raised here."""
        if self._pool is None or self.on_it():
            return fn(*args, **kwargs)
        return self._pool.submit(fn, *args, **kwargs).result()

    def call_wide(self, fn: Callable[..., T], *args, **kwargs) -> T:
        """`call`, with torch's thread count from before `enable` for the duration: for work that runs
        alone, such as loading a model (converting, packing, warming up), not beside a page being drawn."""
        wide = self._threads_before
        if wide is None:
            return self.call(fn, *args, **kwargs)

        def widened():
            narrow = torch.get_num_threads()
            torch.set_num_threads(wide)
            try:
                return fn(*args, **kwargs)
            finally:
                torch.set_num_threads(narrow)

        return self.call(widened)

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
