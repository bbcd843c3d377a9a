"""The run plan: where the PS and each site are, what each site's link does, how fast each computes.

One typed, versioned object shared by wantrain and the testbed (the one wantrain module the
testbed imports; it needs nothing but the standard library), with the rest of their contract:
the link emulator's command file (`outage_command`) and `JsonlTail`, which reads both that file
and the emulator's event log (links.jsonl) as they grow. The testbed makes a plan from a
scenario file (`python -m testbed describe`), the notebook edits it (a speed factor, a
bandwidth), `Run` writes it to the run folder, the testbed runs exactly that plan (`python -m
testbed links --plan`) and writes it back with where each site must dial once its link
listens, and `site_argv` turns a site's entry into the site's command line.
"""

from __future__ import annotations

import dataclasses
import json
import math
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["PLAN_VERSION", "CANNOT_SHAPE", "ON_HOST_BACKENDS", "Outage", "SitePlan", "RunPlan", "PlanError",
           "JsonlTail", "outage_command"]

PLAN_VERSION = 1
CANNOT_SHAPE = 3     # `python -m testbed shape` exits so when it refuses (no netem, no root): nothing left behind
ON_HOST_BACKENDS = ("tcconfig", "kernel")   # a site's own backend, applied on its host (testbed shape)


class PlanError(ValueError):
    """A plan that cannot be read; the message names the field. (ValueError: the testbed needs no wantrain tree.)"""


@dataclass(frozen=True)
class Outage:
    start_s: float            # trace seconds
    duration_s: float         # at most 200 s


@dataclass(frozen=True)
class SitePlan:
    name: str
    region: str
    rtt_ms: float = 0.0                   # published RTT between the site's region and the PS's
    bandwidth_mbps: float | None = None   # None: unlimited
    jitter_ms: float = 0.0
    loss: float = 0.0
    spikes_per_min: float = 0.0
    spike_min_ms: float = 50.0
    outages: tuple[Outage, ...] = ()
    resets: tuple[float, ...] = ()        # trace seconds at which every connection of the link is reset
    speed_factor: float = 1.0             # > 1: the site computes that many times slower
    # Application-level loss of the site's delta chunks (recovery.ChunkLoss, seeded by the site's
    # name): a lost chunk is sent chunk_late_s after the others, as a retransmission would be.
    chunk_loss: float = 0.0
    chunk_burst: float = 1.0              # mean run of lost chunks (1: i.i.d.; more: Gilbert-Elliott)
    chunk_late_s: float = 30.0
    trace: str | None = None              # an absolute path to a CSV trace (replaces the synthetic link)
    # Shaped on the site's own host, on `interface`, by `python -m testbed shape` (ON_HOST_BACKENDS):
    # "tcconfig" (netem: everything; the site dials the PS directly) or "kernel" (htb: the uplink rate;
    # its proxy link in the emulator does delay, loss and outages). None: the run's backend, in the emulator.
    backend: str | None = None
    interface: str | None = None
    # Where the site dials once its link listens (None: the link is not open yet, or there is none).
    host: str | None = None
    port: int | None = None
    exec_prefix: tuple[str, ...] = ()     # what to run the site under (a network namespace)

    def __post_init__(self) -> None:
        if self.bandwidth_mbps is not None and math.isinf(self.bandwidth_mbps):
            object.__setattr__(self, "bandwidth_mbps", None)

    @property
    def dial(self) -> str | None:
        """HOST:PORT the site dials through its link, once the link listens."""
        return f"{self.host}:{self.port}" if self.host is not None and self.port is not None else None


