"""Processes the test session leaves behind, found through /proc and killed.

Every test stops what it starts; this is the net under that rule. At the end of the session
(and of each test module) the processes descended from pytest are listed; any still alive a
few seconds later are killed and named in the session's summary, so that a test that leaks a
process is found, and CI never waits on one. The session's own warm starter is not a leak."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def _parents() -> dict[int, int]:
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses; ppid follows the last ")".
        out[int(d.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return out


def descendants(root: int) -> list[int]:
    parents = _parents()
    found, frontier = [], [root]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parents.items() if pp == p]
        found += kids
        frontier += kids
    return found


def _describe(pid: int) -> str:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        cmd = "?"
    return f"{pid}: {cmd[:160]}"


def _own_warm_starter(pid: int, root: int) -> bool:
    """This process's warm starter (wantrain/launch/warm.py): it serves the whole session, and its
    children, the processes the tests started, are reaped like any other."""
    try:
        parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        return parent == root and "wantrain.launch.warm" in _describe(pid)
    except (OSError, ValueError, IndexError):
        return False


def reap(grace_s: float = 5.0, root: int | None = None) -> list[str]:
    """Wait up to grace_s for pytest's descendants to exit, SIGKILL the rest; their descriptions."""
    root = root or os.getpid()
    deadline = time.monotonic() + grace_s
    while True:
        left = [p for p in descendants(root) if not _is_zombie(p) and not _own_warm_starter(p, root)]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    named = [_describe(p) for p in left]
    for p in left:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return named


def _is_zombie(pid: int) -> bool:
    try:
        return (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]) == "Z"
    except OSError:
        return True
