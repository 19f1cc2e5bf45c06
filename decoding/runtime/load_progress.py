"""What the model load in progress is doing, for a page to show while it waits. Loads run one at a time
(models.load runs alone on the engine thread), so one record serves the process: the loader reports each
stage as it begins (report), a page reads it from another thread (current), the load clears it at the end
(loading).
A stage's `at` is the share of a first start on an empty cache done when it begins (the embedded model,
measured: docs/app.md, "Speed"), for a progress bar; a start with the converted copy on disk begins at
"load" (at 0) and skips the first-start stages. The kernel timing's share varies most: it is a benchmark,
slowed several times over when other processes load the CPU."""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class Stage:
    key: str
    text: str
    at: float                  # share of a first start done when this stage begins, in [0, 1)


STAGES = {s.key: s for s in (     # `at`: a first start in a quiet moment here (2 CPUs): 15 s, kernels 5 s of it
    Stage("read", "Reading the GGUF file: tokenizer and config (first start only)", 0.0),
    Stage("dequantize", "Dequantizing the weights to float32 (first start only)", 0.35),
    Stage("save", "Saving the converted copy to the cache (first start only)", 0.6),
    Stage("load", "Loading the converted model from the cache", 0.0),    # a later start begins here
    Stage("pack", "Packing the weights for the CPU's matrix kernels", 0.62),
    Stage("tune", "Timing the matrix kernels on this CPU (first start only)", 0.65),
    Stage("warm", "Warming up the model", 0.95),
)}


@dataclass(frozen=True)
class Current:
    stage: Stage
    since: float               # time.monotonic() when the stage began


_lock = threading.Lock()
_current: Current | None = None
_active = 0                    # loads in progress (loading() blocks)


def report(key: str) -> None:
    """The load has begun stage `key` (one of STAGES); ignored outside loading() (the same code run for
    another purpose, such as a benchmark's plan)."""
    global _current
    stage = STAGES[key]
    with _lock:
        if _active:
            _current = Current(stage, time.monotonic())


def current() -> Current | None:
    """The stage of the load in progress; None when no load reports one."""
    with _lock:
        return _current


@contextmanager
def loading() -> Iterator[None]:
    """A load: stages reported within it; the record cleared when it ends, however it ends."""
    global _current, _active
    with _lock:
        _active += 1
    try:
        yield
    finally:
        with _lock:
            _active -= 1
            _current = None
