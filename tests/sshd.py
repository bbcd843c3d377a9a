"""A real OpenSSH server for the tests, on 127.0.0.1 at a port bound to 0.

The test's own listener takes each connection and hands it to `sshd -i` (inetd mode), so the
port is never guessed, and a test can drop one SSH connection by killing its sshd (`drop_all`).
The server has its own host key and config (`UsePAM no`, `StrictModes no`, keys only) and lets
this account in with a key made for the test; `known_hosts` holds the server's key.
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import threading
from pathlib import Path

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def _keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "wantrain-test", "-f", str(path)], check=True)
    return path.with_suffix(".pub").read_text().strip()


class SshServer:
    def __init__(self, root: Path, exec_prefix: tuple[str, ...] = ()) -> None:
        """`exec_prefix` runs sshd under it, e.g. `ip netns exec NS`: its sessions then live in that
        network namespace, a separate "host" with interfaces of its own."""
        if not os.access(SSHD, os.X_OK) or not shutil.which("ssh-keygen"):
            raise RuntimeError("the SSH tests need OpenSSH's sshd and ssh-keygen (tools/install_sysdeps.sh installs "
                               "openssh-server)")
        root.mkdir(parents=True, exist_ok=True)
        self.root, self.user, self.exec_prefix = root, getpass.getuser(), tuple(exec_prefix)
        host_pub = _keygen(root / "host_key")
        (root / "authorized_keys").write_text(_keygen(root / "id_ed25519") + "\n")
        self.key_file = str(root / "id_ed25519")
        self.other_key_file = root / "other_key"
        _keygen(self.other_key_file)                    # a key the server does not know
        self.config = root / "sshd_config"
        self.config.write_text("\n".join([
            f"HostKey {root / 'host_key'}", f"AuthorizedKeysFile {root / 'authorized_keys'}",
            "PasswordAuthentication no", "KbdInteractiveAuthentication no", "UsePAM no", "StrictModes no",
            "PermitRootLogin prohibit-password", "PidFile none", "LogLevel VERBOSE", ""]))
        if os.geteuid() == 0:
            Path("/run/sshd").mkdir(parents=True, exist_ok=True)    # sshd's privilege separation folder
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.known_hosts = root / "known_hosts"
        self.known_hosts.write_text(f"[127.0.0.1]:{self.port} {' '.join(host_pub.split()[:2])}\n")
        self.sessions: list[subprocess.Popen] = []
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"ssh://{self.user}@127.0.0.1:{self.port}"

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
                    stdin=conn, stdout=conn, stderr=subprocess.DEVNULL, start_new_session=True))

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
