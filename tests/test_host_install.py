"""Getting a remote host ready (issue 13): `wantrain host check | install` against a real OpenSSH
server, and an install that fails part way (a full disk, a dropped connection) says why and leaves
no half-made venv behind.

An install costs half a minute of CPU (pip, the codec's loops compiled), so each is made where it
proves something: the suite's own install (conftest.py: `venvs`) is the one the warm paths find, and
only two tests install afresh (after a dropped connection; for a second Python)."""

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from wantrain.errors import SshError
from wantrain.launch.install import install_on_host
from wantrain.launch.ssh import SshLauncher, SshTarget

from .sshd import SshServer

WANTRAIN = [sys.executable, "-m", "wantrain"]


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    server = SshServer(tmp_path_factory.mktemp("sshd"))
    yield server
    server.close()


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*WANTRAIN, *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.timeout(400)
def test_host_check_and_install_from_the_command_line(sshd, venvs):
    import torch

    keys = ("--key", sshd.key_file, "--known-hosts", str(sshd.known_hosts), "--python", sys.executable)
    r = _cli("host", "check", sshd.url, *keys)
    assert r.returncode == 0, r.stderr
    assert f"Python {sys.version.split()[0]}, torch {torch.__version__}" in r.stdout
    # The suite's install is there already: the command finds it and names its Python (a cold
    # install says "creating" and "installing": the tests below).
    warm = _cli("host", "install", sshd.url, *keys, "--reuse-site-packages", "--venvs", venvs)
    assert warm.returncode == 0 and "already installed" in warm.stderr, warm.stderr
    python = warm.stdout.strip().splitlines()[-1].split("its Python: ")[1]
    assert python.startswith(venvs) and Path(python).exists()
    refused = _cli("host", "check", sshd.url, "--key", str(sshd.other_key_file), "--known-hosts",
                   str(sshd.known_hosts))
    assert refused.returncode == 1 and "refused the key" in refused.stderr and "127.0.0.1" in refused.stderr
    assert "Traceback" not in refused.stderr


def _launcher(server: SshServer) -> SshLauncher:
    return SshLauncher(SshTarget.parse(server.url, key_file=server.key_file, known_hosts=str(server.known_hosts)),
                       python=sys.executable)


@pytest.mark.timeout(300)
@pytest.mark.skipif(os.geteuid() != 0, reason="a small tmpfs for the full disk needs root (CI runs as root)")
def test_a_full_disk_during_install_is_named_and_leaves_nothing(sshd, tmp_path):
    disk = tmp_path / "small-disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4M", "tmpfs", str(disk)], check=True)
    remote = _launcher(sshd)
    try:
        with pytest.raises(SshError, match="the disk that holds .*small-disk on the host is full"):
            install_on_host(remote, sys.executable, reuse_site_packages=True, venvs=str(disk))
        assert os.listdir(disk) == []                           # no half-made venv
    finally:
        remote.close()
        subprocess.run(["umount", str(disk)], check=True)


@pytest.mark.timeout(300)
def test_a_connection_dropped_during_install_is_named_and_the_next_install_completes(tmp_path):
    server = SshServer(tmp_path / "sshd")            # its own server: this test cuts every connection
    venvs = tmp_path / "venvs"
    said: list[str] = []
    installing = threading.Event()
    remote = _launcher(server)

    def progress(message: str) -> None:
        said.append(message)
        if "installing" in message:
            installing.set()

    failure: list[BaseException] = []

    def install() -> None:
        try:
            install_on_host(remote, sys.executable, reuse_site_packages=True, venvs=str(venvs), progress=progress)
        except BaseException as e:
            failure.append(e)

    worker = threading.Thread(target=install)
    try:
        worker.start()
        assert installing.wait(200), said
        server.drop_all()                               # pip is running on the host
        worker.join(120)
        assert failure and isinstance(failure[0], SshError), failure
        assert "lost" in str(failure[0]) and "installing wantrain" in str(failure[0]), failure[0]
        assert not any((d / "installed").exists() for d in venvs.glob("*"))      # never taken for done
        again = _launcher(server)                       # a new connection: the install completes
        try:
            python = install_on_host(again, sys.executable, reuse_site_packages=True, venvs=str(venvs))
            assert subprocess.run([python, "-c", "import wantrain"]).returncode == 0
        finally:
            again.close()
    finally:
        remote.close()
        server.close()


@pytest.mark.timeout(300)
def test_a_venv_that_reuses_a_python_belongs_to_that_python(sshd, venvs):
    """Its packages come from that Python (a .pth file): another Python, or the same one moved,
    gets a venv of its own, never one whose packages may be gone."""
    bin_dir = Path(sys.executable).parent            # the same interpreter and packages under another name
    other = next(bin_dir / n for n in ("python3", "python", f"python3.{sys.version_info[1]}")
                 if (bin_dir / n).exists() and str(bin_dir / n) != sys.executable)
    said: list[str] = []
    remote = _launcher(sshd)
    try:
        first = install_on_host(remote, sys.executable, reuse_site_packages=True, venvs=venvs, progress=said.append)
        second = install_on_host(remote, str(other), reuse_site_packages=True, venvs=venvs, progress=said.append)
        again = install_on_host(remote, str(other), reuse_site_packages=True, venvs=venvs, progress=said.append)
    finally:
        remote.close()
    assert first != second == again
    assert Path(first).parent.parent.parent == Path(second).parent.parent.parent == Path(venvs)
    # The suite's install was found; the other Python's venv was made, its loops compiled once.
    assert sum("creating" in m for m in said) == 1 and sum("already installed" in m for m in said) == 2, said
    assert sum("installing" in m for m in said) == 1, said
    assert sum("compiling the codec's loops" in m for m in said) == 1, said
    assert subprocess.run([second, "-c", "import wantrain"]).returncode == 0


def test_the_venvs_folder_defaults_to_wantrain_venvs_then_the_home_folder(monkeypatch):
    from wantrain.launch.install import default_venvs

    monkeypatch.delenv("WANTRAIN_VENVS", raising=False)
    assert default_venvs() == "~/.wantrain/venvs"
    monkeypatch.setenv("WANTRAIN_VENVS", "/data/wantrain-venvs")      # what the suite sets for tutorial 06
    assert default_venvs() == "/data/wantrain-venvs"
