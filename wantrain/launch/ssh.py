"""SSH launcher: a process of the run on another machine, started over SSH; nothing listens there.

Each SSH launcher holds one asyncssh connection to its host. All of them run on one event loop of
their own, in a background thread (`_Loop`): the Launcher interface is synchronous (`Run`, the
panel's buttons and the CLI call it from their threads), and a notebook kernel's own loop cannot
block on work that it would itself have to run.

On the host, each process runs under a small Python watchdog (`WATCHDOG`), started with `exec`,
so it leads the process group sshd made for the session. It reads the command, its environment
and folder as the first line of its stdin (secrets such as tokens never appear on a command line,
and sshd's AcceptEnv does not matter), starts it in that group, reports the group, and waits.
When its stdin ends, which is when the SSH channel closes (Stop, a lost connection, a notebook
kernel that died), it stops the whole group: a remote site never outlives its connection unseen.
Stopping is a second command on the same connection (`kill -TERM -- -PGID`): sshd does not pass
signals to a root session.
"""

from __future__ import annotations

import asyncio
import getpass
import json
import re
import shlex
import threading
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from ..errors import ProcessError, SshError, WaitTimeoutError
from .base import ProcessSpec, log_tail, stop_gracefully
from .watchdog import WATCHDOG

__all__ = ["SshTarget", "SshLauncher", "SshProcess"]

LOST = 255      # the exit code of a process whose connection was lost (as ssh(1) reports it)


@dataclass(frozen=True)
class SshTarget:
    """Where and as whom: `ssh://user@host[:port]`, a key (None: the agent's and the default
    keys), and the known_hosts file that the host's key must be in (`check_host_key=False` skips
    that check, for a throwaway host only)."""

    host: str
    user: str | None = None
    port: int = 22
    key_file: str | None = None
    known_hosts: str = "~/.ssh/known_hosts"
    check_host_key: bool = True

    @classmethod
    def parse(cls, url: str, **options) -> SshTarget:
        """`ssh://[user@]host[:port]`; without a user, this account's name (as ssh takes it)."""
        parts = urlsplit(url)
        try:
            port = parts.port or 22
        except ValueError:
            port = -1
        if parts.scheme != "ssh" or not parts.hostname or port < 1 or parts.path not in ("", "/"):
            raise SshError(f"not an SSH address: {url!r} (expected ssh://[user@]host[:port])")
        return cls(parts.hostname, parts.username or getpass.getuser(), port, **options)

    def __str__(self) -> str:
        return f"ssh://{self.user + '@' if self.user else ''}{self.host}:{self.port}"


