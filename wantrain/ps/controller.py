"""The round controller (`schedule.controller`): each site's compute budget for the next round, from
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

Its second lever is the codec of a site's deltas. A site whose link costs more than `LINK_BOUND`
of the budget a round is link-bound: its deltas go in `SMALL_CODEC` from then on (to the end of
the run: its link measured again in the smaller codec would look cheap and switch it back), where
the run's deltas are int8 (+ Huffman). int4 + Huffman is 2.4x fewer bits than int8 + Huffman at
no loss measured (docs/codecs.md: -0.01 % on tiny, -0.07 % on small, three seeds); sites on good
links keep the run's codec. The update, which every site applies (so one encoding for all: the
replicas stay identical), goes in SMALL_CODEC too once any site is link-bound: the link-bound
site downloads it as well (no loss measured with int4 both ways either).
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass

__all__ = ["Decision", "BudgetController", "MAX_EXTRA", "WINDOW", "LINK_BOUND", "SMALL_CODEC"]

MAX_EXTRA = 2.0        # a site's budget is at most this many times the configured one
WINDOW = 3             # rounds of a site's measurements its comm_s is the median of
LINK_BOUND = 0.5       # a link that costs more than this share of the budget a round is the round's bottleneck
SMALL_CODEC = "int4-huffman"
SHRINKS = ("int8", "int8-huffman")    # the run codecs SMALL_CODEC is a smaller stand-in for


@dataclass(frozen=True)
class Decision:
    site: str
    budget_s: float        # the compute budget its RoundStart carries
    comm_s: float | None   # what its link costs a round (median of the last WINDOW), None if unmeasured
    reason: str
    codec: str = ""        # its deltas' encoding this round ("": its own)


class BudgetController:
    """Per-site compute budgets; "fixed" gives every site `budget_s`."""

    def __init__(self, budget_s: float, adaptive: bool, codec_mode: str = "") -> None:
        """`codec_mode`: the run's delta codec (SMALL_CODEC stands in for it on a link-bound site
        only where it is one of SHRINKS)."""
        self.budget_s, self.adaptive = budget_s, adaptive
        self.comm: dict[str, deque[float]] = {}
        self.shrinks = adaptive and codec_mode in SHRINKS
        self.link_bound: set[str] = set()     # sites whose deltas go in SMALL_CODEC, to the end of the run

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
                out[s] = Decision(s, b, None, "its link not measured yet: the configured budget", self.codec_of(s))
                continue
            budget = min(b + (worst - c), MAX_EXTRA * b)     # (worst - c first: exactly b for the costliest)
            why = (f"its link costs {c:.2f} s a round, the costliest {worst:.2f} s: computing "
                   f"{budget - b:.2f} s more delivers with it" if budget > b else
                   f"the costliest link ({c:.2f} s a round): the configured budget")
            if self.shrinks and s not in self.link_bound and c > LINK_BOUND * b:
                self.link_bound.add(s)
                why += (f"; its link costs more than {LINK_BOUND:.0%} of the budget: its deltas, and every "
                        f"update, go in {SMALL_CODEC} from now on (2.4x fewer bits, no loss measured)")
            out[s] = Decision(s, budget, c, why, self.codec_of(s))
        return out

    def update_mode(self) -> str:
        """The encoding of the next update ("": the run's): SMALL_CODEC once any site is link-bound."""
        return SMALL_CODEC if self.link_bound else ""

    def codec_of(self, site: str) -> str:
        """The encoding a site's deltas go in now ("": its own)."""
        return SMALL_CODEC if site in self.link_bound else ""
