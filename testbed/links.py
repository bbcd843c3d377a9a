"""Run every site link of a scenario as a proxy, and log what each link does.

`python -m testbed links --plan PLAN.json --target 127.0.0.1:PSPORT --listening F --log L`
(or `--scenario three-sites` instead of `--plan`) opens one link per site (proxy or kernel
backend, as the plan says) in one process, writes the plan back to F once listening, with where
each site dials and what it runs under (wantrain.launch.plan.RunPlan), then every 5 x `interval`
seconds appends one JSON line per link to L: the trace in force (delay each way, bandwidth,
down), bytes each way, time stalled by outages; plus `outage_start` / `outage_end` / `spike` / `reset` events as they happen
(a scheduled reset aborts every connection of that link).

With `--control C`, lines appended to the file C are commands, read every tick: a JSON object
`{"site": NAME, "outage_s": SECONDS}` takes that link down now (the notebook's "outage now"
button); its start and end are logged like a scheduled outage, with `"forced": true`.
`{"ps_region": REGION}` says the PS moved there (wantrain's Run.move_ps): every proxied link takes
its traces for that region's RTT from now on (a `ps_moved` event with each link's RTT); a kernel
link (htb) keeps its rate and takes the delay on its proxy link like the others.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import signal
import time
from pathlib import Path

from wantrain.launch.plan import JsonlTail, Outage, RunPlan, SitePlan

from .backend import ProxyBackend, get_backend, without_rate
from .scenario import Scenario
from .trace import Spike

__all__ = ["run_links", "plan_of"]


def plan_of(sc: Scenario, handles: dict | None = None) -> RunPlan:
    """The run plan of a scenario (wantrain.launch.plan): everything the scenario says, with the published
    RTTs and, once the links listen (`handles`), where each site dials and what it runs under."""
    handles = handles or {}

    def where(name: str) -> dict:
        h = handles.get(name)
        return {"host": h.connect[0], "port": h.connect[1], "exec_prefix": tuple(h.exec_prefix)} if h else {}

    def trace_path(s) -> str | None:
        if not s.trace:
            return None
        return str(Path(s.trace) if sc.path is None else (sc.path.parent / s.trace).resolve())

    return RunPlan(sc.name, sc.ps_region, tuple(
        SitePlan(s.name, s.region, rtt_ms=sc.rtt_ms(s), bandwidth_mbps=s.bandwidth_mbps, jitter_ms=s.jitter_ms,
                 loss=s.loss, spikes_per_min=s.spikes_per_min, spike_min_ms=s.spike_min_ms,
                 outages=tuple(Outage(o.start_s, o.duration_s) for o in s.outages), resets=tuple(s.resets),
                 speed_factor=s.speed_factor, trace=trace_path(s), backend=s.backend, interface=s.interface,
                 chunk_loss=s.chunk_loss, chunk_burst=s.chunk_burst, chunk_late_s=s.chunk_late_s,
                 **where(s.name)) for s in sc.sites),
        time_scale=sc.time_scale, seed=sc.seed, backend=sc.backend)


def moved(sc: Scenario, ps_region: str, handles: dict) -> Scenario:
    """The scenario with its PS in `ps_region`, every open link's traces swapped for that region's
    (from the same seeds: only the RTT changes); ValueError for a region without RTTs."""
    there = dataclasses.replace(sc, ps_region=ps_region)
    try:
        traces = {s.name: there.traces(s) for s in sc.sites if s.name in handles}
    except KeyError as e:
        raise ValueError(str(e).strip("'\"")) from None
    for name, (up, down) in traces.items():
        if next(s for s in sc.sites if s.name == name).backend == "kernel":    # its host's htb does the rate
            up, down = without_rate(up), without_rate(down)
        handles[name].retrace(up, down)
    return there


async def run_links(sc: Scenario, target: tuple[str, int], plan_file: Path, log_file: Path | None,
                    interval_s: float = 0.1, stop: asyncio.Event | None = None, control: Path | None = None,
                    backend_name: str | None = None) -> None:
    """`backend_name` overrides the scenario's (`kernel-relay`: no proxy, for peers that connect to
    each other; bench/peers.py)."""
    stop = stop or asyncio.Event()
    backend = get_backend(backend_name or sc.backend)
    handles = {}
    try:
        for site in sc.sites:
            if site.backend == "tcconfig":      # shaped on its own host (shape.py): no link here
                continue
            up_trace, down_trace = sc.traces(site)
            if site.backend == "kernel":        # its host's htb does the rate; its proxy link the rest
                handles[site.name] = await ProxyBackend().open(site.name, target, without_rate(up_trace),
                                                               without_rate(down_trace))
                continue
            handles[site.name] = await backend.open(site.name, target, up_trace, down_trace)
    except BaseException:
        for h in handles.values():
            await h.close()
        raise
    t0 = time.time()
    listening = plan_of(sc, handles)
    listening.write(plan_file)
    log = open(log_file, "a", buffering=1) if log_file else None
    was_down = {name: False for name in handles}
    spikes_seen: set = set()
    resets_due = {s.name: sorted(r * sc.time_scale for r in s.resets) for s in sc.sites}
    tick = 0
    commands = JsonlTail(control)   # commands appended to the control file, one JSON object a line
    forced: set[str] = set()     # links whose current outage was forced by a command

    def write(obj: dict) -> None:
        if log:
            log.write(json.dumps(obj, separators=(",", ":")) + "\n")

    write({"kind": "links_start", "t": t0, **listening.to_dict()})
    try:
        while not stop.is_set():
            now = time.time()
            for cmd in commands.read():
                target_link = handles.get(str(cmd.get("site")))
                try:
                    if "ps_region" in cmd:
                        sc = moved(sc, str(cmd["ps_region"]), handles)
                        write({"kind": "ps_moved", "t": now, "ps_region": sc.ps_region,
                               "rtt_ms": {s.name: sc.rtt_ms(s) for s in sc.sites if s.name in handles}})
                        continue
                    if target_link is None:
                        raise ValueError(f"no link {cmd.get('site')!r}")
                    target_link.force_outage(float(cmd["outage_s"]))
                    forced.add(cmd["site"])
                except (ValueError, KeyError, TypeError) as e:   # a bad command is logged, never fatal
                    write({"kind": "command_error", "t": now, "command": cmd, "error": str(e)})
            for name, h in handles.items():
                el = h.elapsed()
                up, down = h.states(el)
                if up.down != was_down[name]:
                    write({"kind": "outage_start" if up.down else "outage_end", "t": now, "site": name,
                           **({"forced": True} if name in forced else {})})
                    was_down[name] = up.down
                    if not up.down:
                        forced.discard(name)
                for ev in h.up.events:
                    if isinstance(ev, Spike) and ev.start_s <= el % h.up.duration_s < ev.start_s + ev.duration_s \
                            and (name, ev) not in spikes_seen:
                        spikes_seen.add((name, ev))
                        write({"kind": "spike", "t": now, "site": name, "extra_delay_ms": ev.extra_delay_ms})
                while resets_due[name] and el >= resets_due[name][0]:
                    resets_due[name].pop(0)
                    write({"kind": "reset", "t": now, "site": name, "connections": h.reset()})
                if tick % 5:   # events are checked every tick, link rows written every fifth
                    continue
                s = h.stats()
                write({"kind": "link", "t": now, "site": name, "delay_up_ms": up.delay_ms,
                       "delay_down_ms": down.delay_ms, "trace_rtt_ms": up.delay_ms + down.delay_ms,
                       "bandwidth_mbps": None if math.isinf(up.bandwidth_mbps) else up.bandwidth_mbps,
                       "down": up.down, "bytes_up": s.bytes_up, "bytes_down": s.bytes_down, "stalled_s": s.stalled_s,
                       "connections": s.connections, "resets": s.resets})
            tick += 1
            try:
                await asyncio.wait_for(stop.wait(), interval_s)
            except asyncio.TimeoutError:
                pass
    finally:
        for h in handles.values():
            await h.close()
        if log:
            log.close()


def main_links(args) -> int:
    from .scenario import load_scenario, scenario_from_plan

    sc = scenario_from_plan(RunPlan.read(args.plan), args.plan) if args.plan else load_scenario(args.scenario)
    host, _, port = args.target.rpartition(":")

    async def go() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run_links(sc, (host, int(port)), Path(args.listening), Path(args.log) if args.log else None,
                        stop=stop, control=Path(args.control) if args.control else None, backend_name=args.backend)

    asyncio.run(go())
    return 0
