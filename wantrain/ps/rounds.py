"""Rounds at the parameter server: who is in the round, what arrived, when it closes.

`RoundState` is sans-IO: it holds the current round's members and uploads and answers
questions (may this site still join the round, whose upload is this chunk, can the round close
now and who missed it); the PS does the I/O (messages, timers, telemetry) around its answers.

A round never waits forever. Its deadline is fixed (`schedule.deadline_s`) or derived from how long
deltas took to arrive in recent rounds: the compute budget plus `deadline_factor` times the
typical time beyond it, never less than `deadline_min_s` beyond it. "Typical" is the lower median
over the sites of each site's own median arrival (late ones included): a site that was away for
a while keeps its history, so the others, timed alone meanwhile, do not shrink the deadline below
what it needs to come back; and one site, however slow, cannot move it past the next site's
time (with two sites it is the faster one's), however it drips its chunks. With
`schedule.quorum_share` (a minimum quorum, as Decoupled DiLoCo has) the deadline comes forward once
that share of the round's members have delivered: to a grace after, the grace adapting to how much
later the slowest member usually delivers. The first round, with
nothing timed, waits up to `deadline_initial_s`: it carries each site's one-time costs (a compile,
a cold cache), which differ by site. It is bounded from within all the same: once the first half
of its sites have delivered, it waits at most `FIRST_ROUND_FACTOR` x the time they took, never
less than `deadline_min_s` (nor more than `deadline_initial_s`), so a site that drips its first
delta holds the others for three times their own time, not two minutes (a site whose one-time
costs are longer than that is late in round 0, and its delta counts as a late one does). At the deadline the PS
aggregates the deltas that arrived; a delta that arrives later is dropped (the site carries it
forward in its error feedback) or, with the "stale" policy, applied in a following round with
its weight discounted per round of staleness.

A site that missed a deadline owes that round's delta, and a site that owes a delta is not
counted on in a new round: it may be dark (its link down for minutes), and a round start it
cannot hear of would only make it owe another. It is heard from again when its late delta
arrives, or when it reports having applied the update of the round it owes (a site sends in
order, so that delta can no longer come); from then on it takes part again, in the running
round if it is current and enough of the budget is left (with fixed inner steps: if at least its
usual time to deliver is left before the deadline; admitted with less, a slow site back from an
outage missed every deadline, owed every round and was never counted again).

A site whose round counted the chunks it had in (recovery.partial_deltas) is not dark: it owes only
the rest, its tail, which it sends while it trains the next round. Its tail is kept apart
(`tails`, per site and round) and the site is counted on; a hash report does not end a tail (the
site sends it beside its later rounds), its metrics or the site's leaving do. A site new to a
round (not in the one before: it joined, rejoined or came back) tolerates no loss: its delta
counts whole or not at all, and the round does not close early while it is missing.
"""

from __future__ import annotations

import math
import statistics
from collections import deque

from ..config import RecoveryConfig, ScheduleConfig
from ..errors import ProtocolError
from ..transport.messages import MAX_STALENESS
from ..outer.screening import late_key
from .uploads import Upload

__all__ = ["RoundClock", "RoundState", "FIRST_ROUND_FACTOR", "QUORUM_GRACE_FLOOR_S",
           "MAX_STALENESS",
           "stale_weight", "late_outcome", "kept_reason"]


FIRST_ROUND_FACTOR = 3.0       # the first round waits at most this x the time its first half took
QUORUM_GRACE_FLOOR_S = 0.5     # schedule.quorum_share: the least a round waits for the rest once its quorum is in


