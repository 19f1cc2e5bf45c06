"""Hand freed heap memory back to the operating system.

glibc's malloc keeps memory that Python and torch free in its arenas (one per thread that allocated),
so a server that frees a dropped model copy of 270 MB may not shrink at all: the next copy is placed
elsewhere and the resident size only grows. `malloc_trim(0)` returns the free pages of every arena.
Elsewhere (macOS, musl, Windows) this is a no-op.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import sys


def _trim():
    """glibc's malloc_trim, or None where there is none."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


_MALLOC_TRIM = _trim()


def give_back() -> bool:
    """Return the allocator's free pages to the OS; whether it could be asked (glibc on Linux)."""
    if _MALLOC_TRIM is None:
        return False
    _MALLOC_TRIM(0)
    return True