@dataclass(frozen=True)
class RunPlan:
    scenario: str
    ps_region: str
    sites: tuple[SitePlan, ...]
    time_scale: float = 1.0               # trace seconds -> real seconds
    seed: int = 0
    backend: str = "proxy"                # "proxy" (no root) or "kernel"
    version: int = field(default=PLAN_VERSION)

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.sites]

    def site(self, name: str) -> SitePlan:
        for s in self.sites:
            if s.name == name:
                return s
        raise PlanError(f"no site {name!r} in the plan (sites: {', '.join(self.names)})")

    def with_site(self, name: str, **changes: Any) -> RunPlan:
        """The plan with one site's entry changed (a speed factor, a bandwidth, a name ...)."""
        self.site(name)
        sites = tuple(dataclasses.replace(s, **changes) if s.name == name else s for s in self.sites)
        return dataclasses.replace(self, sites=sites)

    def replace(self, **changes: Any) -> RunPlan:
        return dataclasses.replace(self, **changes)

    # ------------------------------------------------------------ JSON

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_dict(cls, d: dict) -> RunPlan:
        if not isinstance(d, dict):
            raise PlanError(f"a run plan is a JSON object, got {type(d).__name__}")
        if d.get("version") != PLAN_VERSION:
            raise PlanError(f"field version: this wantrain reads run plans of version {PLAN_VERSION}, "
                            f"got {d.get('version')!r}")
        _known(d, cls, "")
        sites = d.get("sites")
        if not isinstance(sites, (list, tuple)) or not sites:
            raise PlanError("field sites: a list of at least one site")
        parsed = []
        for i, s in enumerate(sites):
            if not isinstance(s, dict):
                raise PlanError(f"field sites[{i}]: an object, got {type(s).__name__}")
            _known(s, SitePlan, f"sites[{i}].")
            outages = tuple(Outage(**_fields(o, Outage, f"sites[{i}].outages")) for o in s.get("outages", ()))
            kw = {**s, "outages": outages, "resets": tuple(s.get("resets", ())),
                  "exec_prefix": tuple(s.get("exec_prefix", ()))}
            try:
                parsed.append(SitePlan(**kw))
            except TypeError as e:
                raise PlanError(f"field sites[{i}]: {e}") from None
        try:
            return cls(**{**d, "sites": tuple(parsed)})
        except TypeError as e:
            raise PlanError(str(e)) from None

    @classmethod
    def from_json(cls, text: str) -> RunPlan:
        try:
            return cls.from_dict(json.loads(text))
        except json.JSONDecodeError as e:
            raise PlanError(f"not JSON: {e}") from None

    def write(self, path: str | Path) -> Path:
        """Write atomically: a reader never sees half a plan."""
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(self.to_json() + "\n")
        tmp.replace(path)
        return path

    @classmethod
    def read(cls, path: str | Path) -> RunPlan:
        try:
            return cls.from_json(Path(path).read_text())
        except PlanError as e:
            raise PlanError(f"{path}: {e}") from None


def _known(d: dict, cls: type, prefix: str) -> None:
    names = {f.name for f in dataclasses.fields(cls)}
    for k in d:
        if k not in names:
            raise PlanError(f"field {prefix}{k} is unknown (known: {', '.join(sorted(names))})")


def _fields(d: Any, cls: type, where: str) -> dict:
    if not isinstance(d, dict):
        raise PlanError(f"field {where}: entries are objects")
    _known(d, cls, where + ".")
    return d


# ------------------------------------------------------------ the link emulator's files

def outage_command(site: str, seconds: float) -> str:
    """A line of the link emulator's command file: take `site`'s link down now for `seconds`."""
    return json.dumps({"site": site, "outage_s": seconds}) + "\n"


def move_command(ps_region: str) -> str:
    """A line of the link emulator's command file: the PS now runs in `ps_region`; every link takes
    that region's RTT from now on."""
    return json.dumps({"ps_region": ps_region}) + "\n"


class JsonlTail:
    """Each `read()` returns the JSON objects of the lines completed since the last read (a last
    line still being written waits for its newline); a line that is not a JSON object counts in
    `malformed` and is skipped. A file that shrank was replaced: it is read from the start."""

    def __init__(self, path: str | Path | None) -> None:
        self.path = Path(path) if path else None
        self.malformed = 0
        self._offset = 0
        self._lock = threading.Lock()

    def skip(self) -> None:
        """Read only what is appended from now on."""
        with self._lock:
            self._offset = self.path.stat().st_size if self.path is not None and self.path.exists() else 0

    def read(self) -> list[dict]:
        if self.path is None:
            return []
        with self._lock:
            try:
                with self.path.open("rb") as f:
                    if f.seek(0, 2) < self._offset:
                        self._offset = 0
                    f.seek(self._offset)
                    chunk = f.read()
            except FileNotFoundError:
                return []
            end = chunk.rfind(b"\n") + 1
            self._offset += end
            out = []
            for line in chunk[:end].splitlines():
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except ValueError:
                    row = None
                if isinstance(row, dict):
                    out.append(row)
                else:
                    self.malformed += 1
            return out
