"""Round timing at the parameter server: deadlines derived from recent rounds, late deltas.

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

from .config import TrainConfig

__all__ = ["RoundClock", "MAX_STALENESS", "stale_weight"]

MAX_STALENESS = 2          # a late delta older than this many rounds is dropped even under "stale"


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
