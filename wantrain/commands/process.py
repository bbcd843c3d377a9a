"""What every long-lived wantrain process sets up first: how SIGTERM ends it, and its log lines."""

from __future__ import annotations

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
    PS lose nothing."""
    armed = threading.Event()

    def hard_exit() -> None:
        time.sleep(deadline_s)
        os._exit(143)

    def on_sigterm(*_) -> None:
        if not armed.is_set():
            armed.set()
            threading.Thread(target=hard_exit, name="wantrain-term-deadline", daemon=True).start()
        sys.exit(143)

    signal.signal(signal.SIGTERM, on_sigterm)


def setup_logging(level: str = "INFO") -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)


