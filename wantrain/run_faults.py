"""Faults a run takes on purpose, and the one it repairs by itself.

`Run` (run.py) has these as methods: kill a site (`start_site` brings it back), take its emulated
link down, restart the PS from its checkpoint, drop an SSH site's connection. Each is recorded as
a `fault` row and relayed into the PS's telemetry. A site on an SSH host whose connection was lost
(exit code LOST: its watchdog stopped it on the host) is started again in the background, on a new
connection, for up to `reconnect_s`; only when that fails does the run fail, with the last reason.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import ConfigError, ProcessError, SshError
from .launch.ssh import LOST
from .plan import outage_command

if TYPE_CHECKING:
    from .launch.base import ProcessHandle
    from .launch.placement import Placements
    from .relay import EventRelay

__all__ = ["RunFaults"]


class RunFaults:
    # What Run holds that these use.
    sites: list[str]
    workers: dict[str, ProcessHandle]
    links: ProcessHandle | None
    links_control: Path
    relay: EventRelay | None
    faults: list[dict]
    _killed: set[int]
    ps: ProcessHandle | None
    ps_port: int | None
    placements: Placements
    _stopping: threading.Event
    _restarting: bool
    _ps_restarts: int
    reconnect_s: float = 300.0          # how long an SSH site whose connection was lost is tried again
    _reconnect_error: str = ""

    def _start_ps(self, port: int, log_name: str, deadline: float) -> None:
        raise NotImplementedError          # Run's

    def start_site(self, name: str, extra: tuple[str, ...] = ()) -> ProcessHandle:
        raise NotImplementedError          # Run's

    def _fault(self, action: str, site: str | None = None, **extra) -> None:
        row = {"kind": "fault", "t": time.time(), "action": action, **({"site": site} if site else {}), **extra}
        self.faults.append(row)
        if self.relay is not None:
            self.relay.add(row)

    def kill_site(self, name: str) -> None:
        """SIGKILL a site's process, as a crash would; `start_site(name)` brings it back."""
        if name not in self.workers:
            raise ConfigError(f"no site {name!r} in this run (sites: {', '.join(self.sites)})")
        p = self.workers[name]
        self._killed.add(id(p))
        self._fault("kill site", name)
        p.kill()
        p.wait(10)

    def outage(self, name: str, seconds: float) -> None:
        """Take a site's emulated link down now for `seconds` (needs a scenario)."""
        if self.links is None or self.links.poll() is not None:
            raise ProcessError("no link emulator is running: outages need a run with a scenario or plan")
        if name not in self.sites:
            raise ConfigError(f"no site {name!r} in this run (sites: {', '.join(self.sites)})")
        if not 0 < seconds <= 200:
            raise ConfigError(f"an outage lasts (0, 200] s, got {seconds}")
        self._fault("link outage", name, seconds=seconds)
        with open(self.links_control, "a") as f:
            f.write(outage_command(name, seconds))

    def restart_ps(self, timeout_s: float = 120.0) -> None:
        """SIGKILL the PS and start it again on the same port: it resumes from its checkpoint
        and the sites reconnect by themselves."""
        if self.ps is None or self.ps_port is None:
            raise ProcessError("the run has not started: there is no parameter server to restart")
        self._restarting = True
        try:
            old = self.ps
            self._killed.add(id(old))
            self._fault("restart PS")
            old.kill()
            old.wait(10)
            self._ps_restarts += 1
            self._start_ps(self.ps_port, f"ps-restart-{self._ps_restarts}.log", time.time() + timeout_s)
        finally:
            self._restarting = False

    def drop_connection(self, name: str) -> None:
        """Cut an SSH site's connection, as a network failure would: its watchdog stops the site on
        the host, and the run reconnects and starts it again (it rejoins)."""
        if name not in self.placements.remote:
            raise ConfigError(f"site {name!r} does not run over SSH (SSH sites: {', '.join(self.placements.remote)})")
        self._fault("drop SSH connection", name)
        self.placements.remote[name].launcher.close()

    def _lost(self, p: ProcessHandle, code: int) -> bool:
        """Whether `p` is an SSH site whose connection went; if so, its restart is under way."""
        name = next((n for n, w in self.workers.items() if w is p), None)
        if name is None or name not in self.placements.remote or code != LOST or self._stopping.is_set():
            return False
        self._killed.add(id(p))                 # handled here, not a failure of the run
        self._fault("SSH connection lost", name)

        def again() -> None:
            deadline, last = time.time() + self.reconnect_s, ""
            while time.time() < deadline and not self._stopping.is_set():
                try:
                    self.start_site(name)
                    return
                except SshError as e:            # the host is still unreachable: try again shortly
                    last = str(e)
                    self._stopping.wait(5.0)
            if not self._stopping.is_set():
                self._reconnect_error = (f"site {name} lost its SSH connection and could not be started again "
                                         f"within {self.reconnect_s:.0f} s: {last}")
        threading.Thread(target=again, name=f"wantrain-reconnect-{name}", daemon=True).start()
        return True
