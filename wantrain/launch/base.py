"""What every launcher offers: start a ProcessSpec somewhere, get a handle to watch and stop it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

__all__ = ["ProcessSpec", "ProcessHandle", "Launcher", "stop_gracefully", "log_tail"]


@dataclass(frozen=True)
class ProcessSpec:
    """A process of a run: its name (for messages), command line, environment and log file."""

    name: str
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)   # added to the launcher's environment
    cwd: str | None = None
    log_path: Path | None = None                        # stdout and stderr go here


class ProcessHandle(Protocol):
    name: str
    pid: int

    def poll(self) -> int | None:
        """Exit code, or None while running."""

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the exit code; raises TimeoutError after `timeout` seconds."""

    def terminate(self) -> None:
        """Ask the process (and everything it started) to stop."""

    def kill(self) -> None:
        """Stop the process (and everything it started) now."""

    def stop(self, grace_s: float = 3.0) -> int | None:
        """terminate(), then kill() after `grace_s`; the exit code (None if unknown)."""

    def log_tail(self, lines: int = 20) -> str:
        """The last lines of its output, for error messages."""


class Launcher(Protocol):
    def start(self, spec: ProcessSpec) -> ProcessHandle: ...


def stop_gracefully(handle: ProcessHandle, grace_s: float) -> int | None:
    """SIGTERM to the process's group, SIGKILL after `grace_s`; its exit code (None if unknown)."""
    handle.terminate()
    deadline = time.time() + grace_s
    while handle.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    handle.kill()
    return handle.poll()


def log_tail(path: Path | None, lines: int) -> str:
    """The last lines of a process's log file ("" when it has none yet)."""
    if not path or not Path(path).exists():
        return ""
    return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
