"""What a round does about the deltas, or the chunks of them, that are not in when it closes.

The round-close policy, from the run config's `train`:

    late_policy       what becomes of a delta that comes after its round closed (rounds.late_outcome):
                      the site hears it in a DeltaOutcome, the telemetry in a `late_delta` event
    partial_deltas    whether a round counts the chunks of a delta that are in without the rest
                      (under a late_policy with a substitute for the rest; not in the warm-up:
                      the first `reliable_rounds`, and every round with a step of the inner
                      learning rate's warm-up; nor on a sharded PS; nor of a site new to the
                      round, rounds.py); a warm-up round whose missing members have all sent
                      their manifests (they are sending, not dark) puts its deadline off, at
                      most twice: it tolerates no loss
    loss_budget       whether a round closes before its deadline: once every member's manifest and
                      critical chunks are in, what is missing is within the budget, and nothing has
                      come from the members still missing chunks for a grace of a tenth of the
                      deadline (what is missing is late, not in flight)
    extend_above      whether a round past the warm-up waits beyond its deadline: one deadline more
                      at most, while a critical chunk or more than this share of its importance is
                      missing from members that all sent their manifests; it closes ("extended")
                      as an early close does, once what is missing is within this share
    downlink_budget   whether a round's update goes in a head and a tail, the tail after the next
                      RoundStart (ps/downlink.py): under the sync schedule, not in the
                      warm-up nor the last round, not on a sharded PS

`ClosePolicy` decides; the server acts on its decisions (its timers, the sites' outboxes, the commit).
"""

from __future__ import annotations

import logging

from ..config import RunConfig
from ..transport.messages import DeltaOutcome
from ..telemetry import Recorder
from .rounds import RoundState, kept_reason, late_outcome
from .uploads import Upload

__all__ = ["ClosePolicy"]

log = logging.getLogger("wantrain.ps")


class ClosePolicy:
    """The round-close decisions of one PS (see the module's docstring)."""

    def __init__(self, cfg: RunConfig, rounds: RoundState, recorder: Recorder, sharded: bool) -> None:
        self.cfg, self.rounds, self.recorder, self.sharded = cfg, rounds, recorder, sharded
        self.train, self.recovery = cfg.train, cfg.recovery

    def in_warmup(self, round_: int) -> bool:
        """Is round `round_` in the warm-up, which tolerates no loss: the first `reliable_rounds`,
        and (fixed inner steps) every round with a step of the inner learning rate's warm-up (its
        schedule's one change of phase: a linear ramp, then a cosine)?"""
        t = self.train
        lr_rounds = 0 if t.round_budget_s else -(-t.warmup_steps // t.inner_steps)
        return round_ < max(self.recovery.reliable_rounds, lr_rounds)

    def counts_partial(self, round_: int) -> bool:
        """Does round `round_` count the chunks of a delta that are in without the rest?"""
        return self.recovery.counts_partial and not self.in_warmup(round_) and not self.sharded

    def splits_update(self, round_: int) -> bool:
        """Does round `round_`'s update go in a head and a tail (recovery.downlink_budget)?"""
        return (self.cfg.patches_downlink and not self.in_warmup(round_) and not self.sharded
                and round_ + 1 < self.train.rounds)      # the last: every site ends holding the whole model

    WARMUP_EXTENSIONS = 2

    def extends_deadline(self, round_: int) -> bool:
        """At its deadline: does this round wait one deadline more for what is still coming? A warm-up
        round for deltas still coming (twice at most); a later one for what matters (extend_above)."""
        r = self.rounds
        if not (r.missing() and r.all_sending()):
            return False
        if (self.recovery.counts_partial and not self.sharded and self.in_warmup(round_)
                and r.extensions < self.WARMUP_EXTENSIONS):
            r.put_off_deadline()
            return True
        if (self.recovery.extend_above and self.counts_partial(round_) and not r.extensions
                and r.missing_share() > self.recovery.extend_above):
            r.put_off_deadline()
            return True
        return False

    def within_budget(self, round_: int) -> bool:
        """Is what the running round still misses within recovery.loss_budget (every manifest and
        critical chunk in)? Within extend_above, in an extension past its deadline."""
        r = self.rounds
        budget = max(self.recovery.loss_budget, self.recovery.extend_above if r.extensions else 0.0)
        return (bool(budget) and self.counts_partial(round_) and bool(r.members)
                and not r.aggregating and r.missing_share() <= budget)

    @property
    def grace_s(self) -> float:
        return 0.1 * self.rounds.deadline_s

    def arm_early_close(self, round_: int, now: float) -> float | None:
        """The first time what is missing is within the budget: the grace after which the round may
        close early (the caller asks again then: `early_wait_s`), else None."""
        if not self.rounds.early_armed and self.within_budget(round_):
            self.rounds.arm_early(now + self.grace_s)
            return self.grace_s
        return None

    def early_wait_s(self, round_: int, now: float, clock: float) -> float | None:
        """May the round close early now (0.0), later (ask again in that many seconds), or not
        (None: what is missing is over the budget)? `now` is time.time(), `clock` perf_counter()."""
        if not self.rounds.early_armed or not self.within_budget(round_):
            return None
        if self.rounds.completing():     # closing now would make a whole delta a partial one
            return self.grace_s
        return max(0.0, self.rounds.early_from - now, self.grace_s - self.rounds.quiet_for(clock))

    def closes_early(self, round_: int, now: float, clock: float) -> bool:
        return self.early_wait_s(round_, now, clock) == 0.0

    def late_delta(self, site: str, up: Upload, current: int, aggregating: bool) -> DeltaOutcome:
        """A delta that arrived after its round closed: dropped, or deferred to the next commit (rounds
        then keeps it), as recovery.late_policy says; what the site hears, and why."""
        action, reason = late_outcome(self.recovery, up.round, current, aggregating, self.train.rounds)
        self.recorder.emit("late_delta", round=up.round, site=site, rounds_late=current - up.round,
                           action=action, policy=self.recovery.late_policy, reason=reason)
        if action == "deferred":
            self.rounds.defer(site, up)
        return DeltaOutcome(up.round, action, reason)

    def kept_delta(self, site: str, owed: Upload, current: int) -> None:
        """A site that owed a delta reported a later model without sending it: it kept the delta."""
        self.recorder.emit("late_delta", round=owed.round, site=site, rounds_late=current - owed.round,
                           action="kept", policy=self.recovery.late_policy, reason=kept_reason(owed.round))
        log.info("site %s is back: %s", site, kept_reason(owed.round))
