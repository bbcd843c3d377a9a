"""Link traces: what one direction of a WAN path does over time.

A Trace is a step function sampled at increasing times (seconds from the start of the run):
one-way delay in ms, bandwidth in Mbit/s (0 means the link is down: an outage), and a packet
loss rate. Between samples the last value holds. Traces load from and save to CSV, are scaled
in time (a 200 s outage can be replayed as 2 s; the scale is kept with the trace), resampled,
and looped.

`synthetic()` builds a trace from explicit, seeded parameters: a base delay (for example half a
published inter-region RTT, see regions.py), Gaussian jitter, heavy-tailed (Pareto) delay spikes
and scheduled outages.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

__all__ = ["Trace", "LinkState", "TraceError", "synthetic", "Outage", "Spike", "MAX_OUTAGE_S"]

COLUMNS = ("t_s", "delay_ms", "bandwidth_mbps", "loss")
MAX_OUTAGE_S = 200.0     # the longest outage a trace or scenario may hold (the product promises up to 200 s)


class TraceError(ValueError):
    """A malformed trace; the message names the file, the line and the field."""


@dataclass(frozen=True)
class LinkState:
    delay_ms: float
    bandwidth_mbps: float
    loss: float

    @property
    def down(self) -> bool:
        return self.bandwidth_mbps <= 0


@dataclass(frozen=True)
class Outage:
    start_s: float
    duration_s: float


@dataclass(frozen=True)
class Spike:
    start_s: float
    duration_s: float
    extra_delay_ms: float


@dataclass(frozen=True)
class Trace:
    t_s: np.ndarray             # (n,) strictly increasing, t_s[0] == 0
    delay_ms: np.ndarray        # (n,) >= 0
    bandwidth_mbps: np.ndarray  # (n,) >= 0; 0 = outage
    loss: np.ndarray            # (n,) in [0, 1)
    loop: bool = False          # after the last sample, start over (period = duration_s)
    time_scale: float = 1.0     # 0.01: this trace replays a recorded one 100x faster
    name: str = ""
    events: tuple = field(default_factory=tuple)   # Outage / Spike it was built with (for telemetry)

    def __post_init__(self) -> None:
        n = self.t_s.size
        if n == 0:
            raise TraceError(f"trace {self.name!r} has no samples")
        for name in COLUMNS[1:]:
            if getattr(self, name).size != n:
                raise TraceError(f"trace {self.name!r}: column {name} has {getattr(self, name).size} values, t_s has {n}")
        if self.t_s[0] != 0 or np.any(np.diff(self.t_s) <= 0):
            raise TraceError(f"trace {self.name!r}: t_s must start at 0 and increase strictly")
        if np.any(self.delay_ms < 0) or np.any(self.bandwidth_mbps < 0) or np.any((self.loss < 0) | (self.loss >= 1)):
            raise TraceError(f"trace {self.name!r}: delay and bandwidth must be >= 0 and loss in [0, 1)")

    # ---------------------------------------------------------------- construction

    @classmethod
    def constant(cls, delay_ms: float = 0.0, bandwidth_mbps: float = 0.0, loss: float = 0.0, name: str = "") -> Trace:
        """One state forever. bandwidth 0 here means 'unlimited' is NOT implied: use math.inf."""
        a = lambda v: np.array([float(v)])
        return cls(a(0.0), a(delay_ms), a(bandwidth_mbps), a(loss), name=name)

    @classmethod
    def from_rows(cls, rows: list[tuple[float, float, float, float]], **kw) -> Trace:
        arr = np.array(rows, dtype=np.float64).reshape(-1, 4)
        return cls(arr[:, 0].copy(), arr[:, 1].copy(), arr[:, 2].copy(), arr[:, 3].copy(), **kw)

    @classmethod
    def load_csv(cls, path: str | Path, loop: bool = False) -> Trace:
        """CSV with the header t_s,delay_ms,bandwidth_mbps,loss (bandwidth 'inf' = unshaped)."""
        path = Path(path)
        if not path.is_file():
            raise TraceError(f"trace file {path} does not exist")
        with open(path, newline="") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if header is None or [h.strip() for h in header] != list(COLUMNS):
                raise TraceError(f"{path}:1: header must be {','.join(COLUMNS)}, got {','.join(header or [])}")
            rows: list[tuple[float, float, float, float]] = []
            for line_no, row in enumerate(reader, start=2):
                if not row or not "".join(row).strip():
                    continue
                if len(row) != len(COLUMNS):
                    raise TraceError(f"{path}:{line_no}: expected {len(COLUMNS)} fields, got {len(row)}")
                values = []
                for name, cell in zip(COLUMNS, row):
                    try:
                        v = float(cell)
                    except ValueError:
                        raise TraceError(f"{path}:{line_no}: field {name} is not a number: {cell!r}") from None
                    if math.isnan(v) or (name != "bandwidth_mbps" and math.isinf(v)):
                        raise TraceError(f"{path}:{line_no}: field {name} must be finite, got {cell!r}")
                    values.append(v)
                if rows and values[0] <= rows[-1][0]:
                    raise TraceError(f"{path}:{line_no}: field t_s must increase, {values[0]} follows {rows[-1][0]}")
                if not rows and values[0] != 0:
                    raise TraceError(f"{path}:{line_no}: field t_s of the first sample must be 0, got {values[0]}")
                for name, v, ok in (("delay_ms", values[1], values[1] >= 0), ("bandwidth_mbps", values[2], values[2] >= 0),
                                    ("loss", values[3], 0 <= values[3] < 1)):
                    if not ok:
                        raise TraceError(f"{path}:{line_no}: field {name} out of range: {v}")
                rows.append((values[0], values[1], values[2], values[3]))
        if not rows:
            raise TraceError(f"{path}: no samples")
        return cls.from_rows(rows, loop=loop, name=path.stem)

    @classmethod
    def from_rtt_samples(cls, samples: list[tuple[float, float]], bandwidth_mbps: float = math.inf,
                         step_s: float = 1.0, name: str = "recorded", t0: float | None = None) -> Trace:
        """Replay measured RTTs: (Unix time, RTT ms) pairs -> one-way delay RTT / 2 per step_s
        bin (median of the bin; empty bins hold the previous value, the first one's until the
        first sample) from `t0` (default: the first sample's time)."""
        if not samples:
            raise TraceError("no RTT samples to build a trace from")
        samples = sorted(s for s in samples if t0 is None or s[0] >= t0)
        if not samples:
            raise TraceError("no RTT samples after the trace's start")
        t0 = samples[0][0] if t0 is None else t0
        nbins = int((samples[-1][0] - t0) // step_s) + 1
        bins: list[list[float]] = [[] for _ in range(nbins)]
        for t, rtt in samples:
            bins[int((t - t0) // step_s)].append(rtt)
        delay, last = [], float(np.median(next(b for b in bins if b))) / 2
        for b in bins:
            last = float(np.median(b)) / 2 if b else last
            delay.append(last)
        n = len(delay)
        return cls(np.arange(n) * step_s, np.array(delay), np.full(n, float(bandwidth_mbps)), np.zeros(n), name=name)

    @classmethod
    def from_telemetry(cls, events: list[dict], site: str, **kw) -> Trace:
        """The RTTs a site measured in a run (its `link_rtt` telemetry events: `times`, `rtt_ms`), as a
        trace."""
        samples = [(t, r) for e in events if e.get("kind") == "link_rtt" and e.get("site") == site
                   for t, r in zip(e["times"], e["rtt_ms"])]
        if not samples:
            raise TraceError(f"the run has no RTT probes from site {site!r}")
        return cls.from_rtt_samples(samples, name=f"recorded-{site}", **kw)

    def save_csv(self, path: str | Path) -> None:
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(COLUMNS)
            for row in zip(self.t_s, self.delay_ms, self.bandwidth_mbps, self.loss):
                w.writerow([repr(float(v)) for v in row])

    # ---------------------------------------------------------------- queries

    @property
    def duration_s(self) -> float:
        """Length of one pass: the last sample time plus the last interval (or 1 s for one sample)."""
        if self.t_s.size == 1:
            return 1.0
        return float(self.t_s[-1] + (self.t_s[-1] - self.t_s[-2]))

    def at(self, t: float) -> LinkState:
        """The state in force at time t (seconds since the link started)."""
        if self.loop and t >= self.duration_s:
            t = t % self.duration_s
        i = max(0, int(np.searchsorted(self.t_s, t, side="right")) - 1)
        return LinkState(float(self.delay_ms[i]), float(self.bandwidth_mbps[i]), float(self.loss[i]))

    # ---------------------------------------------------------------- transforms

    def scaled(self, factor: float) -> Trace:
        """Time stretched by `factor` (0.01 plays 100x faster); values unchanged."""
        if not factor > 0:
            raise TraceError(f"time scale must be positive, got {factor}")
        events = tuple(_scale_event(e, factor) for e in self.events)
        return Trace(self.t_s * factor, self.delay_ms, self.bandwidth_mbps, self.loss, self.loop,
                     self.time_scale * factor, self.name, events)

    def resampled(self, step_s: float) -> Trace:
        """Sampled every step_s seconds over one pass (values held, as `at` sees them)."""
        t = np.arange(0.0, self.duration_s, step_s)
        states = [self.at(x) for x in t]
        return Trace(t, np.array([s.delay_ms for s in states]), np.array([s.bandwidth_mbps for s in states]),
                     np.array([s.loss for s in states]), self.loop, self.time_scale, self.name, self.events)

    def with_outages(self, outages: tuple[Outage, ...]) -> Trace:
        """This trace with the bandwidth at 0 during each outage (trace seconds). A looped trace is first
        repeated until one pass covers every outage; the result loops over that longer pass."""
        if not outages:
            return self
        for o in outages:
            if not 0 < o.duration_s <= MAX_OUTAGE_S or o.start_s < 0:
                raise TraceError(f"outage duration must be in (0, {MAX_OUTAGE_S:g}] s and its start >= 0, got {o}")
        period = self.duration_s
        end = max(o.start_s + o.duration_s for o in outages)
        reps = max(1, math.ceil(end / period)) if self.loop else 1
        if reps * self.t_s.size > 1_000_000:
            raise TraceError(f"trace {self.name!r} would need {reps} passes to reach an outage at {end:g} s")
        t = np.concatenate([self.t_s + k * period for k in range(reps)])
        cuts = np.array(sorted({x for o in outages for x in (o.start_s, o.start_s + o.duration_s)}))
        t = np.union1d(t, cuts[cuts < reps * period] if self.loop else cuts)
        base = Trace(self.t_s, self.delay_ms, self.bandwidth_mbps, self.loss, self.loop, 1.0, self.name)
        states = [base.at(x) for x in t]
        bw = np.array([st.bandwidth_mbps for st in states])
        for o in outages:
            bw[(t >= o.start_s) & (t < o.start_s + o.duration_s)] = 0.0
        return Trace(t, np.array([st.delay_ms for st in states]), bw, np.array([st.loss for st in states]), self.loop,
                     self.time_scale, self.name, self.events + tuple(outages))

    def looped(self, loop: bool = True) -> Trace:
        return Trace(self.t_s, self.delay_ms, self.bandwidth_mbps, self.loss, loop, self.time_scale, self.name,
                     self.events)


def _scale_event(e, f: float):
    if isinstance(e, Outage):
        return Outage(e.start_s * f, e.duration_s * f)
    return Spike(e.start_s * f, e.duration_s * f, e.extra_delay_ms)


def synthetic(base_delay_ms: float, bandwidth_mbps: float, duration_s: float, *, step_s: float = 0.5,
              jitter_ms: float = 0.0, loss: float = 0.0, spikes_per_min: float = 0.0, spike_alpha: float = 1.5,
              spike_min_ms: float = 50.0, spike_duration_s: float = 2.0, outages: tuple[Outage, ...] = (),
              extra_spikes: tuple[Spike, ...] = (), seed: int = 0, loop: bool = True, name: str = "") -> Trace:
    """A trace from explicit parameters; the same seed gives the same trace.

    Delay = base + |N(0, jitter)| + spikes; spikes arrive as a Poisson process and add a
    Pareto(alpha)-distributed extra delay of at least spike_min_ms (heavy tailed: most are
    small, a few are huge). Outages set the bandwidth to 0 for their duration (up to 200 s).
    """
    for o in outages:
        if not 0 < o.duration_s <= MAX_OUTAGE_S:
            raise TraceError(f"outage duration must be in (0, 200] s, got {o.duration_s}")
    rng = np.random.default_rng(seed)
    t = np.arange(0.0, duration_s, step_s)
    delay = base_delay_ms + np.abs(rng.normal(0.0, jitter_ms, t.size)) if jitter_ms > 0 else np.full(t.size, base_delay_ms)
    bw = np.full(t.size, float(bandwidth_mbps))
    events: list = []
    if spikes_per_min > 0:
        n = rng.poisson(spikes_per_min * duration_s / 60.0)
        for start in np.sort(rng.uniform(0, duration_s, n)):
            extra = spike_min_ms * (1 + rng.pareto(spike_alpha))
            events.append(Spike(float(start), spike_duration_s, float(extra)))
    events.extend(extra_spikes)
    for s in events:
        if isinstance(s, Spike):
            delay[(t >= s.start_s) & (t < s.start_s + s.duration_s)] += s.extra_delay_ms
    for o in outages:
        bw[(t >= o.start_s) & (t < o.start_s + o.duration_s)] = 0.0
        events.append(o)
    return Trace(t, delay, bw, np.full(t.size, float(loss)), loop, 1.0, name, tuple(events))
