"""A site's deltas on their way to the PS, and what became of them.

`Uplink` owns what the site has sent and not yet seen counted:

    the error feedback   what quantization left out of each delta, and deltas the PS never
                         applied, added to the next delta so their change is not lost
    pending              deltas pushed and not yet settled by a RoundResult (round -> values as
                         the PS decodes them)
    outcomes             what the PS said of deltas it did not simply count (DeltaOutcome)

`push` encodes a round's delta and sends its chunks and metrics; `keep` puts a delta that will
not be sent into the error feedback (its round committed without it, under a late_policy that
never applies a late delta); `settle` reads each RoundResult: a pushed delta that was counted is
done, one that never will be (late past what the policy allows, rejected) goes into the error
feedback. Under late_policy "rescale" neither carries anything: the round's mean over the others
stood in for the delta. A round may count the chunks of a delta that were in at its deadline
(`RoundResult.partial_chunks`): only the rest is then pending. Under a sharded PS each shard
decides alone, so only the tensors no shard counted are carried (docs/protocol.md 3a).
"""

from __future__ import annotations

import asyncio
import logging
import time

import numpy as np

from ..codec import Codec, EncodeStats, ErrorFeedback, encode_arrays, plan_chunks
from ..config import RunConfig
from ..errors import ConfigError
from ..runtime.faults import Stalls
from ..outer.fragments import synced
from ..transport.messages import MAX_STALENESS, DeltaOutcome, Manifest, RoundMetrics, RoundResult
from ..transport.manifest import DEFAULT_ROLE_WEIGHTS, build_manifest, promote, protect
from ..runtime.chunk_loss import ChunkLoss
from ..transport.sending import ProtectionGauge, Transmission, group_parities, to_resend, transmissions
from .probe import role_energy, role_weights
from .sender import Sender

__all__ = ["Uplink"]

log = logging.getLogger("wantrain.site")

PROMOTE_AFTER = 2       # rounds in a row a chunk was not counted before it goes as a critical one


