"""The exact project version on a remote host: a wheel of this checkout, installed over SSH into a
virtual environment of its own, named by the content it holds and reused while that is unchanged.

The wheel is built once per content (the package sources, pyproject.toml and constraints.txt,
hashed) and cached here. On the host it goes into `~/.wantrain/venvs/<hash>` (or the folder
`WANTRAIN_VENVS` names, set here: a bigger disk, a folder shared by a CI job) with the same
constraints as `make test`; a file `installed` marks a finished install, so a warm start is one
`test -f`. A host whose Python already has a working torch (a GPU box with its CUDA build) keeps
it: `reuse_site_packages=True` lets the venv see that Python's packages, and torch is then taken
from there instead of the CPU build the constraints pin.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from ..errors import ProcessError, SshError
from .ssh import LOST

__all__ = ["project_wheel", "install_on_host", "default_venvs", "CHECKOUT"]

CHECKOUT = Path(__file__).resolve().parents[2]          # where pyproject.toml is, for an editable install
_CACHE = Path.home() / ".cache" / "wantrain" / "wheels"


def default_venvs() -> str:
    """Where hosts keep wantrain's venvs unless told otherwise (a path on the host; `~` is its home)."""
    return os.environ.get("WANTRAIN_VENVS") or "~/.wantrain/venvs"


def _sources(root: Path) -> list[Path]:
    """The files a wheel is built from (not caches, not compiled-code caches)."""
    files = [root / "pyproject.toml", root / "README.md", root / "constraints.txt"]
    for package in ("wantrain", "testbed"):
        files += sorted(p for p in (root / package).rglob("*") if p.is_file() and "__pycache__" not in p.parts
                        and p.suffix not in (".nbi", ".nbc", ".pyc"))
    return [f for f in files if f.is_file()]


def _content_hash(root: Path) -> str:
    h = hashlib.sha256()
    for f in _sources(root):
        h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def project_wheel(root: Path = CHECKOUT) -> Path:
    """A wheel of the checkout at `root`, built once per content."""
    if not (root / "pyproject.toml").is_file():
        raise ProcessError(f"wantrain is not installed from a checkout ({root} has no pyproject.toml): "
                           "a remote install needs the sources")
    out = _CACHE / _content_hash(root)
    wheels = sorted(out.glob("wantrain-*.whl"))
    if not wheels:
        # Built from a copy of exactly those files: the checkout's own build/ folder could hold
        # files since deleted, and nothing is written into the checkout.
        with tempfile.TemporaryDirectory() as tmp:
            for f in _sources(root):
                (Path(tmp) / f.relative_to(root)).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(f, Path(tmp) / f.relative_to(root))
            r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                                "-w", str(out), tmp], capture_output=True, text=True)
        wheels = sorted(out.glob("wantrain-*.whl"))
        if r.returncode != 0 or not wheels:
            raise ProcessError(f"cannot build a wheel of {root}: {(r.stderr or r.stdout).strip()[-500:]}")
    return wheels[-1]


