"""What every long-lived wantrain process sets up first: how SIGTERM ends it, and its log lines."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time

__all__ = ["TERM_DEADLINE_S", "exit_on_sigterm", "setup_logging"]

TERM_DEADLINE_S = 10.0    # after SIGTERM, the process is gone within this, cleanup done or not


def exit_on_sigterm(deadline_s: float = TERM_DEADLINE_S) -> None:
    """SIGTERM unwinds like Ctrl-C (so `with Run(...)` stops the processes it started), and ends the
    process within `deadline_s` even where the unwinding cannot finish: interpreter shutdown waits
    for every worker thread, and one inside a long C call (a training step on a loaded machine, a
    numba compile, a model build) holds the process for as long as that call takes. A parent-death
    SIGTERM (launch/local.py) has no SIGKILL after it, so a process that outlived its CLI that way
    stayed (a busy CI run). Its own children die with it the same way; the journal makes a cut-off
    PS lose nothing.

    The handler takes no lock: it runs between two bytecodes of the main thread, and again inside
    itself when a second SIGTERM comes (the kernel sends the parent-death signal once per thread of
    a dying multi-threaded parent). It once took an Event's lock and deadlocked in the second call.
    The deadline is kept by a thread started here that waits on a pipe, which Python's C-level
    handler writes as the signal arrives (`set_wakeup_fd`): the clock starts even while the main
    thread is inside a long C call and cannot run the handler yet."""
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)

    def hard_exit() -> None:
        while os.read(read_end, 1) != bytes([signal.SIGTERM]):     # the pipe also hears SIGINT
            pass
        time.sleep(deadline_s)
        os._exit(143)

    unwinding = False

    def on_sigterm(*_) -> None:
        nonlocal unwinding
        with contextlib.suppress(OSError):     # also where asyncio took the wakeup fd for itself
            os.write(write_end, bytes([signal.SIGTERM]))
        if not unwinding:                       # a repeated SIGTERM must not cut the unwinding short
            unwinding = True
            sys.exit(143)

    threading.Thread(target=hard_exit, name="wantrain-term-deadline", daemon=True).start()
    signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    signal.signal(signal.SIGTERM, on_sigterm)


def setup_logging(level: str = "INFO") -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)


