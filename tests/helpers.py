"""Shared pieces of the tests that run real processes."""

from __future__ import annotations

import os
import resource
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from wantrain.config import RunConfig
from wantrain.launch import LocalLauncher, ProcessSpec


def drain(link) -> list:
    """What a ParameterServer queued for a site, model downloads expanded into their messages."""
    from wantrain.ps.downloads import ModelDownload
    out = []
    while not link.outbox.empty():
        m = link.outbox.get_nowait()
        out.extend(m.messages() if isinstance(m, ModelDownload) else [m])
    return out


def small_config(**changes) -> RunConfig:
    base = {"num_sites": 3, "train.rounds": 4, "train.inner_steps": 8, "train.batch_size": 4,
            "model.preset": "micro", "model.block_size": 64, "train.eval_batches": 2, "train.warmup_steps": 4}
    base.update(changes)
    return RunConfig().replace(**base)


def slowed(plan, factor: float = 4.0):
    """The run plan with every site `factor` times slower than it says: a site computes 1/factor
    of each time budget and sleeps the rest (the emulated part never pads past the budget), so
    budgets, shares and the ratios between sites are the plan's while the sites leave most of
    the CPU to the suite's other tests."""
    for site in plan.sites:
        plan = plan.with_site(site.name, speed_factor=factor * site.speed_factor)
    return plan


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wantrain(*args: str, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "wantrain", *args], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, **kw)


class Proc:
    """A wantrain process that a test started; always killed (with its group) at the end."""

    def __init__(self, *args: str, log: Path, open_files: int | None = None) -> None:
        self.log = log
        log.write_bytes(b"")
        # Started as the product starts its local processes (forked warm from a starter that has
        # imported torch once, wantrain/launch/warm.py); `p` is what it gives: a Popen's poll,
        # wait and pid.
        self.handle = LocalLauncher().start(ProcessSpec(log.stem, (sys.executable, "-m", "wantrain", *args),
                                                        env={"PYTHONUNBUFFERED": "1"}, log_path=log))
        self.p = self.handle.popen
        if open_files is not None:      # the child's open-file limit, soft and hard (a common 1024), set
            # long before it listens (importing torch alone takes seconds)
            resource.prlimit(self.p.pid, resource.RLIMIT_NOFILE, (open_files, open_files))

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, needle: str, timeout: float = 60) -> None:
        deadline = time.time() + timeout
        while needle not in self.text():
            if self.p.poll() is not None or time.time() > deadline:
                raise AssertionError(f"{needle!r} not seen (exit {self.p.poll()}):\n{self.text()[-3000:]}")
            time.sleep(0.1)

    def kill(self) -> None:
        self.handle.kill()          # SIGKILL to its group, then reaped


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def survivors(pids: list[int], timeout_s: float) -> list[int]:
    """Wait up to `timeout_s` for every pid to end; those still alive then, SIGKILLed (for the
    test to assert on: a test that asserts [] has left nothing behind either way)."""
    deadline = time.time() + timeout_s
    while any(pid_alive(p) for p in pids) and time.time() < deadline:
        time.sleep(0.1)
    alive = [p for p in pids if pid_alive(p)]
    for p in alive:
        os.kill(p, signal.SIGKILL)
    return alive
