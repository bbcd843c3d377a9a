"""The flight recorder: a run's links as it measured them, written as a scenario the testbed replays.

    python -m testbed record RUN_DIR [--out DIR]

For each site: the RTTs it measured (its Ping probes, `link_rtt`) as a trace of one-way delays a
second (Trace.from_telemetry), at the bandwidth its link had (the run's plan; where the plan set
none, the fastest rate a delta of it reached the PS at), its outages as they happened
(`outage_start`, `outage_end`), in the run's own seconds from its links' start; and the run's
regions, PS region and speed factors. The scenario (`replay.toml` beside the traces) plays it at
time scale 1: `wantrain demo --scenario DIR/replay.toml` with the run's settings runs it again.
What a probe cannot see is not in it: loss, and the RTT between probes (a second's median).
"""

from __future__ import annotations

import json
from pathlib import Path

from wantrain.launch.plan import RunPlan

from .scenario import ScenarioError
from .trace import MAX_OUTAGE_S, Trace

__all__ = ["record"]


def record(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write the run's traces and replay.toml into `out` (default RUN_DIR/replay); returns the
    scenario's path."""
    run_dir = Path(run_dir)
    if not (run_dir / "plan.json").is_file():
        raise ScenarioError(f"{run_dir}: not a run through the testbed (no plan.json): no links to record")
    plan = RunPlan.from_json((run_dir / "plan.json").read_text())
    events = _events(run_dir / "events.jsonl")
    starts = _rows(events, "links_start") or _rows(events, "run_start")
    if not starts:
        raise ScenarioError(f"{run_dir}: its events.jsonl has no links_start or run_start: no run to record")
    t0 = starts[0]["t"]
    out = Path(out) if out else run_dir / "replay"
    out.mkdir(parents=True, exist_ok=True)
    lines = [f"# The links of run {run_dir.name} as it measured them (python -m testbed record).",
             f'name = "replay-{run_dir.name}"', f"ps_region = {json.dumps(plan.ps_region)}", "time_scale = 1.0",
             f"seed = {plan.seed}"]
    for site in plan.sites:
        bandwidth = site.bandwidth_mbps or _fastest_upload_mbps(events, site.name)
        trace = Trace.from_telemetry(events, site.name, t0=t0, **({"bandwidth_mbps": bandwidth} if bandwidth else {}))
        trace.save_csv(out / f"{site.name}.csv")
        outages = _outages(events, site.name, t0)
        lines += ["", "[[site]]", f"name = {json.dumps(site.name)}", f"region = {json.dumps(site.region)}",
                  f"speed_factor = {site.speed_factor!r}", f'trace = "{site.name}.csv"']
        if outages:
            lines.append("outages = [" + ", ".join(f"{{ start_s = {s:.2f}, duration_s = {d:.2f} }}"
                                                  for s, d in outages) + "]")
    path = out / "replay.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _events(path: Path) -> list[dict]:
    """The run's telemetry (docs/protocol.md section 10), read here: the testbed's contract with
    wantrain is its plan alone. A torn last line (a PS killed mid-write) is left out."""
    if not path.is_file():
        raise ScenarioError(f"{path} does not exist: no run to record")
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def _rows(events: list[dict], kind: str) -> list[dict]:
    return [e for e in events if e.get("kind") == kind]


def _fastest_upload_mbps(events: list[dict], site: str) -> float | None:
    rates = [8 * e["received_wire_bytes"] / e["upload_s"] / 1e6 for e in _rows(events, "site_round")
             if e["site"] == site and e.get("upload_s", 0) > 0.05]
    return max(rates) if rates else None


def _outages(events: list[dict], site: str, t0: float) -> list[tuple[float, float]]:
    """(start, duration) in seconds since `t0` of each outage the emulator logged for `site`."""
    out, began = [], None
    for e in events:
        if e.get("site") != site:
            continue
        if e["kind"] == "outage_start":
            began = e["t"]
        elif e["kind"] == "outage_end" and began is not None:
            out.append((began - t0, min(e["t"] - began, MAX_OUTAGE_S)))
            began = None
    return out
