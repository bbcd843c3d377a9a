"""A throwaway "SSH host" on this machine: a real OpenSSH server on 127.0.0.1, at a port bound to 0.

For tutorials and tests, to try sites on SSH hosts without a second machine. Its own listener
takes each connection and hands it to `sshd -i` (inetd mode), so the port is never guessed, and
`drop_all` cuts every SSH connection as a network failure would. The server has its own host key
and config (`UsePAM no`, `StrictModes no`, keys only, in `root`) and lets this account in with a
key made for it; `known_hosts` holds the server's key, and `options` is what a RemoteSite, a
RemotePS or the panel's `ssh=` needs to use it. It needs OpenSSH's sshd and ssh-keygen.
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

from ..errors import ProcessError

__all__ = ["LocalSshHost"]

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def _keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "wantrain-local-host", "-f", str(path)], check=True)
    return path.with_suffix(".pub").read_text().strip()


def _listener(exec_prefix: tuple[str, ...], host: str) -> socket.socket:
    """A listening socket on host:0, made under `exec_prefix` (in a network namespace: a socket
    belongs to the namespace it was made in) and handed back here over a Unix socket pair."""
    if not exec_prefix:
        return socket.create_server((host, 0))
    ours, theirs = socket.socketpair()
    make = ("import socket, sys; s = socket.create_server((sys.argv[1], 0)); "
            "socket.send_fds(socket.socket(fileno=int(sys.argv[2])), [b'L'], [s.fileno()])")
    with ours, theirs:
        r = subprocess.run([*exec_prefix, sys.executable, "-c", make, host, str(theirs.fileno())],
                           pass_fds=(theirs.fileno(),), capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise ProcessError(f"cannot listen on {host} under {' '.join(exec_prefix)}: {r.stderr.strip()}")
        _, fds, _, _ = socket.recv_fds(ours, 1, 1)
    return socket.socket(fileno=fds[0])


class LocalSshHost:
    key_file: str          # the client's private key that this host accepts
    known_hosts: Path      # holds this host's key
    def __init__(self, root: Path, exec_prefix: tuple[str, ...] = (), *, like: LocalSshHost | None = None,
                 listen: str = "127.0.0.1") -> None:
        """`exec_prefix` runs sshd under it, e.g. `ip netns exec NS`: its sessions then live in that
        network namespace, a separate "host" with interfaces of its own. `listen`: the address the
        host is reached at; one of the namespace's own (its veth's) puts the listening socket in
        the namespace too, so the SSH traffic crosses its interface as a real host's would. `like`:
        another local host whose key this one accepts and whose known_hosts it joins, so one set of
        `options` (the panel's `ssh=`) reaches both."""
        if not os.access(SSHD, os.X_OK) or not shutil.which("ssh-keygen"):
            raise ProcessError("a local SSH host needs OpenSSH's sshd and ssh-keygen (Debian: apt-get install "
                               "openssh-server)")
        root.mkdir(parents=True, exist_ok=True)
        self.root, self.user, self.exec_prefix = root, getpass.getuser(), tuple(exec_prefix)
        host_pub = _keygen(root / "host_key")
        client = Path(like.key_file) if like is not None else root / "id_ed25519"
        if like is None:
            _keygen(client)
        (root / "authorized_keys").write_text(client.with_suffix(".pub").read_text())
        self.key_file = str(client)
        self.other_key_file = root / "other_key"
        _keygen(self.other_key_file)                    # a key the server does not know
        self.config = root / "sshd_config"
        self.config.write_text("\n".join([
            f"HostKey {root / 'host_key'}", f"AuthorizedKeysFile {root / 'authorized_keys'}",
            "PasswordAuthentication no", "KbdInteractiveAuthentication no", "UsePAM no", "StrictModes no",
            "PermitRootLogin prohibit-password", "PidFile none", "LogLevel VERBOSE", ""]))
        if os.geteuid() == 0:
            Path("/run/sshd").mkdir(parents=True, exist_ok=True)    # sshd's privilege separation folder
        self.listen = listen
        self.sock = _listener(self.exec_prefix if listen != "127.0.0.1" else (), listen)
        self.port = self.sock.getsockname()[1]
        self.known_hosts = like.known_hosts if like is not None else root / "known_hosts"
        with open(self.known_hosts, "a") as f:
            f.write(f"[{listen}]:{self.port} {' '.join(host_pub.split()[:2])}\n")
        self.sessions: list[subprocess.Popen] = []
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def options(self) -> dict[str, str]:
        """The key and known_hosts a RemoteSite, RemotePS or SshTarget needs for this host."""
        return {"key_file": self.key_file, "known_hosts": str(self.known_hosts)}

    @property
    def url(self) -> str:
        return f"ssh://{self.user}@{self.listen}:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn, self._lock:
                if self._closed:
                    return
                self.sessions.append(subprocess.Popen(
                    [*self.exec_prefix, SSHD, "-i", "-f", str(self.config), "-E", str(self.root / "sshd.log")],
                    stdin=conn.fileno(), stdout=conn.fileno(), stderr=subprocess.DEVNULL, start_new_session=True))

    def drop_all(self) -> None:
        """Cut every SSH connection, as a network failure would (the client sees it end)."""
        with self._lock:
            for p in self.sessions:
                if p.poll() is None:
                    p.kill()
                    p.wait(10)

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self.sock.close()
        self.drop_all()
