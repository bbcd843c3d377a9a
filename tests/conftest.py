import fcntl
import os
import re
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings

from . import durations

# Property tests draw the same examples on every run, so that a red CI run can be replayed;
# HYPOTHESIS_PROFILE=explore searches afresh (add what it finds as an @example).
settings.register_profile("seeded", derandomize=True, database=None)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "seeded"))

# Child processes (PS, sites) are started with this interpreter and must find the package.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def _seed():
    import numpy as np
    import torch

    np.random.seed(0)
    torch.manual_seed(0)
    yield


@pytest.fixture
def host_network():
    """Sole use of this host's network namespaces, veth links and nftables tables.

    The kernel-backend tests create them and, after each test, remove every one the backend could
    have left; the test processes (`make test` runs two) take turns through a file lock. Its wait
    counts against the test's timeout, so those tests allow for one other such test first."""
    with open(Path(tempfile.gettempdir()) / "wantrain-host-network.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@pytest.fixture(scope="session")
def venvs(tmp_path_factory) -> str:
    """The folder SSH hosts install wantrain into (`venvs=`), shared by the test processes: the first
    to ask installs this checkout into it (a venv, pip, the codec's loops compiled: 40 to 80 s on a
    loaded machine) through an SSH server of its own, under a lock; every later test finds it there,
    as a second run on a real host does. Two tests of a fresh install (test_host_install.py) use a
    folder of their own."""
    return shared_venvs(tmp_path_factory.getbasetemp())


def shared_venvs(base: Path) -> str:
    """The `venvs` fixture's folder, installed once per suite (`base`: this process's temporary folder;
    the tutorials that start SSH sites reach it through WANTRAIN_VENVS: conftest.py at the root)."""
    import sys

    from wantrain.launch.install import install_on_host
    from wantrain.launch.ssh import SshLauncher, SshTarget

    from .sshd import SshServer

    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base     # xdist: the run's folder
    folder = shared / "venvs"
    with open(shared / "venvs.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / "ready").is_file():
            server = SshServer(Path(tempfile.mkdtemp(prefix="venvs-sshd-", dir=shared)))
            launcher = SshLauncher(SshTarget.parse(server.url, key_file=server.key_file,
                                                   known_hosts=str(server.known_hosts)), python=sys.executable)
            try:
                install_on_host(launcher, sys.executable, reuse_site_packages=True, venvs=str(folder))
            finally:
                launcher.close()
                server.close()
            (folder / "ready").touch()
    return str(folder)


_LEAKED: list[str] = []


@pytest.fixture(scope="module", autouse=True)
def _reap_leftover_processes():
    """After each module: kill whatever processes its tests left running (see tests/reaper.py)."""
    yield
    from .reaper import reap
    _LEAKED.extend(reap())


_DURATIONS = durations.Recorder()


def pytest_runtest_logreport(report):
    _DURATIONS.add(report)


def pytest_sessionfinish(session):
    """In an xdist worker (`make test` runs three): reap its leftovers and hand their names to the
    controller, whose summary lists them (the workers' children are not the controller's). In the
    controller, or a run without workers: write the seconds each test took (tests/durations.py)."""
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        from .reaper import reap
        workeroutput["leaked"] = _LEAKED + reap(grace_s=1.0)
    else:
        _DURATIONS.write()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    _LEAKED.extend(getattr(node, "workeroutput", {}).get("leaked", []))


def pytest_terminal_summary(terminalreporter):
    from .reaper import reap
    _LEAKED.extend(reap(grace_s=1.0))
    if _LEAKED:
        terminalreporter.section("processes left running by tests (killed)")
        for line in _LEAKED:
            terminalreporter.write_line(line)



# Two lanes (Makefile): `make check` runs what proves its point in this process (unit and in-process
# tests, a few minutes); `make test` runs everything, notebooks and real processes included, and is
# what CI runs. A test module that starts a process, or reaches one of the helpers that do, is in the
# `processes` lane as a whole: read from its source, so a new test needs no marker to land in the
# right lane.
STARTS_PROCESSES = re.compile(r"\b(Proc|Cluster|ShardedCluster|Run|ControlPanel|SshServer|LocalSshHost|Popen|"
                              r"subprocess|sync_playwright|soak)\b|\bwantrain\(")


def pytest_collection_modifyitems(config, items):
    lanes: dict[str, bool] = {}
    for item in items:
        path = str(item.path)
        if path not in lanes:
            lanes[path] = not path.endswith(".py") or bool(STARTS_PROCESSES.search(item.path.read_text()))
        if lanes[path]:
            item.add_marker(pytest.mark.processes)
    durations.longest_first(items, durations.load())
