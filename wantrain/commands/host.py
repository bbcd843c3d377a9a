"""`wantrain host check | install ssh://user@host[:port]`: get a remote host ready before a run.

`check` connects as a run would (the key, the host key against known_hosts) and prints what the
host offers: Python, torch, CUDA devices and driver; it fails with one line that names the host and
the cause (unreachable, key refused, host key unknown, Python missing or too old, fewer GPUs than
`--gpus`). `install` puts this checkout's version into a venv of its own there (reused when
unchanged) and prints that venv's Python, the one to give `RemoteSite(python=...)` or the panel.
"""

from __future__ import annotations

import argparse
import sys
import time

__all__ = ["add_parser", "run"]


def _launcher(args: argparse.Namespace):
    from ..launch.ssh import SshLauncher, SshTarget

    target = SshTarget.parse(args.target, key_file=args.key, check_host_key=not args.no_host_key_check,
                             **({"known_hosts": args.known_hosts} if args.known_hosts else {}))
    return SshLauncher(target, python=args.python, connect_timeout_s=args.connect_timeout)


def run(args: argparse.Namespace) -> int:
    from ..launch.host import inspect_host
    from ..launch.install import install_on_host

    launcher = _launcher(args)
    try:
        t0 = time.monotonic()
        info = inspect_host(launcher, args.python, args.gpus)
        print(f"{launcher.target}: {info.describe()} ({info.executable}; {time.monotonic() - t0:.1f} s)", flush=True)
        if args.action == "install":
            python = install_on_host(launcher, args.python, reuse_site_packages=args.reuse_site_packages,
                                     venvs=args.venvs, progress=lambda m: print(m, file=sys.stderr, flush=True))
            print(f"{launcher.target}: wantrain ready in {time.monotonic() - t0:.1f} s; its Python: {python}")
    finally:
        launcher.close()
    return 0


def add_parser(sub) -> None:
    h = sub.add_parser("host", help="check a remote host over SSH, or install this version of wantrain there")
    h.add_argument("action", choices=["check", "install"], help="check: what the host offers; install: this "
                   "version of wantrain in a venv there")
    h.add_argument("target", help="ssh://[user@]host[:port] (the user defaults to this account's name, as in ssh)")
    h.add_argument("--python", default="python3", help="the host's Python (3.10 or newer)")
    h.add_argument("--gpus", type=int, default=0, help="fail unless the host has this many working CUDA devices")
    h.add_argument("--key", default=None, help="private key file (default: the SSH agent's and ~/.ssh's keys)")
    h.add_argument("--known-hosts", default=None, help="known_hosts file the host's key is checked against "
                                                       "(default ~/.ssh/known_hosts)")
    h.add_argument("--no-host-key-check", action="store_true", help="skip the host key check (a throwaway host only)")
    h.add_argument("--connect-timeout", type=float, default=20.0, help="seconds to wait for the SSH connection")
    h.add_argument("--reuse-site-packages", action="store_true",
                   help="install: the venv also sees the host Python's packages (its torch, often a CUDA build)")
    h.add_argument("--venvs", default=None, help="install: where the venvs go on the host (default: "
                   "$WANTRAIN_VENVS, else ~/.wantrain/venvs)")
    h.set_defaults(func=run)
