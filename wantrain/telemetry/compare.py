"""Comparing runs by what they cost: time to a target validation loss, the bytes it took, and how
much of that time each site spent computing.

Every figure comes from a run's telemetry (the PS's clock), so runs of different schedules,
codecs and round lengths are measured alike:

    time to target   from round 0's start to the commit of the first round whose validation loss
                     is at or below the target (process start-up and the first model download are
                     the same for every arm, and left out); with `cadence_s`, to the first tick of
                     a wall-clock grid (every cadence_s from round 0's start) at which the global
                     model is one at or below it. Read at commits, an arm of many short rounds is
                     looked at more often, and one of few long rounds found late; on a common grid
                     every arm is looked at the same moments. The global model changes only at
                     commits, so its loss at a tick is exactly its last commit's: the grid needs no
                     extra evaluation.
    bytes            delta bytes the sites sent and update bytes the PS sent each site, up to and
                     including that round
    work             inner steps, tokens and seconds of compute every site spent up to that round
                     (deltas that came too late to count included: they were computed all the same)
    utilization      per site, over the rounds up to that one: seconds of inner steps (emulated
                     slowness included) over the rounds' wall time (telemetry.utilization); the
                     rest is waiting for the network, the PS or slower sites. Steps a site takes
                     ahead (overlap schedule) count in the round they belong to.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from . import on_wire, rows, utilization

__all__ = ["Outcome", "time_to_target", "on_grid", "counted_tokens", "Spread", "against", "faster", "read_published",
           "loss_recovery_verdict", "time_to_target_verdict", "peers_verdict"]


@dataclass(frozen=True)
class Outcome:
    """One run measured against a target validation loss."""

    target: float
    reached: bool
    round: int                     # the first round at or below the target (the last round if none)
    time_s: float                  # round 0's start -> that round's commit (or the grid's next tick)
    val_loss: float                # the validation loss after that round
    uplink_mb: float
    downlink_mb: float             # to every site together
    utilization: dict[str, float] = field(default_factory=dict)
    steps: int = 0                 # inner steps of every site, up to that round
    tokens: int = 0
    compute_s: float = 0.0         # seconds of compute of every site (emulated slowness included)
    curve: list[tuple[float, float]] = field(default_factory=list)   # (seconds, validation loss) per round
    commit_s: float = 0.0          # round 0's start -> that round's commit, on or off a grid

    @property
    def mb(self) -> float:
        return self.uplink_mb + self.downlink_mb


def on_grid(t: float, cadence_s: float) -> float:
    """The first tick of a grid every `cadence_s` seconds (from 0) at or after `t`."""
    return math.ceil(t / cadence_s - 1e-9) * cadence_s


def time_to_target(events: list[dict], target: float, cadence_s: float = 0.0) -> Outcome | None:
    """The run's outcome against `target`, read at its commits or (cadence_s > 0) on a wall-clock
    grid; None when no round committed."""
    ends = rows(events, "round_end")
    starts = {e["round"]: e for e in rows(events, "round_start")}
    if not ends or 0 not in starts:
        return None
    hit = next((e for e in ends if math.isfinite(e["val_loss"]) and e["val_loss"] <= target), None)
    last = hit or ends[-1]
    t0, upto = starts[0]["t"], last["round"]
    pushes = [e for e in rows(events, "site_round") if e["round"] <= upto]
    receivers = len({e["site"] for e in pushes})
    upto_events = [e for e in events if e.get("round", 0) <= upto]
    commit_s = last["t"] - t0
    return Outcome(
        target=target, reached=hit is not None, round=upto, val_loss=last["val_loss"], commit_s=commit_s,
        time_s=on_grid(commit_s, cadence_s) if cadence_s > 0 else commit_s,
        uplink_mb=sum(on_wire(e) for e in pushes) / 1e6,
        downlink_mb=receivers * sum(on_wire(e) for e in ends if e["round"] <= upto) / 1e6,
        utilization={s: u["utilization"] for s, u in sorted(utilization(upto_events).items())},
        steps=sum(e["steps"] for e in pushes), tokens=sum(e["tokens"] for e in pushes),
        compute_s=sum(e["compute_s"] for e in pushes),
        curve=[(round(e["t"] - t0, 3), e["val_loss"]) for e in ends])


def counted_tokens(events: list[dict], until_s: float) -> dict[str, int]:
    """Per site, the tokens of its deltas that reached the global model within `until_s` of round
    0's start: counted in their round's commit (whole or in part), or deferred to a later one (a
    late delta the late policy applies) and that commit made in time. Goodput's numerator: work
    computed but never applied (dropped, kept by a dark site, never sent) is left out."""
    starts = rows(events, "round_start")
    if not starts:
        return {}
    t0 = min(e["t"] for e in starts)
    commits = sorted((e["t"] - t0, e["round"]) for e in rows(events, "round_end"))
    counted: dict[tuple[str, int], float] = {}           # (site, round) -> when its delta reached the model
    for e in rows(events, "round_end"):
        for site in e["sites"]:
            counted[site, e["round"]] = e["t"] - t0
    for e in rows(events, "late_delta"):
        if e["action"] == "deferred":                     # applied by the first commit after it arrived
            at = next((t for t, _ in commits if t >= e["t"] - t0), None)
            if at is not None:
                counted.setdefault((e["site"], e["round"]), at)
    out: dict[str, int] = {}
    for e in rows(events, "site_round"):
        at = counted.pop((e["site"], e["round"]), None)     # (popped: one delta, one count)
        if at is not None and at <= until_s:
            out[e["site"]] = out.get(e["site"], 0) + e["tokens"]
    return out


# ------------------------------------------------------------------ published figures

@dataclass(frozen=True)
class Spread:
    """A figure measured over several seeds: its centre (a median or a mean) and the interval the
    seeds cover (their range, or the mean ± one standard deviation)."""

    centre: float
    low: float
    high: float

    @classmethod
    def of(cls, figure: float | list) -> Spread:
        """From a stored figure: a number (one run), [mean, sd] or [median, low, high]."""
        if isinstance(figure, (int, float)):
            return cls(figure, figure, figure)
        if len(figure) == 2:
            return cls(figure[0], figure[0] - figure[1], figure[0] + figure[1])
        return cls(*figure)

    def __str__(self) -> str:
        return f"{self.centre:g} ({self.low:g}-{self.high:g})" if self.low != self.high else f"{self.centre:g}"


def against(x: Spread, at_least: float | None = None, at_most: float | None = None) -> str:
    """Whether `x` meets a goal: "met" where the whole spread does, "not met" where none of it
    does, else "cannot tell: the spread covers the goal"."""
    lo, hi = (x.low, x.high) if at_least is not None else (-x.high, -x.low)
    goal = at_least if at_least is not None else -at_most      # type: ignore[operator]
    if lo >= goal:
        return "met"
    if hi < goal:
        return "not met"
    return "cannot tell: the spread covers the goal"


def faster(a: str, a_s: Spread, b: str, b_s: Spread) -> str:
    """Which of two arms reaches the target sooner (seconds), or "cannot tell apart" where their
    spreads overlap."""
    if a_s.high < b_s.low:
        return f"{a} is faster ({a_s.centre:g} s against {b_s.centre:g} s)"
    if b_s.high < a_s.low:
        return f"{b} is faster ({b_s.centre:g} s against {a_s.centre:g} s)"
    return f"cannot tell {a} and {b} apart: {a_s} s against {b_s} s, their ranges overlap"


def read_published(path) -> dict:
    """A benchmark's stored multi-seed figures (bench/published/*.json)."""
    import json
    from pathlib import Path

    return json.loads(Path(path).read_text())


