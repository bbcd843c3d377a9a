"""The process's one pool of threads for CPU-bound work that releases the GIL: the compiled
Huffman loops (a payload's blocks), the PS's per-chunk round step (numpy on large arrays) and its
decoding of delta chunks as they arrive.

One pool, sized by the cores, so that its users never oversubscribe the machine between them.
Work handed to it from one of its own threads runs on that thread: a job that waited for jobs
queued behind it on a full pool would never finish.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

__all__ = ["cores", "map_ordered", "submit"]

T = TypeVar("T")
R = TypeVar("R")

_PREFIX = "wantrain-cpu"
_pool: ThreadPoolExecutor | None = None
_lock = threading.Lock()


def cores() -> int:
    """The cores this process may run on (its affinity mask, as taskset or a container sets it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:                           # not on Linux
        return os.cpu_count() or 1


def map_ordered(fn: Callable[[T], R], items: Iterable[T], threads: int | None = None) -> list[R]:
    """[fn(x) for x in items], on the pool unless `threads` is 1, there is one item, or the caller
    is itself one of the pool's threads. Results keep the order of `items`."""
    todo = list(items)
    if threads == 1 or len(todo) < 2 or threading.current_thread().name.startswith(_PREFIX) or cores() < 2:
        return [fn(x) for x in todo]
    return list(_the_pool().map(fn, todo))


def submit(fn: Callable[..., R], *args: object) -> Future[R]:
    """Run fn(*args) on the pool, for a caller that collects the result later (a chunk decoded
    as it arrives, collected when its delta is complete)."""
    return _the_pool().submit(fn, *args)


def _the_pool() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=cores(), thread_name_prefix=_PREFIX)
        return _pool
