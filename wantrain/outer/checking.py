"""Checked commits: a round's update is tried on held-out data before anyone hears of it.

With fewer than three sites no rule can tell an honest delta from a hostile or broken one by
comparing them (screening.py), but the PS holds the model and data the sites never train on
(`GlobalModel.check`: windows between the validation batches, so that what it reports is not
what it selected on). `CommitCheck.run` evaluates there the round's update with every delta and,
for each delta, the update without it (leave-one-out), and commits without the deltas whose
absence makes the model better by more than the tolerance.

Leave-one-out, not each delta alone: late in training one honest site's step alone is a small
noisy one that can leave the check loss higher than the current model's (measured: +1.26 % at
round 7 of a clean two-site `tiny` run, while both deltas together lowered it), so judging
deltas alone leaves honest ones out; leaving one out measures what each delta does to the update
that is actually committed. Nor only when the update makes the model worse: a noisy or reversed
delta riding on an honest one still lets the loss fall, only less (measured at two sites: noise
at 10x the honest norm, +16 % final loss, and the update never worse than the model before it).
With two sites both ways are the same passes. The cost, n + 1 forward passes over the check
batches for n deltas, is measured in `make bench` (bench/check_cost.py); `robust.check_every`
checks one round in K where that is too much.

A round with one delta (the others late, or one site) has nothing to compare it with and is
committed as it is: judging it against the current model left honest deltas out (an honest
round's update raised the check loss by more than 2.5 % in short runs, where the outer
momentum overshoots), so only the arrival bounds hold there.

The tolerance is learned from the run's own rounds that left nothing out: twice the largest median
gain leaving a delta out showed there (an honest delta's absence helps only by the check set's
noise; the median, so that a delta kept just under the tolerance cannot raise it for the next
round), never under `robust.check_tolerance` nor over five times it. If every delta would be left out,
the one whose absence hurts most is kept. A delta left out is rejected as the screen rejects one:
its site keeps it in its error feedback, so an honest site's work is never lost by a false alarm.
A site left out in `robust.exclude_after` of its last 2x that checked rounds is excluded (its
rounds still logged, its deltas not counted) until an operator clears it (`clear`).
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from ..config import RobustConfig
from .screening import Verdict, parse_key

__all__ = ["CommitCheck", "CheckDecision", "Checkable", "LEARNED_FACTOR", "MAX_TOLERANCE_FACTOR"]

LEARNED_FACTOR = 2.0          # the tolerance: this x the largest median gain of leaving a delta out in a clean round ...
MAX_TOLERANCE_FACTOR = 5.0    # ... up to this x robust.check_tolerance ...
PROGRESS_SHARE = 0.2          # ... or this share of what the round changes the check loss by, if more
HONEST_WINDOW = 20            # clean rounds the tolerance is learned from

T = TypeVar("T")


class Checkable(Generic[T]):
    """What the check needs of a model: apply a candidate (`apply(kept)`: the round's update with
    only the deltas `kept`; returns what the commit returns), its check loss, and a saved state
    to go back to between candidates."""

    def __init__(self, apply: Callable[[frozenset[str]], T], loss: Callable[[], float],
                 save: Callable[[], dict], load: Callable[[dict], None]) -> None:
        self.apply, self.loss, self.save, self.load = apply, loss, save, load


@dataclass(frozen=True)
class CheckDecision:
    """One round's check: the losses it compared, and whom it left out."""

    round: int
    base: float                          # the current model's check loss
    candidate: float                     # with every delta counted
    tolerance: float                     # the relative gain a delta's absence must bring to leave it out
    without: dict[str, float] = field(default_factory=dict)    # each delta left out: the check loss
    left_out: tuple[str, ...] = ()
    final: float = 0.0                   # the committed model's check loss

    @property
    def fired(self) -> bool:
        return bool(self.left_out)

    def event(self) -> dict:
        """The fields of a `check` event (docs/telemetry.md)."""
        return {"round": self.round, "base": self.base, "candidate": self.candidate, "tolerance": self.tolerance,
                "without": dict(sorted(self.without.items())), "left_out": list(self.left_out), "final": self.final}