class RoundClock:
    """Remembers when each site's deltas arrived (seconds after their round started) and sets deadlines."""

    def __init__(self, schedule: ScheduleConfig, budget_s: float = 0.0, window: int = 8) -> None:
        self.schedule, self.budget_s, self.window = schedule, budget_s, window
        self.arrivals: dict[str, deque[float]] = {}

    def arrived(self, site: str, after_s: float) -> None:
        self.arrivals.setdefault(site, deque(maxlen=self.window)).append(max(0.0, after_s))

    def site_s(self, site: str) -> float:
        """How long this site's deltas usually take to arrive (its median), 0.0 if never timed."""
        arrivals = self.arrivals.get(site)
        return statistics.median(arrivals) if arrivals else 0.0

    def typical_s(self) -> float:
        """The lower median over the sites of each one's median arrival."""
        return statistics.median_low(statistics.median(a) for a in self.arrivals.values())

    @property
    def untimed(self) -> bool:
        """Nothing timed yet and no fixed deadline: a new round gets deadline_initial_s."""
        return not self.schedule.deadline_s and not self.arrivals

    def first_round_bound_s(self, arrived_s: list[float], members: int) -> float | None:
        """The deadline of a round that started untimed, once the first half of its `members` have
        delivered (`arrived_s`: seconds after its start), or None (too few yet)."""
        t, quorum = self.schedule, (members + 1) // 2
        if members < 2 or len(arrived_s) < quorum:
            return None
        return min(t.deadline_initial_s, max(t.deadline_min_s, FIRST_ROUND_FACTOR * sorted(arrived_s)[quorum - 1]))

    def quorum_bound_s(self, arrived_s: list[float], members: set[str]) -> float | None:
        """With schedule.quorum_share, the deadline of a round once that share of its `members` have
        delivered (`arrived_s`): a grace after the quorum's last arrival, grace_factor x how much
        later than the quorum's the slowest member usually delivers (each one's median), at least
        QUORUM_GRACE_FLOOR_S; None before (or without a quorum share)."""
        t = self.schedule
        quorum = max(1, math.ceil(t.quorum_share * len(members)))
        if not t.quorum_share or len(arrived_s) < quorum:
            return None
        usual = sorted(self.site_s(s) for s in members if s in self.arrivals)
        spread = usual[-1] - usual[quorum - 1] if len(usual) >= quorum else 0.0
        return sorted(arrived_s)[quorum - 1] + max(QUORUM_GRACE_FLOOR_S, t.grace_factor * spread)

    def deadline_s(self) -> float:
        """A new round's deadline, seconds after its start."""
        t, budget_s = self.schedule, self.budget_s
        if t.deadline_s:
            return t.deadline_s
        if not self.arrivals:
            return max(t.deadline_initial_s, budget_s + t.deadline_min_s)
        beyond = max(0.0, self.typical_s() - budget_s)
        return budget_s + max(t.deadline_min_s, t.deadline_factor * beyond)


def stale_weight(tokens: float, staleness: int, discount: float) -> float:
    """Aggregation weight of a delta applied `staleness` rounds after the round it was for."""
    return tokens * discount ** staleness


def late_outcome(recovery: RecoveryConfig, late_round: int, committed: int, aggregating: bool,
                 rounds: int) -> tuple[str, str]:
    """What becomes of a delta of `late_round` that arrived after its round closed, `committed` rounds
    being committed (and the next one being aggregated, or not), in a run of `rounds`: ("deferred",
    why) if it will count in the next commit it can reach ("stale": discounted, in the mean;
    "zero-outside": at its share of its own round, outside the outer momentum; at most MAX_STALENESS
    rounds on, and before the run ends), else ("dropped", why)."""
    counts_in = committed + (1 if aggregating else 0)
    closed = (f"round {late_round} committed without it" if committed > late_round
              else f"round {late_round} closed without it") + " (its deadline passed)"
    late_policy = recovery.late_policy
    policy = f"late_policy {late_policy}"
    if not late_policy.applies_late:
        return "dropped", f"{closed}; {policy}: a late delta is never applied ({late_policy.unapplied_fate()})"
    if counts_in >= rounds:         # deferred, it would wait for a commit that never comes
        return "dropped", (f"{closed}, and the run's last round (round {rounds - 1}) has closed: there is no "
                           f"later commit to count it in")
    if counts_in - late_round > MAX_STALENESS:
        return "dropped", (f"{closed}, and the next commit it could count in is round {counts_in}, more than "
                           f"{MAX_STALENESS} rounds later: too stale to apply")
    if late_policy.outside_momentum:
        return "deferred", (f"{closed}; {policy}: it counted as zeros there, and is applied when round {counts_in} "
                            f"commits, at its share of round {late_round}, outside the outer momentum")
    discount = recovery.staleness_discount ** (counts_in - late_round)
    return "deferred", (f"{closed}; {policy}: it counts in round {counts_in} with its weight multiplied "
                        f"by {discount:.3g}")


def kept_reason(owed_round: int) -> str:
    return (f"round {owed_round} committed before the site sent its delta (the site missed the deadline: dark or "
            f"slow), and the site keeps its change for its next delta")


