"""`python -m testbed shape --plan PLAN.json --site NAME`: shape one site's link on its own host.

For a site whose plan entry says `backend = "kernel"`, it puts the uplink trace's rate in force
with htb on the entry's interface (htb_link.py; its proxy link does the rest), follows it, and
removes it when stopped: the fallback where the host has no netem.

For a site whose plan entry says `backend = "tcconfig"`: this process runs on the site's host (the
Run starts it there with the site's own launcher, over SSH for a remote host), puts the site's
uplink trace in force on the entry's interface with tcconfig, checks it with `tc qdisc show`,
follows the trace while it runs, and removes its qdiscs when stopped (SIGTERM or SIGINT: the SSH
watchdog sends SIGTERM when the connection ends). Only the outgoing direction is shaped: incoming
shaping would need an ifb device, which tcconfig sets up only where the module is loaded.

It prints `shaping IFACE: ...` once the first state is in force. Where tcconfig cannot shape
(no netem in the kernel, no root, no such interface) it prints why on stderr, leaves no qdisc, and
exits with code 3, so the Run refuses with that message before any site starts.
"""

from __future__ import annotations

import signal
import sys
import threading
import time

from wantrain.launch.plan import CANNOT_SHAPE, ON_HOST_BACKENDS, RunPlan

from .scenario import scenario_from_plan
from .htb_link import HtbError, HtbLink
from .kernel import KernelBackendError
from .tcconfig_backend import TcconfigError, TcconfigLink

FAILED = (TcconfigError, HtbError, KernelBackendError)

__all__ = ["main_shape", "CANNOT_SHAPE", "tcconfig_command"]



def tcconfig_command(tool: str) -> list[str]:
    """tcset / tcdel of the tcconfig this Python imports: a venv that reuses the host's packages
    (launch/install.py) has the module but not the console script."""
    return [sys.executable, "-c", f"import sys; from tcconfig.{tool} import main; sys.exit(main())"]


def main_shape(args) -> int:
    plan = RunPlan.read(args.plan)
    site = plan.site(args.site)
    if site.backend not in ON_HOST_BACKENDS or not site.interface:
        print(f"testbed shape: site {site.name} is not shaped on its host (its plan entry has backend "
              f"{site.backend!r}, interface {site.interface!r})", file=sys.stderr)
        return 2
    sc = scenario_from_plan(plan, args.plan)
    up, _ = sc.traces(next(s for s in sc.sites if s.name == site.name))
    st = up.at(0)
    link: TcconfigLink | HtbLink
    if site.backend == "tcconfig":
        link = TcconfigLink(site.interface, up, tcset=tcconfig_command("tcset"), tcdel=tcconfig_command("tcdel"),
                            dry_run=args.dry_run)
        what = f"delay {st.delay_ms:g} ms, rate {st.bandwidth_mbps:g} Mbit/s, loss {st.loss:g}"
    else:
        link = HtbLink(site.interface, up)
        what = f"rate {st.bandwidth_mbps:g} Mbit/s by htb; delay, loss and outages by its proxy link"
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        link.apply(st)
    except FAILED as e:
        print(f"testbed shape: site {site.name}: {e}", file=sys.stderr)
        return CANNOT_SHAPE
    print(f"shaping {site.interface}: uplink of site {site.name} ({what}) and following its trace", flush=True)
    t0 = time.monotonic()
    try:
        while not stop.wait(0.2):
            try:
                link.step(time.monotonic() - t0)
            except FAILED as e:       # a later state failed: say so, keep the last one in force
                print(f"testbed shape: {e}", file=sys.stderr, flush=True)
    finally:
        link.clear()
        print(f"removed the shaping of {site.interface}", flush=True)
    return 0
