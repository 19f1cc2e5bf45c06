"""Peak memory of a block of code, for the benchmark tables.

    with peak_memory(lm.device) as mem:
        run_the_contender()
    mem.above_mib            # the most memory held above what was held when the block started

On CUDA: torch.cuda.max_memory_allocated after torch.cuda.reset_peak_memory_stats at the block's start,
less the bytes allocated at its start (tensors only; the caching allocator's reserve is not counted).
On the CPU: the process's resident set size (/proc/self/statm), sampled by a background thread every
`interval_s` while the block runs, less the resident size at its start (taken after a garbage
collection and, with glibc, malloc_trim, so freed heap from earlier blocks does not hide growth).
Allocations that live shorter than the sampling interval can be missed; memory the allocator keeps
after a free counts until the block ends. Without /proc (not Linux) the CPU figure is None.
"""
from __future__ import annotations

import gc
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from decoding.runtime import heap

STATM = "/proc/self/statm"
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
DEFAULT_INTERVAL_S = 0.003
MIB = 2**20


def resident_bytes() -> int | None:
    """This process's resident set size now (None where /proc/self/statm is missing)."""
    try:
        with open(STATM, "rb") as fh:
            return int(fh.read().split()[1]) * PAGE_BYTES
    except (OSError, IndexError, ValueError):
        return None


def _release_free_heap() -> None:
    """Collect garbage and hand free heap pages back to the OS (glibc's malloc_trim; best effort)."""
    gc.collect()
    heap.give_back()


@dataclass
class Peak:
    """Bytes held when the block started and the most held while it ran (None: not measurable)."""

    device: str = "cpu"
    baseline: int | None = None
    peak: int | None = None
    samples: int = 0

    @property
    def above(self) -> int | None:
        if self.baseline is None or self.peak is None:
            return None
        return max(0, self.peak - self.baseline)

    @property
    def above_mib(self) -> float | None:
        return None if self.above is None else self.above / MIB


class _Sampler(threading.Thread):
    """Reads the resident size every `interval_s` until stopped; keeps the largest."""

    def __init__(self, result: Peak, interval_s: float):
        super().__init__(daemon=True, name="peak-rss-sampler")
        self.result, self.interval_s, self.stopped = result, interval_s, threading.Event()

    def sample(self) -> None:
        now = resident_bytes()
        if now is not None:
            self.result.peak = max(self.result.peak or 0, now)
            self.result.samples += 1

    def run(self) -> None:
        while not self.stopped.wait(self.interval_s):
            self.sample()


@contextmanager
def _cpu_peak(interval_s: float) -> Iterator[Peak]:
    _release_free_heap()
    result = Peak(device="cpu", baseline=resident_bytes())
    if result.baseline is None:
        yield result
        return
    result.peak = result.baseline
    sampler = _Sampler(result, interval_s)
    sampler.start()
    try:
        yield result
    finally:
        sampler.stopped.set()
        sampler.join()
        sampler.sample()                       # the block's end counts too


@contextmanager
def _cuda_peak(device: torch.device) -> Iterator[Peak]:
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    result = Peak(device=str(device), baseline=torch.cuda.memory_allocated(device))
    try:
        yield result
    finally:
        torch.cuda.synchronize(device)
        result.peak = torch.cuda.max_memory_allocated(device)
        result.samples = 1


def peak_memory(device: torch.device | str | None = None, interval_s: float = DEFAULT_INTERVAL_S):
    """A context manager yielding a Peak, filled in when the block ends (see the module docstring)."""
    device = torch.device(device or "cpu")
    if device.type == "cuda":
        return _cuda_peak(device)
    return _cpu_peak(interval_s)


def mib_cell(values: list[float | None]) -> str:
    """A table cell: the largest of the measured peaks in MiB, '—' when none was measured."""
    measured = [v for v in values if v is not None]
    return f"{max(measured):.1f}" if measured else "—"


NOTE = "Peak MiB: memory held above the run's start, the largest over its runs (how: see the top of this file)."
