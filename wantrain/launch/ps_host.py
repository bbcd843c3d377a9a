"""Where the parameter server runs: this machine (`LocalPS`) or an SSH host (`RemotePS`).

`RemotePS` is deployment shape (b): a cloud VM with a public address. Sites dial that address with
TLS and tokens of their own; the notebook reaches the PS (Watch, the relay of faults and link
events) through a local port forward on its SSH connection, so nothing listens on the notebook's
side. The run's config, the PS's certificate and key, the sites' tokens and the observer token go to
a private folder on the host (0600, never on a command line); the PS's run folder (journal,
checkpoints, events.jsonl) is on the host, under `run_root`. A Run asks either kind the same
questions: how to start the PS there, where its files are, which port it bound, and which address
observers and sites use.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable
from pathlib import Path

from ..errors import ProcessError
from .base import Launcher, ProcessHandle
from .remote import RemoteSite

__all__ = ["LocalPS", "RemotePS"]


class LocalPS:
    """The PS on this machine: its files are the run folder's, observers and sites dial it directly."""

    def __init__(self, launcher: Launcher, python: str, host: str) -> None:
        self.launcher, self.python, self.public_host, self.bind = launcher, python, host, host

    def place(self, files: dict[str, Path], run_dir: Path) -> tuple[dict[str, str], str]:
        """The PS's copies of the run's files (role -> path there) and its run folder there."""
        return {role: str(path) for role, path in files.items()}, str(run_dir)

    def port_file(self, run_dir: Path) -> str:
        return str(run_dir / "ps.port")

    def read_port(self, port_file: str) -> int | None:
        p = Path(port_file)
        return int(p.read_text()) if p.exists() else None

    def clear_port(self, port_file: str) -> None:
        Path(port_file).unlink(missing_ok=True)

    def observer_address(self, port: int) -> str:
        return f"{self.public_host}:{port}"

    def copy_back(self, name: str, to: Path) -> None:
        pass                  # the PS's run folder is the run's

    def close(self) -> None:
        pass


class RemotePS:
    """The PS on an SSH host, at `public_host` (default: the SSH target's host name) for the sites."""

    def __init__(self, target: str, python: str = "python3", *, public_host: str | None = None,
                 bind: str = "0.0.0.0", run_root: str = "~/.wantrain/runs",
                 progress: Callable[[str], None] = lambda _: None, **options) -> None:
        self.host = RemoteSite(target, python, progress=progress, **options)     # inspected and installed alike
        self.launcher = self.host.launcher
        self.public_host = public_host or self.launcher.target.host
        self.bind = bind          # the address the PS listens on there (a VM's public IP is often not its own)
        self.run_root, self.folder, self.run_dir = run_root, "", ""
        self._forwards: dict[int, int] = {}

    def __str__(self) -> str:
        return str(self.host)

    @property
    def python(self) -> str:
        return self.host.ready()

    def place(self, files: dict[str, Path], run_dir: Path) -> tuple[dict[str, str], str]:
        self.host.ready()
        self.folder = self.launcher.private_folder()
        copies = {}
        for role, path in files.items():
            copies[role] = f"{self.folder}/{role}-{Path(path).name}"
            self.launcher.put(Path(path).read_bytes(), copies[role])
        root = self.run_root
        if root.startswith("~"):
            root = self.launcher.run("cd && pwd")[1].strip() + root[1:]
        self.run_dir = there = f"{root}/{run_dir.name}"
        code, out = self.launcher.run(f"mkdir -p {shlex.quote(there)}")
        if code != 0:
            raise ProcessError(f"{self}: cannot make the PS's run folder {there}: {out.strip()}")
        return copies, there

    def port_file(self, run_dir: Path) -> str:
        return f"{self.folder}/ps.port"

    def read_port(self, port_file: str) -> int | None:
        code, out = self.launcher.run(f"cat {shlex.quote(port_file)} 2>/dev/null")
        return int(out) if code == 0 and out.strip().isdigit() else None

    def clear_port(self, port_file: str) -> None:
        self.launcher.run(f"rm -f {shlex.quote(port_file)}")

    def observer_address(self, port: int) -> str:
        """127.0.0.1:LOCAL, a forward through the SSH connection to the PS's port on its host."""
        if port not in self._forwards or not self.launcher.connected:
            self._forwards[port] = self.launcher.local_forward("127.0.0.1", port)
        return f"127.0.0.1:{self._forwards[port]}"

    def copy_back(self, name: str, to: Path) -> None:
        """Copy a file of the PS's run folder into the run folder here (events.jsonl at the end: the
        Watch stream ends at run_end, the PS's own log a little later). Best effort."""
        try:
            code, out = self.launcher.run(f"cat {shlex.quote(self.run_dir + '/' + name)}", timeout_s=300)
        except (ProcessError, TimeoutError):
            return
        if code == 0 and out:
            to.write_text(out)

    def close(self) -> None:
        self.host.close()
        self._forwards.clear()


def wait_for_port(ps: LocalPS | RemotePS, handle: ProcessHandle, port_file: str, deadline: float) -> int:
    """The port the PS bound, once it has written it; ProcessError if it exits or takes too long."""
    while (port := ps.read_port(port_file)) is None:
        if handle.poll() is not None:
            raise ProcessError(f"the parameter server exited with code {handle.poll()} before listening:\n"
                               f"{handle.log_tail()}")
        if time.time() > deadline:
            raise ProcessError("the parameter server did not start listening in time")
        time.sleep(0.05 if isinstance(ps, LocalPS) else 0.5)
    return port