def loss_recovery_verdict(published: dict) -> list[str]:
    """The stored loss-recovery figures as lines a tutorial prints: each goal, met or not."""
    rows = {r["condition"]: r for r in published["rows"]}
    lines = [f"stored: {published['command']}; {published['seeds']} seeds ({published['spread']}); "
             f"measured {published['measured']}"]
    for g in published["goals"]:
        bound = f">= {g['at_least']:g}" if "at_least" in g else f"<= {g['at_most']:g}"
        if g["condition"] == "*":        # every condition: judged at the worst
            figures = {c: Spread.of(r[g["metric"]]) for c, r in rows.items()}
            worst = (max if "at_most" in g else min)(figures, key=lambda c: figures[c].centre)
            x, where = figures[worst], f"{min(f.centre for f in figures.values()):g}-" \
                                       f"{max(f.centre for f in figures.values()):g}, the worst at {worst}"
        else:
            x, where = Spread.of(rows[g["condition"]][g["metric"]]), g["condition"]
            where = f"{x} at {where}"
        lines.append(f"{g['what']}: goal {g['metric']} {bound}, measured {where}: "
                     f"{against(x, g.get('at_least'), g.get('at_most'))}")
    return lines


def time_to_target_verdict(published: dict, scenario: str) -> list[str]:
    """The stored time-to-target figures of `scenario` as lines a tutorial prints: every arm, the
    controller against the best other (or "cannot tell apart"), and each goal, met or not."""
    arms = {a: Spread.of(v) for a, v in published["scenarios"][scenario].items()}
    lines = [f"stored: {published['command']}; {published['seeds']} seeds ({published['spread']}); "
             f"measured {published['measured']}",
             f"{scenario}, seconds to the target: " + ", ".join(f"{a} {s}" for a, s in arms.items())]
    best = min((a for a in arms if a != "controller"), key=lambda a: arms[a].centre)
    lines.append(faster("controller", arms["controller"], best, arms[best]))
    for g in published["goals"]:
        if g["metric"] == "controller_speedup":
            ratios = []
            for table in published["scenarios"].values():
                t = {a: Spread.of(v) for a, v in table.items()}
                other = min((a for a in t if a != "controller"), key=lambda a: t[a].centre)
                ratios.append(t[other].centre / t["controller"].centre)
            x = Spread(sorted(ratios)[len(ratios) // 2], min(ratios), max(ratios))
            lines.append(f"{g['what']}: goal >= {g['at_least']:g}x, measured {min(ratios):.2f}x-{max(ratios):.2f}x "
                         f"over {len(ratios)} scenarios (medians): {against(x, at_least=g['at_least'])}")
        else:
            x = Spread.of(g["value"])
            lines.append(f"{g['what']}: goal >= {g['at_least']:g}, measured {x} ({g['source']}): "
                         f"{against(x, at_least=g['at_least'])}")
    return lines


PEERS_GOAL = 2.0         # issue 57: wantrain at least this many times faster to the target than the best peer


def peers_verdict(published: dict) -> list[str]:
    """The stored figures of bench/peers.py as lines a tutorial prints: per scenario, wantrain's best
    arm against the best peer that reached the target (the medians), and the arms that did not."""
    lines = [f"stored: {published['command']}"]
    for scenario, table in published["scenarios"].items():
        seeds = published.get("seeds_by_scenario", {}).get(scenario, published["seeds"])
        reached = {a: Spread.of(v) for a, v in table.items() if v is not None}
        ours = min((a for a in reached if a.startswith("wantrain")), key=lambda a: reached[a].centre)
        peers = [a for a in reached if not a.startswith("wantrain")]
        missed = [a for a in table if a not in reached]
        line = (f"{scenario} ({seeds} seed{'s' if seeds > 1 else ''}): seconds to the target: "
                + ", ".join(f"{a} {s}" for a, s in reached.items())
                + (f"; not reached within the cap: {', '.join(missed)}" if missed else ""))
        lines.append(line)
        if peers:
            best = min(peers, key=lambda a: reached[a].centre)
            ratio = reached[best].centre / reached[ours].centre
            lines.append(f"  {ours} against the best peer, {best}: {ratio:.2f}x sooner (goal >= {PEERS_GOAL:g}x): "
                         f"{'met' if ratio >= PEERS_GOAL else 'not met'}")
        else:
            lines.append(f"  {ours}: no peer reached the target")
    return lines
