"""A host's own uplink rate, by htb on one of its interfaces: the kernel fallback of a site whose
host has no netem (where tcconfig cannot shape).

A site with `backend = "kernel"` and `interface = "eth0"` in its scenario entry is shaped in two
places: `python -m testbed shape` (shape.py) runs on its host and puts the uplink trace's rate in
force there with htb, following the trace; the site's proxy link in the run's emulator does the
rest (delay, loss's effect on TCP, outages), and an SSH site's reverse forward leads through it.
Every rate is read back from the kernel (`tc class show`); clear() removes the root qdisc.
Needs root and `tc` (iproute2) on the host; nothing else.
"""

from __future__ import annotations

import math
import shutil
import subprocess
from dataclasses import dataclass

from .kernel import htb_rates
from .trace import LinkState, Trace

__all__ = ["HtbLink", "HtbError"]


class HtbError(RuntimeError):
    """htb could not put the rate in place on this host; the message says why."""


@dataclass
class HtbLink:
    interface: str
    trace: Trace

    def __post_init__(self) -> None:
        self.rate_mbps: float | None = None          # the rate in force (inf: no limit)

    def _tc(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        r = subprocess.run(["tc", *args], capture_output=True, text=True, timeout=30)
        if check and r.returncode != 0:
            raise HtbError(f"`tc {' '.join(args)}` failed on {self.interface}: {(r.stderr or r.stdout).strip()}")
        return r

    def check(self) -> None:
        """HtbError naming what this host lacks: tc, root, the interface."""
        if shutil.which("tc") is None:
            raise HtbError("the kernel backend needs `tc` on the site's host (Debian package iproute2)")
        r = subprocess.run(["ip", "link", "show", "dev", self.interface], capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            raise HtbError(f"the host has no interface {self.interface!r}: {r.stderr.strip()}")

    def apply(self, st: LinkState) -> None:
        """Put the state's rate in force on the interface's egress (inf: no limit), and read it back;
        the first time, check what the host has."""
        if self.rate_mbps is None:
            self.check()
        rate_mbps = st.bandwidth_mbps
        if math.isinf(rate_mbps) or rate_mbps <= 0:      # 0 is an outage: the proxy link holds it
            self.clear()
        else:
            self._tc("qdisc", "replace", "dev", self.interface, "root", "handle", "1:", "htb", "default", "10")
            self._tc("class", "replace", "dev", self.interface, "parent", "1:", "classid", "1:10", "htb",
                     "rate", f"{rate_mbps}mbit", "ceil", f"{rate_mbps}mbit")
            rates = htb_rates([], self.interface)
            if not any(abs(r - rate_mbps * 1e6) <= 0.01 * rate_mbps * 1e6 for r in rates):
                raise HtbError(f"htb on {self.interface} shows rates {rates} bit/s, not {rate_mbps:g} Mbit/s")
        self.rate_mbps = rate_mbps

    def step(self, t: float) -> bool:
        """Follow the trace's rate at time t; True if it changed (an outage keeps the last rate)."""
        st = self.trace.at(t)
        if st.down or st.bandwidth_mbps == self.rate_mbps:
            return False
        self.apply(st)
        return True

    def clear(self) -> None:
        if self.rate_mbps is not None and not math.isinf(self.rate_mbps):
            self._tc("qdisc", "del", "dev", self.interface, "root", check=False)
        self.rate_mbps = math.inf
