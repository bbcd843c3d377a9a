"""Starting the processes of a run: ProcessSpec + Launcher, on this machine or over SSH."""

from .base import Launcher, ProcessHandle, ProcessSpec
from .local import LocalLauncher, LocalProcess
from .local_host import LocalSshHost
from .ps_host import LocalPS, RemotePS
from .remote import RemoteSite
from .ssh import SshLauncher, SshProcess, SshTarget

__all__ = ["Launcher", "ProcessHandle", "ProcessSpec", "LocalLauncher", "LocalProcess", "LocalPS", "RemotePS", "LocalSshHost",
           "RemoteSite", "SshLauncher", "SshProcess", "SshTarget"]
