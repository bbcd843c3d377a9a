"""Where each site of a run runs, and what it needs there.

A site runs on this machine (the run's launcher) or on an SSH host (`RemoteSite`). `place` returns
how to start it there: the launcher, the Python, the PS address it dials and its copies of the
run's secret files. `start_shaper` starts the shaper of a site whose plan entry asks for one
(`backend = "tcconfig"` or `"kernel"`: `python -m testbed shape`) on that same host, and returns once the
shaping is in force, or raises ShapingError with the shaper's reason (it leaves nothing behind).
"""

from __future__ import annotations

import dataclasses
import shlex
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError, ProcessError, ShapingError
from .plan import CANNOT_SHAPE, RunPlan
from .base import Launcher, ProcessHandle, ProcessSpec
from .remote import RemoteSite

__all__ = ["Placement", "Placements"]



@dataclass(frozen=True)
class Placement:
    launcher: Launcher
    python: str
    ps: str                      # the address the site dials
    token: str                   # the shared secret's file, on the site's host
    ca: str | None               # the run's CA, on the site's host
    folder: str                  # where the run's files for this site go on its host


class Placements:
    def __init__(self, sites: list[str], remote: dict[str, RemoteSite | str] | None, launcher: Launcher,
                 python: str) -> None:
        self.remote = {k: RemoteSite(v) if isinstance(v, str) else v for k, v in (remote or {}).items()}
        if set(self.remote) - set(sites):
            raise ConfigError(f"remote hosts given for sites not in the run: {sorted(set(self.remote) - set(sites))}")
        self.launcher, self.python = launcher, python

    def place(self, name: str, dial: str, secret: Path, ca: Path | None, run_dir: Path, forward: bool = True
              ) -> Placement:
        """Prepare the site's host (for an SSH host: inspect, install, forward to `dial` (HOST:PORT)
        unless `forward` is off (a PS at a public address), copy the secrets; once per host and
        address) and say how to start the site there."""
        if name not in self.remote:
            if not forward:
                self._check_reaches(name, dial, None, "")
            return Placement(self.launcher, self.python, dial, str(secret), str(ca) if ca is not None else None,
                             str(run_dir))
        host, port = dial.rsplit(":", 1)
        r = self.remote[name].prepare(host, int(port), {"secret": secret, **({"ca": ca} if ca is not None else {})},
                                      forward)
        if not forward:
            self._check_reaches(name, dial, r.launcher, r.python)
        return Placement(r.launcher, r.python, r.ps, r.files["secret"], r.files.get("ca"), r.folder)

    def _check_reaches(self, name: str, address: str, launcher, python: str, timeout_s: float = 10.0) -> None:
        """A site that dials the PS's public address must reach it from its host: else the site would
        retry unseen, so the run refuses now, by name (ProcessError)."""
        host, port = address.rsplit(":", 1)
        if launcher is None:
            try:
                socket.create_connection((host, int(port)), timeout_s).close()
                return
            except OSError as e:
                why = str(e) or type(e).__name__
        else:
            probe = ("import socket, sys\ntry: socket.create_connection((sys.argv[1], int(sys.argv[2])), "
                     f"{timeout_s}).close()\nexcept OSError as e: sys.exit(str(e) or type(e).__name__)")
            code, out = launcher.run(f"{shlex.quote(python)} -c {shlex.quote(probe)} {shlex.quote(host)} {port}",
                                     timeout_s=timeout_s + 30)
            if code == 0:
                return
            why = out.strip().splitlines()[-1] if out.strip() else f"exit code {code}"
        raise ProcessError(f"site {name} on {self.where(name)} cannot reach the PS at {address}: {why}. Every site's "
                           "host must reach the PS's public address (RemotePS public_host=) on its port: check the "
                           "address, the PS's bind address and the firewall between them")

    def start_shaper(self, name: str, plan: RunPlan, where: Placement, log_path: Path,
                     timeout_s: float = 120.0) -> ProcessHandle:
        """Shape the site's link on its host (tcconfig or htb); returns the shaper once it is in force."""
        site = plan.site(name)
        if name in self.remote:          # the host reads its own copies of the plan and the trace
            launcher = self.remote[name].launcher
            if site.trace:
                trace = f"{where.folder}/trace-{name}.csv"
                launcher.put(Path(site.trace).read_bytes(), trace)
                site = dataclasses.replace(site, trace=trace)
            plan_path = f"{where.folder}/plan-{name}.json"
            launcher.put(plan.replace(sites=(site,)).to_json().encode(), plan_path)
        else:
            plan_path = str(plan.replace(sites=(site,)).write(log_path.with_name(f"plan-{name}.json")))
        shaper = where.launcher.start(ProcessSpec(
            f"shaper of {name}", (where.python, "-m", "testbed", "shape", "--plan", plan_path, "--site", name),
            env={"PYTHONUNBUFFERED": "1"}, log_path=log_path))
        deadline = time.time() + timeout_s
        while "shaping " not in shaper.log_tail(5):
            code = shaper.poll()
            if code is not None or time.time() > deadline:
                shaper.kill()
                why = shaper.log_tail(5).strip() or f"exit code {code}"
                how = ("" if code == CANNOT_SHAPE else " (the shaper failed)" if code is not None else
                       f" (the shaper did not report within {timeout_s:.0f} s)")
                raise ShapingError(f"site {name}: its link cannot be shaped on {self.where(name)}{how}: {why}")
            time.sleep(0.1)
        return shaper

    def where(self, name: str) -> str:
        return str(self.remote[name]) if name in self.remote else "this machine"

    def close(self) -> None:
        for host in self.remote.values():
            host.close()
