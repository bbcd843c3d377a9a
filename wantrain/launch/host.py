"""What a remote host offers a site: its Python, torch, CUDA devices and driver, found over SSH.

`inspect_host` runs one short Python program on the host (`_PROBE`) and checks what it reports
against what the run asks for, so that a wrong host fails before anything is installed or
started, with a message that names the host and what it lacks.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field

from ..errors import SshError

__all__ = ["HostInfo", "inspect_host", "MIN_PYTHON"]

MIN_PYTHON = (3, 10)

_PROBE = r"""
import json, shutil, subprocess, sys
info = {"python": list(sys.version_info[:3]), "executable": sys.executable, "torch": None, "cuda": None,
        "gpus": [], "driver": None}
try:
    import torch
    info["torch"] = torch.__version__
    if torch.cuda.is_available():
        info["cuda"] = torch.version.cuda
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            info["gpus"].append({"name": p.name, "memory_GB": round(p.total_memory / 1e9, 1)})
except Exception as e:
    info["torch_error"] = f"{type(e).__name__}: {e}"
if shutil.which("nvidia-smi"):
    r = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                       capture_output=True, text=True)
    info["driver"] = r.stdout.strip().splitlines()[0] if r.returncode == 0 and r.stdout.strip() else None
print("wantrain-host", json.dumps(info))
"""


@dataclass(frozen=True)
class HostInfo:
    python: tuple[int, int, int]
    executable: str
    torch: str | None = None          # None: not importable with that Python
    cuda: str | None = None           # the CUDA version torch was built with, when a device works
    gpus: tuple[dict, ...] = field(default_factory=tuple)
    driver: str | None = None

    def describe(self) -> str:
        py = ".".join(map(str, self.python))
        if not self.gpus:
            return f"Python {py}, torch {self.torch or 'not installed'}, no CUDA device"
        names = sorted({g["name"] for g in self.gpus})
        return (f"Python {py}, torch {self.torch}, {len(self.gpus)} x {'/'.join(names)} "
                f"({self.gpus[0]['memory_GB']} GB), CUDA {self.cuda}, driver {self.driver or 'unknown'}")


def inspect_host(launcher, python: str = "python3", gpus: int = 0) -> HostInfo:
    """Probe the host of an SshLauncher; SshError if its Python is missing or too old, or if it
    has fewer than `gpus` working CUDA devices."""
    target = launcher.target
    code, out = launcher.run(f"{shlex.quote(python)} -c {shlex.quote(_PROBE)}", timeout_s=120)
    line = next((ln for ln in out.splitlines() if ln.startswith("wantrain-host ")), None)
    if code != 0 or line is None:
        raise SshError(f"{target}: cannot run {python} there (exit {code}): {out.strip()[-300:] or 'no output'}; "
                       f"a site needs Python {'.'.join(map(str, MIN_PYTHON))} or newer")
    raw = json.loads(line.split(" ", 1)[1])
    info = HostInfo(tuple(raw["python"]), raw["executable"], raw["torch"], raw["cuda"],
                    tuple(raw["gpus"]), raw["driver"])
    if info.python[:2] < MIN_PYTHON:
        raise SshError(f"{target}: {python} is Python {'.'.join(map(str, info.python))}; a site needs "
                       f"{'.'.join(map(str, MIN_PYTHON))} or newer")
    if len(info.gpus) < gpus:
        why = raw.get("torch_error") or ("torch is not installed" if info.torch is None else
                                         f"torch {info.torch} sees {len(info.gpus)} CUDA device(s)")
        raise SshError(f"{target}: {gpus} GPU(s) asked for, but {why} (driver: {info.driver or 'none found'})")
    return info
