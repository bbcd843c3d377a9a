"""Telemetry: one JSONL event log per run, a recorder that writes it, a reader that reads it.

Every event is one JSON object on one line of runs/<run-id>/events.jsonl with the common
fields `v` (schema version), `seq` (0, 1, 2, ...), `kind`, `t` (Unix time) and `elapsed_s`
(seconds since the run started), plus the fields of its kind. The kinds and their fields are
listed once, in docs/protocol.md (section 10: Watch streams these events to observers);
tests/test_telemetry_schema.py checks that every kind is there and that what is emitted and
what is read are documented fields.

The PS records its own events (`emit`) and, since schema 2, the events of the run that happen
elsewhere (`record_reported`): the link emulator's samples and events and faults injected on
purpose arrive over the Report RPC, so the run has one log and one stream. A log of another schema
version is refused with the version it has (version 1 logs are no longer read).
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import MissingTelemetryError, TelemetryError

__all__ = ["SCHEMA_VERSION", "Recorder", "read_events", "rows", "EVENT_KINDS", "PS_KINDS", "LINK_KINDS",
           "REPORTED_KINDS", "round_windows", "utilization", "on_wire"]

SCHEMA_VERSION = 2
PS_KINDS = ("run_start", "join", "leave", "round_start", "site_round", "round_end", "hash_check", "link_rtt",
            "checkpoint", "restart", "error", "run_end",
            # rounds that do not wait forever, and faults
            "deadline", "late_delta", "quarantine", "check", "alert", "stall", "downloads_frozen", "ready",
            "download", "catchup", "lane", "update_split", "controller", "shed")
# What the link emulator logs (testbed/links.py), and faults injected on purpose (Run): reported to the PS;
# and a sharded PS's other shards' events, each wrapped as a `shard` event, reported to shard 0.
LINK_KINDS = ("links_start", "link", "outage_start", "outage_end", "spike", "reset", "command_error", "ps_moved")
REPORTED_KINDS = (*LINK_KINDS, "fault", "shard", "clear_site")
EVENT_KINDS = (*PS_KINDS, *REPORTED_KINDS)
# A reported event keeps the time it says it happened if that lies between this much before the
# run started (a link emulator starts first) and this much after now (clocks differ); otherwise it
# is recorded at its arrival, the time it claimed kept as `claimed_t`: a reporter cannot place
# events where the run's charts and figures would take them as real.
REPORTED_TIME_SLACK_S = 600.0


def _clean(v: Any) -> Any:
    """JSON has no NaN: non-finite floats become null."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    return v


