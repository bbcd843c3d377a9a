"""The round controller (`train.controller`): each site's compute budget for the next round, from
what its link cost it in the last ones. Sans-IO: the server feeds it what it measured and asks it
before each round; every decision comes with its inputs and reason, for the telemetry.

Under time-budgeted rounds (`train.round_budget_s`) a "fixed" controller gives every site the same
budget, so a site with a long or narrow link delivers last and the others wait for it, idle.
"adaptive" gives every site the time the others would wait anyway: with `comm_s` a site's part of
a round that is not computing (its delta's arrival after the round's start, less its compute:
time in flight, the update's download and apply, encoding, the upload), the round is planned to
take `budget + max(comm_s)`, and each site computes for what its own link leaves of that,
`budget + max(comm_s) - comm_s`, so that every delta arrives at about the same time. No site gets
less than the configured budget (the slowest link's site gets exactly it), nor more than
`MAX_EXTRA` times it. A site measured in none of the last rounds gets the configured budget.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass

__all__ = ["Decision", "BudgetController", "MAX_EXTRA", "WINDOW"]

MAX_EXTRA = 2.0        # a site's budget is at most this many times the configured one
WINDOW = 3             # rounds of a site's measurements its comm_s is the median of


@dataclass(frozen=True)
class Decision:
    site: str
    budget_s: float        # the compute budget its RoundStart carries
    comm_s: float | None   # what its link costs a round (median of the last WINDOW), None if unmeasured
    reason: str


class BudgetController:
    """Per-site compute budgets; "fixed" gives every site `budget_s`."""

    def __init__(self, budget_s: float, adaptive: bool) -> None:
        self.budget_s, self.adaptive = budget_s, adaptive
        self.comm: dict[str, deque[float]] = {}

    def observe(self, site: str, arrived_s: float, compute_s: float) -> None:
        """A site's delta of the current round arrived `arrived_s` after the round's start, after
        `compute_s` of computing."""
        self.comm.setdefault(site, deque(maxlen=WINDOW)).append(max(0.0, arrived_s - compute_s))

    def comm_s(self, site: str) -> float | None:
        seen = self.comm.get(site)
        return statistics.median(seen) if seen else None

    def plan(self, sites: set[str]) -> dict[str, Decision]:
        """Each site's budget for the next round, and why."""
        b = self.budget_s
        comm = {s: self.comm_s(s) for s in sorted(sites)}
        if not self.adaptive or not b:
            return {s: Decision(s, b, c, "fixed: every site the configured budget") for s, c in comm.items()}
        known = [c for c in comm.values() if c is not None]
        if not known:
            return {s: Decision(s, b, None, "no link measured yet: the configured budget") for s in comm}
        worst = max(known)
        out = {}
        for s, c in comm.items():
            if c is None:
                out[s] = Decision(s, b, None, "its link not measured yet: the configured budget")
                continue
            budget = min(b + (worst - c), MAX_EXTRA * b)     # (worst - c first: exactly b for the costliest)
            why = (f"its link costs {c:.2f} s a round, the costliest {worst:.2f} s: computing "
                   f"{budget - b:.2f} s more delivers with it" if budget > b else
                   f"the costliest link ({c:.2f} s a round): the configured budget")
            out[s] = Decision(s, budget, c, why)
        return out
