"""Warm starts: a starter process that has imported torch once forks the PS and site processes.

A fresh `python -m wantrain site` spends about 2.5 s of CPU before it can join, most of it
importing torch, numpy and numba; a notebook's Start, a demo and the test suite start hundreds of
them. The launcher (local.py) keeps a starter, `python -m wantrain.launch.warm FD`, for each
environment its processes ask for (see below), which imports those libraries, then forks a child
for each request it reads on the socket FD and tells the launcher each child's pid and, when it
has reaped it, its exit code.

The child is what `python -m MODULE ARGS` would have been: its own session (so its process group
can be signalled), SIGTERM when its parent (the starter) dies, stdin from /dev/null, stdout and
stderr appended to its log file, the requested working folder and environment, and the module run
as `__main__` with the interpreter's normal exit (atexit, non-daemon threads, exit code). The
starter dies with the launcher's spawner thread (setpriv --pdeathsig, as every local process),
and its children with it. It forks before any thread or gRPC channel exists in it (gRPC and
OpenMP are not fork-safe once started); it imports neither gRPC nor anything that starts a thread.
Beside the libraries it loads the codec's compiled loops (numba's first call in a process is
costly), so it imports the checkout's `wantrain.codec`: an edit to the codec reaches warm children
only through a new starter (a new launcher: restart the kernel).

Only what would run the same way is started warm (`WarmStarter.fits`): the launcher's own Python,
`-m wantrain`, and an environment that agrees with the starter's on every variable the preloaded
libraries read when imported (local.py keeps a starter per such environment, a few at most).
Anything else, and any failure of the starter, starts cold. `WANTRAIN_WARM_START=0` turns warm
starts off.

Protocol (JSON lines on a socketpair): starter -> launcher `{"ready": pid}` once imported;
launcher -> starter `{"id", "argv", "module", "args", "env", "cwd", "log"}`; starter -> launcher
`{"id", "pid"}` or `{"id", "error"}`, and `{"exit": pid, "code": c}` (negative: killed by signal -c,
as subprocess reports it).
"""

from __future__ import annotations

import ctypes
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence

import setproctitle

# Environment variables the preloaded libraries read when they are imported: a starter serves only
# requests whose environment agrees with its own on these (local.py starts another for the rest).
IMPORT_TIME_ENV = ("PYTHON", "LD_", "NUMBA_", "OMP_", "MKL_", "KMP_", "OPENBLAS_", "TORCH", "PYTORCH_", "CUDA",
                   "NVIDIA_", "HIP_", "ROCM", "GRPC_", "VIRTUAL_ENV")
IMPORT_TIME_EXEMPT = ("PYTHONUNBUFFERED",)      # become() sets the streams up as it says
PRELOAD = ("numpy", "torch", "numba")
_PR_SET_PDEATHSIG = 1


