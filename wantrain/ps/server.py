"""The parameter server as a domain object: ParameterServer holds the global model and runs the rounds.

It knows nothing of gRPC: each connected site is a `SiteLink` with an outbound queue of domain
messages, owned with its comings and goings by `Sites` (sites.py), and tests drive it directly;
servicer.py turns a site's gRPC stream into calls of `handle()` and the site's queue back into
wire messages.

A round: when every site is connected and has said it is Ready (its model loaded), the PS
sends RoundStart; each site answers with its delta chunks and RoundMetrics. When every delta is
in, or at the round's deadline those that are (rounds.py), the PS screens them (commit.py),
averages them, takes the outer Nesterov step, encodes the update with its own error feedback,
applies exactly the decoded update to its replica (outer/aggregate.py), journals the round, and sends the
update chunks and a RoundResult (with the new parameter hash) to every site. Late deltas are
dropped or applied in a later round; a site that (re)joins mid-round trains in it with what is
left of the budget; one that comes back holding an earlier model gets the updates it missed.

Everything a site sends is checked before it touches any state: the message itself (wire.py),
its place in the protocol (here and rounds.py), its chunks and its delta (uploads.py), its
claims (screening.py), and the rate of what it makes the PS do (limits.py). A violation raises
ProtocolError or RejectedError for that site alone.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from pathlib import Path

from ..transport.auth import Authenticator
from ..outer.checking import CommitCheck
from .checkpoint import CHECKPOINT_NAME, load_checkpoint
from ..codec import Codec
from ..config import CodecConfig, RunConfig
from ..data import load_run_data
from ..errors import DeltaRejectedError, NonFiniteDeltaError, ProtocolError
from ..runtime.faults import Stalls
from ..transport.limits import Limits
from ..runtime.memory import trim_heap
from ..transport.messages import (DeltaParity, HashReport, Join, LinkProbe, Manifest, Ready, RoundMetrics, RoundStart,
                                  TensorChunk)
from ..outer.screening import Screen, check_claims
from ..transport import wire
from ..telemetry import Recorder
from .commit import Committed, Committer
from .downloads import Downloads
from .model import GlobalModel
from .closing import ClosePolicy
from .controller import BudgetController
from .rounds import RoundClock, RoundState
from .sites import SiteLink, Sites
from .journal import JOURNAL_DIR, Journal
from .ledger import Ledger
from .state import CheckpointWriter, come_up, snapshot
from .uploads import assemble, check_chunk, check_manifest, check_parity, rebuild_member

__all__ = ["ParameterServer", "SiteLink"]

log = logging.getLogger("wantrain.ps")


class ParameterServer:
    """Holds the global model and runs DiLoCo rounds over the connected sites."""

    def __init__(self, cfg: RunConfig, run_dir: str | Path | None = None, run_id: str | None = None,
                 exit_when_done: bool = True, resume: bool = True, auth: Authenticator | None = None,
                 stalls: dict[str, float] | None = None, limits: Limits | None = None,
                 shard: tuple[int, int] = (0, 1)) -> None:
        self.cfg = cfg
        self.auth = auth or Authenticator()
        self.limits = limits or Limits()
        self.run_dir = Path(run_dir) if run_dir else None
        self.recorder = Recorder(self.run_dir / "events.jsonl" if self.run_dir else None)
        self.stalls = Stalls(stalls, log, on_stall=lambda phase, r, s: self.recorder.emit(
            "stall", phase=phase, round=r, seconds=s))
        self.exit_when_done = exit_when_done

        tok, corpus = load_run_data(cfg.data)
        self.corpus_summary = corpus.summary()
        self.global_model = g = GlobalModel(cfg, tok.vocab_size, corpus.val, shard)
        self.model, self.shapes, self.num_params, self.plan = g.model, g.shapes, g.num_params, g.plan
        model_codec = Codec(CodecConfig(mode="fp32", chunk_bytes=cfg.codec.chunk_bytes,
                                        quant_block=cfg.codec.quant_block))
        self.downloads = Downloads(g.views, model_codec, self.limits, self.recorder, self.num_params)
        self.clock = RoundClock(cfg.schedule, cfg.train.round_budget_s)
        self.controller = BudgetController(cfg.train.round_budget_s, cfg.schedule.controller.adapts, cfg.codec.mode)
        self.screen = Screen(cfg)
        self.check = CommitCheck(cfg.robust, cfg.num_sites, sharded=shard[1] > 1)     # checking.py
        self.ckpt_path = self.run_dir / CHECKPOINT_NAME if self.run_dir else None
        saved = load_checkpoint(self.ckpt_path) if (self.ckpt_path and resume) else None
        # What the rounds committed (ledger.py): round, hashes, sites ever seen, their data positions.
        self.ledger = Ledger(run_id or time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6], g.hash(),
                             float("nan") if saved is not None else g.evaluate())

        self.rounds = RoundState()
        self.close_policy = ClosePolicy(cfg, self.rounds, self.recorder, sharded=shard[1] > 1)
        self.last_commit_at = time.time()
        self._timers: list[asyncio.TimerHandle] = []
        self.round_task: asyncio.Task | None = None
        self.done = asyncio.Event()
        self.closing = asyncio.Event()         # the server is about to stop: end Watch streams
        # Durability (state.py): a journal record per round, full state every checkpoint_every rounds.
        self.journal = Journal(self.run_dir / JOURNAL_DIR) if self.run_dir and cfg.train.checkpoint_every else None
        self.checkpoints = (CheckpointWriter(self.ckpt_path, self.journal, self._snapshot, self.recorder, self.stalls)
                            if self.ckpt_path is not None and self.journal is not None else None)
        self.committer = Committer(cfg, self.ledger, g, self.screen, self.check, self.downloads, self.journal, self.checkpoints,
                                   self.recorder, self.stalls)
        # Come up from disk, or begin the run's durable record (state.py).
        self.catchup = come_up(cfg, self.ledger, g, self.screen, self.check, saved, self.ckpt_path, self.journal,
                               self.checkpoints, self.recorder, self.corpus_summary)
        self.sites = Sites(cfg, self.auth, self.limits, self.ledger, g, self.downloads, self.catchup, self.recorder)
        if saved is not None:
            self.rounds.last_members = set(self.ledger.registry)   # after a restart, give every site time to return
            if self.ledger.round >= cfg.train.rounds:
                self.done.set()
        c = self.corpus_summary
        log.info("corpus %s: %d document(s), %d tokens (%d for training, %d held out)%s", cfg.data.corpus,
                 c["documents"], c["tokens"], c["train_tokens"], c["val_tokens"],
                 f"; skipped {c['skipped_files']} file(s) that are not text" if c.get("skipped_files") else "")

    def clear_site(self, site: str) -> bool:
        """An operator cleared `site` (a `clear_site` report): the commit check counts it again and
        forgets its record (checking.py). False if it was not excluded."""
        cleared = self.check.clear(site)
        log.warning("operator cleared site %s%s", site, "" if cleared else " (it was not excluded)")
        return cleared

    def _snapshot(self) -> dict:
        return snapshot(self.cfg, self.ledger, self.global_model, self.screen, self.check)

    # ------------------------------------------------------------ site lifecycle

    def join(self, msg: Join) -> SiteLink:
        """Admit a site or raise RejectedError; queues the Welcome and the model download (sites.py).
        A site still connected replaces its session: the old one left, as if its stream had ended."""
        replacing = msg.site in self.sites.links
        link = self.sites.join(msg, self.done.is_set(), self.rounds.aggregating)
        if replacing:
            self.rounds.drop(link.name)
            self._maybe_finish_round()
        return link

    async def handle(self, link: SiteLink, msg, nbytes: int | None = None) -> None:
        """One message from a joined site, after wire.py has checked its form; raises ProtocolError or
        RejectedError for this site alone. Each kind is bounded by the protocol (metrics once per
        upload, Ready once per download, a hash report once per committed round) or by a rate
        (link probes), so a site can cause only a bounded number of events. `nbytes`: what it took
        on the wire (serialized, with gRPC's prefix; counted again from the message when not given),
        counted into the delta it belongs to."""
        if link.closed:          # a session replaced by the site's new one: what it still sends is void
            return
        if isinstance(msg, (TensorChunk, Manifest, DeltaParity, RoundMetrics)):      # a delta's message
            up = self.rounds.upload_for(link.name, msg.round, self.ledger.round)
            up.came(wire.framed_size(msg) if nbytes is None else nbytes)
        if isinstance(msg, TensorChunk):
            self.on_chunk(link, msg)
        elif isinstance(msg, Manifest):
            self.on_manifest(link, msg)
        elif isinstance(msg, DeltaParity):
            self.on_parity(link, msg)
        elif isinstance(msg, RoundMetrics):
            await self.on_metrics(link, msg)
        elif isinstance(msg, HashReport):
            self.on_hash_report(link, msg)
        elif isinstance(msg, Ready):
            self.on_ready(link, msg)
        elif isinstance(msg, LinkProbe):
            self.on_link_probe(link, msg)
        else:
            raise ProtocolError(f"unexpected {type(msg).__name__} after joining")

    def on_ready(self, link: SiteLink, msg: Ready) -> None:
        """The site loaded its model: from now on it counts for rounds (and joins a running one)."""
        self.sites.mark_ready(link, msg)
        if msg.round == self.ledger.round:      # else an update is on its way to it, then the next RoundStart
            self._admit_to_round(link)
        self.maybe_start_round()

    def _admit_to_round(self, link: SiteLink) -> None:
        """A site that (re)joins while a round runs takes part in it, with what is left of the budget."""
        train_s = self.rounds.admission(link.name, self.cfg.train.round_budget_s, time.time(),
                                        needs_s=self.clock.site_s(link.name))
        if train_s is not None:
            self.rounds.admit(link.name, self.ledger.round, train_s)
            link.outbox.put_nowait(RoundStart(self.ledger.round, self.ledger.hash, train_s, self.controller.codec_of(link.name)))

    def leave(self, link: SiteLink, reason: str) -> None:
        if self.sites.leave(link, reason):
            self.rounds.drop(link.name)
            self._maybe_finish_round()        # the others may all be done already

    # ------------------------------------------------------------ rounds

    def _later(self, delay_s: float, fn, *args) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:        # driven without an event loop (unit tests): no timers
            return
        self._timers = [t for t in self._timers if not t.cancelled()]
        self._timers.append(loop.call_later(delay_s, fn, *args))

    def maybe_start_round(self) -> None:
        ready = self.sites.ready()
        # A site that owes the delta of a round it missed is not counted on (it may be dark: rounds.py);
        # it is present all the same, so the quorum does not wait for it.
        dark = ready & self.rounds.owing()
        enrolled = ready - dark
        if self.rounds.members or self.rounds.aggregating or self.done.is_set() or not enrolled:
            return
        wait = self.rounds.quorum_wait(ready, set(self.ledger.registry), self.cfg.num_sites, self.ledger.round,
                                       self.cfg.schedule.quorum_wait_s - (time.time() - self.last_commit_at))
        if wait is not None:
            if wait < float("inf"):
                self._later(wait + 0.01, self.maybe_start_round)
            return
        budget = self.cfg.train.round_budget_s
        deadline = self.clock.deadline_s()
        decisions = self.controller.plan(enrolled)          # each site's budget (ps/controller.py)
        self.rounds.start(self.ledger.round, enrolled, {s: d.budget_s for s, d in decisions.items()}, time.time(), deadline,
                          untimed=self.clock.untimed)
        self.recorder.emit("round_start", round=self.ledger.round, sites=sorted(enrolled), deadline_s=deadline,
                           budget_s=budget, dark=sorted(dark))
        for name, d in sorted(decisions.items()):
            if self.controller.adaptive:
                self.recorder.emit("controller", round=self.ledger.round, site=name, budget_s=d.budget_s, comm_s=d.comm_s,
                                   codec=d.codec or self.cfg.codec.mode, reason=d.reason)
            self.sites.links[name].outbox.put_nowait(RoundStart(self.ledger.round, self.ledger.hash, d.budget_s, d.codec))
        self._later(deadline, self._on_deadline, self.ledger.round)

    def _on_deadline(self, round_: int) -> None:
        if round_ != self.ledger.round or self.rounds.aggregating or not self.rounds.members:
            return
        if self.close_policy.extends_deadline(round_):      # no loss tolerated, or too much missing (closing.py)
            log.info("round %d: deadline put off %.1f s for %s, still sending", round_,
                     self.rounds.deadline_s, ", ".join(self.rounds.missing()))
            self._later(self.rounds.deadline_s, self._on_deadline, round_)
            return
        self.rounds.past_deadline = True
        missing = self.rounds.missing()
        self.recorder.emit("deadline", round=round_, deadline_s=time.time() - self.rounds.started_at,
                           missing=missing, policy=self.cfg.recovery.late_policy,
                           missing_importance=self.rounds.missing_importance())
        log.warning("round %d: deadline passed, %d site(s) missing: %s", round_, len(missing), ", ".join(missing))
        self._maybe_finish_round()

    def on_manifest(self, link: SiteLink, m: Manifest) -> None:
        """Take a delta's manifest, before its chunks; raises ProtocolError if it does not belong."""
        up = self.rounds.upload_for(link.name, m.round, self.ledger.round)
        check_manifest(self.cfg, up, m, self.plan)
        up.take_manifest(m)

    def on_chunk(self, link: SiteLink, c: TensorChunk) -> None:
        """Accept one delta chunk after checking that it belongs; raises ProtocolError otherwise."""
        up = self.rounds.upload_for(link.name, c.round, self.ledger.round)
        if not check_chunk(up, c, self.plan, self.shapes, self.cfg.codec.delta_modes(), self.cfg.codec.quant_block,
                           self.cfg.recovery.hedges_every_chunk):
            up.add_repeat(c)            # a second copy: the first is in
            return
        up.add(link.name, c)
        if up.manifest is not None and (group := up.manifest.chunks[c.index].group) in up.groups:
            rebuild_member(up, link.name, group, self.plan, self.shapes, self.cfg.codec)
        self._maybe_close_early()

    def on_parity(self, link: SiteLink, p: DeltaParity) -> None:
        """Take a parity group's XOR parity, and rebuild the one member the group lacks if the others
        are in; raises ProtocolError if it does not belong or rebuilds no chunk of the delta."""
        up = self.rounds.upload_for(link.name, p.round, self.ledger.round)
        check_parity(up, p)
        up.take_parity(p)
        rebuild_member(up, link.name, p.group, self.plan, self.shapes, self.cfg.codec)
        self._maybe_close_early()

    async def on_metrics(self, link: SiteLink, m: RoundMetrics) -> None:
        up = self.rounds.upload_for(link.name, m.round, self.ledger.round)
        if up.metrics is not None:
            raise ProtocolError(f"round {m.round} metrics from {link.name!r} arrived twice")
        if len(up.decoding) != up.count or m.chunks != up.count:
            raise ProtocolError(f"metrics after {len(up.decoding)} of {max(up.count, m.chunks)} delta chunks")
        check_claims(self.cfg, m, up.train_s, self.num_params, up.wire_bytes, self.ledger.round)
        if up.manifest is not None and (m.steps, m.tokens) != (up.manifest.steps, up.manifest.tokens):
            raise ProtocolError(f"round {m.round} metrics claim {m.steps} steps and {m.tokens} tokens, its manifest "
                                f"{up.manifest.steps} and {up.manifest.tokens}")
        # Check this site's delta now (its chunks were decoded as they came), while others still
        # train: a bad delta is rejected here, for this site alone, and never reaches the aggregate.
        try:
            delta, norm = await asyncio.to_thread(assemble, self.cfg, link.name, up, m.steps, self.global_model.norm,
                                                  self.num_params)
        except (NonFiniteDeltaError, DeltaRejectedError) as e:
            self.recorder.emit("quarantine", round=m.round, site=link.name, message=str(e), action="rejected")
            raise
        if self.rounds.uploads.get(link.name) is not up and self.rounds.owed(link.name, m.round) is not up:
            return                  # the site left (or its upload was dropped) while its delta was checked
        self.ledger.drew(link.name, m.data_position)
        up.delta, up.metrics, up.norm = delta, m, norm
        up.decoding = {}            # the checked delta is kept in up.delta
        if self.journal is not None:    # into the journal now, while others train (commit waits for it)
            up.journaled = asyncio.ensure_future(asyncio.to_thread(self.journal.write_delta, m.round, link.name,
                                                                   delta))
        fields = {k: getattr(m, k) for k in m.__dataclass_fields__ if k != "round"}
        late = self.rounds.owed(link.name, m.round) is up
        to_round = time.time() - time.perf_counter() - self.rounds.started_at   # + a perf_counter: seconds into the round
        self.recorder.emit("site_round", round=m.round, site=link.name, late=late,
                           first_in_s=None if late else to_round + up.first_chunk_at,
                           arrived_s=None if late else to_round + up.last_chunk_at,
                           ratio=m.raw_bytes / up.framed_bytes if up.framed_bytes else 0.0,
                           received_wire_bytes=up.wire_bytes, upload_s=up.upload_s, delta_norm=norm,
                           encoding=up.encoding,
                           rebuilt=len(up.rebuilt), protection_bytes=up.protection_bytes,
                           parity_bytes=up.parity_bytes, framed_bytes=up.framed_bytes,
                           delta_to_model=norm / self.global_model.norm if self.global_model.norm else 0.0, **fields)
        if late:
            if up.round == self.ledger.round:     # its round is closed but not committed: its timing is known
                self.clock.arrived(link.name, time.time() - self.rounds.started_at)
            self.rounds.came(link.name, up)    # heard from: counted on again from the next round
            link.outbox.put_nowait(self.close_policy.late_delta(link.name, up, self.ledger.round, self.rounds.aggregating))
            self.maybe_start_round()         # (every site was dark: none runs)
            return
        after_s = time.time() - self.rounds.started_at
        self.clock.arrived(link.name, after_s)
        self.controller.observe(link.name, to_round + up.last_chunk_at, m.compute_s)
        self.rounds.arrived_s.append(after_s)
        self._bound_round()
        self._maybe_finish_round()
        self._maybe_close_early()

    def _bound_round(self) -> None:
        """Bring the round's deadline forward: a round that started untimed to what its first half's
        arrivals allow; with schedule.quorum_share, once its quorum is in (rounds.py)."""
        r = self.rounds
        bound = (self.clock.first_round_bound_s(r.arrived_s, len(r.members)) if r.untimed
                 else self.clock.quorum_bound_s(r.arrived_s, r.members))
        if bound is not None and bound < self.rounds.deadline_s:
            self.rounds.deadline_s = bound
            self._later(max(0.0, bound - (time.time() - self.rounds.started_at)), self._on_deadline, self.ledger.round)

    def _maybe_close_early(self) -> None:
        grace_s = self.close_policy.arm_early_close(self.ledger.round, time.time())
        if grace_s is not None:
            self._later(grace_s + 0.001, self._close_early, self.ledger.round)

    def _close_early(self, round_: int) -> None:
        if round_ != self.ledger.round or self.rounds.aggregating:
            return
        wait_s = self.close_policy.early_wait_s(round_, time.time(), time.perf_counter())
        if wait_s == 0.0:
            self._maybe_finish_round()
        elif wait_s is not None:        # chunks still flowing: ask again once they may have stopped
            self._later(wait_s + 0.001, self._close_early, round_)

    def _maybe_finish_round(self) -> None:
        """Aggregate once every site in the round has sent its delta, or at the deadline those that did
        (or, with recovery.loss_budget, early: once what is missing is within it), in a task of its own:
        not one of the stream of the site whose delta completed the round (if that site's connection
        drops, its stream's tasks are cancelled, and the round with them)."""
        early = self.close_policy.closes_early(self.ledger.round, time.time(), time.perf_counter())
        if self.rounds.close(self.close_policy.counts_partial(self.ledger.round), early):
            self.round_task = asyncio.create_task(self._finish_round())

    def on_link_probe(self, link: SiteLink, p: LinkProbe) -> None:
        """RTTs the site measured: the one message the protocol does not bound per round, so rate-limited."""
        link.check_probe(p)
        if p.rtt_ms:
            self.recorder.emit("link_rtt", site=link.name, times=list(p.t), rtt_ms=list(p.rtt_ms))

    def on_hash_report(self, link: SiteLink, h: HashReport) -> None:
        """A site's hash after applying round h.round's update: each committed round at most once, in order."""
        if not link.check_hash_report(h, self.ledger.round):
            return
        owed = self.rounds.heard_from(link.name, h.round)
        if owed is not None:        # it kept that delta (its round closed before it went): recorded
            self.close_policy.kept_delta(link.name, owed, self.ledger.round)
        expected = self.ledger.hashes.get(h.round + 1)
        ok = expected == h.model_hash
        self.recorder.emit("hash_check", round=h.round, site=link.name, ok=ok, site_hash=h.model_hash,
                           ps_hash=expected)
        if ok and h.round + 1 == self.cfg.train.rounds:
            self.sites.holds_final(link.name)
        if ok and link.ready and h.round + 1 == self.ledger.round:
            self._admit_to_round(link)    # a rejoined or dark site that caught up with the rounds it missed
            self.maybe_start_round()
        if not ok and link.ready:          # one resync at a time: reports during a download change nothing
            self.sites.resync(link, h, expected)

    # ------------------------------------------------------------ commit

    async def _finish_round(self) -> None:
        try:
            committed = await self.committer.commit({s: self.rounds.uploads[s] for s in sorted(self.rounds.members)},
                                                    self.rounds.take_stale(self.ledger.round), self.rounds.late,
                                                    self.rounds.started_at, self.rounds.close_reason,
                                                    self.close_policy.counts_partial(self.ledger.round),
                                                    self.close_policy.splits_update(self.ledger.round),
                                                    self.controller.update_mode())
        except Exception as e:  # a bug, not bad input (that is rejected per site): say so, go on
            log.exception("round %d failed to commit", self.ledger.round)
            self.recorder.emit("error", code="round_failed", message=f"round {self.ledger.round} failed to commit: {e!r}")
            self.rounds.finish()
            self.maybe_start_round()
            return
        self._announce(committed)

    def _announce(self, c: Committed) -> None:
        """Tell every site of the committed round; start the next, or end the run."""
        self.rounds.committed(c.round, c.late_shares, c.counted_chunks)
        for site, outcome in c.outcomes.items():     # screened deltas: why, before the update
            if site in self.sites.links:
                self.sites.links[site].outbox.put_nowait(outcome)
        # Every site that holds the round's starting model applies the update, late ones included; a
        # site that comes back later holding that model gets it from the catch-up (no await between).
        self.catchup.add(c.round, c.update, c.result)
        head = c.update[:len(c.update) - c.tail]
        result = dataclasses.replace(c.result, tail_chunks=c.tail) if c.tail else c.result
        # a site that rejoined during the aggregation gets the model instead
        heard = self.sites.heard()
        for link in heard:
            for chunk in head:
                link.outbox.put_nowait(chunk)
            link.outbox.put_nowait(result)
        self.rounds.finish()
        self.last_commit_at = time.time()
        self.sites.send_awaited_models()
        trim_heap()                             # the commit's scratch memory, back while the sites train
        if c.finished:
            self.recorder.emit("run_end", rounds=self.ledger.round, val_loss=self.ledger.val_loss)
            log.info("run finished: %d rounds, validation loss %.4f", self.ledger.round, self.ledger.val_loss)
            self.done.set()
        else:
            self.maybe_start_round()
        for link in heard:                  # the update's tail: after the next RoundStart (ps/downlink.py)
            for chunk in c.update[len(head):]:
                link.outbox.put_nowait(chunk)