class _Loop:
    """The event loop of every SSH connection, in a daemon thread started on first use."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                threading.Thread(target=self._loop.run_forever, name="wantrain-ssh", daemon=True).start()
            return self._loop

    def run(self, coro, timeout_s: float):
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout_s)
        except TimeoutError:
            future.cancel()
            raise


_LOOP = _Loop()


class SshLauncher:
    """Starts processes on one remote host over SSH (the same interface as LocalLauncher)."""

    def __init__(self, target: SshTarget | str, python: str = "python3", connect_timeout_s: float = 20.0) -> None:
        self.target = SshTarget.parse(target) if isinstance(target, str) else target
        self.python = python            # runs the watchdog on the host
        self.connect_timeout_s = connect_timeout_s
        self._conn = None
        self.connections = 0      # made so far: a new one has none of the old one's forwards
        self._folders: list[str] = []      # on the host, for the sockets of reverse forwards
        self._closing = threading.Lock()

    def start(self, spec: ProcessSpec) -> SshProcess:
        return _LOOP.run(self._start(spec), self.connect_timeout_s + 60)

    def run(self, command: str, timeout_s: float = 60.0) -> tuple[int, str]:
        """A short command on the host: (exit code, stdout and stderr)."""
        return _LOOP.run(self._run(command), timeout_s)

    def put(self, data: bytes, path: str) -> None:
        """Write a file on the host, readable by its owner only (through a command's stdin: the host
        needs no SFTP). For tokens and CA files too: they never appear on a command line."""
        _LOOP.run(self._put(data, path), 600)

    async def _put(self, data: bytes, path: str) -> None:
        import asyncssh

        conn = await self._connection()
        try:
            r = await conn.run(f"umask 077 && cat > {shlex.quote(path)}", input=data, encoding=None, check=False)
        except (asyncssh.Error, OSError) as e:
            raise SshError(f"{self.target}: the SSH connection was lost while writing {path} "
                           f"({getattr(e, 'reason', e) or type(e).__name__})") from None
        if r.exit_status != 0:
            why = (r.stderr or b"").decode(errors="replace").strip()
            raise SshError(f"{self.target}: cannot write {path} ({why or f'exit {r.exit_status}'})")

    @property
    def connected(self) -> bool:
        """Whether the current connection is up (the next command makes a new one if not)."""
        return self._conn is not None and not self._conn.is_closed()

    def reverse_forward(self, dest_host: str, dest_port: int) -> str:
        """An address on the host (`unix:PATH`) that leads to dest_host:dest_port on this side,
        through this connection: how a remote site reaches a PS next to the notebook. It is a Unix
        socket in a folder of mode 0700, not a TCP port: nothing on the host listens on the network,
        and no other account there can use it. It lasts as long as the connection."""
        return _LOOP.run(self._reverse_forward(dest_host, dest_port), self.connect_timeout_s + 30)

    def private_folder(self) -> str:
        """A new folder on the host, mode 0700, removed when the connection closes: for a run's
        secrets and sockets there."""
        return _LOOP.run(self._private_folder(), self.connect_timeout_s + 30)

    async def _private_folder(self) -> str:
        code, out = await self._run("umask 077 && mktemp -d /tmp/wantrain-XXXXXXXX")
        if code != 0:
            raise SshError(f"{self.target}: cannot make a private folder in /tmp: {out.strip()}")
        self._folders.append(out.strip())
        return out.strip()

    def local_forward(self, dest_host: str, dest_port: int) -> int:
        """A port on 127.0.0.1 here that leads to dest_host:dest_port as the host sees it, through
        this connection: how the notebook reaches a PS in the cloud (Watch, faults). Its port."""
        return _LOOP.run(self._local_forward(dest_host, dest_port), self.connect_timeout_s + 30)

    async def _local_forward(self, dest_host: str, dest_port: int) -> int:
        conn = await self._connection()
        try:
            listener = await conn.forward_local_port("127.0.0.1", 0, dest_host, dest_port)
        except Exception as e:
            raise SshError(f"{self.target}: cannot forward a local port to {dest_host}:{dest_port} there "
                           f"({getattr(e, 'reason', e)}); is AllowTcpForwarding off?") from None
        return listener.get_port()

    async def _reverse_forward(self, dest_host: str, dest_port: int) -> str:
        path = await self._private_folder() + "/ps.sock"
        conn = await self._connection()
        try:
            await conn.forward_remote_path_to_port(path, dest_host, dest_port)
        except Exception as e:        # asyncssh raises ChannelListenError when the server says no
            raise SshError(f"{self.target}: the server refused to forward a socket to {dest_host}:{dest_port} "
                           f"({getattr(e, 'reason', e)}); is AllowStreamLocalForwarding off?") from None
        return "unix:" + path

    def close(self) -> None:
        """Close the connection: every process started through it is stopped by its watchdog, and
        its forwards end."""
        with self._closing:             # a Stop button and the run's own end may close at once
            conn = self._conn
            if conn is None:
                return
            if self._folders:
                try:
                    self.run("rm -rf " + " ".join(self._folders), timeout_s=30)
                except (SshError, TimeoutError):
                    pass          # a lost connection: the folders stay in /tmp, empty but for a dead socket
                self._folders = []
            self._conn = None
            _LOOP.run(self._close(conn), 30)

    @staticmethod
    async def _close(conn) -> None:
        conn.close()
        await conn.wait_closed()

    async def _connection(self):
        import asyncssh

        if self._conn is not None and not self._conn.is_closed():
            return self._conn
        t = self.target
        if t.check_host_key and not Path(t.known_hosts).expanduser().is_file():
            raise SshError(f"{t}: no known_hosts file at {t.known_hosts} to check the host's key against "
                           f"(ssh-keyscan -p {t.port} {t.host} >> {t.known_hosts}, after checking the key)")
        options = dict(username=t.user, port=t.port, connect_timeout=self.connect_timeout_s,
                       known_hosts=str(Path(t.known_hosts).expanduser()) if t.check_host_key else None)
        if t.key_file is not None:
            options["client_keys"] = [str(Path(t.key_file).expanduser())]
        try:
            self._conn = await asyncssh.connect(t.host, **options)
            self.connections += 1
        except asyncssh.HostKeyNotVerifiable as e:
            raise SshError(f"{t}: the host's key is not trusted ({e.reason}): add it to {t.known_hosts} "
                           f"(ssh-keyscan -p {t.port} {t.host}) or turn the check off for a throwaway host") from None
        except asyncssh.PermissionDenied:
            raise SshError(f"{t}: the server refused the key "
                           f"{t.key_file or 'from the SSH agent or ~/.ssh'} for user {t.user or 'of this account'}") from None
        except (OSError, asyncio.TimeoutError) as e:
            raise SshError(f"{t}: cannot connect ({e or type(e).__name__})") from None
        except (asyncssh.Error, ValueError) as e:
            raise SshError(f"{t}: {getattr(e, 'reason', e)}") from None
        return self._conn

    async def _run(self, command: str) -> tuple[int, str]:
        import asyncssh

        conn = await self._connection()
        try:
            r = await conn.run(command, check=False)
        except (asyncssh.Error, OSError) as e:        # the connection went while the command ran or opened
            return LOST, f"the SSH connection was lost ({getattr(e, 'reason', e) or type(e).__name__})"
        return (r.exit_status if r.exit_status is not None else LOST), f"{r.stdout or ''}{r.stderr or ''}"

    async def _start(self, spec: ProcessSpec) -> SshProcess:
        conn = await self._connection()
        proc = await conn.create_process(f"exec {shlex.quote(self.python)} -u -c {shlex.quote(WATCHDOG)} 2>&1",
                                         encoding=None)
        proc.stdin.write(json.dumps({"argv": list(spec.argv), "cwd": spec.cwd, "env": spec.env}).encode() + b"\n")
        # The watchdog's one line. The command shares the channel and may already have written
        # (a busy host schedules it first): its bytes around the line are its log's.
        said, started = b"", None
        while started is None:
            part = await proc.stdout.read(4096)
            if not part:
                break
            said += part
            started = watchdog_said(said)
        if started is None or started[2]:
            proc.close()
            why = started[2] if started is not None else said.decode(errors="replace").strip()
            raise ProcessError(f"cannot start {spec.name} on {self.target}: {why or 'the host closed the session'}")
        pgid, pid, _, output = started
        handle = SshProcess(spec, self, proc, pgid, pid)
        handle._write(output)
        handle._pump = asyncio.get_running_loop().create_task(handle._follow())
        return handle


def watchdog_said(said: bytes) -> tuple[int, int, str, bytes] | None:
    """The watchdog's line in what a session printed so far: (pgid, pid, why it could not start or
    "", the command's own bytes around the line); None until the whole line is there."""
    m = re.search(rb"wantrain-(started|error)( [^\n]*)?\n", said)
    if m is None:
        return None
    rest = said[:m.start()] + said[m.end():]
    words = (m.group(2) or b"").decode(errors="replace").split()
    if m.group(1) == b"started" and len(words) == 2 and all(w.isdigit() for w in words):
        return int(words[0]), int(words[1]), "", rest
    return -1, -1, " ".join(words) or "the watchdog could not start it", rest