class CommitCheck:
    """The check of every commit, and each site's record of being left out. Owned by the PS's
    committer (and the in-process harness); its state goes into the PS's checkpoints."""

    def __init__(self, robust: RobustConfig, num_sites: int, sharded: bool = False) -> None:
        self.robust = robust
        self.enabled = robust.checks(num_sites) and not sharded
        self.base: float | None = None                 # the current model's check loss (None: not yet taken)
        self.gains: deque[float] = deque(maxlen=HONEST_WINDOW)   # clean rounds: the median gain of leaving one out
        self.windows: dict[str, list[tuple[int, bool]]] = {}     # site -> its last rounds: left out?
        self.alerted: set[str] = set()
        self.excluded: dict[str, int] = {}             # site -> the round it was excluded at

    def due(self, round_: int) -> bool:
        return self.enabled and round_ % self.robust.check_every == 0

    def tolerance(self) -> float:
        floor = self.robust.check_tolerance
        learned = LEARNED_FACTOR * max(self.gains, default=0.0)
        return min(max(floor, learned), MAX_TOLERANCE_FACTOR * floor)

    def exclude(self, verdicts: dict[str, Verdict]) -> dict[str, Verdict]:
        """The verdicts with every delta of an excluded site rejected (they are still logged)."""
        return {k: (Verdict("reject", v.norm, v.weight, 0.0, v.reference,
                            f"its site was excluded by the commit check at round {self.excluded[site]} "
                            f"(robust.exclude_after); an operator clears it with `wantrain clear-site`",
                            v.disagrees)
                    if (site := parse_key(k)[0]) in self.excluded and v.action != "reject" else v)
                for k, v in verdicts.items()}

    def run(self, round_: int, subjects: Iterable[str], model: Checkable[T]) -> tuple[T, CheckDecision | None]:
        """Apply the round (`subjects`: the keys of the deltas that may be left out), checked if due."""
        subjects = frozenset(subjects)
        if not self.due(round_) or not subjects:
            out = model.apply(subjects)
            self.base = None            # the model moved unchecked: take its loss afresh next time
            return out, None
        base = self.base if self.base is not None else model.loss()
        saved = model.save()
        without = {}
        if len(subjects) > 1:
            for key in sorted(subjects):
                model.apply(subjects - {key})
                without[key] = model.loss()
                model.load(saved)
        out = model.apply(subjects)        # last: when nothing is left out, this is the commit
        candidate = model.loss()
        # A round that moves the model far is far from linear: the mean of two honest deltas can then
        # do worse than one of them (measured: 2.5 % at round 0 of a clean two-site run; 1.6 % in a
        # short-round run whose loss jumped 9 % in a round, where a tenth of the change let a false
        # alarm through and its carried delta doubled the next one).
        tol = max(self.tolerance(), PROGRESS_SHARE * abs(base - candidate) / candidate if candidate > 0 else 0.0)
        left = frozenset(k for k, loss in without.items() if loss < candidate * (1 - tol))
        if left == subjects:               # keep the one whose absence hurts most
            left -= {max(without, key=lambda k: without[k])}
        final = candidate
        if left:
            model.load(saved)
            out = model.apply(subjects - left)
            final = model.loss()
        elif candidate > 0 and without:    # the median: a delta that is kept cannot raise it alone
            self.gains.append(statistics.median((candidate - loss) / candidate for loss in without.values()))
        self.base = final
        return out, CheckDecision(round_, base, candidate, tol, without, tuple(sorted(left)), final)

    @staticmethod
    def left_out_verdicts(verdicts: dict[str, Verdict], decision: CheckDecision | None) -> dict[str, Verdict]:
        """The verdicts with the deltas the check left out rejected, and why."""
        if decision is None or not decision.left_out:
            return verdicts
        out = dict(verdicts)
        for k in decision.left_out:
            v = verdicts[k]
            out[k] = Verdict("reject", v.norm, v.weight, 0.0, v.reference,
                             f"left out by the commit check: the update with it gives a check loss of "
                             f"{decision.candidate:.4f}, without it {decision.without[k]:.4f} (over "
                             f"{decision.tolerance:.2%} better; the current model's {decision.base:.4f})", v.disagrees)
        return out

    def record(self, round_: int, sites: Iterable[str], decision: CheckDecision | None) -> list[dict]:
        """After a checked commit: each site's record. Returns the alerts to raise: a site left out
        in robust.alert_after of its last 2x that checked rounds (once until a clean window), and a
        site excluded (robust.exclude_after)."""
        if decision is None:
            return []
        left = {parse_key(k)[0] for k in decision.left_out}
        n, m = self.robust.alert_after, self.robust.exclude_after
        keep = 2 * max(n, m)
        alerts = []
        for site in sorted(set(sites) | left):
            window = self.windows.setdefault(site, [])
            window.append((round_, site in left))
            del window[:-keep]
            recent = [r for r, out in window[-2 * n:] if out]
            if not recent and len(window) >= 2 * n:
                self.alerted.discard(site)
            elif len(recent) >= n and site not in self.alerted:
                self.alerted.add(site)
                alerts.append({"site": site, "sites": [site], "since": recent[0], "rounds": len(recent),
                               "action": "left-out",
                               "message": f"the commit check left out {site}'s delta in {len(recent)} of its last "
                                          f"{len(window[-2 * n:])} checked rounds since round {recent[0]}: the "
                                          f"update did better on held-out data without it"})
            bad = [r for r, out in window[-2 * m:] if out] if m else []
            if m and len(bad) >= m and site not in self.excluded:
                self.excluded[site] = round_
                alerts.append({"site": site, "sites": [site], "since": bad[0], "rounds": len(bad), "action": "excluded",
                               "message": f"{site} is excluded: the commit check left out its delta in {len(bad)} of "
                                          f"its last {len(window[-2 * m:])} checked rounds (robust.exclude_after "
                                          f"{m}); its deltas are not counted until an operator clears it "
                                          f"(`wantrain clear-site` or the panel's Clear button)"})
        return alerts

    def clear(self, site: str) -> bool:
        """An operator's word that `site` is fixed: counted again, its record forgotten. False if it was
        not excluded."""
        self.windows.pop(site, None)
        self.alerted.discard(site)
        return self.excluded.pop(site, None) is not None

    def state_dict(self) -> dict:
        return {"gains": list(self.gains), "windows": {k: [list(x) for x in w] for k, w in self.windows.items()},
                "alerted": sorted(self.alerted), "excluded": dict(self.excluded)}

    def load_state_dict(self, state) -> None:
        """A checkpoint's check state (none in those of older versions). The check loss is taken afresh."""
        state = state if isinstance(state, dict) else {}
        self.gains = deque((float(x) for x in state.get("gains", [])), maxlen=HONEST_WINDOW)
        self.windows = {k: [(int(r), bool(o)) for r, o in w] for k, w in state.get("windows", {}).items()}
        self.alerted = set(state.get("alerted", []))
        self.excluded = {k: int(v) for k, v in state.get("excluded", {}).items()}
        self.base = None
