"""How a wantrain process (the PS, a site) holds its memory: fewer malloc arenas, and the heap given
back between rounds.

glibc's malloc gives each thread that allocates an arena of its own (up to 8 per core), and keeps
what is freed in it. A site's threads (the training thread, the codec's pool, gRPC's) each held
tens of MB that way: measured with bench/binder_memory.py, three sites, the PS and a kernel took
1.8 GB where a Binder session has 2. One arena costs no measurable speed here (114 ms a step of
`tiny` either way); trimming at the end of a round (a site's push, the PS's commit) returns the
round's scratch memory to the system while the other processes do their part of the round. Both
are no-ops where the C library is not glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

__all__ = ["limit_malloc_arenas", "trim_heap"]

_M_ARENA_MAX = -8        # mallopt's parameter number (malloc.h)


@functools.cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


def limit_malloc_arenas(arenas: int = 1) -> bool:
    """At most `arenas` malloc arenas for the threads to come (call at the process's start)."""
    libc = _libc()
    return bool(libc is not None and libc.mallopt(_M_ARENA_MAX, arenas))


def trim_heap() -> None:
    """Give the memory malloc holds free back to the system (a few ms)."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)
