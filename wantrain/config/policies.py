"""The run's policies as typed values: each names a choice of the run config and carries the
behaviour it selects, so that the PS and the sites ask the value (`policy.applies_late`) instead
of comparing its string in every module that acts on it. The config parses each string once
(config/__init__.py); these are `str` enums, so they read and write as their strings in JSON."""

from __future__ import annotations

import enum

__all__ = ["Policy", "LatePolicy", "ScheduleMode", "BudgetMode", "Importance", "Trust", "NormAction",
           "Aggregation", "CheckMode"]


class Policy(str, enum.Enum):
    """A config value out of a fixed set of strings."""

    def __str__(self) -> str:       # "zero-outside", not "LatePolicy.ZERO_OUTSIDE", in messages and logs
        return self.value

    @classmethod
    def values(cls) -> tuple[str, ...]:
        return tuple(m.value for m in cls)


class LatePolicy(Policy):
    """What becomes of a delta that misses its round (docs/protocol.md 3; bench/late_policy.py).

    DROP          the round's mean is over the deltas that came; the site carries the late one in its
                  error feedback (its mass counts twice: in the others' mean, and itself)
    STALE         that mean; the late delta counts in a later round's mean, discounted
    RESCALE       that mean stands in for it; the late delta is never applied nor carried
    ZERO_OUTSIDE  zeros stand in for it, and it is applied when it comes, at the next commit,
                  outside the outer momentum (one never sent goes into the site's next delta)
    ZERO_CARRY    zeros stand in for it; never applied, the site carries it into its next delta
    """

    DROP = "drop"
    STALE = "stale"
    RESCALE = "rescale"
    ZERO_OUTSIDE = "zero-outside"
    ZERO_CARRY = "zero-carry"

    @property
    def zero_substitute(self) -> bool:
        """Does a missing delta, or chunk, count as zeros in its round's mean (not the others' mean)?"""
        return self in (LatePolicy.ZERO_OUTSIDE, LatePolicy.ZERO_CARRY)

    @property
    def substitute(self) -> str:
        """What stands in for what is missing, as commit records and round_end events name it."""
        return "zero" if self.zero_substitute else "peer"

    @property
    def allows_partial(self) -> bool:
        """May a delta count in part? Only where something stands in for its missing chunks: under
        DROP and STALE a late delta counts whole or not at all."""
        return self in (LatePolicy.RESCALE, LatePolicy.ZERO_OUTSIDE, LatePolicy.ZERO_CARRY)

    @property
    def applies_late(self) -> bool:
        """May the PS still apply a delta after its round closed? (Then a site sends it late.)"""
        return self in (LatePolicy.STALE, LatePolicy.ZERO_OUTSIDE)

    @property
    def outside_momentum(self) -> bool:
        """Is a late delta applied at its share of its own round, outside the outer momentum (not in
        a later round's mean)?"""
        return self is LatePolicy.ZERO_OUTSIDE

    @property
    def discounts_late(self) -> bool:
        """Does a late delta count in a later round's mean, its weight discounted per round late?"""
        return self is LatePolicy.STALE

    @property
    def carries_unapplied(self) -> bool:
        """Does a site put a delta the PS never applied into its next one? Not under RESCALE, where
        the others' mean stood in for it: carrying it too would count its mass twice."""
        return self is not LatePolicy.RESCALE

    def unapplied_fate(self) -> str:
        """What happens to a delta the PS never applied, in words for logs."""
        return ("the mean over the deltas that came stood in for it" if not self.carries_unapplied
                else "the site carries it into its next delta")


class ScheduleMode(Policy):
    """When a site computes (site/schedule.py). SYNC: it waits for the round's update before it
    trains again. OVERLAP: it trains the next round ahead while its delta goes up and the update
    comes down, then moves those steps onto the new global model."""

    SYNC = "sync"
    OVERLAP = "overlap"

    @property
    def trains_ahead(self) -> bool:
        return self is ScheduleMode.OVERLAP


class BudgetMode(Policy):
    """Each site's compute budget under time-budgeted rounds (ps/controller.py). FIXED: the same for
    every site. ADAPTIVE: the time its link leaves it before the costliest link's site delivers."""

    FIXED = "fixed"
    ADAPTIVE = "adaptive"

    @property
    def adapts(self) -> bool:
        return self is BudgetMode.ADAPTIVE


class Importance(Policy):
    """What a chunk's importance in its manifest weighs (transport/manifest.py). ENERGY: its role's
    weight times its energy after quantization. SIZE: its share of the delta's elements, blind to
    what it holds (an ablation)."""

    ENERGY = "energy"
    SIZE = "size"


class Trust(Policy):
    """UNTRUSTED: each round's deltas are judged against each other (screening.py). TRUSTED: only
    the absolute bounds."""

    UNTRUSTED = "untrusted"
    TRUSTED = "trusted"


class NormAction(Policy):
    """What becomes of a delta whose norm is out of line with the others': rejected, or clipped
    (when it is only too large)."""

    REJECT = "reject"
    CLIP = "clip"


class Aggregation(Policy):
    """How a round's deltas are averaged (outer/aggregate.py): the token-weighted mean, or a coordinate-
    wise trimmed mean."""

    MEAN = "mean"
    TRIMMED_MEAN = "trimmed_mean"


class CheckMode(Policy):
    """When the PS checks a commit on held-out data (checking.py): AUTO, runs of fewer than three
    sites (where deltas cannot be judged against each other); LOSS, every run; OFF, never."""

    AUTO = "auto"
    LOSS = "loss"
    OFF = "off"

    def checks(self, num_sites: int) -> bool:
        return self is CheckMode.LOSS or (self is CheckMode.AUTO and num_sites < 3)
