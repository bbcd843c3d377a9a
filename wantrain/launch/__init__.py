"""Starting the processes of a run: ProcessSpec + Launcher (local now; SSH later)."""

from .base import Launcher, ProcessHandle, ProcessSpec
from .local import LocalLauncher, LocalProcess

__all__ = ["Launcher", "ProcessHandle", "ProcessSpec", "LocalLauncher", "LocalProcess"]
