"""The tcconfig backend: play a trace on a named interface of a real host with tcset / tcdel.

For real hosts: `python -m testbed shape` (shape.py) runs it on a site's own host, over SSH for a
remote one.
tcconfig always builds a netem qdisc, even for rate-only shaping, and when the kernel has no
netem it prints an error and still exits 0; so every apply is read back with `tc qdisc show`
and a missing netem is refused with a message that says so. One tcset call takes about
0.5-0.8 s, so a trace is followed at most once per `min_interval_s` (values are sampled, not
replayed point by point). `dry_run=True` only prints what would be applied (`--tc-command`).
"""

from __future__ import annotations

import math
import re
import shlex
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .trace import LinkState, Trace

__all__ = ["TcconfigLink", "TcconfigError"]


class TcconfigError(RuntimeError):
    """tcconfig could not put the requested shaping in place; the message says why."""


@dataclass
class TcconfigLink:
    interface: str
    trace: Trace
    direction: str = "outgoing"
    prefix: list[str] = field(default_factory=list)      # e.g. ["ip", "netns", "exec", "ns"] or ["ssh", "host"]
    tcset: str | list[str] = "tcset"      # a program, or a command line (testbed/shape.py)
    tcdel: str | list[str] = "tcdel"
    min_interval_s: float = 1.0
    dry_run: bool = False
    runner: Callable[..., subprocess.CompletedProcess] = subprocess.run

    def __post_init__(self) -> None:
        self._tcset = [self.tcset] if isinstance(self.tcset, str) else list(self.tcset)
        self._tcdel = [self.tcdel] if isinstance(self.tcdel, str) else list(self.tcdel)
        self.applied: LinkState | None = None
        self.last_apply = -math.inf
        self.log: list[str] = []

    def _run(self, argv: list[str]) -> subprocess.CompletedProcess:
        cmd = self.prefix + argv
        self.log.append(shlex.join(cmd))
        return self.runner(cmd, capture_output=True, text=True, timeout=60)

    def tcset_argv(self, st: LinkState) -> list[str]:
        argv = [*self._tcset, self.interface, "--direction", self.direction, "--overwrite"]
        if st.down:
            argv += ["--loss", "100%"]
        else:
            if not math.isinf(st.bandwidth_mbps):
                argv += ["--rate", f"{st.bandwidth_mbps:g}Mbps"]
            argv += ["--delay", f"{st.delay_ms:g}ms"]
            if st.loss > 0:
                argv += ["--loss", f"{st.loss * 100:g}%"]
        return argv + (["--tc-command"] if self.dry_run else [])

    def apply(self, st: LinkState) -> str:
        """Put one state in force; returns what tcset printed (the tc commands, in a dry run)."""
        r = self._run(self.tcset_argv(st))
        out = re.sub(r"\x1b\[[0-9;]*m", "", (r.stdout or "") + (r.stderr or ""))   # tcconfig's colours
        if r.returncode != 0:
            raise TcconfigError(f"tcset failed on {self.interface} (exit {r.returncode}): {out.strip()}")
        if not self.dry_run:
            shown = self._run(["tc", "qdisc", "show", "dev", self.interface])
            if "netem" not in shown.stdout:
                self.clear()
                hint = " (the kernel has no netem qdisc)" if "unknown" in out.lower() else ""
                raise TcconfigError(f"tcset exited 0 but no netem qdisc is on {self.interface}{hint}; tcconfig "
                                    f"cannot shape here. tcset said: {out.strip()[:300]!r}. Use backend = \"kernel\" for this "
                                    "site instead (htb on its host; delay, loss and outages by its proxy link).")
        self.applied, self.last_apply = st, time.monotonic()
        return out

    def step(self, t: float) -> bool:
        """Follow the trace at time t, if the state changed and tcset may run again; True if applied."""
        st = self.trace.at(t)
        if st == self.applied or time.monotonic() - self.last_apply < self.min_interval_s:
            return False
        self.apply(st)
        return True

    def clear(self) -> None:
        if not self.dry_run:
            self._run([*self._tcdel, self.interface, "--all"])
        self.applied = None
