"""Launcher conformance: the local and the SSH launcher (a real OpenSSH server, tests/sshd.py)
pass the same checks (start, log, exit code, stop of the whole group, no orphans)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from wantrain.errors import ProcessError, SshError
from wantrain.launch import LocalLauncher, ProcessSpec
from wantrain.launch.ssh import LOST, SshLauncher, SshTarget

from wantrain.telemetry import read_events, rows

from .helpers import pid_alive, survivors
from .reaper import descendants
from .sshd import SshServer


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    server = SshServer(tmp_path_factory.mktemp("sshd"))
    yield server
    server.close()


def ssh_launcher(server: SshServer, **target) -> SshLauncher:
    options = {"key_file": server.key_file, "known_hosts": str(server.known_hosts), **target}
    return SshLauncher(SshTarget.parse(server.url, **options), python=sys.executable)


@pytest.fixture(params=["local", "ssh"])
def launcher(request):
    if request.param == "local":
        yield LocalLauncher()
        return
    remote = ssh_launcher(request.getfixturevalue("sshd"))
    yield remote
    remote.close()


def _wait_for_output(h, timeout_s: float = 30) -> str:
    deadline = time.time() + timeout_s
    while not h.log_tail().strip() and time.time() < deadline:
        time.sleep(0.05)
    return h.log_tail().strip()


def test_a_run_says_what_it_is_where_a_notebook_shows_it(tmp_path):
    from wantrain.launch.run import Run

    from .helpers import small_config

    run = Run(small_config(), run_dir=tmp_path / "r1")
    assert repr(run) == f"<wantrain Run r1: 3 sites (us-east, eu-west, ap-southeast), not started; folder {tmp_path / 'r1'}>"


@pytest.mark.timeout(60)
def test_start_poll_log_and_exit_code(launcher, tmp_path):
    code = "import os; print('hi', os.environ['WANTRAIN_TEST']); raise SystemExit(3)"
    h = launcher.start(ProcessSpec("hello", (sys.executable, "-c", code), env={"WANTRAIN_TEST": "x"},
                                   cwd=str(tmp_path), log_path=tmp_path / "hello.log"))
    assert h.wait(30) == 3 and h.poll() == 3
    assert h.log_tail() == "hi x"


@pytest.mark.timeout(60)
def test_stop_takes_the_whole_process_group(launcher, tmp_path):
    # The process starts a grandchild that ignores SIGTERM; stopping must still end both.
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
    code = ("import subprocess, sys, time;"
            f"c = subprocess.Popen([sys.executable, '-c', {stubborn!r}]);"
            "print(c.pid, flush=True); time.sleep(600)")
    h = launcher.start(ProcessSpec("parent", (sys.executable, "-c", code), log_path=tmp_path / "p.log"))
    grandchild = int(_wait_for_output(h))
    assert h.poll() is None and pid_alive(grandchild)
    with pytest.raises(TimeoutError):
        h.wait(0.2)
    h.stop(grace_s=0.5)
    deadline = time.time() + 10
    while pid_alive(grandchild) and time.time() < deadline:
        time.sleep(0.05)
    assert h.poll() is not None and not pid_alive(grandchild)


@pytest.mark.timeout(60)
def test_start_failure_is_a_process_error(launcher, tmp_path):
    with pytest.raises(ProcessError, match="cannot start ghost"):
        launcher.start(ProcessSpec("ghost", ("/no/such/binary",), log_path=tmp_path / "g.log"))


@pytest.mark.timeout(90)
def test_a_dropped_ssh_connection_stops_the_remote_group(sshd, tmp_path):
    """No orphan on the host: when the connection is cut, the watchdog ends the whole group, and
    the handle reports the loss (exit code 255, a line in the log)."""
    remote = ssh_launcher(sshd)
    try:
        code = ("import subprocess, sys, time;"
                "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']);"
                "print(c.pid, flush=True); time.sleep(600)")
        h = remote.start(ProcessSpec("site", (sys.executable, "-c", code), log_path=tmp_path / "s.log"))
        grandchild = int(_wait_for_output(h))
        assert pid_alive(h.pid) and pid_alive(grandchild)
        sshd.drop_all()
        assert h.wait(30) == LOST
        assert "SSH connection to ssh://" in h.log_tail() and "was lost" in h.log_tail()
        deadline = time.time() + 20
        while (pid_alive(h.pid) or pid_alive(grandchild)) and time.time() < deadline:
            time.sleep(0.1)
        assert not pid_alive(h.pid) and not pid_alive(grandchild)
        assert remote.run("echo again") == (0, "again\n")          # the launcher connects anew
    finally:
        remote.close()


@pytest.mark.timeout(60)
def test_two_threads_closing_one_ssh_launcher_both_return(sshd):
    """A panel's Stop and the run's own end close the same connection at once (a browser test
    once showed an AttributeError from the second): each returns, and the forward's folder goes."""
    import threading

    remote = ssh_launcher(sshd)
    ps = remote.reverse_forward("127.0.0.1", 9)
    folder = ps[len("unix:"):].rsplit("/", 1)[0]
    assert Path(folder).is_dir()
    errors: list[BaseException] = []

    def close() -> None:
        try:
            remote.close()
        except BaseException as e:
            errors.append(e)
    threads = [threading.Thread(target=close) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(40)
    assert errors == [] and not any(t.is_alive() for t in threads)
    assert not remote.connected and not Path(folder).exists()


@pytest.mark.timeout(60)
def test_ssh_refusals_name_the_host_and_the_cause(sshd, tmp_path):
    with pytest.raises(SshError, match=f"ssh://.*:{sshd.port}: the server refused the key .*other_key"):
        ssh_launcher(sshd, key_file=str(sshd.other_key_file)).run("true")
    stranger = tmp_path / "known_hosts"
    other = " ".join(sshd.other_key_file.with_suffix(".pub").read_text().split()[:2])
    stranger.write_text(f"[127.0.0.1]:{sshd.port} {other}\n")       # the host shows another key
    with pytest.raises(SshError, match="the host's key is not trusted"):
        ssh_launcher(sshd, known_hosts=str(stranger)).run("true")
    assert ssh_launcher(sshd, known_hosts=str(stranger), check_host_key=False).run("echo ok") == (0, "ok\n")
    with pytest.raises(SshError, match="no known_hosts file at"):
        ssh_launcher(sshd, known_hosts=str(tmp_path / "missing")).run("true")
    import socket
    with socket.create_server(("127.0.0.1", 0)) as s:
        closed_port = s.getsockname()[1]
    with pytest.raises(SshError, match="cannot connect"):
        SshLauncher(SshTarget.parse(f"ssh://nobody@127.0.0.1:{closed_port}", known_hosts=str(sshd.known_hosts)),
                    connect_timeout_s=5).run("true")
    with pytest.raises(SshError, match="not an SSH address"):
        SshLauncher("http://host:22")


def _sigterm(prog: str, settle_s: float = 0.0) -> tuple[int, str]:
    """Run `prog` (which calls exit_on_sigterm(0.5), then prints "ready"), send it SIGTERM
    `settle_s` after that line: its exit code, and what it printed after "ready"."""
    p = subprocess.Popen([sys.executable, "-c", "from wantrain.commands.process import exit_on_sigterm\n"
                          "exit_on_sigterm(0.5)\n" + prog], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline() == "ready\n"
        time.sleep(settle_s)
        p.send_signal(signal.SIGTERM)
        return p.wait(30), p.stdout.read()
    finally:
        p.kill()
        p.wait()


@pytest.mark.timeout(60)
def test_sigterm_unwinds_and_ends_the_process_though_a_thread_is_stuck():
    # A thread in a call that does not return (here a sleep; in a site, a step on a loaded machine)
    # would hold interpreter shutdown until it returned. A second SIGTERM while unwinding (a dying
    # parent sends one per thread) lets the unwinding finish.
    prog = ("import os, signal, threading, time\n"
            "threading.Thread(target=time.sleep, args=(300,)).start()\n"
            "try:\n    print('ready', flush=True); time.sleep(300)\n"
            "finally:\n    os.kill(os.getpid(), signal.SIGTERM); time.sleep(0.1); print('unwound', flush=True)\n")
    assert _sigterm(prog) == (143, "unwound\n")


@pytest.mark.timeout(60)
def test_sigterm_ends_a_process_whose_main_thread_never_returns_from_a_c_call():
    # A mutex wait is not interrupted by a signal: the Python handler never runs, the deadline
    # still does (it starts as the signal arrives, not when the main thread gets to it).
    prog = ("import ctypes, threading, time\n"
            "libc, mutex = ctypes.CDLL(None), ctypes.create_string_buffer(64)\n"
            "threading.Thread(target=lambda: (libc.pthread_mutex_lock(mutex), time.sleep(300)), daemon=True).start()\n"
            "time.sleep(0.2); print('ready', flush=True); libc.pthread_mutex_lock(mutex)\n")
    assert _sigterm(prog, settle_s=0.2) == (143, "")     # 0.2 s: the main thread is in the wait


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_interrupted_demo_leaves_no_process_behind(tmp_path, sig):
    run_dir = tmp_path / "run"
    # Ctrl-C as a terminal delivers it, whatever this process inherited: a test run started in the
    # background of a script has SIGINT ignored, and its children with it.
    ctrl_c = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
              "sys.argv[0] = 'wantrain'; runpy.run_module('wantrain', run_name='__main__')")
    demo = subprocess.Popen([sys.executable, "-c", ctrl_c, "demo", "--rounds", "50", "--run-dir", str(run_dir)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    children: list[int] = []
    try:
        deadline = time.time() + 90
        while time.time() < deadline:   # wait until all three sites have joined
            if (run_dir / "events.jsonl").exists() and len(rows(read_events(run_dir), "join")) >= 3:
                break
            time.sleep(0.2)
        else:
            pytest.fail("the demo did not start its processes")
        time.sleep(1.0)
        # Everything it started: the PS, the sites, the link emulator, the warm starter they were
        # forked from (wantrain/launch/warm.py).
        children = descendants(demo.pid)
        assert len(children) >= 4, children
        os.kill(demo.pid, sig)
        demo.wait(30)
        assert survivors(children, 15) == []
    finally:
        survivors(children, 0)
        if demo.poll() is None:
            demo.kill()


@pytest.mark.timeout(120)
def test_a_host_is_inspected_before_use(sshd, tmp_path):
    """Its Python, torch and GPUs are reported; a missing or old Python, or too few GPUs, is refused by name."""
    import torch

    from wantrain.launch.host import inspect_host

    remote = ssh_launcher(sshd)
    try:
        info = inspect_host(remote, python=sys.executable)
        assert info.python[:2] == sys.version_info[:2] and info.torch == torch.__version__
        assert info.describe().startswith(f"Python {sys.version.split()[0]}, torch {torch.__version__}")
        with pytest.raises(SshError, match="cannot run /no/python there .* Python 3.10 or newer"):
            inspect_host(remote, python="/no/python")
        old = tmp_path / "python-3.8"            # a Python that reports itself as 3.8
        old.write_text(f"#!/bin/sh\nexec {sys.executable} -c "
                       "\"import sys; sys.version_info = (3, 8, 10); exec(sys.argv[2])\" -- \"$2\"\n")
        old.chmod(0o755)
        with pytest.raises(SshError, match="is Python 3.8.10; a site needs 3.10 or newer"):
            inspect_host(remote, python=str(old))
        if not torch.cuda.is_available():
            with pytest.raises(SshError, match="1 GPU.s. asked for, but torch .* sees 0 CUDA device"):
                inspect_host(remote, python=sys.executable, gpus=1)
    finally:
        remote.close()


@pytest.mark.timeout(180)
def test_the_wheel_a_host_installs_holds_every_file_the_package_reads():
    """A host installs a wheel of this checkout, not the checkout: the testbed's region table,
    traces and scenarios must be in it (a remote shaper once failed on the missing RTT table)."""
    import zipfile

    from wantrain.launch.install import CHECKOUT, project_wheel

    names = set(zipfile.ZipFile(project_wheel()).namelist())
    for package in ("wantrain", "testbed"):
        for f in (CHECKOUT / package).rglob("*"):
            if f.is_file() and "__pycache__" not in f.parts and f.suffix not in (".pyc", ".nbi", ".nbc"):
                assert str(f.relative_to(CHECKOUT)) in names, f"{f.relative_to(CHECKOUT)} is not in the wheel"


def test_the_watchdogs_line_is_found_wherever_the_commands_output_put_it():
    """On a busy host the started command can print before its watchdog: its bytes stay its log's
    (a loaded CI run once failed to start a site that printed its first line early)."""
    from wantrain.launch.ssh import watchdog_said

    assert watchdog_said(b"wantrain-started 5 6\nhello") == (5, 6, "", b"hello")
    assert watchdog_said(b"28972\nwantrain-started 5 6\n") == (5, 6, "", b"28972\n")
    assert watchdog_said(b"partialwantrain-started 5 6\n line\n") == (5, 6, "", b"partial line\n")
    assert watchdog_said(b"28972\nwantrain-star") is None                 # the line is not all there yet
    assert watchdog_said(b"wantrain-error [Errno 2] No such file: 'x'\n") == (-1, -1, "[Errno 2] No such file: 'x'", b"")
