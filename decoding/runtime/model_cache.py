"""A bounded, least-recently-used cache of loaded models for a server that many sessions share.

Each key (model, device, dtype, model options) is a separate copy of the weights: about 0.5 GB for the
embedded model in float32. A cache of `cap` entries keeps the `cap` most recently used copies; asking
for another key loads it and drops the least recently used one. Nothing a caller passes can keep an
entry from being dropped: a session that still holds a dropped model keeps a working reference (its
run is not affected), and the memory goes when the last such reference does (`on_drop` is the owner's
cue to let go of such references, see ui.widgets.session). Loading happens outside
the cache's lock, once per key at a time (a second caller of the same key waits for the first).
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


class ModelCache(Generic[T]):
    def __init__(self, cap: int, on_drop: Callable[[Hashable], None] | None = None):
        if not (isinstance(cap, int) and cap >= 1):
            raise ValueError(f"cap={cap!r} must be an integer >= 1")
        self.cap = cap
        self._on_drop = on_drop               # told each key dropped (e.g. to drop what was built on it)
        self._held: OrderedDict[Hashable, T] = OrderedDict()   # least recently used first
        self._lock = threading.Lock()
        self._loading: dict[Hashable, threading.Lock] = {}

    def get(self, key: Hashable, load: Callable[[], T]) -> T:
        """The entry for `key`, loaded by `load()` when absent (its errors reach the caller; nothing is
        kept); the entry becomes the most recently used."""
        found, value = self._lookup(key)
        if found:
            return value
        lock = self._key_lock(key)
        with lock:
            try:
                found, value = self._lookup(key)  # loaded by another caller while this one waited
                if not found:
                    value = load()
                    self._put(key, value)
            finally:
                with self._lock:                  # no lock kept per key once loaded or failed
                    if self._loading.get(key) is lock:
                        del self._loading[key]
        return value

    def peek(self, key: Hashable) -> T | None:
        """The entry held for `key` (made the most recently used), or None; never loads."""
        return self._lookup(key)[1]

    def keys(self) -> list[Hashable]:
        """The keys held, least recently used first."""
        with self._lock:
            return list(self._held)

    def values(self) -> list[T]:
        """The entries held, least recently used first."""
        with self._lock:
            return list(self._held.values())

    def holds(self, key: Hashable, value: object) -> bool:
        """Whether `value` is the entry held for `key` now (False once dropped or replaced)."""
        with self._lock:
            return key in self._held and self._held[key] is value

    def drop(self, keep: Callable[[Hashable], bool] | None = None) -> None:
        """Drop every entry (or those whose key `keep` refuses)."""
        with self._lock:
            gone = [k for k in self._held if keep is None or not keep(k)]
            for key in gone:
                del self._held[key]
        self._told(gone)

    def _lookup(self, key: Hashable) -> tuple[bool, T | None]:
        with self._lock:
            if key in self._held:
                self._held.move_to_end(key)
                return True, self._held[key]
            return False, None

    def _put(self, key: Hashable, value: T) -> None:
        with self._lock:
            self._held[key] = value
            self._held.move_to_end(key)
            gone = []
            while len(self._held) > self.cap:
                gone.append(self._held.popitem(last=False)[0])
        self._told(gone)

    def _key_lock(self, key: Hashable) -> threading.Lock:
        with self._lock:
            return self._loading.setdefault(key, threading.Lock())

    def _told(self, gone: list) -> None:
        if self._on_drop is not None:
            for key in gone:
                self._on_drop(key)
