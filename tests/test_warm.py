"""Warm starts (wantrain/launch/warm.py): a child forked from the starter is what `python -m` would
have started, dies with whoever started it, and the local launcher uses it only where it fits."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from wantrain.launch import LocalLauncher, ProcessSpec
from wantrain.launch.argv import ps_command
from wantrain.launch.local import _dying_with_parent
from wantrain.launch.warm import WarmStarter

from .helpers import pid_alive, small_config, survivors

# What a child reports about itself: everything `python -m` decides for a process.
REPORT = """\
import atexit, json, os, sys
atexit.register(lambda: print("atexit ran", flush=True))
print(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "env": os.environ.get("WARM_TEST"),
                  "stdin": sys.stdin.read(), "path0": sys.path[0], "name": __name__,
                  "own_group": os.getpgid(0) == os.getpid() == os.getsid(0),
                  "cmdline": open("/proc/self/cmdline").read().replace(chr(0), " ").strip(),
                  "torch_preloaded": "torch" in sys.modules,
                  "kernels_loaded": "wantrain.codec.quantize_kernels" in sys.modules
                  and bool(sys.modules["wantrain.codec.quantize_kernels"].quantize_blocks.signatures)}))
raise SystemExit(3)
"""


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


@pytest.fixture
def starter():
    s = WarmStarter(sys.executable, os.environ, _dying_with_parent)
    yield s
    s.close()


@pytest.mark.timeout(120)
def test_a_warm_child_is_what_python_m_would_have_started(starter, tmp_path):
    import json

    (tmp_path / "report.py").write_text(REPORT)
    argv = [sys.executable, "-m", "report", "two words", "--flag"]
    env = {**os.environ, "WARM_TEST": "x"}
    child = starter.start(argv, env, str(tmp_path), str(tmp_path / "warm.log"))
    assert child.wait(60) == 3 and child.poll() == 3
    cold = subprocess.run(argv, env=env, cwd=tmp_path, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=60, start_new_session=True)      # as the launcher starts it cold
    assert cold.returncode == 3
    warm_lines, cold_lines = (tmp_path / "warm.log").read_text().splitlines(), cold.stdout.splitlines()
    assert warm_lines[1:] == cold_lines[1:] == ["atexit ran"]
    warm, cold_report = json.loads(warm_lines[0]), json.loads(cold_lines[0])
    assert warm.pop("torch_preloaded") and not cold_report.pop("torch_preloaded")   # the point of it
    assert warm.pop("kernels_loaded") and not cold_report.pop("kernels_loaded")     # and the codec's loops
    assert os.listdir(f"/proc/{starter.proc.pid}/task") == [str(starter.proc.pid)]  # forked with no thread
    assert warm == cold_report, (warm, cold_report)
    assert warm["own_group"] and warm["cmdline"] == " ".join(argv) and warm["env"] == "x"


@pytest.mark.timeout(60)
def test_a_warm_child_can_be_signalled_as_soon_as_it_is_started(starter, tmp_path):
    (tmp_path / "sleeper.py").write_text("import time; time.sleep(600)\n")
    child = starter.start([sys.executable, "-m", "sleeper"], dict(os.environ), str(tmp_path), None)
    os.killpg(child.pid, signal.SIGKILL)          # its group exists before its pid is known
    assert child.wait(30) == -signal.SIGKILL      # as subprocess reports a death by signal
    with pytest.raises(subprocess.TimeoutExpired):
        starter.start([sys.executable, "-m", "sleeper"], dict(os.environ), str(tmp_path), None).wait(0.2)


@pytest.mark.timeout(120)
def test_warm_children_die_with_the_process_that_started_them(tmp_path):
    (tmp_path / "sleeper.py").write_text("import time; time.sleep(600)\n")
    script = ("import os, sys\n"
              "from wantrain.launch.local import _SPAWNER, _dying_with_parent\n"
              "from wantrain.launch.warm import WarmStarter\n"
              "s = _SPAWNER.submit(WarmStarter, sys.executable, os.environ, _dying_with_parent).result()\n"
              f"c = s.start([sys.executable, '-m', 'sleeper'], dict(os.environ), {str(tmp_path)!r}, None)\n"
              "print(s.proc.pid, c.pid, flush=True)\n"
              "import time; time.sleep(600)\n")
    launcher = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    pids: list[int] = []
    try:
        pids = [int(p) for p in launcher.stdout.readline().split()]
        assert len(pids) == 2 and all(pid_alive(p) for p in pids)
        launcher.kill()
        launcher.wait(10)
        assert survivors(pids, 20) == []
    finally:
        survivors(pids, 0)
        if launcher.poll() is None:
            launcher.kill()
        launcher.wait(10)


@pytest.mark.timeout(180)
def test_the_local_launcher_forks_wantrain_warm_and_starts_the_rest_cold(tmp_path, monkeypatch):
    (tmp_path / "config.json").write_text(small_config().to_json())
    argv = ps_command(sys.executable, tmp_path / "config.json", port=0, run_dir=tmp_path / "run")
    launcher, started = LocalLauncher(), []

    def start(name: str, **env: str):
        h = launcher.start(ProcessSpec(name, argv, env=env, log_path=tmp_path / f"{name}.log"))
        started.append(h)
        deadline = time.time() + 60
        while "listening on" not in h.log_tail() and time.time() < deadline:
            assert h.poll() is None, h.log_tail()
            time.sleep(0.1)
        return h

    warm = start("warm")
    try:
        starter = _parent(warm.pid)
        assert starter != os.getpid() and "wantrain.launch.warm" in Path(f"/proc/{starter}/cmdline").read_text()
        # A variable the preloaded libraries read at import: forked from a starter of its own.
        other = start("other", NUMBA_DISABLE_JIT="1")
        assert _parent(other.pid) not in (starter, os.getpid())
        # Warm starts turned off, or a command other than `-m wantrain`: started cold.
        monkeypatch.setenv("WANTRAIN_WARM_START", "0")
        cold = start("cold")
        monkeypatch.delenv("WANTRAIN_WARM_START")
        assert _parent(cold.pid) == os.getpid()
        script = launcher.start(ProcessSpec("script", (sys.executable, "-c", "import time; time.sleep(600)")))
        started.append(script)
        assert _parent(script.pid) == os.getpid()
        for h in (other, cold, warm):
            assert h.stop(grace_s=10) == 143          # the PS's SIGTERM handler, however it started
        # A starter that dies takes its children with it; the next start starts another.
        again = start("again")
        assert _parent(again.pid) == starter
        os.kill(starter, signal.SIGKILL)
        assert again.wait(30) is not None and not pid_alive(again.pid)
        after = start("after")
        assert _parent(after.pid) not in (starter, os.getpid())
        after.stop(grace_s=10)
    finally:
        for h in started:
            h.kill()
