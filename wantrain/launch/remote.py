"""A site on another machine, as a Run sees it: where it runs (an SSH host), the Python it runs
with there, the address it dials and its copies of the run's secret files.

`prepare` does what a remote site needs before it can start, once per host and PS address:
inspect the host (launch/host.py), install this checkout's version (launch/install.py), open a
reverse forward to the PS (launch/ssh.py), and copy the shared secret and the run's CA into the
forward's private folder on the host (0600; never on a command line). The Run then starts the
site with the returned launcher, exactly as it starts a local one. A site whose SSH connection was
lost (its watchdog stopped it on the host) is started again by a `Reconnector`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import SshError

from .host import HostInfo, inspect_host
from .install import install_on_host
from .ssh import SshLauncher, SshTarget

__all__ = ["RemoteSite", "Prepared", "Reconnector"]


@dataclass(frozen=True)
class Prepared:
    launcher: SshLauncher
    python: str                 # on the host
    ps: str                     # the address the site dials there (unix:PATH, a reverse forward)
    files: dict[str, str]       # local file's role -> its copy on the host
    folder: str                 # the private folder of the run's files on the host (0700)


class RemoteSite:
    """Where a site runs when it is not this machine: `ssh://user@host[:port]` and how to use it."""

    def __init__(self, target: SshTarget | str, python: str = "python3", *, install: bool = True,
                 reuse_site_packages: bool = False, venvs: str | None = None, gpus: int = 0,
                 progress: Callable[[str], None] = lambda _: None, **ssh) -> None:
        self.launcher = SshLauncher(SshTarget.parse(target, **ssh) if isinstance(target, str) else target,
                                    python=python)
        self.python, self.install, self.reuse, self.venvs, self.gpus = python, install, reuse_site_packages, venvs, gpus
        self.progress = progress
        self.host: HostInfo | None = None
        self._python_there: str | None = None
        self._forwards: dict[tuple[str, int], str] = {}
        self._forwarded_on = 0          # the launcher's connection they were opened on
        self._direct_folder: str | None = None

    def __str__(self) -> str:
        return str(self.launcher.target)

    def ready(self) -> str:
        """Inspect the host and install this version there (once); the Python to run it with."""
        if self.host is None:
            self.host = inspect_host(self.launcher, self.python, self.gpus)
            self.progress(f"{self}: {self.host.describe()}")
        if self._python_there is None:
            self._python_there = (install_on_host(self.launcher, self.python, reuse_site_packages=self.reuse,
                                                  venvs=self.venvs, progress=self.progress)
                                  if self.install else self.python)
        return self._python_there

    def prepare(self, ps_host: str, ps_port: int, files: dict[str, Path], forward: bool = True) -> Prepared:
        """Ready the host for a site that dials ps_host:ps_port: through a reverse forward (a PS next
        to the notebook), or directly (`forward=False`: a PS at a public address)."""
        python = self.ready()
        if not forward:
            if self._direct_folder is None or not self.launcher.connected:
                self._direct_folder = self.launcher.private_folder()
            return Prepared(self.launcher, python, f"{ps_host}:{ps_port}", self._put(files, self._direct_folder),
                            self._direct_folder)
        key = (ps_host, ps_port)
        if key not in self._forwards or not self.launcher.connected or self._forwarded_on != self.launcher.connections:
            if not self.launcher.connected or self._forwarded_on != self.launcher.connections:
                self._forwards.clear()          # the connection was lost, and its forwards with it
            self._forwards[key] = self.launcher.reverse_forward(ps_host, ps_port)
            self._forwarded_on = self.launcher.connections
        ps = self._forwards[key]
        folder = ps[len("unix:"):].rsplit("/", 1)[0]           # 0700, removed when the launcher closes
        return Prepared(self.launcher, python, ps, self._put(files, folder), folder)

    def _put(self, files: dict[str, Path], folder: str) -> dict[str, str]:
        copies = {}
        for role, path in files.items():
            copies[role] = f"{folder}/{role}-{Path(path).name}"
            self.launcher.put(Path(path).read_bytes(), copies[role])
        return copies

    def close(self) -> None:
        self.launcher.close()
        self._forwards.clear()


class Reconnector:
    """Starts again, in the background, a site whose SSH connection was lost: on a new connection,
    every few seconds for up to `within_s`, until `stopping` is set. When that fails the reason is
    kept in `error` (the run fails with it)."""

    def __init__(self, start: Callable[[str], object], stopping: threading.Event, within_s: float = 300.0,
                 every_s: float = 5.0) -> None:
        self.start, self.stopping, self.within_s, self.every_s = start, stopping, within_s, every_s
        self.error = ""

    def again(self, name: str) -> None:
        threading.Thread(target=self._again, args=(name,), name=f"wantrain-reconnect-{name}", daemon=True).start()

    def _again(self, name: str) -> None:
        deadline, last = time.time() + self.within_s, ""
        while time.time() < deadline and not self.stopping.is_set():
            try:
                self.start(name)
                return
            except SshError as e:            # the host is still unreachable: try again shortly
                last = str(e)
                self.stopping.wait(self.every_s)
        if not self.stopping.is_set():
            self.error = (f"site {name} lost its SSH connection and could not be started again "
                          f"within {self.within_s:.0f} s: {last}")
