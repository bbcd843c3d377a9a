"""The link emulator of a run: its process, the plan it runs and the file it takes commands from.

wantrain imports nothing of testbed: it starts `python -m testbed links` (argv.py) with a run plan
(plan.py, the contract between them), waits for the plan it writes back once every link listens
(where each site dials), and writes outages and PS moves into its control file. `describe_scenario` asks testbed
for a scenario's plan without starting anything.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

from ..errors import ConfigError, ProcessError
from .plan import RunPlan, move_command, outage_command
from .argv import links_command
from .base import Launcher, ProcessHandle, ProcessSpec

__all__ = ["LinkEmulator", "describe_scenario", "describe_moved"]


def describe_scenario(scenario: str | Path, python: str = sys.executable, ps_region: str | None = None) -> RunPlan:
    """The run plan of a testbed scenario (sites, regions, RTTs, speed factors), without starting it;
    with `ps_region`, as if its PS were there."""
    return RunPlan.from_json(_describe(scenario, python, *(["--ps-region", ps_region] if ps_region else [])))


def describe_placements(scenario: str | Path, python: str = sys.executable) -> dict[str, RunPlan]:
    """The run plan of a testbed scenario for its PS in each region the testbed knows."""
    return {region: RunPlan.from_json(json.dumps(plan))
            for region, plan in json.loads(_describe(scenario, python, "--ps-region", "all")).items()}


def describe_moved(plan: RunPlan, ps_region: str, folder: Path, python: str = sys.executable) -> RunPlan:
    """`plan` (a run's) as if its PS were in `ps_region` (each site's RTT to it); ConfigError for a
    region the testbed has no RTTs for. The plan goes through a file in `folder`."""
    path = folder / "plan-to-move.json"
    plan.write(path)
    return RunPlan.from_json(_describe(path, python, "--ps-region", ps_region, what="--plan"))


def _describe(scenario: str | Path, python: str, *extra: str, what: str = "--scenario") -> str:
    r = subprocess.run([python, "-m", "testbed", "describe", what, str(scenario), *extra], capture_output=True,
                       text=True, timeout=60)
    if r.returncode == 2:      # the scenario is malformed: testbed's message names the file, line and field
        raise ConfigError(r.stderr.strip().removeprefix("testbed describe: "))
    if r.returncode != 0:
        raise ProcessError(r.stderr.strip() or f"cannot describe scenario {scenario!r}")
    return r.stdout


class LinkEmulator:
    """One process emulating every site's link of `plan`; files in `run_dir`."""

    def __init__(self, plan: RunPlan, launcher: Launcher, python: str, run_dir: Path) -> None:
        self.plan = plan                        # what it runs
        self.listening: RunPlan | None = None   # the same once its links listen: where each site dials
        self.launcher, self.python, self.run_dir = launcher, python, run_dir
        self.control = run_dir / "links.control"    # commands to it (outages), one JSON line each
        self.events = run_dir / "links.jsonl"       # what it did to each link, for the relay
        self.process: ProcessHandle | None = None

    def start(self, target: str, sites: list[str], deadline: float) -> RunPlan:
        """Start it relaying to the PS at `target`; returns the plan as it listens."""
        if sorted(self.plan.names) != sorted(sites):
            raise ConfigError(f"the run plan has sites {self.plan.names}, the run expects {sites}")
        listening = self.run_dir / "links.json"
        listening.unlink(missing_ok=True)
        self.process = p = self.launcher.start(ProcessSpec("link emulator", links_command(
            self.python, self.plan.write(self.run_dir / "plan.json"), target, listening, self.events, self.control),
            env={"PYTHONUNBUFFERED": "1"}, log_path=self.run_dir / "links.log"))
        while not listening.exists():
            if p.poll() is not None:
                raise ProcessError(f"the link emulator exited with code {p.poll()}:\n{p.log_tail()}")
            if time.time() > deadline:
                raise ProcessError("the link emulator did not start in time")
            time.sleep(0.05)
        self.listening = RunPlan.read(listening)
        return self.listening

    def move_ps(self, region: str) -> RunPlan:
        """The PS now runs in `region`: every link takes its RTT to it from now on (the testbed's
        table; ConfigError for a region it has none for). Returns the plan as it now stands."""
        if self.process is None or self.process.poll() is not None or self.listening is None:
            raise ProcessError("no link emulator is running: moving the PS needs a run with a scenario or plan")
        there = describe_moved(self.plan, region, self.run_dir, self.python)
        self.plan, self.listening = _moved(self.plan, there), _moved(self.listening, there)
        with open(self.control, "a") as f:
            f.write(move_command(there.ps_region))
        return self.plan

    def outage(self, site: str, seconds: float) -> None:
        """Take a site's link down now for `seconds` (at most 200, as the traces' outages)."""
        if self.process is None or self.process.poll() is not None:
            raise ProcessError("no link emulator is running: outages need a run with a scenario or plan")
        if site not in self.plan.names:
            raise ConfigError(f"no site {site!r} in this run (sites: {', '.join(self.plan.names)})")
        if not 0 < seconds <= 200:
            raise ConfigError(f"an outage lasts (0, 200] s, got {seconds}")
        with open(self.control, "a") as f:
            f.write(outage_command(site, seconds))


def _moved(plan: RunPlan, there: RunPlan) -> RunPlan:
    """`plan` with the PS in `there`'s region and each site's RTT to it (nothing else changes: the
    listening plan keeps its ports)."""
    rtt = {s.name: s.rtt_ms for s in there.sites}
    return dataclasses.replace(plan, ps_region=there.ps_region,
                               sites=tuple(dataclasses.replace(s, rtt_ms=rtt[s.name]) for s in plan.sites))
