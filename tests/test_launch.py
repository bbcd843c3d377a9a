"""Launcher conformance (local now; the SSH launcher will run the same checks) and no orphans."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from wantrain.errors import ProcessError
from wantrain.launch import LocalLauncher, ProcessSpec

from .helpers import pid_alive

LAUNCHERS = [LocalLauncher]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("launcher_cls", LAUNCHERS)
def test_start_poll_log_and_exit_code(launcher_cls, tmp_path):
    h = launcher_cls().start(ProcessSpec("hello", (sys.executable, "-c", "print('hi'); raise SystemExit(3)"),
                                         log_path=tmp_path / "hello.log"))
    assert h.wait(30) == 3 and h.poll() == 3
    assert h.log_tail() == "hi"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("launcher_cls", LAUNCHERS)
def test_stop_takes_the_whole_process_group(launcher_cls, tmp_path):
    # The process starts a grandchild that ignores SIGTERM; stopping must still end both.
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
    code = ("import subprocess, sys, time;"
            f"c = subprocess.Popen([sys.executable, '-c', {stubborn!r}]);"
            "print(c.pid, flush=True); time.sleep(600)")
    h = launcher_cls().start(ProcessSpec("parent", (sys.executable, "-c", code), log_path=tmp_path / "p.log"))
    deadline = time.time() + 20
    while not h.log_tail().strip() and time.time() < deadline:
        time.sleep(0.05)
    grandchild = int(h.log_tail().strip())
    assert h.poll() is None and pid_alive(grandchild)
    with pytest.raises(TimeoutError):
        h.wait(0.2)
    h.stop(grace_s=0.5)
    time.sleep(0.2)
    assert h.poll() is not None and not pid_alive(grandchild)


def test_start_failure_is_a_process_error(tmp_path):
    with pytest.raises(ProcessError, match="cannot start"):
        LocalLauncher().start(ProcessSpec("ghost", ("/no/such/binary",), log_path=tmp_path / "g.log"))


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(d.name))
    return out


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
        while time.time() < deadline:   # wait until the PS and all three sites run
            children = _children(demo.pid)
            if len(children) >= 4:
                break
            time.sleep(0.2)
        else:
            pytest.fail("the demo did not start its processes")
        time.sleep(1.0)
        os.kill(demo.pid, sig)
        demo.wait(30)
        deadline = time.time() + 15
        while any(pid_alive(p) for p in children) and time.time() < deadline:
            time.sleep(0.2)
        assert [p for p in children if pid_alive(p)] == []
    finally:
        for pid in children:
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
        if demo.poll() is None:
            demo.kill()