class RoundState:
    """The current round's members and their uploads, and late uploads of earlier rounds."""

    def __init__(self) -> None:
        self.members: set[str] = set()        # sites expected to deliver for the current round
        self.uploads: dict[str, Upload] = {}
        self.late: dict[str, Upload] = {}     # sites that missed a deadline, owing that round's delta
        self.tails: dict[tuple[str, int], Upload] = {}   # (site, round): the rest of a delta counted in part
        self.stale: dict[tuple[str, int], Upload] = {}   # (site, round): complete late deltas for the next aggregation
        self.started_at = 0.0
        self.deadline_s = 0.0                 # after started_at
        self.untimed = False                  # started before any arrival was timed (the first round)
        self.arrived_s: list[float] = []      # when the round's deltas arrived, after started_at
        self.past_deadline = False
        self.early_from = math.inf            # when the round may close early (ps/closing.py)
        self.extensions = 0                   # deadlines put off for a warm-up round (ps/closing.py)
        self.close_reason = ""                # "complete", "deadline", "early" or "extended", once closed
        self.last_members: set[str] = set()   # sites the last (or current) round started with
        self.aggregating = False

    def start(self, round_: int, sites: set[str], budget_s: float | dict[str, float], now: float,
              deadline_s: float = 0.0, untimed: bool = False) -> None:
        """Round `round_` starts with `sites`, each with its compute budget (one for all, or per site)."""
        before = self.last_members      # empty in the first round this PS runs: the warm-up's to judge
        self.members, self.last_members = set(sites), set(sites)
        budgets = budget_s if isinstance(budget_s, dict) else dict.fromkeys(sites, budget_s)
        self.uploads = {name: Upload(round_, budgets[name], whole_only=bool(before) and name not in before)
                        for name in sites}
        self.started_at, self.deadline_s, self.untimed, self.arrived_s = now, deadline_s, untimed, []
        self.past_deadline = False
        self.early_from = math.inf            # when the round may close early (ps/closing.py)
        self.extensions = 0

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

    def admission(self, site: str, budget_s: float, now: float, needs_s: float = 0.0) -> float | None:
        """The compute budget a site (re)joining a running round gets, or None: it waits for the next
        round (none runs, it is in this one, or too little of the budget is left to be worth it).
        With fixed inner steps (no budget) it needs `needs_s` (its usual time to deliver) before
        the deadline."""
        if not self.members or self.aggregating or site in self.members or site in self.late:
            return None
        if not budget_s:
            left_s = self.deadline_s - (now - self.started_at)
            return 0.0 if not self.deadline_s or left_s >= needs_s else None
        train_s = budget_s - (now - self.started_at)
        return train_s if train_s >= 0.1 * budget_s else None

    def admit(self, site: str, round_: int, train_s: float) -> None:
        self.members.add(site)
        self.uploads[site] = Upload(round_, train_s, whole_only=True)

    def owing(self) -> set[str]:
        """Sites that missed a deadline and have not been heard from since: not counted on. (A site
        that owes only the tail of a delta counted in part is counted on.)"""
        return set(self.late)

    def heard_from(self, site: str, applied_round: int) -> Upload | None:
        """The site applied the update of `applied_round`: a delta it owes for that round or an earlier
        one can no longer come (it would have been sent first). Returns the upload it owed, if any."""
        up = self.late.get(site)
        if up is None or up.round > applied_round:
            return None
        return self.late.pop(site)

    def upload_for(self, site: str, round_: int, current: int) -> Upload:
        """The upload a delta message of `site` for `round_` belongs to; ProtocolError if none."""
        up = self.uploads.get(site)
        if up is not None and round_ == current and site in self.members and not self.aggregating:
            return up
        late = self.owed(site, round_)
        if late is not None:
            return late
        raise ProtocolError(f"delta for round {round_} from {site!r}, which is not in that round "
                            f"(the current round is {current})")

    def closed_for(self, site: str, round_: int, current: int) -> bool:
        """Has `round_` (at most MAX_STALENESS + 1 rounds old) closed to `site`'s delta, owing nothing of
        it? A hedged chunk on a lane may land after its first copy completed the delta."""
        if not current - MAX_STALENESS - 1 <= round_ <= current:
            return False
        try:
            self.upload_for(site, round_, current)
        except ProtocolError:
            return True
        return False

    def owed(self, site: str, round_: int) -> Upload | None:
        """The late delta (or tail) of `site` for `round_` still coming, if any."""
        late = self.late.get(site)
        return late if late is not None and late.round == round_ else self.tails.get((site, round_))

    def came(self, site: str, up: Upload) -> bool:
        """The late delta or tail `up` of `site` is complete: no longer owed. False if it was not."""
        if self.late.get(site) is up:
            del self.late[site]          # heard from: counted on again from the next round
            return True
        return self.tails.pop((site, up.round), None) is not None

    def missing(self) -> list[str]:
        return sorted(s for s in self.members if self.uploads[s].metrics is None)

    @property
    def early_armed(self) -> bool:
        return self.early_from < math.inf

    def arm_early(self, at: float) -> None:
        """The round may close early from `at` (ps/closing.py)."""
        self.early_from = at

    def missing_share(self) -> float:
        """The share of the round's importance not in yet, each member's delta weighted by the tokens it
        claims; inf while a member's manifest, or one of its critical chunks, is not in, or a member
        new to the round (it tolerates no loss) is not complete."""
        total = missing = 0.0
        for s in self.members:
            up = self.uploads[s]
            if up.metrics is not None:
                total += up.metrics.tokens
                continue
            if up.manifest is None or up.critical_missing or up.missing_importance is None or up.whole_only:
                return math.inf
            total += up.manifest.tokens
            missing += up.manifest.tokens * up.missing_importance
        return missing / total if total else math.inf

    def completing(self) -> bool:
        """Has a member sent every chunk of its delta, its metrics still to come or being checked?
        Its delta is about to be complete: an early close waits for it (the deadline does not)."""
        return any(self.uploads[s].all_chunks_in for s in self.members)

    def quiet_for(self, now: float) -> float:
        """How long (perf_counter seconds before `now`) no chunk has come from any member whose delta
        is not complete: what is missing then is not merely in flight."""
        last = [self.uploads[s].last_chunk_at for s in self.missing()]
        return now - max(last) if last else math.inf

    def put_off_deadline(self) -> None:
        """The deadline passes once more before the round closes (ps/closing.py: a warm-up round)."""
        self.extensions += 1

    def all_sending(self) -> bool:
        """Has every member whose delta is not in sent its manifest (it is alive and sending)?"""
        return all(self.uploads[s].manifest is not None for s in self.missing())

    def missing_importance(self) -> dict[str, float]:
        """Of the members whose delta is not complete and who sent its manifest: the share of its
        importance still to come (transport/manifest.py)."""
        out = {}
        for s in self.missing():
            share = self.uploads[s].missing_importance
            if share is not None:
                out[s] = round(share, 6)
        return out

    def close(self, partial: bool = False, early: bool = False) -> bool:
        """Close the round if every member's delta is in, or the deadline passed (or `early`: the
        round may close early) and some are, or (`partial`: the round counts partial deltas) some
        of a delta's chunks and its manifest: the missing ones become late. True when it closed (the
        caller aggregates `uploads`)."""
        if self.aggregating or not self.members:
            return False
        arrived = {s for s in self.members if self.uploads[s].metrics is not None}
        countable = arrived or (partial and any(self.uploads[s].counts_in_part for s in self.members))
        if arrived != self.members and not ((self.past_deadline or early) and countable):
            return False
        self.close_reason = ("complete" if arrived == self.members else "deadline" if self.past_deadline
                             else "extended" if self.extensions else "early")
        for s in sorted(self.members - arrived):
            self.late[s] = self.uploads.pop(s)
        self.members = arrived
        self.aggregating = True
        return True

    def drop(self, site: str) -> None:
        """The site left: what it was sending will not come."""
        self.uploads.pop(site, None)
        self.late.pop(site, None)
        self.tails = {k: up for k, up in self.tails.items() if k[0] != site}
        self.members.discard(site)

    def defer(self, site: str, up: Upload) -> None:
        """A late delta the policy applies at the next commit (late_outcome: "deferred")."""
        self.stale[site, up.round] = up

    def committed(self, round_: int, shares: dict[str, float], counted: dict[str, frozenset[int]]) -> None:
        """Round `round_` committed without these sites' deltas, owed or already deferred: each will
        have `shares` of it when applied (late_policy zero-outside), and `counted` chunks of it
        counted already (recovery.partial_deltas): such a site owes only its tail."""
        for site in shares.keys() | counted.keys():
            for up in (self.late.get(site), self.stale.get((site, round_))):
                if up is not None and up.round == round_:
                    up.share = shares.get(site, 0.0)
                    up.counted = counted.get(site, frozenset())
            if counted.get(site) and (up := self.late.get(site)) is not None and up.round == round_:
                self.tails[site, round_] = self.late.pop(site)

    def take_stale(self, current: int) -> dict[str, Upload]:
        """Late deltas still young enough to apply, keyed "site@round" (a site may have a fresh one too)."""
        # (A delta of the current round deferred while it commits waits for the next.)
        stale = {late_key(s, r): up for (s, r), up in sorted(self.stale.items())
                 if 0 < current - r <= MAX_STALENESS}
        self.stale = {k: up for k, up in self.stale.items() if k[1] == current}
        return stale

    def finish(self) -> None:
        self.members, self.uploads, self.aggregating = set(), {}, False
