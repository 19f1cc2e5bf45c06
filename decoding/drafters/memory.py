"""What the training-free sources learn while they draft: token recycling's table (what the target said after
each token) and suffix matching's store (the text runs read and wrote). It belongs to whoever holds it, never
to the model: a run given no memory starts from an empty one of its own, so its drafts depend on its own
prompt and settings alone (a trace reproduces, and nothing one user's run read reaches another's). A caller
that wants later runs to start warm passes the same SourceMemory to each; the app keeps none between runs.
"""
from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence

from decoding.core.draft_names import TRAINING_FREE
from decoding.core.trace import DraftingInfo
from decoding.drafters.recycling import RecyclingTable
from decoding.drafters.suffix import SuffixStore

EMPTY = "empty"


class SourceMemory:
    """One recycling table and one suffix store, made on first use. The table is sized by the model's
    vocabulary; a run on another model starts both afresh (what one model said predicts nothing of another)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.model: tuple | None = None           # (name, vocab size) of the model the memory was filled by
        self.runs = 0                              # runs that started from this memory
        self._table: RecyclingTable | None = None
        self._store: SuffixStore | None = None

    def start(self, lm) -> str:
        """A run of `lm` begins with this memory: what it starts from, in words ("empty", "3 earlier runs")."""
        with self.lock:
            model = (str(lm.name), int(lm.vocab_size))
            if model != self.model:
                self.model, self.runs, self._table, self._store = model, 0, None, None
            earlier, self.runs = self.runs, self.runs + 1
        return describe(earlier)

    def recycling_table(self, vocab_size: int) -> RecyclingTable:
        with self.lock:
            if self._table is None or len(self._table.next_ids) != vocab_size:
                self._table = RecyclingTable(vocab_size)
            return self._table

    def suffix_store(self) -> SuffixStore:
        with self.lock:
            if self._store is None:
                self._store = SuffixStore()
            return self._store

    def copy(self) -> SourceMemory:
        """An independent memory holding what this one holds now (a benchmark's fixed warm state)."""
        other = SourceMemory()
        with self.lock:
            other.model, other.runs = self.model, self.runs
            if self._table is not None:
                other._table = RecyclingTable(len(self._table.next_ids), self._table.next_ids.shape[1])
                other._table.restore(self._table.snapshot())
            if self._store is not None:
                other._store = SuffixStore(self._store.max_tokens)
                other._store.restore(self._store.snapshot())
        return other

    def clear(self) -> None:
        """Forget everything (the next run starts empty)."""
        with self.lock:
            self.model, self.runs, self._table, self._store = None, 0, None, None


def describe(earlier_runs: int) -> str:
    """A run's starting memory as its trace records it."""
    if earlier_runs == 0:
        return EMPTY
    return f"{earlier_runs} earlier run{'s' if earlier_runs != 1 else ''}"


def uses_memory(names: Sequence[str]) -> bool:
    """Whether any of the named sources learns across rounds (and so from a memory)."""
    return any(name in TRAINING_FREE for name in names)


def run_memory(memory: SourceMemory | None, lm, info: DraftingInfo) -> tuple[SourceMemory, DraftingInfo]:
    """The memory a run of `lm` drafts from (a fresh, empty one when none is given) and its drafting record
    saying what that memory held, when one of its sources reads it. Call before the sources are made."""
    memory = SourceMemory() if memory is None else memory
    if not uses_memory(info.sources):
        return memory, info
    return memory, dataclasses.replace(info, memory=memory.start(lm))


def planned_memory(info: DraftingInfo) -> DraftingInfo:
    """The drafting record of a run that is given no memory (the app's, the CLI's): "empty" where a source reads it."""
    return dataclasses.replace(info, memory=EMPTY) if uses_memory(info.sources) else info