class SshProcess:
    """A process on a remote host: its output copied into the local log file as it comes."""

    def __init__(self, spec: ProcessSpec, launcher: SshLauncher, proc, pgid: int, pid: int) -> None:
        self.spec, self.name, self.launcher, self.proc = spec, spec.name, launcher, proc
        self.pgid, self.pid = pgid, pid            # on the remote host
        self._log = open(spec.log_path, "ab", buffering=0) if spec.log_path else None
        self._code: int | None = None
        self._ended = threading.Event()
        self._pump: asyncio.Task | None = None

    def _write(self, data: bytes) -> None:
        if self._log is not None and data:
            self._log.write(data)

    async def _follow(self) -> None:
        try:
            while part := await self.proc.stdout.read(65536):
                self._write(part)
            await self.proc.wait_closed()
            status, signal = self.proc.exit_status, self.proc.exit_signal
            if status is not None and status >= 0:
                self._code = status
            elif signal is not None:
                self._code = 128 + _signal_number(signal[0])
            else:
                self._code = LOST
                self._write(f"\n[wantrain] the SSH connection to {self.launcher.target} was lost\n".encode())
        except Exception as e:                     # a broken connection: its watchdog stops the group
            self._code = LOST
            self._write(f"\n[wantrain] the SSH connection to {self.launcher.target} was lost: {e}\n".encode())
        finally:
            if self._log is not None:
                self._log.close()
                self._log = None
            self._ended.set()

    def poll(self) -> int | None:
        return self._code if self._ended.is_set() else None

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            raise WaitTimeoutError(f"{self.name} (pid {self.pid} on {self.launcher.target}) still running after {timeout} s")
        assert self._code is not None
        return self._code

    def _signal_group(self, name: str) -> None:
        if self.poll() is None:
            try:
                self.launcher.run(f"kill -{name} -- -{self.pgid}", timeout_s=30)
            except (SshError, TimeoutError):
                pass      # the connection is gone, and with it (its watchdog sees to that) the group

    def terminate(self) -> None:
        self._signal_group("TERM")

    def kill(self) -> None:
        self._signal_group("KILL")
        self._ended.wait(10)

    def stop(self, grace_s: float = 3.0) -> int | None:
        """SIGTERM to the group, then SIGKILL after `grace_s`; always reaps the process."""
        return stop_gracefully(self, grace_s)

    def log_tail(self, lines: int = 20) -> str:
        return log_tail(self.spec.log_path, lines)


def _signal_number(name: str) -> int:
    import signal

    try:
        return int(getattr(signal, "SIG" + name))
    except AttributeError:
        return 0