class Recorder:
    """Appends events to a JSONL file and keeps them in memory for live watchers (thread-safe)."""

    def __init__(self, path: str | Path | None, start_time: float | None = None) -> None:
        self.path = Path(path) if path else None
        self.start = start_time if start_time is not None else time.time()
        self.events: list[str] = []
        self._lock = threading.Lock()
        self._listeners: list[Callable[[], None]] = []
        self._file = None
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if self.path.exists():  # a restarted PS continues the same log, and the same clock
                self._drop_torn_line()
                self.events = [ln for ln in self.path.read_text().splitlines() if ln.strip()]
                if self.events and start_time is None:
                    first = json.loads(self.events[0])
                    self.start = first["t"] - first["elapsed_s"]
            self._file = open(self.path, "a", buffering=1)

    def _drop_torn_line(self) -> None:
        """A PS killed mid-write leaves its last event half written: cut it off, so that what this
        process appends starts on a line of its own (the half event was never recorded)."""
        assert self.path is not None
        with open(self.path, "rb+") as f:
            data = f.read()
            if data and not data.endswith(b"\n"):
                f.truncate(data.rfind(b"\n") + 1)

    def emit(self, kind: str, **fields: Any) -> dict[str, Any]:
        """Record one of the PS's own events, now."""
        if kind not in PS_KINDS:
            raise TelemetryError(f"unknown telemetry event kind {kind!r}")
        return self._append(kind, time.time(), fields)

    def record_reported(self, event: dict[str, Any]) -> int:
        """Record an event that happened outside the PS (a REPORTED_KINDS kind, already checked by
        the caller), at the time it says it happened if that is plausible (REPORTED_TIME_SLACK_S);
        returns its sequence number."""
        fields = {k: v for k, v in event.items() if k not in ("v", "seq", "kind", "t", "elapsed_s", "claimed_t")}
        t, now = event.get("t"), time.time()
        if isinstance(t, (int, float)) and math.isfinite(t):
            if self.start - REPORTED_TIME_SLACK_S <= t <= now + REPORTED_TIME_SLACK_S / 10:
                return self._append(event["kind"], float(t), {**fields, "source": "reported"})["seq"]
            fields["claimed_t"] = float(t)
        return self._append(event["kind"], now, {**fields, "source": "reported"})["seq"]

    def _append(self, kind: str, t: float, fields: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            event = {"v": SCHEMA_VERSION, "seq": len(self.events), "kind": kind, "t": t,
                     "elapsed_s": t - self.start, **_clean(fields)}
            line = json.dumps(event, separators=(",", ":"))
            self.events.append(line)
            if self._file:
                self._file.write(line + "\n")
            listeners = list(self._listeners)
        for notify in listeners:
            notify()
        return event

    def rows(self, kind: str) -> list[dict[str, Any]]:
        """The events of one kind recorded so far (this process's and, after a restart, the log's)."""
        with self._lock:
            lines = list(self.events)
        return [e for e in map(json.loads, lines) if e["kind"] == kind]

    def since(self, seq: int) -> list[str]:
        with self._lock:
            return self.events[seq:]

    def subscribe(self, notify: Callable[[], None]) -> Callable[[], None]:
        """Call `notify()` after every new event; returns the function that unsubscribes."""
        with self._lock:
            self._listeners.append(notify)

        def unsubscribe() -> None:
            with self._lock:
                if notify in self._listeners:
                    self._listeners.remove(notify)
        return unsubscribe

    def close(self) -> None:
        if self._file:
            self._file.close()
            self._file = None


def read_events(path: str | Path) -> list[dict[str, Any]]:
    """All events of a run: `path` is the events.jsonl file or the run folder holding it."""
    p = Path(path)
    if p.is_dir():
        p = p / "events.jsonl"
    if not p.is_file():
        raise MissingTelemetryError(f"no telemetry at {p}")
    out = []
    for n, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            ev = json.loads(line)
        except json.JSONDecodeError as e:
            raise TelemetryError(f"{p}:{n}: not a JSON event ({e})") from None
        if ev.get("v") != SCHEMA_VERSION:
            raise TelemetryError(f"{p}:{n}: telemetry schema version {ev.get('v')} (this wantrain reads "
                                 f"version {SCHEMA_VERSION} only)")
        out.append(ev)
    return out


def rows(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The events of one kind, in order."""
    return [e for e in events if e["kind"] == kind]


def on_wire(e: dict[str, Any]) -> int:
    """Bytes a site_round's delta (every message of it: manifest, chunks, copies, hedges, parities,
    metrics) or a round_end's update (its chunks, per site) took on the wire: `framed_bytes`, which
    PSs before it was recorded lacked (then the encoded chunks alone, `wire_bytes`). Every headline
    figure of bytes counts this."""
    return e.get("framed_bytes") or e["wire_bytes"]


def round_windows(events: list[dict]) -> dict[int, tuple[float, float]]:
    """Each round's wall time on the run's clock, (start, end): from its round_start to the next
    round's, or to its own round_end for the last. It includes the push, the wait for the others,
    aggregation and the update (round_time.py splits it)."""
    starts = {e["round"]: e["t"] for e in rows(events, "round_start")}
    ends = {e["round"]: e["t"] for e in rows(events, "round_end")}
    return {r: (t, starts.get(r + 1, ends.get(r, t))) for r, t in starts.items()}


def utilization(events: list[dict]) -> dict[str, dict[str, float]]:
    """Per site: seconds computing, seconds of the rounds it took part in (`round_windows`), and
    their ratio. Emulated compute (speed-factor padding) counts as computing: it stands for a
    slower GPU; so do steps taken ahead under the overlap schedule."""
    windows = round_windows(events)
    out: dict[str, dict[str, float]] = {}
    for e in rows(events, "site_round"):
        r = e["round"]
        if r not in windows or e.get("late"):
            continue
        t0, t1 = windows[r]
        if t1 <= t0:
            continue
        d = out.setdefault(e["site"], {"compute_s": 0.0, "wall_s": 0.0, "rounds": 0})
        d["compute_s"] += e["compute_s"]
        d["wall_s"] += t1 - t0
        d["rounds"] += 1
    for d in out.values():
        d["utilization"] = d["compute_s"] / d["wall_s"]
    return out
