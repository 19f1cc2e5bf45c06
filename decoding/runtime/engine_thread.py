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

Turns are fair between sessions: each caller (an owner: the calling thread unless `submit` names one; a
Streamlit session runs its script in one thread at a time) has a queue of its own, and the engine thread
serves the owners in turn, one unit of work each (a step, a round, a load) — so a Run to end in one
session, however long, puts at most one of its steps before another session's Step, whatever it has
queued. (A first-come queue interleaves callers that each wait for one result before asking again, as
the app's do; turns per owner keep that true whatever an owner queues.) `others_ahead` says how many
other owners a new request waits behind (the page shows it). Nothing is kept for an owner with no work.
"""
from __future__ import annotations

import os
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TypeVar

import torch

T = TypeVar("T")


def threads_beside_ui(default: int | None = None, env: Mapping[str, str] = os.environ) -> int | None:
    """Torch threads for a process that shares the CPU with its UI: one fewer than `default` (torch's
    count when None; at least one); None when OMP_NUM_THREADS is set (the user chose, torch follows it)."""
    if env.get("OMP_NUM_THREADS"):
        return None
    return max(1, (torch.get_num_threads() if default is None else default) - 1)


@dataclass(frozen=True)
class _Job:
    fn: Callable
    args: tuple
    kwargs: dict
    future: Future

    def run(self) -> None:
        if not self.future.set_running_or_notify_cancel():
            return
        try:
            result = self.fn(*self.args, **self.kwargs)
        except BaseException as err:        # StopIteration included: the caller raises it
            self.future.set_exception(err)
        else:
            self.future.set_result(result)


class EngineThread:
    def __init__(self, name: str = "decodescope-engine"):
        self.name = name
        self._turn = threading.Condition()
        self._queues: OrderedDict[Hashable, deque[_Job]] = OrderedDict()   # per owner, in turn order
        self._serving: Hashable | None = None    # the owner whose job runs now
        self._worker: threading.Thread | None = None
        self._stopping = False
        self._ident: int | None = None
        self._guard = threading.Lock()
        self._threads_before: int | None = None
        self.threads: int | None = None      # torch threads on the engine thread (None: not enabled)

    @property
    def enabled(self) -> bool:
        return self._worker is not None

    def enable(self, threads: int | None = None) -> None:
        """Start the thread (once; later calls do nothing); `threads`: torch's thread count from then on
        (None: unchanged; `disable` puts back the count it replaced)."""
        with self._guard:
            if self._worker is None:
                if threads is not None:
                    self._threads_before = torch.get_num_threads()
                self.threads = threads if threads is not None else torch.get_num_threads()
                self._stopping = False
                self._worker = threading.Thread(target=self._serve, args=(threads,), name=self.name, daemon=True)
                self._worker.start()

    def disable(self) -> None:
        """Let the thread finish what it was given and stop; later calls run in their caller's thread."""
        with self._guard:
            worker, self._worker = self._worker, None
            before, self._threads_before = self._threads_before, None
            self.threads = None
            if worker is not None:
                with self._turn:
                    self._stopping = True
                    self._turn.notify_all()
                worker.join()
        if before is not None:
            torch.set_num_threads(before)
        self._ident = None

    def _serve(self, threads: int | None) -> None:
        """The engine thread: note it, set its torch thread count there (torch keeps the count per thread
        once a thread has computed; threads started later take the last count set anywhere), then serve
        the owners in turn until stopped with nothing left to do."""
        self._ident = threading.get_ident()
        if threads is not None:
            torch.set_num_threads(threads)
        while (job := self._next_job()) is not None:
            job.run()

    def _next_job(self) -> _Job | None:
        """The first job of the owner whose turn it is (that owner goes to the back of the turn; one with
        nothing left leaves it); None when stopping with no job queued."""
        with self._turn:
            self._serving = None
            while not self._queues and not self._stopping:
                self._turn.wait()
            if not self._queues:
                return None
            owner, queue = self._queues.popitem(last=False)
            if len(queue) > 1:
                self._queues[owner] = queue
            self._serving = owner
            return queue.popleft()

    def submit(self, owner: Hashable | None, fn: Callable[..., T], *args, **kwargs) -> Future:
        """fn(*args, **kwargs) queued for `owner` (None: the calling thread); its Future. Run at once in
        the caller when disabled or on the engine thread."""
        owner = threading.get_ident() if owner is None else owner
        job = _Job(fn, args, kwargs, Future())
        with self._turn:
            queued = self._worker is not None and not self._stopping and not self.on_it()
            if queued:
                self._queues.setdefault(owner, deque()).append(job)
                self._turn.notify()
        if not queued:
            job.run()
        return job.future

    def others_ahead(self, owner: Hashable | None = None) -> int:
        """How many other owners (None: the calling thread) have work running or queued: what a request
        of `owner` made now waits behind, at most one unit of work each."""
        owner = threading.get_ident() if owner is None else owner
        with self._turn:
            busy = set(self._queues) | ({self._serving} if self._serving is not None else set())
        return len(busy - {owner})

    def queued_owners(self) -> int:
        """Owners with work queued (none once their work is done: nothing is kept per owner)."""
        with self._turn:
            return len(self._queues)

    def on_it(self) -> bool:
        return threading.get_ident() == self._ident

    def call(self, fn: Callable[..., T], *args, **kwargs) -> T:
        """fn(*args, **kwargs) on the engine thread (directly when disabled or already on it); its
        exceptions, StopIteration included, are raised here."""
        if self._worker is None or self.on_it():
            return fn(*args, **kwargs)
        return self.submit(None, fn, *args, **kwargs).result()

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
        return gen if self._worker is None else self._stepped(gen)

    def _stepped(self, gen: Iterator[T]) -> Iterator[T]:
        while True:
            try:
                event = self.call(next, gen)
            except StopIteration:
                return
            yield event


ENGINE = EngineThread()
