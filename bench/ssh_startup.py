"""SSH site start-up: from the run's start to each site's Ready, SSH sites beside a local one.

Two runs of the same config (a PS and three sites, two of them on a local OpenSSH server,
`wantrain.launch.LocalSshHost`), in one process: the first with no venv on the host (the install is
cold: a wheel of this checkout into a new venv that reuses this Python's packages), the second
with it in place (warm: one `test -f`). Per site, from the PS's telemetry and this process's clock:

    start -> ready   Run.start() called, to the site's Ready: for an SSH site that is the SSH
                     connection, the host's inspection, the install (or its check), the reverse
                     forward, the secrets copied, the process started there, its Join and the
                     model download through the forward

The baseline is a third run of the same config with every site on this machine (no SSH). In the
SSH runs every host is prepared before any site starts, so the local site waits for them too.
Separately, `install_on_host` alone, cold and warm. (A full install without reused packages,
torch included, took 4 min 52 s on this machine in December 2026; not repeated here.)

    python bench/ssh_startup.py
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import save


def one_run(host, venvs: str, tmp: Path) -> dict[str, float]:
    from wantrain.config import RunConfig
    from wantrain.launch import RemoteSite
    from wantrain.launch.run import Run

    cfg = RunConfig().replace(**{"num_sites": 3, "sites": ["here", "ssh-1", "ssh-2"], "train.rounds": 2,
                                 "train.inner_steps": 5, "train.batch_size": 4, "train.eval_batches": 1})
    remote = {s: RemoteSite(host.url, python=sys.executable, reuse_site_packages=True, venvs=venvs, **host.options)
              for s in ("ssh-1", "ssh-2")} if host is not None else {}
    t0 = time.time()
    ready: dict[str, float] = {}
    with Run(cfg, run_dir=tmp, remote=remote) as run:
        for ev in run.follow(timeout_s=900):
            if ev["kind"] == "ready":
                ready.setdefault(ev["site"], ev["t"] - t0)
    return ready


def main() -> None:
    from wantrain.launch import LocalSshHost, SshLauncher, SshTarget
    from wantrain.launch.install import install_on_host

    with tempfile.TemporaryDirectory() as tmp:
        host = LocalSshHost(Path(tmp) / "sshd")
        try:
            runs = {"local": one_run(None, "", Path(tmp) / "run-local")}
            base = statistics.mean(runs["local"].values())
            print(f"every site here: start -> ready {base:.1f} s (mean of 3 sites)", flush=True)
            for kind in ("cold", "warm"):
                runs[kind] = one_run(host, str(Path(tmp) / "venvs"), Path(tmp) / f"run-{kind}")
                r = runs[kind]
                ssh = statistics.mean(r[s] for s in ("ssh-1", "ssh-2"))
                print(f"{kind} install: start -> ready: here {r['here']:.1f} s, ssh-1 {r['ssh-1']:.1f} s, ssh-2 "
                      f"{r['ssh-2']:.1f} s (SSH sites / all-local run {ssh / base:.2f})", flush=True)
            installs = {}
            launcher = SshLauncher(SshTarget.parse(host.url, **host.options), python=sys.executable)
            try:
                for kind in ("cold", "warm"):
                    t = time.monotonic()
                    install_on_host(launcher, sys.executable, reuse_site_packages=True, venvs=str(Path(tmp) / "v2"))
                    installs[kind] = time.monotonic() - t
            finally:
                launcher.close()
            print(f"install_on_host (reusing this Python's packages): cold {installs['cold']:.1f} s, "
                  f"warm {installs['warm']:.2f} s", flush=True)
        finally:
            host.close()
    save("ssh_startup", {"start_to_ready_s": runs, "install_s": installs})


if __name__ == "__main__":
    main()
