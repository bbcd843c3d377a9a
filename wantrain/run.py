"""A run: the PS and its sites as processes, started, watched and stopped together.

Used by the CLI (`wantrain demo`) and the notebook widgets. `Run` starts the PS, waits for the
port it bound, optionally starts the WAN emulator of a run plan (plan.py; `python -m testbed
links`, its own process: wantrain imports nothing of testbed), starts one worker per site
(through its emulated link when there is one), relays the link emulator's events and the faults
it injects into the PS's telemetry (relay.py), follows that telemetry over the `Watch` RPC, and
stops every process it started when the run ends, fails, or is interrupted. The PS may run on an
SSH host (launch/ps_host.py) and each site on one (launch/placement.py); faults on purpose, and
the restart of an SSH site whose connection was lost, are in run_faults.py.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import queue
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

from . import net
from .auth import new_secret_file, read_secret
from .config import RunConfig
from .errors import ConfigError, ProcessError, SshError, WantrainError
from .launch import LocalLauncher, ProcessSpec
from .launch.argv import links_command, site_command
from .launch.local import LocalProcess
from .launch.base import ProcessHandle
from .launch.placement import Placement, Placements
from .launch.ps_host import LocalPS, RemotePS, wait_for_port
from .launch.remote import RemoteSite
from .naming import default_site_names, new_run_dir
from .plan import ON_HOST_BACKENDS, RunPlan, SitePlan, describe_scenario
from .relay import EventRelay
from .run_faults import RunFaults
from .watch import follow_events

if TYPE_CHECKING:
    from .tls import DevCerts

__all__ = ["Run", "default_site_names", "new_run_dir", "describe_scenario"]

_LIVE_RUNS: weakref.WeakSet[Run] = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    for run in list(_LIVE_RUNS):
        run.stop()


class Run(RunFaults):
    """The processes of one training run: the PS, the link emulator and the sites, here or on SSH hosts."""

    def __init__(self, cfg: RunConfig, run_dir: str | Path | None = None, sites: list[str] | None = None,
                 host: str = "127.0.0.1", site_threads: int = 1, launcher=None,
                 python: str = sys.executable, scenario: str | Path | None = None, tls: bool = True,
                 devices: dict[str, str] | None = None, plan: RunPlan | None = None,
                 remote: dict[str, RemoteSite | str] | None = None, nproc: dict[str, int] | None = None,
                 ps_on: RemotePS | str | None = None) -> None:
        self.cfg = cfg
        self.run_dir = Path(run_dir) if run_dir else new_run_dir()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if plan is None and scenario is not None:
            plan = describe_scenario(scenario, python)
        self.run_plan = plan           # what the link emulator runs (None: sites dial the PS directly)
        self.plan: RunPlan | None = None   # the same, once the links listen: where each site dials
        self.links: LocalProcess | None = None
        if plan is not None and sites is None:
            sites = plan.names
        self.sites = list(sites or cfg.sites or default_site_names(cfg.num_sites))
        if len(self.sites) != cfg.num_sites or len(set(self.sites)) != len(self.sites):
            raise ConfigError(f"need {cfg.num_sites} distinct site names, got {self.sites}")
        if not cfg.sites:   # name the sites in the config, so each keeps its data shard
            self.cfg = cfg = cfg.replace(sites=list(self.sites))
        self.host, self.site_threads, self.python = host, site_threads, python
        self.devices = dict(devices or {})   # site -> torch device ("auto" where absent)
        self.nproc = dict(nproc or {})       # site -> processes of its torch.distributed group (1 where absent)
        for what, given in (("devices", self.devices), ("process counts", self.nproc)):
            if set(given) - set(self.sites):
                raise ConfigError(f"{what} given for sites not in the run: {sorted(set(given) - set(self.sites))}")
        self.tls = tls            # a development CA per run: sites verify the PS, traffic is encrypted
        self.certs: DevCerts | None = None
        self.launcher = launcher or LocalLauncher()
        # Where the PS runs: here, or an SSH host that sites reach at its public address and this
        # notebook through a forward (then each site has a token of its own).
        self.ps_host = LocalPS(self.launcher, python, host) if ps_on is None else \
            RemotePS(ps_on) if isinstance(ps_on, str) else ps_on
        # Where each site runs: here, or an SSH host (installed there, it dials back through its own
        # connection); a site whose link is shaped on its own host gets a shaper there.
        self.placements = Placements(self.sites, remote, self.launcher, python)
        self.shapers: dict[str, ProcessHandle] = {}
        self.ps: ProcessHandle | None = None
        self.workers: dict[str, ProcessHandle] = {}
        self.port: int | None = None          # where observers reach the PS (a forward's, for a remote PS)
        self.ps_port: int | None = None       # the port the PS bound on its host
        self._events: queue.Queue[dict | None] = queue.Queue()
        self._watch_thread: threading.Thread | None = None
        self._watch_error = ""
        self._stopping = threading.Event()
        self._stop_lock, self._stopped = threading.Lock(), False
        self.events: list[dict] = []
        self._killed: set[int] = set()        # processes killed on purpose (kill_site, restart_ps)
        self.faults: list[dict] = []          # faults injected on purpose (also relayed into the PS's log)
        self.relay: EventRelay | None = None
        self.links_control = self.run_dir / "links.control"   # commands to the link emulator (outages)
        self._restarting = False
        self._ps_restarts = 0

    # ------------------------------------------------------------ processes

    @property
    def address(self) -> str:
        """Where this process reaches the PS (Watch, the relay)."""
        return f"{self.host}:{self.port}"

    @property
    def site_address(self) -> str:
        """Where sites and their links reach the PS."""
        return f"{self.ps_host.public_host}:{self.ps_port}"

    def start(self, timeout_s: float = 120.0) -> Run:
        _LIVE_RUNS.add(self)
        cfg_path = self.run_dir / "config.json"
        cfg_path.write_text(self.cfg.to_json())
        # Even on one machine the PS admits only this run's sites, and shows its telemetry only to
        # this run's observers: a fresh shared secret (a token per site for a PS on another host), and
        # a fresh observer token.
        files = {"config": cfg_path, **self._secrets()}
        self.observer_token_file = files["observer-token"] = new_secret_file(self.run_dir / "observer-token")
        self.observer_token = read_secret(self.observer_token_file)
        if self.tls:
            from .tls import make_dev_certs  # cryptography: only for runs that use TLS
            self.certs = make_dev_certs(self.run_dir / "tls", hosts=(self.ps_host.public_host, "localhost"))
            files.update({"tls-cert": self.certs.server_cert, "tls-key": self.certs.server_key})
        there, run_dir = self.ps_host.place(files, self.run_dir)
        flags = {"config": "--config", "shared-secret": "--shared-secret-file", "tokens": "--tokens",
                 "observer-token": "--observer-token-file", "tls-cert": "--tls-cert", "tls-key": "--tls-key"}
        self._ps_args = ("--run-dir", run_dir, "--host", self.ps_host.bind,
                         *(arg for role, path in there.items() for arg in (flags[role], path)))
        deadline = time.time() + timeout_s
        self._start_ps(0, "ps.log", deadline)
        self.relay = EventRelay(self._open_channel, self.observer_token,
                                self.run_dir / "links.jsonl" if self.run_plan is not None else None).start()
        try:
            if self.run_plan is not None:
                self._start_links(self.run_plan, deadline)
            for name in self.sites:       # every host prepared and every link shaped before any site starts
                self._place(name)
            for name in self.sites:
                self.start_site(name)
        except BaseException:       # a refused shaping, a host that cannot be used: nothing stays up
            self.stop()
            raise
        self._start_watch()
        return self

    def _start_ps(self, port: int, log_name: str, deadline: float) -> None:
        """Start the PS (port 0: any free port) and wait until it listens; sets the ports."""
        port_file = self.ps_host.port_file(self.run_dir)
        self.ps_host.clear_port(port_file)
        self.ps = self.ps_host.launcher.start(ProcessSpec(
            "parameter server", (self.ps_host.python, "-m", "wantrain", "ps", *self._ps_args, "--port", str(port),
                                 "--port-file", port_file),
            env={"PYTHONUNBUFFERED": "1"}, log_path=self.run_dir / log_name))
        try:
            self.ps_port = wait_for_port(self.ps_host, self.ps, port_file, deadline)
        except ProcessError:
            self.stop()
            raise
        observer = self.ps_host.observer_address(self.ps_port)
        self.host, self.port = observer.rsplit(":", 1)[0], int(observer.rsplit(":", 1)[1])

    def _secrets(self) -> dict[str, Path]:
        """The shared secret all sites present, or (PS on another host) a token file per site."""
        if isinstance(self.ps_host, LocalPS):
            self.site_tokens = dict.fromkeys(self.sites, new_secret_file(self.run_dir / "secret"))
            return {"shared-secret": self.site_tokens[self.sites[0]]}
        self.site_tokens = {s: new_secret_file(self.run_dir / f"token-{s}") for s in self.sites}
        tokens = self.run_dir / "tokens.json"
        tokens.touch(mode=0o600)
        tokens.write_text(json.dumps({s: read_secret(f) for s, f in self.site_tokens.items()}))
        return {"tokens": tokens}

    def _start_links(self, plan: RunPlan, deadline: float) -> None:
        if sorted(plan.names) != sorted(self.sites):
            raise ConfigError(f"the run plan has sites {plan.names}, the run expects {self.sites}")
        listening = self.run_dir / "links.json"
        listening.unlink(missing_ok=True)
        self.links = self.launcher.start(ProcessSpec("link emulator", links_command(
            self.python, plan.write(self.run_dir / "plan.json"), self.site_address, listening,
            self.run_dir / "links.jsonl", self.links_control), env={"PYTHONUNBUFFERED": "1"},
            log_path=self.run_dir / "links.log"))
        while not listening.exists():
            if self.links.poll() is not None:
                raise ProcessError(f"the link emulator exited with code {self.links.poll()}:\n{self.links.log_tail()}")
            if time.time() > deadline:
                raise ProcessError("the link emulator did not start in time")
            time.sleep(0.05)
        self.plan = RunPlan.read(listening)

    def start_site(self, name: str, extra: tuple[str, ...] = ()) -> ProcessHandle:
        """Start (or restart) the worker process of one site (through its emulated link, in its
        namespace if it has one); `extra`: more `wantrain worker` arguments (a test's `--stall`)."""
        old = self.workers.get(name)
        if old is not None and old.poll() is None:
            raise ProcessError(f"site {name} is already running (pid {old.pid})")
        where, link = self._place(name)
        argv = site_command(where.python, where.ps, name, link, threads=self.site_threads,
                            device=self.devices.get(name, "auto"), nproc=self.nproc.get(name, 1),
                            token_file=where.token, tls_ca=where.ca,
                            tls_server_name="localhost" if self.certs is not None else "",  # a link or forward
                            extra=extra)
        self.workers[name] = where.launcher.start(ProcessSpec(
            f"site {name}", argv, env={"PYTHONUNBUFFERED": "1"}, log_path=self.run_dir / f"site-{name}.log"))
        return self.workers[name]

    def _place(self, name: str) -> tuple[Placement, SitePlan | None]:
        """Where the site runs and its link as the site sees it; a link shaped on the site's host
        (tcconfig, or the kernel's htb) is shaped there first."""
        link = self.plan.site(name) if self.plan is not None else None
        remote = name in self.placements.remote
        # An SSH site's reverse forward leads to its emulated link where the proxy has one (a kernel
        # namespace is on this machine: not for it), else to the PS; so does a tcconfig site's dial.
        via = link.dial if link is not None and link.dial and not (remote and link.exec_prefix) else self.site_address
        where = self.placements.place(name, via, self.site_tokens[name], self.certs.ca if self.certs else None,
                                      self.run_dir, forward=isinstance(self.ps_host, LocalPS) or via != self.site_address)
        if self.plan is not None and link is not None and link.backend in ON_HOST_BACKENDS and name not in self.shapers:
            self.shapers[name] = self.placements.start_shaper(name, self.plan, where, self.run_dir / f"shaper-{name}.log")
        if remote and link is not None:     # it dials its forward; the link's figures still count
            link = dataclasses.replace(link, host=None, port=None, exec_prefix=())
        return where, link

    def processes(self) -> list[ProcessHandle]:
        return [p for p in [self.ps, self.links, *self.shapers.values(), *self.workers.values()] if p is not None]

    def stop(self) -> None:
        """Stop every process of the run (idempotent): sites first, then their links, then the PS
        (once the relay has handed it what the links and faults said)."""
        with self._stop_lock:             # the panel's Stop and the run's own end may both stop it
            if self._stopped:
                return
            self._stopping.set()              # the Watch pump opens no new channel from now on
            for p in reversed(self.processes()):
                if p is not self.ps:
                    p.stop(grace_s=3.0)
            if self.relay is not None:
                self.relay.close()
            if self.ps is not None:
                self.ps.stop(grace_s=3.0)
            self.placements.close()
            if self.ps is not None:
                self.ps_host.copy_back("events.jsonl", self.run_dir / "events.jsonl")
            self.ps_host.close()
            if self._watch_thread is not None and self._watch_thread is not threading.current_thread():
                self._watch_thread.join(5)
            _LIVE_RUNS.discard(self)
            self._stopped = True

    def __enter__(self) -> Run:
        return self.start() if self.ps is None else self

    def __exit__(self, *exc) -> None:
        self.stop()

    # ------------------------------------------------------------ telemetry

    def _tls_client(self):
        return self.certs.client() if self.certs is not None else None

    def _open_channel(self) -> grpc.Channel:
        return net.observer_channel(self.address, self._tls_client())

    def _start_watch(self) -> None:
        # A PS on another host keeps its events.jsonl there: the run folder here gets a copy.
        mirror = None if isinstance(self.ps_host, LocalPS) else self.run_dir / "events.jsonl"

        def pump() -> None:
            try:     # across restart_ps(); ends at run_end, on stop(), or when the PS died by itself
                for ev in follow_events(self.address, self.observer_token, self._tls_client(), stop=self._stopping,
                                        keep_trying=lambda: self._restarting or id(self.ps) in self._killed
                                        or (self.ps is not None and self.ps.poll() is None)):
                    if mirror is not None:
                        with open(mirror, "a") as f:
                            f.write(json.dumps(ev, separators=(",", ":")) + "\n")
                    self._events.put(ev)
            except WantrainError as e:
                self._watch_error = str(e)
            finally:
                self._events.put(None)

        self._watch_thread = threading.Thread(target=pump, name="wantrain-watch", daemon=True)
        self._watch_thread.start()

    def follow(self, timeout_s: float | None = None) -> Iterator[dict]:
        """Yield telemetry events as they happen until run_end; raise ProcessError if a process fails."""
        deadline = time.time() + timeout_s if timeout_s else None
        while True:
            try:
                ev: dict | None = self._events.get(timeout=0.2)
                idle = False
            except queue.Empty:
                ev, idle = None, True
            if ev is None and not idle:
                if self._watch_error:
                    raise ProcessError(f"following the run's telemetry failed: {self._watch_error}")
                self._check_processes(final=True)
                tail = self.ps.log_tail() if self.ps is not None else ""
                raise ProcessError("the parameter server stopped before the run finished:\n" + tail)
            if ev is not None:
                self.events.append(ev)
                yield ev
                if ev["kind"] == "run_end":
                    return
            self._check_processes()
            if deadline and time.time() > deadline:
                raise ProcessError(f"the run did not finish within {timeout_s:.0f} s")

    def _check_processes(self, final: bool = False) -> None:
        if self._reconnect_error:
            raise SshError(self._reconnect_error)
        for p in self.processes():
            code = p.poll()
            if code not in (None, 0) and id(p) not in self._killed and (final or not self._lost(p, code)):
                raise ProcessError(f"{p.name} exited with code {code}:\n{p.log_tail()}")

    def wait_exit(self, timeout_s: float = 60.0) -> dict[str, int | None]:
        """After run_end: wait for the PS and the sites to exit by themselves (the link emulator
        runs until stopped); returns the exit codes of all processes."""
        deadline = time.time() + timeout_s
        for p in self.processes():
            if p is self.links:
                continue
            try:
                p.wait(max(0.1, deadline - time.time()))
            except TimeoutError:
                pass
        return {p.name: p.poll() for p in self.processes()}
