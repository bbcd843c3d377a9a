"""Rounds at the parameter server: who is in the round, what arrived, when it closes.

`RoundState` is sans-IO: it holds the current round's members and uploads and answers
questions (may this site still join the round, whose upload is this chunk, can the round close
now and who missed it); the PS does the I/O (messages, timers, telemetry) around its answers.

A round never waits forever. Its deadline is fixed (`train.deadline_s`) or derived from how long
deltas took to arrive in recent rounds: the compute budget plus `deadline_factor` times the
median time beyond it, never less than `deadline_min_s` beyond it. At the deadline the PS
aggregates the deltas that arrived; a delta that arrives later is dropped (the site carries it
forward in its error feedback) or, with the "stale" policy, applied in a following round with
its weight discounted per round of staleness.
"""

from __future__ import annotations

import statistics
from collections import deque

from ..config import TrainConfig
from ..errors import ProtocolError
from ..messages import MAX_STALENESS
from .uploads import Upload

__all__ = ["RoundClock", "RoundState", "MAX_STALENESS", "stale_weight"]


class RoundClock:
    """Remembers when deltas arrived (seconds after their round started) and sets deadlines."""

    def __init__(self, train: TrainConfig, window: int = 8) -> None:
        self.train = train
        self.arrivals: deque[float] = deque(maxlen=window)

    def arrived(self, after_s: float) -> None:
        self.arrivals.append(max(0.0, after_s))

    def deadline_s(self) -> float:
        t = self.train
        if t.deadline_s:
            return t.deadline_s
        if not self.arrivals:
            return max(t.deadline_initial_s, t.round_budget_s + t.deadline_min_s)
        beyond = max(0.0, statistics.median(self.arrivals) - t.round_budget_s)
        return t.round_budget_s + max(t.deadline_min_s, t.deadline_factor * beyond)


def stale_weight(tokens: float, staleness: int, discount: float) -> float:
    """Aggregation weight of a delta applied `staleness` rounds after the round it was for."""
    return tokens * discount ** staleness


class RoundState:
    """The current round's members and their uploads, and late uploads of earlier rounds."""

    def __init__(self) -> None:
        self.members: set[str] = set()        # sites expected to deliver for the current round
        self.uploads: dict[str, Upload] = {}
        self.late: dict[str, Upload] = {}     # sites that missed a deadline and are still pushing
        self.stale: dict[str, Upload] = {}    # complete late deltas for the next aggregation
        self.started_at = 0.0
        self.past_deadline = False
        self.last_members: set[str] = set()   # sites the last (or current) round started with
        self.aggregating = False

    def start(self, round_: int, sites: set[str], budget_s: float, now: float) -> None:
        self.members, self.last_members = set(sites), set(sites)
        self.uploads = {name: Upload(round_, budget_s) for name in sites}
        self.started_at, self.past_deadline = now, False

    def quorum_wait(self, ready: set[str], known: set[str], num_sites: int, committed: int,
                    quorum_left_s: float) -> float | None:
        """Whether a round may start with the `ready` sites: None, yes; a number, ask again in that
        many seconds; inf, wait for more sites to be ready. At the start of a run every site is
        waited for. Later a missing site must not hold the others up: one that was in the last round
        (it may be restarting) gets `quorum_left_s` more to come back, then the round goes on without it."""
        if len(ready) >= num_sites:
            return None
        if committed == 0:
            return float("inf")
        if quorum_left_s > 0 and (known - ready) & self.last_members:
            return quorum_left_s
        return None

    def admission(self, site: str, budget_s: float, now: float) -> float | None:
        """The compute budget a site (re)joining a running round gets, or None: it waits for the next
        round (none runs, it is in this one, or too little of the budget is left to be worth it)."""
        if not self.members or self.aggregating or site in self.members:
            return None
        if not budget_s:
            return 0.0
        train_s = budget_s - (now - self.started_at)
        return train_s if train_s >= 0.1 * budget_s else None

    def admit(self, site: str, round_: int, train_s: float) -> None:
        self.members.add(site)
        self.uploads[site] = Upload(round_, train_s)

    def upload_for(self, site: str, round_: int, current: int) -> Upload:
        """The upload a delta message of `site` for `round_` belongs to; ProtocolError if none."""
        up = self.uploads.get(site)
        if up is not None and round_ == current and site in self.members and not self.aggregating:
            return up
        late = self.late.get(site)
        if late is not None and late.round == round_:
            return late
        raise ProtocolError(f"delta for round {round_} from {site!r}, which is not in that round "
                            f"(the current round is {current})")

    def missing(self) -> list[str]:
        return sorted(s for s in self.members if self.uploads[s].metrics is None)

    def close(self) -> bool:
        """Close the round if every member's delta is in, or the deadline passed and some are: the
        missing ones become late. True when it closed (the caller aggregates `uploads`)."""
        if self.aggregating or not self.members:
            return False
        arrived = {s for s in self.members if self.uploads[s].metrics is not None}
        if arrived != self.members and not (self.past_deadline and arrived):
            return False
        for s in sorted(self.members - arrived):
            self.late[s] = self.uploads.pop(s)
        self.members = arrived
        self.aggregating = True
        return True

    def drop(self, site: str) -> None:
        """The site left: what it was sending will not come."""
        self.uploads.pop(site, None)
        self.late.pop(site, None)
        self.members.discard(site)

    def take_stale(self, current: int) -> dict[str, Upload]:
        """Late deltas still young enough to apply, keyed "site@round" (a site may have a fresh one too)."""
        stale = {f"{s}@{up.round}": up for s, up in sorted(self.stale.items()) if current - up.round <= MAX_STALENESS}
        self.stale = {}
        return stale

    def finish(self) -> None:
        self.members, self.uploads, self.aggregating = set(), {}, False