class Uplink:
    """One site's deltas: encoded with error feedback, pushed, and settled by the PS's results."""

    def __init__(self, site: str, cfg: RunConfig, roles: dict[str, str], stalls: Stalls | None = None,
                 loss: ChunkLoss | None = None, late_s: float = 30.0, mode: str = "") -> None:
        """`mode`: this site's delta encoding ("": the run's codec.mode); ConfigError if the run's
        chunk plan cannot carry it."""
        self.site, self.cfg, self.roles = site, cfg, roles
        self.loss, self.late_s = loss, late_s        # chunks lost on purpose, sent late_s after the others
        self.own_mode = mode                 # its setting; a round's RoundStart may ask for another (use)
        self.codec = self._codec(mode)
        self.feedback = ErrorFeedback() if cfg.codec.error_feedback else None
        self.stalls = stalls or Stalls((), log)
        self.pending: dict[int, dict[str, np.ndarray]] = {}
        self.outcomes: dict[int, DeltaOutcome] = {}
        self.role_weights = dict(DEFAULT_ROLE_WEIGHTS)   # of the manifests' importance (site/probe.py)
        self.missed: dict[int, int] = {}     # chunk -> rounds in a row its round counted the delta without it
        self.plan_size = 0                   # chunks a delta comes in (known from the first push)
        self.protection = ProtectionGauge(cfg.recovery)    # the copies and parity its deltas carry, by the loss seen

    def _codec(self, mode: str) -> Codec:
        if mode and mode not in self.cfg.codec.delta_modes():
            raise ConfigError(f"site {self.site!r}: codec {mode!r} is not one this run's deltas may be in "
                              f"({', '.join(self.cfg.codec.delta_modes())}: those that fit its chunk plan)")
        return Codec(self.cfg.codec.for_site(mode))

    def use(self, mode: str) -> None:
        """Encode the next deltas in `mode`, as the PS's controller asked ("": the site's own); the
        error feedback carries on across the change (it holds values, not symbols)."""
        mode = mode or self.own_mode
        if mode and mode not in self.cfg.codec.delta_modes():
            log.warning("site %s: the PS asked for deltas in %s, which this run's chunk plan cannot carry; they "
                        "stay in %s", self.site, mode, self.codec.cfg.mode)
        elif (mode or self.cfg.codec.mode) != self.codec.cfg.mode:
            self.codec = self._codec(mode)
            log.info("site %s: deltas now go in %s", self.site, self.codec.cfg.mode)

    @property
    def pushes_late(self) -> bool:
        """Is a delta whose round committed without it still worth sending? Only if the PS may apply it."""
        return self.cfg.recovery.late_policy.applies_late

    async def push(self, stream, round_: int, delta: dict[str, np.ndarray], figures: dict, began_at: float = 0.0,
                   mode: str = "") -> EncodeStats:
        """Encode the round's delta (error feedback in; in `mode` where the PS's controller asked for
        one: `use`) and send its manifest, its chunks, then its
        RoundMetrics with `figures` (the training's, wait_s, decode_s) and the seconds from
        `began_at` (perf_counter: when the round began here) to the first message of the delta. The chunks go in the order
        recovery.transmissions gives (critical ones first, then by importance, so that what a
        deadline cuts short is what matters least), with their copies and parity where the run asks
        (recovery.critical_copies, recovery.parity_share, as the loss seen sizes them: ProtectionGauge) and
        `stream` can carry them; except that the
        smallest goes first of all: the PS times the upload from the first chunk's arrival to the
        last's, so the first must take no time itself."""
        self.use(mode)
        stats = EncodeStats()
        protects = stream.protects
        chunks, sent, manifest, parity = await asyncio.to_thread(self._encode, round_, delta, figures, stats, protects)
        if self.feedback is not None:
            self.pending[round_] = sent
        order = transmissions(manifest, copies=protects and self.protection.copies())
        first = min(range(len(chunks)), key=lambda i: chunks[i][1].wire_bytes)
        order.insert(0, order.pop(order.index(Transmission("chunk", first))))
        t = self.cfg.recovery
        out = Sender(stream, await stream.lanes(t.lanes) if t.lanes else None, round_, chunks, parity)
        sizes = [out.size(x) for x in order]
        lost: set[int] = set()       # positions lost on purpose (chunk loss)
        if self.loss is not None:
            lost = set(np.flatnonzero(self.loss.mask(sizes)).tolist())
        turnaround_s = max(0.0, time.perf_counter() - began_at) if began_at else 0.0
        await out.manifest(manifest)
        t0 = time.perf_counter()
        for n, x in enumerate(order):
            await out.send(x, lost=n in lost)
            if n == 0:
                await self.stalls.asleep("push", round_)
        send_s = time.perf_counter() - t0       # the send calls alone: hedges and late chunks wait for acks
        late = to_resend(manifest, order, lost) if lost else []   # what the PS cannot rebuild
        hedged: set[int] = set()
        if out.lanes is not None and t.hedge_s > 0:
            hedged = await out.hedge(manifest, order, t.hedge_s, self.loss, float(np.mean(sizes)), t.hedge_all)
            late = [i for i in late if i not in hedged]
        self.protection.saw_loss(len(set(late) | hedged) / len(chunks))
        if lost:
            log.warning("site %s: %d of the %d transmissions of round %d lost on purpose (chunk loss); %d chunk(s) "
                        "not rebuilt at the PS%s go %.1f s after the others", self.site, len(lost), len(order),
                        round_, len(late), " nor hedged" if out.hedged else "", self.late_s)
        if late:
            await asyncio.sleep(self.late_s)
        for i in late:
            await out.send(Transmission("chunk", i))
        await out.settled()          # every lane's chunk taken: the metrics may follow
        metrics = RoundMetrics(round=round_, raw_bytes=stats.raw_bytes, wire_bytes=stats.wire_bytes,
                               huffman_bits_per_symbol=stats.huffman_bits_per_symbol, encode_s=stats.seconds,
                               send_s=send_s, chunks=len(chunks), hedged=out.hedged, turnaround_s=turnaround_s,
                               **figures)
        await stream.send(metrics)
        return stats

    def _encode(self, round_: int, delta: dict[str, np.ndarray], figures: dict, stats: EncodeStats, protects: bool
                ) -> tuple[list, dict[str, np.ndarray], Manifest, dict[int, bytes]]:
        """The delta's chunks, its values as the PS will decode them, its manifest (with parity groups
        where the run asks and the stream can carry them) and each group's parity payload."""
        fragment = synced({k: v.size for k, v in delta.items()}, self.cfg.train.fragments, round_)
        held = {k: self.feedback.residuals.pop(k) for k in delta          # another fragment's residual waits
                if fragment is not None and k not in fragment and self.feedback and k in self.feedback.residuals}
        chunks, sent = encode_arrays(delta, self.codec, self.feedback, stats)
        if self.feedback is not None:
            self.feedback.residuals.update(held)
        self.plan_size = len(chunks)
        t0 = time.perf_counter()
        manifest = build_manifest(round_, chunks, sent, self.roles, self.role_weights, tokens=figures["tokens"],
                                  steps=figures["steps"], by=self.cfg.recovery.importance)
        if promoted := sorted(i for i, n in self.missed.items() if n >= PROMOTE_AFTER):
            manifest = promote(manifest, promoted)
            log.info("site %s: chunk(s) %s of round %d promoted to critical: their rounds counted this site's delta "
                     "without them %d times in a row", self.site, ", ".join(map(str, promoted)), round_, PROMOTE_AFTER)
        t = self.cfg.recovery
        parity: dict[int, bytes] = {}
        if protects and (share := self.protection.share()) > 0:
            manifest = protect(manifest, share, t.parity_group_size)
            parity = group_parities(manifest, chunks)
        stats.seconds += time.perf_counter() - t0
        return chunks, sent, manifest, parity

    def calibrate(self, sensitivity: dict[str, float], delta: dict[str, np.ndarray]) -> None:
        """A sensitivity probe's result for `delta`: the role weights move halfway to what it says."""
        probed = role_weights(sensitivity, role_energy(delta, self.roles))
        self.role_weights = {r: 0.5 * (w + probed.get(r, w)) for r, w in self.role_weights.items()}
        log.info("site %s: role weights after the sensitivity probe: %s", self.site,
                 ", ".join(f"{r} {w:.2f}" for r, w in sorted(self.role_weights.items())))

    def keep(self, delta: dict[str, np.ndarray]) -> None:
        """A delta that will not be sent: its change goes into the next one (unless the policy says
        the others' mean stood in for it)."""
        if self.feedback is not None and self.cfg.recovery.late_policy.carries_unapplied:
            self.feedback.carry(delta)

    def fresh_model(self) -> None:
        """A whole model was loaded: what was in flight is the PS's business now (a catch-up keeps it:
        the missed rounds' results settle it)."""
        self.pending = {}

    def _without_chunks(self, values: dict[str, np.ndarray], chunks: frozenset[int]) -> dict[str, np.ndarray]:
        """`values` (a whole delta as sent) with the chunks `chunks` of its plan zeroed."""
        out = {k: v.copy() for k, v in values.items()}
        for i, spec in enumerate(plan_chunks({k: v.size for k, v in values.items()}, self.codec.cfg.chunk_elements())):
            if i in chunks:
                out[spec.tensor][spec.offset: spec.offset + spec.length] = 0
        return out

    def heard(self, o: DeltaOutcome) -> None:
        self.outcomes[o.round] = o
        log.warning("site %s: the PS %s the delta of round %d: %s", self.site, o.outcome, o.round, o.reason)
        for r in [r for r in self.outcomes if r < o.round - 2 * MAX_STALENESS]:
            del self.outcomes[r]

    def _late_applied(self, result: RoundResult) -> set[int]:
        """The rounds of this site's late deltas (or tails) that `result`'s commit applied. It names
        the site once per delta: those the PS said it deferred first (DeltaOutcome), then the oldest
        (a site sends its deltas in round order). A site may have two on the way: each tail follows
        its round beside the next ones."""
        n = sum(s == self.site for s in result.late_sites)
        waiting = [r for r in sorted(self.pending) if r < result.round]
        deferred = [r for r in waiting if (o := self.outcomes.get(r)) is not None and o.outcome == "deferred"]
        return set((deferred + [r for r in waiting if r not in deferred])[:n])

    def _count_misses(self, result: RoundResult) -> None:
        """A round that counted this site's delta whole clears the chunks' misses; one that counted
        some of its chunks adds one to each of the others'."""
        me = self.site
        if me in result.sites:
            self.missed = {}
        elif (counted := dict(result.partial_chunks).get(me)) is not None:
            self.missed = {i: self.missed.get(i, 0) + 1 for i in range(self.plan_size) if i not in counted}

    def settle(self, result: RoundResult) -> None:
        """After a round's result: were the pushed deltas applied? One that never will be is carried forward."""
        self._count_misses(result)
        stale = self.pushes_late
        me = self.site
        applied = self._late_applied(result)
        for r in sorted(self.pending):
            if (r == result.round and me in result.sites) or r in applied:
                del self.pending[r]
                continue
            # A sharded PS may have counted some tensors' parts: only the others are still pending.
            counted = dict(result.partial_sites if r == result.round else
                           result.partial_late if r < result.round else ()).get(me, frozenset())
            self.pending[r] = {k: v for k, v in self.pending[r].items() if k not in counted}
            if r == result.round and (chunks := dict(result.partial_chunks).get(me)):
                self.pending[r] = self._without_chunks(self.pending[r], chunks)   # counted; the rest may follow
            if not self.pending[r]:
                del self.pending[r]
            elif r <= result.round and not (stale and result.round - r < MAX_STALENESS):
                sent = self.pending.pop(r)
                if not (policy := self.cfg.recovery.late_policy).carries_unapplied:
                    log.warning("site %s: the delta of round %d was not applied; late_policy %s: %s, so it is not "
                                "sent again", me, r, policy, policy.unapplied_fate())
                    continue
                if self.feedback is not None:    # what the PS never applied goes out again next round
                    self.feedback.carry(sent)
                said = self.outcomes.get(r)
                why = f"the PS {said.outcome} it" if said else "its round committed without it"
                log.warning("site %s: the delta of round %d was not applied (%s)%s; its change goes into the next "
                            "delta", me, r, why, f" for {len(sent)} of its tensors (the rest counted)" if counted else "")
