"""Run every site link of a scenario as a proxy, and log what each link does.

`python -m testbed links --scenario three-sites --target 127.0.0.1:PSPORT --plan-file F --log L`
opens one link per site (proxy or kernel backend, as the scenario says) in one process, writes
the plan (site -> where to dial, what to run it under, region, published RTT, speed factor) to F
once listening, then every 5 x `interval` seconds appends one JSON line per link to L: the trace in force (delay each way, bandwidth, down), bytes each way, time
stalled by outages; plus `outage_start` / `outage_end` / `spike` / `reset` events as they happen
(a scheduled reset aborts every connection of that link).

With `--control C`, lines appended to the file C are commands, read every tick: a JSON object
`{"site": NAME, "outage_s": SECONDS}` takes that link down now (the notebook's "outage now"
button); its start and end are logged like a scheduled outage, with `"forced": true`.
"""

from __future__ import annotations

import asyncio
import json
import math
import signal
import time
from pathlib import Path

from .backend import get_backend
from .scenario import Scenario
from .trace import Spike

__all__ = ["run_links", "plan_of"]


def plan_of(sc: Scenario, handles: dict | None = None) -> dict:
    """What a run needs to know: per site, where to dial (host, port), what to run it under."""
    handles = handles or {}

    def where(name: str) -> dict:
        h = handles.get(name)
        return {"host": h.connect[0], "port": h.connect[1], "exec_prefix": h.exec_prefix} if h else \
            {"host": None, "port": None, "exec_prefix": []}

    def trace_path(s) -> str | None:
        if not s.trace:
            return None
        return str(Path(s.trace) if sc.path is None else (sc.path.parent / s.trace).resolve())

    # Everything a scenario file says is here too, so a tool can write an edited copy of it.
    return {
        "scenario": sc.name, "ps_region": sc.ps_region, "time_scale": sc.time_scale, "backend": sc.backend,
        "seed": sc.seed,
        "sites": [{"name": s.name, "region": s.region, "rtt_ms": sc.rtt_ms(s),
                   "bandwidth_mbps": None if math.isinf(s.bandwidth_mbps) else s.bandwidth_mbps,
                   "speed_factor": s.speed_factor, "jitter_ms": s.jitter_ms, "loss": s.loss,
                   "spikes_per_min": s.spikes_per_min, "spike_min_ms": s.spike_min_ms,
                   "outages": [{"start_s": o.start_s, "duration_s": o.duration_s} for o in s.outages],
                   "resets": list(s.resets), "trace": trace_path(s), **where(s.name)} for s in sc.sites],
    }


class _Commands:
    """New JSON lines of the control file since the last read (a partial last line waits)."""

    def __init__(self, path: Path | None) -> None:
        self.path, self.offset, self.partial = path, 0, b""

    def read(self) -> list[dict]:
        if self.path is None or not self.path.exists():
            return []
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = self.partial + f.read()
        self.offset += len(data) - len(self.partial)
        *lines, self.partial = data.split(b"\n")
        out = []
        for ln in lines:
            try:
                out.append(json.loads(ln))
            except ValueError:
                out.append({"bad": ln.decode(errors="replace")})
        return out


async def run_links(sc: Scenario, target: tuple[str, int], plan_file: Path, log_file: Path | None,
                    interval_s: float = 0.1, stop: asyncio.Event | None = None, control: Path | None = None) -> None:
    stop = stop or asyncio.Event()
    backend = get_backend(sc.backend)
    handles = {}
    try:
        for site in sc.sites:
            up, down = sc.traces(site)
            handles[site.name] = await backend.open(site.name, target, up, down)
    except BaseException:
        for h in handles.values():
            await h.close()
        raise
    proxies = {name: h.proxy for name, h in handles.items()}
    t0 = time.time()
    tmp = Path(str(plan_file) + ".tmp")
    tmp.write_text(json.dumps(plan_of(sc, handles), indent=2))
    tmp.replace(plan_file)
    log = open(log_file, "a", buffering=1) if log_file else None
    was_down = {name: False for name in proxies}
    spikes_seen: set = set()
    resets_due = {s.name: sorted(r * sc.time_scale for r in s.resets) for s in sc.sites}
    tick = 0
    commands = _Commands(control)
    forced: set[str] = set()     # links whose current outage was forced by a command

    def write(obj: dict) -> None:
        if log:
            log.write(json.dumps(obj, separators=(",", ":")) + "\n")

    write({"kind": "links_start", "t": t0, **plan_of(sc, handles)})
    try:
        while not stop.is_set():
            now = time.time()
            for cmd in commands.read():
                p = proxies.get(cmd.get("site"))
                try:
                    if p is None:
                        raise ValueError(f"no link {cmd.get('site')!r}")
                    p.force_outage(float(cmd["outage_s"]))
                    forced.add(cmd["site"])
                except (ValueError, KeyError, TypeError) as e:   # a bad command is logged, never fatal
                    write({"kind": "command_error", "t": now, "command": cmd, "error": str(e)})
            for name, p in proxies.items():
                el = p.elapsed()
                up, down = p.state(p.up, el), p.state(p.down, el)
                if up.down != was_down[name]:
                    write({"kind": "outage_start" if up.down else "outage_end", "t": now, "site": name,
                           **({"forced": True} if name in forced else {})})
                    was_down[name] = up.down
                    if not up.down:
                        forced.discard(name)
                for e in p.up.events:
                    if isinstance(e, Spike) and e.start_s <= el % p.up.duration_s < e.start_s + e.duration_s \
                            and (name, e) not in spikes_seen:
                        spikes_seen.add((name, e))
                        write({"kind": "spike", "t": now, "site": name, "extra_delay_ms": e.extra_delay_ms})
                while resets_due[name] and el >= resets_due[name][0]:
                    resets_due[name].pop(0)
                    write({"kind": "reset", "t": now, "site": name, "connections": p.reset()})
                s = p.stats
                if tick % 5:   # events are checked every tick, link rows written every fifth
                    continue
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
    from .scenario import load_scenario

    sc = load_scenario(args.scenario)
    host, _, port = args.target.rpartition(":")

    async def go() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run_links(sc, (host, int(port)), Path(args.plan_file), Path(args.log) if args.log else None,
                        stop=stop, control=Path(args.control) if args.control else None)

    asyncio.run(go())
    return 0