def install_on_host(launcher, python: str = "python3", *, reuse_site_packages: bool = False,
                    venvs: str | None = None, progress: Callable[[str], None] = lambda _: None,
                    timeout_s: float = 3600.0) -> str:
    """Install this checkout's version on the launcher's host, in a venv under `venvs` (there; `~`
    is the home folder; default: `default_venvs()`); returns the venv's Python."""
    folder = venvs or default_venvs()
    wheel = project_wheel()
    # A venv that reuses a Python's packages is that Python's alone: another one's (a CI clone's
    # .venv, since deleted) would be "installed" yet unable to import torch.
    digest = wheel.parent.name + (f"-reuse-{hashlib.sha256(python.encode()).hexdigest()[:8]}"
                                  if reuse_site_packages else "")
    target = launcher.target

    def run(command: str, what: str, timeout: float = 600.0) -> str:
        code, out = launcher.run(command, timeout_s=timeout)
        if code == LOST:
            raise SshError(f"{target}: the SSH connection was lost while {what}; nothing half-installed is "
                           "used: the next install starts that venv again")
        if code != 0:
            free = _free_mb(launcher, folder)
            full = "No space left on device" in out or (free is not None and free < FULL_MB)
            raise SshError(f"{target}: {what} failed (exit {code})" + (
                f": the disk that holds {folder} on the host is full ({free} MB free; the install needs a few "
                "hundred MB, more without --reuse-site-packages)" if full else f": {out.strip()[-800:] or 'no output'}"))
        return out

    if folder.startswith("~"):
        folder = run("cd && pwd", "finding the home folder").strip() + folder[1:]
    venv = f"{folder}/{digest}"
    if launcher.run(f"test -f {shlex.quote(venv)}/installed", timeout_s=60)[0] == 0:
        progress(f"{target}: wantrain {digest} already installed")
        return f"{venv}/bin/python"
    progress(f"{target}: creating {venv}")
    q = shlex.quote(venv)
    try:
        _install(launcher, run, wheel, python, venv, reuse_site_packages, progress, timeout_s)
    except BaseException:     # a full disk, a failed pip, a lost connection: leave no half venv behind
        try:
            launcher.run(f"rm -rf {q}", timeout_s=120)
        except Exception:     # (the connection is gone: the next install removes it first)
            pass
        raise
    progress(f"{target}: installed")
    return f"{venv}/bin/python"


FULL_MB = 64       # less free than this where an install failed: the disk is why (pip does not always say)


def _free_mb(launcher, path: str) -> int | None:
    """Free space (MB) of the file system that holds `path` on the host (or its nearest parent)."""
    code, out = launcher.run(f"p={shlex.quote(path)}; while [ ! -e \"$p\" ]; do p=$(dirname \"$p\"); done; "
                             "df -Pk \"$p\" | tail -1", timeout_s=60)
    try:
        return int(out.split()[3]) // 1024 if code == 0 else None
    except (IndexError, ValueError):
        return None


def _install(launcher, run: Callable[..., str], wheel: Path, python: str, venv: str, reuse_site_packages: bool,
             progress: Callable[[str], None], timeout_s: float) -> None:
    target, q = launcher.target, shlex.quote(venv)
    run(f"rm -rf {q} && mkdir -p {q} && {shlex.quote(python)} -m venv {q}", "creating the virtual environment")
    constraints = (CHECKOUT / "constraints.txt").read_text()
    if reuse_site_packages:               # the host's own packages (its torch) come first
        purelib = run(f"{shlex.quote(python)} -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])'",
                      "finding the host Python's packages").strip()
        site = run(f"{q}/bin/python -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])'",
                   "finding the venv's packages").strip()
        launcher.put(f"{purelib}\n".encode(), f"{site}/wantrain-host-packages.pth")
        constraints = "".join(ln for ln in constraints.splitlines(keepends=True) if not ln.startswith("torch=="))
    launcher.put(wheel.read_bytes(), f"{venv}/{wheel.name}")
    launcher.put(constraints.encode(), f"{venv}/constraints.txt")
    progress(f"{target}: installing {wheel.name} and its dependencies (minutes the first time)")
    run(f"cd {q} && bin/python -m pip install -q --disable-pip-version-check -c constraints.txt {wheel.name} 2>&1",
        "installing wantrain", timeout_s)
    # The codec's compiled loops into numba's cache in the venv now, once per host: each site's
    # process loads them before its Join in a fraction of a second (commands/worker.py) instead of
    # compiling them in its first round (13 s "encoding" and 6 s "applying" seen on a fresh host).
    progress(f"{target}: compiling the codec's loops")
    run(f"{q}/bin/python -c 'from wantrain.codec import load_kernels; from wantrain.config import CODEC_MODES; "
        f"import wantrain.outer.kernels as a; load_kernels(CODEC_MODES); a.load()' 2>&1",
        "compiling the codec's loops", 600)
    run(f"{q}/bin/python -c 'import wantrain' && touch {q}/installed", "checking the install")
