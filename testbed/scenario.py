"""Scenarios: where the PS and the sites are, what their links do, how fast each site computes.

A scenario is a TOML file (see scenarios/ for the built-in ones):

    name, ps_region, time_scale (trace seconds -> real seconds), seed,
    backend ("proxy", the default and needing no root, or "kernel": root, namespaces)
    [[site]] name, region, and optionally: bandwidth_mbps (default unlimited), jitter_ms, loss,
             spikes_per_min, spike_min_ms, outages = [{start_s, duration_s}], resets = [start_s, ...]
             (connection resets), speed_factor, trace = "file.csv" (replaces the synthetic delay,
             bandwidth, jitter, loss and spikes; relative to the scenario file; outages and resets
             still happen on top of it), backend = "tcconfig" with interface = "eth0" (this site's
             link is shaped on its own host by tcconfig, not by the run's backend; root there) or
             backend = "kernel" (where the host has no netem: htb there does the uplink rate, its
             proxy link here the delay, loss and outages), chunk_loss, chunk_burst, chunk_late_s
             (the site's own delta chunks lost at that rate, in runs of that mean length, each sent
             that many seconds after the others: wantrain.runtime.chunk_loss.ChunkLoss)

A bad file gets a message that names the file, the line (where the TOML says it) and the field.
"""

from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from wantrain.launch.plan import ON_HOST_BACKENDS, RunPlan

from .regions import regions, rtt_ms
from .trace import Outage, Trace, TraceError, synthetic

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["Scenario", "SiteLink", "ScenarioError", "load_scenario", "scenario_from_plan", "BUILTIN"]

BUILTIN_DIR = Path(__file__).parent / "scenarios"
BUILTIN = sorted(p.stem for p in BUILTIN_DIR.glob("*.toml"))
TRACE_SECONDS = 3600.0   # synthetic traces cover an hour of trace time, then loop


class ScenarioError(ValueError):
    """A malformed scenario; the message names the file, line and field."""


@dataclass(frozen=True)
class SiteLink:
    name: str
    region: str
    bandwidth_mbps: float = math.inf
    jitter_ms: float = 0.0
    loss: float = 0.0
    spikes_per_min: float = 0.0
    spike_min_ms: float = 50.0
    outages: tuple[Outage, ...] = ()
    speed_factor: float = 1.0
    trace: str | None = None
    resets: tuple[float, ...] = ()     # trace seconds at which every connection of the link is reset
    backend: str | None = None         # "tcconfig" or "kernel": shaped on the site's host (wantrain.launch.plan.SitePlan)
    interface: str | None = None       # the host's interface to shape
    chunk_loss: float = 0.0            # application-level delta chunk loss (wantrain.launch.plan.SitePlan)
    chunk_burst: float = 1.0
    chunk_late_s: float = 30.0


@dataclass(frozen=True)
class Scenario:
    name: str
    ps_region: str
    sites: tuple[SiteLink, ...]
    time_scale: float = 1.0
    seed: int = 0
    path: Path | None = field(default=None, compare=False)
    backend: str = "proxy"

    def rtt_ms(self, site: SiteLink) -> float:
        return rtt_ms(site.region, self.ps_region)

    def traces(self, site: SiteLink) -> tuple[Trace, Trace]:
        """(uplink, downlink) traces of a site's link, already time-scaled."""
        if site.trace:
            t = Trace.load_csv(Path(site.trace) if self.path is None else self.path.parent / site.trace, loop=True)
            t = t.with_outages(site.outages)
            return t.scaled(self.time_scale), t.scaled(self.time_scale)
        i = [s.name for s in self.sites].index(site.name)
        one_way = self.rtt_ms(site) / 2
        make = lambda k: synthetic(
            one_way, site.bandwidth_mbps, TRACE_SECONDS, jitter_ms=site.jitter_ms, loss=site.loss,
            spikes_per_min=site.spikes_per_min, spike_min_ms=site.spike_min_ms, outages=site.outages,
            seed=self.seed * 1000 + 2 * i + k, name=f"{site.name}-{'up' if k == 0 else 'down'}")
        return make(0).scaled(self.time_scale), make(1).scaled(self.time_scale)


def load_scenario(name_or_path: str | Path) -> Scenario:
    """A built-in scenario by name, or a TOML file."""
    p = Path(name_or_path)
    if str(name_or_path) in BUILTIN:
        p = BUILTIN_DIR / f"{name_or_path}.toml"
    if not p.is_file():
        raise ScenarioError(f"no scenario {str(name_or_path)!r}: not a file, and not one of {', '.join(BUILTIN)}")
    text = p.read_text()
    try:
        d = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ScenarioError(f"{p}: {e}") from None
    return _build(d, p, text)


def scenario_from_plan(plan: RunPlan, where: str | Path = "run plan") -> Scenario:
    """The scenario a run plan describes, checked like a scenario file (the message names the field)."""
    def site(s) -> dict:        # a [[site]] table: the plan's fields of the same names
        d = {k: getattr(s, k) for k in _SITE_FIELDS}
        d["outages"] = [{"start_s": o.start_s, "duration_s": o.duration_s} for o in s.outages]
        d["resets"] = list(s.resets)
        return {k: v for k, v in d.items() if v is not None}       # no bandwidth: unlimited; no trace

    d = {"name": plan.scenario, "ps_region": plan.ps_region, "time_scale": plan.time_scale, "seed": plan.seed,
         "backend": plan.backend, "site": [site(s) for s in plan.sites]}
    return _build(d, Path(where), "")


