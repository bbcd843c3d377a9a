"""Local launcher: each process in its own process group, output to a log file.

A process group lets us stop a process together with anything it started; on Linux the child
also asks the kernel to send it SIGTERM if its parent dies, so no orphan outlives a killed CLI
or notebook kernel. The kernel counts the *thread* that started the child as the parent, so every
start happens on one long-lived spawner thread: a process started from a short-lived thread (a
notebook button's) would otherwise be sent SIGTERM as soon as that thread finished.

The child arms that signal with util-linux's `setpriv --pdeathsig` before it execs the command,
not with a `preexec_fn`: a preexec_fn makes Python fork() while holding the GIL, and gRPC's fork
handlers in this process then wait for gRPC threads that need the GIL (a run's Watch, a test's
channels): the whole process hung in fork() once in a test run. Without one, Python starts the
child with vfork, which runs no fork handlers.

`python -m wantrain ...` (the PS, the sites) is forked from a warm starter instead (warm.py: torch
imported once, not in every process), where it would run the same; everything else, and every
start the starter cannot make, starts cold as above.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

from ..errors import ProcessError, WaitTimeoutError
from .base import ProcessSpec, log_tail, stop_gracefully
from .warm import WarmChild, WarmStarter, import_time_env

__all__ = ["LocalLauncher", "LocalProcess"]

log = logging.getLogger("wantrain.launch")
_SPAWNER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="wantrain-spawner")   # lives as long as we do
_SETPRIV = shutil.which("setpriv") if sys.platform.startswith("linux") else None


def _dying_with_parent(argv: list[str]) -> list[str]:
    """argv that runs with SIGTERM as its parent-death signal (Linux, util-linux), else as it is."""
    return [_SETPRIV, "--pdeathsig", "TERM", "--", *argv] if _SETPRIV else argv


# The warm starters (warm.py), one per environment as the preloaded libraries see it at import,
# each started on the first `python -m wantrain` that needs it; a few at most, then cold.
_warm: dict[tuple[tuple[str, str], ...], WarmStarter] = {}
_warm_lock = threading.Lock()
MAX_WARM_STARTERS = 4


def _warm_starter(argv: list[str], env: dict[str, str]) -> WarmStarter | None:
    """The warm starter that forks `argv` with `env`, started (again) if need be; None: start cold."""
    if os.environ.get("WANTRAIN_WARM_START", "1") == "0" or not sys.platform.startswith("linux") \
            or argv[1:3] != ["-m", "wantrain"] or os.path.abspath(argv[0]) != os.path.abspath(sys.executable):
        return None
    key = import_time_env(env)
    with _warm_lock:
        starter = _warm.get(key)
        if starter is None or not starter.alive():
            if starter is None and len(_warm) >= MAX_WARM_STARTERS:
                return None
            try:
                starter = _SPAWNER.submit(WarmStarter, sys.executable, env, _dying_with_parent).result()
            except OSError as e:
                log.warning("starting processes cold: %s", e)
                return None
            _warm[key] = starter
        return starter if starter.fits(argv, env) else None


class LocalProcess:
    def __init__(self, spec: ProcessSpec, popen: subprocess.Popen | WarmChild, log_file) -> None:
        self.spec, self.name, self.popen, self.pid = spec, spec.name, popen, popen.pid
        self._log_file = log_file

    def poll(self) -> int | None:
        return self.popen.poll()

    def wait(self, timeout: float | None = None) -> int:
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            raise WaitTimeoutError(f"{self.name} (pid {self.pid}) still running after {timeout} s") from None

    def _signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def terminate(self) -> None:
        if self.popen.poll() is None:
            self._signal_group(signal.SIGTERM)

    def kill(self) -> None:
        self._signal_group(signal.SIGKILL)
        try:
            self.popen.wait(5)
        except subprocess.TimeoutExpired:
            pass
        if self._log_file:
            self._log_file.close()
            self._log_file = None

    def stop(self, grace_s: float = 3.0) -> int | None:
        """SIGTERM to the group, then SIGKILL after `grace_s`; always reaps the process."""
        return stop_gracefully(self, grace_s)

    def log_tail(self, lines: int = 20) -> str:
        return log_tail(self.spec.log_path, lines)


class LocalLauncher:
    """Starts processes on this machine."""

    def start(self, spec: ProcessSpec) -> LocalProcess:
        env = {**os.environ, **spec.env}
        if shutil.which(spec.argv[0], path=env.get("PATH")) is None:   # setpriv would only exit 127
            raise ProcessError(f"cannot start {spec.name}: no program {spec.argv[0]!r}")
        warm = _warm_starter(list(spec.argv), env)
        if warm is not None:
            try:
                child = warm.start(spec.argv, env, spec.cwd, str(spec.log_path) if spec.log_path else None)
                return LocalProcess(spec, child, None)
            except OSError as e:
                log.warning("starting %s cold: %s", spec.name, e)
        log_file = open(spec.log_path, "ab", buffering=0) if spec.log_path else None
        try:
            popen = _SPAWNER.submit(
                subprocess.Popen, _dying_with_parent(list(spec.argv)), cwd=spec.cwd, env=env,
                stdin=subprocess.DEVNULL, stdout=log_file or subprocess.DEVNULL, stderr=subprocess.STDOUT,
                start_new_session=True).result()
        except OSError as e:
            if log_file:
                log_file.close()
            raise ProcessError(f"cannot start {spec.name}: {e}") from None
        return LocalProcess(spec, popen, log_file)