def import_time_env(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The part of `env` the preloaded libraries read when imported: two environments that agree
    on it can share a starter."""
    return tuple(sorted((k, v) for k, v in env.items() if k.startswith(IMPORT_TIME_ENV) and k not in IMPORT_TIME_EXEMPT))


def _parent_death_signal(sig: int) -> None:
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)


def _send(sock: socket.socket, msg: dict) -> None:
    sock.sendall(json.dumps(msg).encode() + b"\n")


def serve(sock: socket.socket) -> dict | None:
    """The starter's loop. Returns None when the launcher has gone; in a forked child, returns
    the request that child is to run."""
    for name in PRELOAD:
        __import__(name)
    _load_codec_kernels()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)      # a handler, so that the wakeup fd is written
    signal.set_wakeup_fd(wake_w)
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ)
    sel.register(wake_r, selectors.EVENT_READ)
    _send(sock, {"ready": os.getpid()})
    buf = b""
    while True:
        for key, _ in sel.select():
            if key.fileobj == wake_r:
                while True:
                    try:
                        if not os.read(wake_r, 512):
                            break
                    except BlockingIOError:
                        break
                _reap(sock)
                continue
            data = sock.recv(1 << 16)
            if not data:
                return None
            buf += data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                req = json.loads(line)
                settled_r, settled_w = os.pipe()
                try:
                    pid = os.fork()
                except OSError as e:
                    os.close(settled_r)
                    os.close(settled_w)
                    _send(sock, {"id": req["id"], "error": f"fork: {e}"})
                    continue
                if pid == 0:                         # the child: leave the starter's loop behind
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    sel.close()
                    for fd in (wake_r, wake_w, settled_r):
                        os.close(fd)
                    sock.close()
                    _settle(os.getppid())
                    os.close(settled_w)              # the starter may now say our pid
                    return req
                # The pid goes out once the child leads its own session and dies with us: a
                # launcher that signals its group at once must reach it.
                os.close(settled_w)
                os.read(settled_r, 1)
                os.close(settled_r)
                _send(sock, {"id": req["id"], "pid": pid})


def _load_codec_kernels() -> None:
    """Load the codec's compiled loops here, once: the first numba function a process calls costs
    about 0.6 s of CPU (numba setting up its compiler and reading the on-disk cache), which every
    PS and site would otherwise pay at its first delta. The loops are plain compiled code, no
    thread, so the children inherit them. A failure here is the children's to report."""
    try:
        from wantrain.outer.kernels import load as load_round_loops
        from wantrain.codec import load_kernels
        from wantrain.config import CODEC_MODES

        load_kernels(CODEC_MODES)
        load_round_loops()
    except Exception:                                # (see the docstring)
        pass


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _send(sock, {"exit": pid, "code": os.waitstatus_to_exitcode(status)})


def _settle(starter: int) -> None:
    """In the forked child, before the starter reports it: its own session, SIGTERM when the
    starter dies."""
    os.setsid()
    _parent_death_signal(signal.SIGTERM)
    if os.getppid() != starter:                   # the starter died before the signal was armed
        os._exit(128 + signal.SIGTERM)


def become(req: dict) -> None:
    """In the forked child: turn into `python -m MODULE ARGS` as the request describes it."""
    # What ps, top and /proc/PID/cmdline show: the command it stands for, not the starter's.
    # (Before the environment changes: setproctitle takes the space of the one exec gave us.)
    setproctitle.setproctitle(" ".join(req["argv"]))
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    out = os.open(req["log"] or os.devnull, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(out, 1)
    os.dup2(out, 2)
    for fd in (devnull, out):
        os.close(fd)
    os.environ.clear()
    os.environ.update(req["env"])
    if req["cwd"]:
        os.chdir(req["cwd"])
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    # New stream objects over the new fds, buffered as a fresh interpreter's would be.
    sys.stdout = open(1, "w", buffering=1 if unbuffered else -1, closefd=False,
                      encoding=sys.stdout.encoding, errors=sys.stdout.errors)
    sys.stderr = open(2, "w", buffering=1, closefd=False, encoding=sys.stderr.encoding,
                      errors="backslashreplace")
    sys.stdin = open(0, closefd=False)
    sys.path[0] = os.getcwd()                     # where `python -m` looks first
    sys.argv = [req["module"], *req["args"]]


# ------------------------------------------------------------------ the launcher's side

class WarmChild:
    """A child of the starter as the launcher sees it: the part of a Popen that LocalProcess uses."""

    def __init__(self, starter: WarmStarter, pid: int) -> None:
        self.pid, self._starter = pid, starter
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._starter.exit_code(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.poll() is None:
            if not self._starter.wait_exit(self.pid, timeout):
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
        return self.poll()        # type: ignore[return-value]


class WarmStarter:
    """One starter process (`python -m wantrain.launch.warm`) and what it says about its children.
    `spawn(argv)` turns a list into the command that runs it (the launcher's parent-death wrapper);
    the caller starts this from the thread that starts its other processes."""

    READY_S = 120.0      # imports on a loaded machine
    REPLY_S = 30.0

    def __init__(self, python: str, env: Mapping[str, str], spawn=lambda argv: argv) -> None:
        self.python, self.env = python, dict(env)
        ours, theirs = socket.socketpair()
        self._errors = tempfile.TemporaryFile()
        try:
            self.proc = subprocess.Popen(
                spawn([python, "-m", "wantrain.launch.warm", str(theirs.fileno())]), pass_fds=(theirs.fileno(),),
                env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._errors,
                start_new_session=True)
        finally:
            theirs.close()
        self._sock, self._file = ours, ours.makefile("rb")
        self._cond = threading.Condition()
        self._replies: dict[int, dict] = {}
        self._exits: dict[int, int] = {}
        self._ready = False
        self._gone = False
        self._next_id = 0
        threading.Thread(target=self._read, name="wantrain-warm-starter", daemon=True).start()
        with self._cond:
            if not self._cond.wait_for(lambda: self._ready or self._gone, self.READY_S) or self._gone:
                self.close()
                raise OSError(f"the warm starter did not start: {self._error_text()}")

    def fits(self, argv: Sequence[str], env: Mapping[str, str]) -> bool:
        """Would `argv` with `env` run the same forked from this starter as started afresh?"""
        if len(argv) < 3 or list(argv[1:3]) != ["-m", "wantrain"] or not self.alive():
            return False
        if os.path.abspath(argv[0]) != os.path.abspath(self.python):
            return False
        return import_time_env(env) == import_time_env(self.env)

    def start(self, argv: Sequence[str], env: Mapping[str, str], cwd: str | None, log: str | None) -> WarmChild:
        """Fork `argv` (`python -m MODULE ARGS`, see fits()); raises OSError if the starter cannot."""
        with self._cond:
            self._next_id += 1
            rid = self._next_id
        try:
            _send(self._sock, {"id": rid, "argv": list(argv), "module": argv[2], "args": list(argv[3:]),
                               "env": dict(env), "cwd": cwd, "log": log})
        except OSError as e:
            raise OSError(f"the warm starter is gone: {e}") from None
        with self._cond:
            if not self._cond.wait_for(lambda: rid in self._replies or self._gone, self.REPLY_S):
                raise OSError("the warm starter did not answer")
            reply = self._replies.pop(rid, None)
        if reply is None:
            raise OSError(f"the warm starter is gone: {self._error_text()}")
        if "error" in reply:
            raise OSError(reply["error"])
        return WarmChild(self, int(reply["pid"]))

    def alive(self) -> bool:
        return not self._gone and self.proc.poll() is None

    def exit_code(self, pid: int) -> int | None:
        with self._cond:
            if pid in self._exits:
                return self._exits[pid]
            if self._gone and not _running(pid):      # nobody left to say: it ended as it was told to
                return -signal.SIGTERM
        return None

    def wait_exit(self, pid: int, timeout: float | None) -> bool:
        """Wait until `pid` has ended (True) or `timeout` has passed (False)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:                 # an RLock: exit_code() takes it again
            while self.exit_code(pid) is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(0.1 if left is None else min(0.1, left))   # /proc, once the starter is gone
        return True

    def close(self) -> None:
        """Stop the starter; its children get SIGTERM (their parent-death signal)."""
        self._sock.close()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def _read(self) -> None:
        try:
            for line in self._file:
                msg = json.loads(line)
                with self._cond:
                    if "ready" in msg:
                        self._ready = True
                    elif "exit" in msg:
                        self._exits[int(msg["exit"])] = int(msg["code"])
                    else:
                        self._replies[int(msg["id"])] = msg
                        if "pid" in msg:             # a pid used again: its last owner's exit is not ours
                            self._exits.pop(int(msg["pid"]), None)
                    self._cond.notify_all()
        except (OSError, ValueError):
            pass
        with self._cond:
            self._gone = True
            self._cond.notify_all()

    def _error_text(self) -> str:
        try:
            self._errors.seek(0)
            return self._errors.read().decode(errors="replace").strip()[-2000:] or "no message"
        except OSError:
            return "no message"


def _running(pid: int) -> bool:
    """Alive and not a zombie (a child of the starter's that init has not reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def main() -> None:
    sock = socket.socket(fileno=int(sys.argv[1]))
    req = serve(sock)
    if req is None:
        return
    become(req)
    import runpy
    runpy.run_module(req["module"], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
