"""The tests' SSH hosts: the package's throwaway local OpenSSH server (wantrain/launch/local_host.py)."""

from wantrain.launch.local_host import LocalSshHost as SshServer

__all__ = ["SshServer"]
