"""A run's processes: what they are (`plan.py`: the run plan, stdlib only, the testbed's contract),
where they run and how they start and stop (ProcessSpec + Launcher, on this machine or over SSH),
and `Run` (`run.py`), which composes them. The names below load on first use (PEP 562), so that the
testbed's `wantrain.launch.plan` and the notebook's panel pull in neither asyncssh nor a launcher."""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {"Launcher": "base", "ProcessHandle": "base", "ProcessSpec": "base", "LocalLauncher": "local",
          "LocalProcess": "local", "LocalSshHost": "local_host", "LocalPS": "ps_host", "RemotePS": "ps_host",
          "RemoteSite": "remote", "SshLauncher": "ssh", "SshProcess": "ssh", "SshTarget": "ssh"}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'wantrain.launch' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