def _line_of(text: str, key: str, occurrence: int = 0) -> int | None:
    hits = [i for i, ln in enumerate(text.splitlines(), 1) if re.match(rf"\s*{re.escape(key)}\s*=", ln)]
    return hits[occurrence] if occurrence < len(hits) else None


def _err(path: Path, text: str, key: str, message: str, occurrence: int = 0) -> ScenarioError:
    line = _line_of(text, key.split(".")[-1].split("]")[-1], occurrence)
    where = f"{path}:{line}" if line else f"{path}"
    return ScenarioError(f"{where}: field {key} {message}")


_SITE_FIELDS = {"name", "region", "bandwidth_mbps", "jitter_ms", "loss", "spikes_per_min", "spike_min_ms", "outages",
                "speed_factor", "trace", "resets", "backend", "interface", "chunk_loss", "chunk_burst", "chunk_late_s"}


def _build(d: dict, path: Path, text: str) -> Scenario:
    known = {"name", "ps_region", "time_scale", "seed", "site", "backend"}
    for k in d:
        if k not in known:
            raise _err(path, text, k, f"is unknown (known: {', '.join(sorted(known))})")
    region_names = regions()
    ps_region = d.get("ps_region")
    if ps_region not in region_names:
        raise _err(path, text, "ps_region", f"must be one of the known regions ({', '.join(region_names)}), got {ps_region!r}")
    time_scale = d.get("time_scale", 1.0)
    if not isinstance(time_scale, (int, float)) or not time_scale > 0:
        raise _err(path, text, "time_scale", f"must be a positive number, got {time_scale!r}")
    backend = d.get("backend", "proxy")
    if backend not in ("proxy", "kernel"):
        raise _err(path, text, "backend", f"must be \"proxy\" or \"kernel\", got {backend!r}")
    raw_sites = d.get("site", [])
    if not raw_sites:
        raise ScenarioError(f"{path}: a scenario needs at least one [[site]]")
    sites = []
    counts: dict[str, int] = {}
    for i, s in enumerate(raw_sites):
        def err(key: str, message: str, i: int = i) -> ScenarioError:
            occ = counts.get(key, 0)
            return _err(path, text, f"site[{i}].{key}", message, occ)
        for k in s:
            if k not in _SITE_FIELDS:
                raise err(k, f"is unknown (known: {', '.join(sorted(_SITE_FIELDS))})")
        if not isinstance(s.get("name"), str) or not s["name"]:
            raise err("name", "must be a non-empty string")
        if s.get("region") not in region_names:
            raise err("region", f"must be one of the known regions, got {s.get('region')!r}")
        kw = {}
        for key, lo, hi in (("bandwidth_mbps", 0, math.inf), ("jitter_ms", 0, 10_000), ("loss", 0, 0.5),
                            ("spikes_per_min", 0, 600), ("spike_min_ms", 0, 100_000), ("speed_factor", 1, 100),
                            ("chunk_loss", 0, 0.9), ("chunk_burst", 1, 1000), ("chunk_late_s", 0, 3600)):
            if key in s:
                v = s[key]
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi or (key == "bandwidth_mbps" and v == 0):
                    raise err(key, f"must be a number in [{lo}, {hi}]{' (and not 0)' if key == 'bandwidth_mbps' else ''}, got {v!r}")
                kw[key] = float(v)
        outages = []
        for o in s.get("outages", []):
            if not isinstance(o, dict) or set(o) != {"start_s", "duration_s"}:
                raise err("outages", "entries must be {start_s = ..., duration_s = ...}")
            if not 0 < o["duration_s"] <= 200 or o["start_s"] < 0:
                raise err("outages", f"duration_s must be in (0, 200] and start_s >= 0, got {o}")
            outages.append(Outage(float(o["start_s"]), float(o["duration_s"])))
        resets = s.get("resets", [])
        if not isinstance(resets, list) or not all(isinstance(x, (int, float)) and x >= 0 for x in resets):
            raise err("resets", f"must be a list of times (s, >= 0), got {resets!r}")
        if "trace" in s and not isinstance(s["trace"], str):
            raise err("trace", "must be a path to a CSV trace")
        if s.get("backend", "tcconfig") not in ON_HOST_BACKENDS:
            raise err("backend", f"of a site can only be \"tcconfig\" or \"kernel\" (shaped on its own host; the "
                                 f"run's backend is set at the top), got {s['backend']!r}")
        if ("backend" in s) != ("interface" in s) or not isinstance(s.get("interface", ""), str):
            raise err("interface" if "backend" in s else "backend",
                      "and a site's backend go together: name the host's interface to shape")
        for k in s:
            counts[k] = counts.get(k, 0) + 1
        sites.append(SiteLink(s["name"], s["region"], outages=tuple(outages), trace=s.get("trace"),
                              resets=tuple(float(x) for x in resets), backend=s.get("backend"),
                              interface=s.get("interface"), **kw))
    names = [s.name for s in sites]
    if len(set(names)) != len(names):
        raise ScenarioError(f"{path}: site names must be unique, got {names}")
    sc = Scenario(str(d.get("name", path.stem)), ps_region, tuple(sites), float(time_scale), int(d.get("seed", 0)), path,
                  backend)
    for site in sites:
        if site.trace:
            try:
                sc.traces(site)
            except TraceError as e:
                raise ScenarioError(f"{path}: site {site.name}: {e}") from None
    return sc
