"""A run: the PS and its sites as processes, started, watched and stopped together.

Used by the CLI (`wantrain demo`) and the notebook widgets. `Run` starts the PS, waits for the
port it bound, optionally starts the WAN emulator of a run plan (plan.py; `python -m testbed
links`, its own process: wantrain imports nothing of testbed), starts one worker per site
(through its emulated link when there is one), relays the link emulator's events and the faults
it injects into the PS's telemetry (relay.py), follows that telemetry over the `Watch` RPC, and
stops every process it started when the run ends, fails, or is interrupted. The PS may run on an
SSH host (launch/ps_host.py) and each site on one (launch/placement.py).

`Run` composes owners and holds only what is the run's own (which processes, which were killed on
purpose, the faults it injected): the run's secrets (launch/credentials.py), the link emulator
(launch/emulator.py), where the PS and each site run, and the restart of an SSH site whose
connection was lost (launch/remote.py: `Reconnector`).
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import logging
import queue
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path

import grpc

from ..transport import net
from ..config import RunConfig
from ..errors import ConfigError, ProcessError, SshError, WantrainError
from . import LocalLauncher, ProcessSpec
from .argv import ps_command, site_command
from .base import ProcessHandle
from .credentials import Credentials
from .emulator import LinkEmulator, describe_scenario
from .placement import Placement, Placements
from .ps_host import LocalPS, RemotePS, wait_for_port
from .remote import Reconnector, RemoteSite
from .ssh import LOST
from .run_names import default_site_names, new_run_dir
from .plan import ON_HOST_BACKENDS, RunPlan, SitePlan
from .relay import EventRelay
from ..telemetry.tensorboard import TensorBoardLog
from ..telemetry.watch import follow_events, report_events

__all__ = ["Run", "default_site_names", "new_run_dir", "describe_scenario"]

log = logging.getLogger("wantrain.run")
_LIVE_RUNS: weakref.WeakSet[Run] = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    for run in list(_LIVE_RUNS):
        run.stop()


class Run:
    """The processes of one training run: the PS, the link emulator and the sites, here or on SSH hosts."""

    def __init__(self, cfg: RunConfig, run_dir: str | Path | None = None, sites: list[str] | None = None,
                 host: str = "127.0.0.1", site_threads: int = 1, launcher=None,
                 python: str = sys.executable, scenario: str | Path | None = None, tls: bool = True,
                 devices: dict[str, str] | None = None, plan: RunPlan | None = None,
                 remote: dict[str, RemoteSite | str] | None = None, nproc: dict[str, int] | None = None,
                 ps_on: RemotePS | str | None = None, tensorboard: str | Path | None = None) -> None:
        self.cfg = cfg
        self.run_dir = Path(run_dir) if run_dir else new_run_dir()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if plan is None and scenario is not None:
            plan = describe_scenario(scenario, python)
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
        self.credentials: Credentials | None = None     # made fresh at start
        self.launcher = launcher or LocalLauncher()
        # The WAN emulator of the plan, if any (None: sites dial the PS directly).
        self.emulator = LinkEmulator(plan, self.launcher, python, self.run_dir) if plan is not None else None
        self.plan: RunPlan | None = None   # the plan once the links listen: where each site dials
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
        # The telemetry as TensorBoard event files too, written as it comes (the watch thread's).
        self.tensorboard = TensorBoardLog(tensorboard) if tensorboard is not None else None
        self._watch_thread: threading.Thread | None = None
        self._watch_error = ""
        self._stopping = threading.Event()
        self._stop_lock, self._stopped = threading.Lock(), False
        self.events: list[dict] = []
        self._killed: set[int] = set()        # processes killed on purpose (kill_site, restart_ps)
        self.faults: list[dict] = []          # faults injected on purpose (also relayed into the PS's log)
        self.relay: EventRelay | None = None
        self.reconnector = Reconnector(self.start_site, self._stopping)
        self._restarting = False
        self._ps_restarts = 0

    # What the run's owners hold, by the names notebooks and tests read.
    run_plan = property(lambda self: self.emulator.plan if self.emulator else None)
    links = property(lambda self: self.emulator.process if self.emulator else None)
    certs = property(lambda self: self.credentials.certs if self.credentials else None)
    observer_token = property(lambda self: self.credentials.observer_token if self.credentials else "")

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
        self.credentials = Credentials(self.run_dir, self.sites, token_per_site=not isinstance(self.ps_host, LocalPS),
                                       tls_hosts=(self.ps_host.public_host, "localhost") if self.tls else None)
        files = {"config": cfg_path, **self.credentials.files}
        there, run_dir = self.ps_host.place(files, self.run_dir)
        roles = {"shared-secret": "shared_secret_file", "observer-token": "observer_token_file"}
        self._ps_options = {"run_dir": run_dir, "host": self.ps_host.bind,
                            **{roles.get(role, role.replace("-", "_")): path for role, path in there.items()}}
        deadline = time.time() + timeout_s
        self._start_ps(0, "ps.log", deadline)
        self.relay = EventRelay(self._open_channel, self.observer_token,
                                self.emulator.events if self.emulator is not None else None).start()
        try:
            if self.emulator is not None:
                self.plan = self.emulator.start(self.site_address, self.sites, deadline)
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
            "parameter server", ps_command(self.ps_host.python, port=port, port_file=port_file, **self._ps_options),
            env={"PYTHONUNBUFFERED": "1"}, log_path=self.run_dir / log_name))
        try:
            self.ps_port = wait_for_port(self.ps_host, self.ps, port_file, deadline)
        except ProcessError:
            self.stop()
            raise
        observer = self.ps_host.observer_address(self.ps_port)
        self.host, self.port = observer.rsplit(":", 1)[0], int(observer.rsplit(":", 1)[1])

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
        assert self.credentials is not None
        where = self.placements.place(name, via, self.credentials.site_tokens[name], self.certs.ca if self.certs else None,
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

    def __repr__(self) -> str:
        """What a notebook shows for a run: its folder, its sites, and whether it is going."""
        state = "stopped" if self._stopped else "not started" if self.ps is None else "running"
        return f"<wantrain Run {self.run_dir.name}: {len(self.sites)} sites ({', '.join(self.sites)}), {state}; " \
               f"folder {self.run_dir}>"

    def __exit__(self, *exc) -> None:
        self.stop()

    # ------------------------------------------------------------ faults on purpose

    def _fault(self, action: str, site: str | None = None, **extra) -> None:
        """Record a fault injected on purpose; the relay writes it into the PS's telemetry."""
        row = {"kind": "fault", "t": time.time(), "action": action, **({"site": site} if site else {}), **extra}
        self.faults.append(row)
        if self.relay is not None:
            self.relay.add(row)

    def clear_site(self, name: str) -> None:
        """Count again a site the commit check excluded (robust.exclude_after; `wantrain clear-site`)."""
        if name not in self.sites:
            raise ConfigError(f"no site {name!r} in this run (sites: {', '.join(self.sites)})")
        with self._open_channel() as channel:
            report_events(channel, self.observer_token, [{"kind": "clear_site", "site": name}])

    def kill_site(self, name: str) -> None:
        """SIGKILL a site's process, as a crash would; `start_site(name)` brings it back."""
        if name not in self.workers:
            raise ConfigError(f"no site {name!r} in this run (sites: {', '.join(self.sites)})")
        p = self.workers[name]
        self._killed.add(id(p))
        self._fault("kill site", name)
        p.kill()
        p.wait(10)

    def outage(self, name: str, seconds: float) -> None:
        """Take a site's emulated link down now for `seconds` (needs a scenario)."""
        if self.emulator is None:
            raise ProcessError("no link emulator is running: outages need a run with a scenario or plan")
        self.emulator.outage(name, seconds)
        self._fault("link outage", name, seconds=seconds)

    def restart_ps(self, timeout_s: float = 120.0) -> None:
        """SIGKILL the PS and start it again on the same port: it resumes from its checkpoint
        and the sites reconnect by themselves."""
        self._restart_ps(timeout_s, "restart PS")

    def _restart_ps(self, timeout_s: float, *fault, **details) -> None:
        """Restart the PS, recorded as the fault `fault` (a restart, or a move: one marker for one act)."""
        if self.ps is None or self.ps_port is None:
            raise ProcessError("the run has not started: there is no parameter server to restart")
        self._restarting = True
        try:
            old = self.ps
            self._killed.add(id(old))
            self._fault(*fault, **details)
            old.kill()
            old.wait(10)
            self._ps_restarts += 1
            self._start_ps(self.ps_port, f"ps-restart-{self._ps_restarts}.log", time.time() + timeout_s)
        finally:
            self._restarting = False

    def move_ps(self, region: str, timeout_s: float = 120.0) -> None:
        """Move the PS to `region`, as a cloud PS is moved: it starts again from its checkpoint and
        journal, the emulated links take that region's RTTs (they stand for the redirect: a DNS
        name moved, or a relay), and the sites follow by themselves; nothing is lost."""
        if self.emulator is None:
            raise ProcessError("moving the PS needs a run whose links are emulated (a scenario or plan)")
        there = self.emulator.move_ps(region)
        self._restart_ps(timeout_s, "move PS", region=region, rtt_ms={s.name: s.rtt_ms for s in there.sites})

    def drop_connection(self, name: str) -> None:
        """Cut an SSH site's connection, as a network failure would: its watchdog stops the site on
        the host, and the run reconnects and starts it again (it rejoins)."""
        if name not in self.placements.remote:
            raise ConfigError(f"site {name!r} does not run over SSH (SSH sites: {', '.join(self.placements.remote)})")
        self._fault("drop SSH connection", name)
        self.placements.remote[name].launcher.close()

    def _lost(self, p: ProcessHandle, code: int) -> bool:
        """Whether `p` is an SSH site whose connection went; if so, its restart is under way."""
        name = next((n for n, w in self.workers.items() if w is p), None)
        if name is None or name not in self.placements.remote or code != LOST or self._stopping.is_set():
            return False
        self._killed.add(id(p))                 # handled here, not a failure of the run
        self._fault("SSH connection lost", name)
        self.reconnector.again(name)
        return True

    # ------------------------------------------------------------ telemetry

    def _tls_client(self):
        return self.credentials.client() if self.credentials is not None else None

    def _open_channel(self) -> grpc.Channel:
        return net.observer_channel(self.address, self._tls_client())

    def _to_tensorboard(self, ev: dict) -> None:
        """The event into the TensorBoard files, if asked for. They are a copy of the telemetry: a
        failure to write them is logged and ends them, never the run."""
        if self.tensorboard is None:
            return
        try:
            self.tensorboard.add(ev)
        except Exception:
            log.exception("writing TensorBoard event files to %s failed; the run goes on without them",
                          self.tensorboard.log_dir)
            self.tensorboard = None

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
                    self._to_tensorboard(ev)
                    self._events.put(ev)
            except WantrainError as e:
                self._watch_error = str(e)
            finally:
                if self.tensorboard is not None:
                    self.tensorboard.flush()
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
        if self.reconnector.error:
            raise SshError(self.reconnector.error)
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
