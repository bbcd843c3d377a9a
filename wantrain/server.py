"""The parameter server: a domain object (ParameterServer) and a thin gRPC adapter (Servicer).

ParameterServer holds the global model and runs the rounds. It knows nothing of gRPC: each
connected site is a `SiteLink` with an outbound queue of domain messages, and tests can drive
it directly. Servicer turns the gRPC stream of a site into calls on ParameterServer and the
site's queue back into wire messages; `serve()` runs both on an asyncio gRPC server.

A round: when every site is connected and has said it is Ready (its model loaded), the PS
sends RoundStart; each site answers with its delta chunks and RoundMetrics. When every delta is
in, or at the round's deadline those that are (see rounds.py), the PS averages them (weighted by
tokens), takes the outer Nesterov step, encodes the update with its own error feedback, applies
exactly the decoded update to its replica, checkpoints, and sends the update chunks and a
RoundResult (with the new parameter hash) to every site. Late deltas are dropped or applied in
a later round; a site that (re)joins mid-round trains in it with what is left of the budget.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np
import torch

from .auth import Authenticator
from .checkpoint import CHECKPOINT_NAME, load_checkpoint, save_checkpoint
from .codec import Codec, EncodeStats, ErrorFeedback, Extracted, plan_chunks
from .config import CodecConfig, RunConfig
from .data import eval_batches, load_run_data
from .download import ModelDownload, live_views
from .errors import CodecError, ConfigError, NonFiniteDeltaError, ProtocolError, RejectedError
from .messages import (DELTA, PROTOCOL_VERSION, UPDATE, ErrorMessage, HashReport, Join, LinkProbe, Ready,
                       RoundMetrics, RoundResult, RoundStart, TensorChunk, Welcome)
from .models import build_model, count_parameters
from .outer import OuterNesterov
from .replica import flat_copy, load_flat, named_params, param_hash
from .rounds import MAX_STALENESS, RoundClock, stale_weight
from .telemetry import Recorder
from .tls import TLSServer
from . import wire

__all__ = ["ParameterServer", "Servicer", "serve", "SiteLink", "server_options"]

log = logging.getLogger("wantrain.ps")


@dataclass
class SiteLink:
    """One connected site, as the PS sees it."""

    name: str
    index: int
    device: str
    outbox: asyncio.Queue = field(default_factory=asyncio.Queue)
    closed: bool = False
    ready: bool = False        # holds a model and can train (it said so after its download)
    joined_at: float = field(default_factory=time.time)


@dataclass
class _Upload:
    """A site's delta for one round, as it arrives."""

    round: int
    count: int = -1
    chunks: dict[int, TensorChunk] = field(default_factory=dict)
    wire_bytes: int = 0
    elements: int = 0
    metrics: RoundMetrics | None = None
    delta: list[Extracted] | None = None   # checked; int8 symbols + scales: a quarter of fp32


class ParameterServer:
    """Holds the global model and runs DiLoCo rounds over the connected sites."""

    def __init__(self, cfg: RunConfig, run_dir: str | Path | None = None, run_id: str | None = None,
                 exit_when_done: bool = True, resume: bool = True, auth: Authenticator | None = None,
                 stalls: dict[str, float] | None = None) -> None:
        self.cfg = cfg
        self.auth = auth or Authenticator()
        self.stalls = dict(stalls or {})       # fault-injection points for tests: phase -> seconds
        self.run_id = run_id or time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
        self.run_dir = Path(run_dir) if run_dir else None
        self.recorder = Recorder(self.run_dir / "events.jsonl" if self.run_dir else None)
        self.exit_when_done = exit_when_done

        tok, corpus = load_run_data(cfg.data)
        self.model = build_model(cfg.model.preset, tok.vocab_size, cfg.model.seed)
        self.val = eval_batches(corpus.val, cfg.train.batch_size, cfg.model.block_size, cfg.train.eval_batches)
        self.shapes = {k: p.numel() for k, p in named_params(self.model).items()}
        self.num_params = sum(self.shapes.values())
        self.plan = plan_chunks(self.shapes, cfg.codec.chunk_elements())   # every delta and update
        self.delta_chunks = len(self.plan)
        self.codec = Codec(cfg.codec)
        self.model_codec = Codec(CodecConfig(mode="fp32", chunk_bytes=cfg.codec.chunk_bytes,
                                             quant_block=cfg.codec.quant_block))
        self.outer = OuterNesterov(cfg.train.outer_lr, cfg.train.outer_momentum)
        self.feedback = ErrorFeedback() if cfg.codec.error_feedback else None
        self.clock = RoundClock(cfg.train)

        self.round = 0                        # committed rounds
        self.hash = param_hash(self.model)
        self.hashes: dict[int, str] = {0: self.hash}
        self.registry: dict[str, int] = {}    # every site ever seen -> index
        self.data_positions: dict[str, int] = {}   # batches each site has drawn, as last reported
        self.links: dict[str, SiteLink] = {}  # connected now
        self.in_round: set[str] = set()       # sites expected to deliver for the current round
        self.uploads: dict[str, _Upload] = {}
        self.late: dict[str, _Upload] = {}    # sites that missed a deadline and are still pushing
        self.stale: dict[str, _Upload] = {}   # complete late deltas for the next aggregation
        self.round_started_at = 0.0
        self.past_deadline = False
        self.round_members: set[str] = set()  # sites a round started with (the last or current one)
        self.last_commit_at = time.time()
        self._timers: list[asyncio.TimerHandle] = []
        self.aggregating = False
        self.round_task: asyncio.Task | None = None
        self.downloads: list[ModelDownload] = []   # in flight, reading the live parameters
        self.awaiting_model: set[str] = set()
        self.told_finished: set[str] = set()  # sites that know the run is over
        self.done = asyncio.Event()
        self.closing = asyncio.Event()         # the server is about to stop: end Watch streams
        self.ckpt_path = self.run_dir / CHECKPOINT_NAME if self.run_dir else None
        saved = load_checkpoint(self.ckpt_path) if (self.ckpt_path and resume) else None
        if saved is not None:
            self._restore(saved)
            self.recorder.emit("restart", round=self.round, run_id=self.run_id)
            log.info("resumed run %s from its checkpoint at round %d (%s)", self.run_id, self.round, self.hash)
            if self.round >= cfg.train.rounds:
                self.done.set()
        else:
            self.val_loss = self.evaluate()
            self.recorder.emit("run_start", run_id=self.run_id, config=cfg.to_dict(),
                               num_params=count_parameters(self.model), val_loss=self.val_loss)

    # ------------------------------------------------------------ checkpoints

    def _checkpoint_state(self) -> dict:
        return {"run_id": self.run_id, "config_json": self.cfg.to_json(), "round": self.round,
                "params_np": flat_copy(self.model), "outer_np": self.outer.state_dict(),
                "feedback_np": self.feedback.state_dict() if self.feedback else {},
                "hashes": dict(self.hashes), "registry": dict(self.registry),
                "data_positions": dict(self.data_positions), "val_loss": self.val_loss}

    def _restore(self, saved: dict) -> None:
        if RunConfig.from_json(saved["config_json"]) != self.cfg:
            raise ConfigError(f"{self.ckpt_path} was written by a run with a different config; "
                              "use a new run folder, or the config of that run")
        load_flat(self.model, saved["params_np"])
        self.outer.load_state_dict(saved["outer_np"])
        if self.feedback is not None:
            self.feedback.load_state_dict(saved["feedback_np"])
        self.run_id, self.round, self.val_loss = saved["run_id"], int(saved["round"]), float(saved["val_loss"])
        self.hashes = {int(k): v for k, v in saved["hashes"].items()}
        self.registry = dict(saved["registry"])
        self.round_members = set(self.registry)      # after a restart, give every site time to return
        self.data_positions = {k: int(v) for k, v in saved.get("data_positions", {}).items()}
        self.hash = param_hash(self.model)
        if self.hash != self.hashes.get(self.round):
            raise ConfigError(f"{self.ckpt_path} is damaged: its parameters hash to {self.hash}, "
                              f"it says {self.hashes.get(self.round)}")

    def _save_checkpoint(self) -> None:
        t0 = time.time()
        save_checkpoint(self.ckpt_path, self._checkpoint_state(), before_rename=lambda: self._stall("checkpoint"))
        self.recorder.emit("checkpoint", round=self.round, seconds=time.time() - t0,
                           bytes=self.ckpt_path.stat().st_size)

    def _stall(self, phase: str) -> None:
        """A fault-injection point: tests kill the process while it sleeps here ("phase" or "phase@round")."""
        seconds = self.stalls.get(f"{phase}@{self.round}", self.stalls.get(phase, 0.0))
        if seconds:
            self.recorder.emit("stall", phase=phase, round=self.round, seconds=seconds)
            log.warning("stalling %.1f s in phase %s (fault injection)", seconds, phase)
            time.sleep(seconds)

    # ------------------------------------------------------------ site lifecycle

    def join(self, msg: Join) -> SiteLink:
        """Admit a site or raise RejectedError; queues the Welcome and the model download."""
        if msg.protocol_version != PROTOCOL_VERSION:
            raise RejectedError("protocol_version", f"site {msg.site!r} speaks wire protocol {msg.protocol_version}, "
                                                    f"this parameter server speaks {PROTOCOL_VERSION}")
        why = self.auth.check(msg.site, msg.token)
        if why is not None:
            log.warning("refused site %r: %s", msg.site, why)
            raise RejectedError("unauthenticated", f"site {msg.site!r} is not allowed to join this run "
                                                   "(unknown site or wrong token)")
        if msg.site in self.links:
            raise RejectedError("duplicate_site", f"a site named {msg.site!r} is already connected; "
                                                  "each site needs its own name")
        if self.cfg.sites and msg.site not in self.cfg.sites:
            raise RejectedError("unknown_site", f"{msg.site!r} is not one of the run's sites "
                                                f"({', '.join(self.cfg.sites)})")
        if msg.site not in self.registry and len(self.registry) >= self.cfg.num_sites:
            raise RejectedError("run_full", f"the run already has its {self.cfg.num_sites} sites "
                                            f"({', '.join(sorted(self.registry))}); {msg.site!r} is not one of them")
        if self.done.is_set():
            self.told_finished.add(msg.site)
            raise RejectedError("run_finished", f"the run finished after {self.round} rounds")
        resumed = msg.site in self.registry
        # Named sites keep their place (and data shard) whatever order they join in.
        index = self.registry.setdefault(msg.site, self.cfg.sites.index(msg.site) if self.cfg.sites
                                         else len(self.registry))
        link = SiteLink(msg.site, index, msg.device)
        self.links[msg.site] = link
        self.recorder.emit("join", site=msg.site, site_index=index, device=msg.device, resumed=resumed,
                           data_position=self.data_positions.get(msg.site, 0))
        log.info("site %s joined (index %d, %s)%s", msg.site, index, msg.device, " again" if resumed else "")
        if self.aggregating:       # the model is about to change: send it after the round commits
            self.awaiting_model.add(link.name)
        else:
            self._send_model(link)
        return link

    def on_ready(self, link: SiteLink, msg: Ready) -> None:
        """The site loaded its model: from now on it counts for rounds (and joins a running one)."""
        if self.hashes.get(msg.round) != msg.model_hash or msg.round > self.round:
            raise ProtocolError(f"{link.name!r} says it loaded the model of round {msg.round} with hash "
                                f"{msg.model_hash}; the PS has {self.hashes.get(msg.round)}")
        link.ready = True
        self.recorder.emit("ready", site=link.name, round=msg.round, since_join_s=time.time() - link.joined_at)
        if msg.round == self.round:      # else an update is on its way to it, then the next RoundStart
            self._admit_to_round(link)
        self.maybe_start_round()

    def _admit_to_round(self, link: SiteLink) -> None:
        """A site that (re)joins while a round runs takes part in it, with what is left of the budget."""
        if not self.in_round or self.aggregating or link.name in self.in_round:
            return
        budget = self.cfg.train.round_budget_s
        train_s = 0.0
        if budget:
            train_s = budget - (time.time() - self.round_started_at)
            if train_s < 0.1 * budget:      # too little left to be worth it: wait for the next round
                return
        self.in_round.add(link.name)
        self.uploads[link.name] = _Upload(self.round)
        link.outbox.put_nowait(RoundStart(self.round, self.hash, train_s))

    def leave(self, link: SiteLink, reason: str) -> None:
        if self.links.get(link.name) is not link:
            return
        link.closed = True
        del self.links[link.name]
        self.uploads.pop(link.name, None)
        self.late.pop(link.name, None)
        self.in_round.discard(link.name)
        self.recorder.emit("leave", site=link.name, reason=reason)
        log.info("site %s left: %s", link.name, reason)
        self._maybe_finish_round()        # the others may all be done already

    def _send_model(self, link: SiteLink) -> None:
        link.ready = False
        welcome = Welcome(self.run_id, link.index, self.cfg, self.round, self.hash, 0,
                          self.data_positions.get(link.name, 0))
        def progress(sent: int, chunks: int, nbytes: int) -> None:     # for watchers: a tenth more is out
            self.recorder.emit("download", site=link.name, chunks=sent, of=chunks, mb=nbytes / 1e6)

        download = ModelDownload(welcome, live_views(self.model), self.model_codec, on_progress=progress)
        self.downloads = [d for d in self.downloads if not d.finished] + [download]
        link.outbox.put_nowait(download)

    async def _freeze_downloads(self) -> None:
        """Before the parameters change: give downloads still in flight one shared frozen copy."""
        active = [d for d in self.downloads if not d.finished]
        self.downloads = active
        if active:
            frozen = await asyncio.to_thread(flat_copy, self.model)
            for d in active:
                d.source = frozen
            self.recorder.emit("downloads_frozen", round=self.round, downloads=len(active))

    # ------------------------------------------------------------ rounds

    def _later(self, delay_s: float, fn, *args) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:        # driven without an event loop (unit tests): no timers
            return
        self._timers = [t for t in self._timers if not t.cancelled()]
        self._timers.append(loop.call_later(delay_s, fn, *args))

    def maybe_start_round(self) -> None:
        ready = {name for name, link in self.links.items() if link.ready}
        if self.in_round or self.aggregating or self.done.is_set() or not ready:
            return
        if len(ready) < self.cfg.num_sites:
            # Wait for everyone at the start of a run. Later (a round has been committed), a
            # missing site must not hold the others up: give a site that was in the last round
            # (it may be restarting) quorum_wait_s to come back, then go on without it.
            if self.round == 0:
                return
            wait = self.cfg.train.quorum_wait_s - (time.time() - self.last_commit_at)
            if wait > 0 and (set(self.registry) - ready) & self.round_members:
                self._later(wait + 0.01, self.maybe_start_round)
                return
        self.in_round = ready
        self.round_members = set(ready)
        self.uploads = {name: _Upload(self.round) for name in self.in_round}
        self.round_started_at = time.time()
        self.past_deadline = False
        deadline = self.clock.deadline_s()
        self.recorder.emit("round_start", round=self.round, sites=sorted(self.in_round), deadline_s=deadline,
                           budget_s=self.cfg.train.round_budget_s)
        for name in sorted(self.in_round):
            self.links[name].outbox.put_nowait(RoundStart(self.round, self.hash, self.cfg.train.round_budget_s))
        self._later(deadline, self._on_deadline, self.round)

    def _on_deadline(self, round_: int) -> None:
        if round_ != self.round or self.aggregating or not self.in_round:
            return
        self.past_deadline = True
        missing = sorted(s for s in self.in_round if self.uploads[s].metrics is None)
        self.recorder.emit("deadline", round=round_, deadline_s=time.time() - self.round_started_at,
                           missing=missing, policy=self.cfg.train.late_policy)
        log.warning("round %d: deadline passed, %d site(s) missing: %s", round_, len(missing), ", ".join(missing))
        self._maybe_finish_round()

    def _upload_for(self, link: SiteLink, round_: int) -> _Upload:
        up = self.uploads.get(link.name)
        if up is not None and round_ == self.round and link.name in self.in_round and not self.aggregating:
            return up
        late = self.late.get(link.name)
        if late is not None and late.round == round_:
            return late
        raise ProtocolError(f"delta for round {round_} from {link.name!r}, which is not in that round "
                            f"(the current round is {self.round})")

    def on_chunk(self, link: SiteLink, c: TensorChunk) -> None:
        """Accept one delta chunk after checking that it belongs; raises ProtocolError otherwise."""
        if c.kind != DELTA:
            raise ProtocolError(f"sites send delta chunks only, got a {c.kind} chunk")
        up = self._upload_for(link, c.round)
        numel = self.shapes.get(c.spec.tensor)
        if numel is None:
            raise ProtocolError(f"delta chunk names unknown tensor {c.spec.tensor!r}")
        if c.spec.offset + c.spec.length > numel or c.spec.length == 0:
            raise ProtocolError(f"delta chunk [{c.spec.offset}, {c.spec.offset + c.spec.length}) is outside "
                                f"tensor {c.spec.tensor!r} of {numel} elements")
        if c.index in up.chunks:
            raise ProtocolError(f"delta chunk {c.index} of round {c.round} arrived twice")
        # Caps, so that one site holds at most about one model's worth of delta in the PS's memory:
        # the chunk count is the codec's plan, each chunk at most fp32-sized (+ headers), and
        # all chunks together cover at most the model's elements.
        if c.count != self.delta_chunks:
            raise ProtocolError(f"a delta comes in {self.delta_chunks} chunks here, this one says {c.count}")
        if c.data.wire_bytes > 4 * c.spec.length + 65536:
            raise ProtocolError(f"delta chunk {c.index} carries {c.data.wire_bytes} bytes for {c.spec.length} elements")
        if up.elements + c.spec.length > self.num_params:
            raise ProtocolError(f"delta chunks add up to more elements than the model's {self.num_params}")
        up.count = c.count
        up.chunks[c.index] = c
        up.wire_bytes += c.data.wire_bytes
        up.elements += c.spec.length

    async def on_metrics(self, link: SiteLink, m: RoundMetrics) -> None:
        up = self._upload_for(link, m.round)
        if len(up.chunks) != up.count or m.chunks != up.count:
            raise ProtocolError(f"metrics after {len(up.chunks)} of {max(up.count, m.chunks)} delta chunks")
        if m.tokens == 0 or m.steps == 0:
            raise ProtocolError(f"round {m.round} metrics from {link.name!r} report no training")
        # Decode and check this site's delta now, while others still train: a bad delta is
        # rejected here, for this site alone, and never reaches the aggregate.
        try:
            delta = await asyncio.to_thread(self._assemble, link.name, up)
        except NonFiniteDeltaError as e:
            self.recorder.emit("quarantine", round=m.round, site=link.name, message=str(e))
            raise
        self.data_positions[link.name] = max(self.data_positions.get(link.name, 0), m.data_position)
        up.delta, up.metrics = delta, m
        up.chunks = {i: None for i in up.chunks}     # the decoded delta is kept, the wire bytes need not be
        fields = {k: getattr(m, k) for k in m.__dataclass_fields__ if k != "round"}
        late = self.late.get(link.name) is up
        self.recorder.emit("site_round", round=m.round, site=link.name, late=late,
                           ratio=m.raw_bytes / m.wire_bytes if m.wire_bytes else 0.0,
                           received_wire_bytes=up.wire_bytes, **fields)
        if late:
            del self.late[link.name]
            self._on_late_delta(link.name, up)
            return
        if self.uploads.get(link.name) is not up:      # the site left or the round moved on meanwhile
            return
        self.clock.arrived(time.time() - self.round_started_at)
        self._maybe_finish_round()

    def _on_late_delta(self, site: str, up: _Upload) -> None:
        t = self.cfg.train
        stale_by = self.round - up.round
        keep = t.late_policy == "stale" and stale_by <= MAX_STALENESS
        self.recorder.emit("late_delta", round=up.round, site=site, rounds_late=stale_by,
                           action="deferred" if keep else "dropped", policy=t.late_policy)
        if keep:
            self.stale[site] = up

    def _maybe_finish_round(self) -> None:
        """Aggregate once every site in the round has sent its delta, or at the deadline those that did.

        The aggregation runs as its own task: it must not belong to the stream of the site whose
        delta happened to complete the round (if that site's connection drops, its stream's
        tasks are cancelled, and the round with them)."""
        if self.aggregating or not self.in_round:
            return
        arrived = {s for s in self.in_round if self.uploads[s].metrics is not None}
        if arrived == self.in_round or (self.past_deadline and arrived):
            for s in sorted(self.in_round - arrived):      # missed the deadline: their delta is late
                self.late[s] = self.uploads.pop(s)
            self.in_round = arrived
            self.aggregating = True
            self.round_task = asyncio.create_task(self._finish_round())

    def on_link_probe(self, link: SiteLink, p: LinkProbe) -> None:
        if p.rtt_ms:
            self.recorder.emit("link_rtt", site=link.name, t=list(p.t), rtt_ms=list(p.rtt_ms))

    def on_hash_report(self, link: SiteLink, h: HashReport) -> None:
        expected = self.hashes.get(h.round + 1)
        ok = expected == h.model_hash
        self.recorder.emit("hash_check", round=h.round, site=link.name, ok=ok, site_hash=h.model_hash,
                           ps_hash=expected)
        if ok and link.ready and h.round + 1 == self.round:
            self._admit_to_round(link)    # a rejoined site that caught up with the rounds it missed
        if not ok:
            self.recorder.emit("error", site=link.name, code="replica_mismatch",
                               message=f"site {link.name} has hash {h.model_hash} after round {h.round}, "
                                       f"the PS has {expected}; resyncing the site")
            log.error("replica mismatch at %s after round %d; resyncing", link.name, h.round)
            self._send_model(link)

    async def _finish_round(self) -> None:
        try:
            await self._commit_round()
        except Exception as e:  # a bug, not bad input (that is rejected per site): say so, go on
            log.exception("round %d failed to commit", self.round)
            self.recorder.emit("error", code="round_failed", message=f"round {self.round} failed to commit: {e!r}")
            self.in_round, self.uploads, self.aggregating = set(), {}, False
            self.maybe_start_round()

    async def _commit_round(self) -> None:
        uploads = {s: self.uploads[s] for s in sorted(self.in_round)}
        stale = {s: up for s, up in sorted(self.stale.items()) if self.round - up.round <= MAX_STALENESS}
        self.stale = {}
        await self._freeze_downloads()
        t0 = time.time()
        result, stats, update_chunks = await asyncio.to_thread(self._aggregate, uploads, stale)
        aggregate_s = time.time() - t0
        r = self.round
        self.round += 1
        self.hash = result.model_hash
        self.hashes[self.round] = self.hash
        self.val_loss = result.val_loss
        every = self.cfg.train.checkpoint_every
        if self.ckpt_path and every and (self.round % every == 0 or self.round >= self.cfg.train.rounds):
            await asyncio.to_thread(self._save_checkpoint)   # commit before anyone hears of the round
        round_s = time.time() - self.round_started_at
        per_site = {s: {"steps": up.metrics.steps, "tokens": up.metrics.tokens, "compute_s": up.metrics.compute_s,
                        "idle_s": max(0.0, round_s - up.metrics.compute_s)} for s, up in uploads.items()}
        self.recorder.emit("round_end", round=r, val_loss=result.val_loss, model_hash=result.model_hash,
                           sites=list(result.sites), late_sites=list(result.late_sites), missed=sorted(self.late),
                           per_site=per_site, raw_bytes=stats.raw_bytes, wire_bytes=stats.wire_bytes,
                           ratio=stats.ratio, huffman_bits_per_symbol=stats.huffman_bits_per_symbol,
                           encode_s=stats.seconds, aggregate_s=aggregate_s, round_s=round_s)
        # Every site that holds the round's starting model applies the update, late ones included.
        for name, link in self.links.items():
            if name in self.awaiting_model:               # rejoined during aggregation: gets the model
                continue
            for c in update_chunks:
                link.outbox.put_nowait(c)
            link.outbox.put_nowait(result)
        if self.round >= self.cfg.train.rounds:
            self.told_finished.update(self.links)
        self.in_round = set()
        self.uploads = {}
        self.aggregating = False
        self.last_commit_at = time.time()
        for name in sorted(self.awaiting_model):
            if name in self.links:
                self._send_model(self.links[name])
        self.awaiting_model.clear()
        if self.round >= self.cfg.train.rounds:
            self.recorder.emit("run_end", rounds=self.round, val_loss=self.val_loss)
            log.info("run finished: %d rounds, validation loss %.4f", self.round, self.val_loss)
            self.done.set()
        else:
            self.maybe_start_round()

    def _aggregate(self, uploads: dict[str, _Upload], stale: dict[str, _Upload]
                   ) -> tuple[RoundResult, EncodeStats, list[TensorChunk]]:
        """Average, outer step, encode, apply, one chunk of the plan at a time: runs in a worker thread.

        Working chunk by chunk keeps the PS's memory at the model, the outer momentum, the
        downlink residual and each site's int8 delta, with no whole-model temporaries. Every
        element sees the same float32 operations as a whole-tensor computation would."""
        self._stall("aggregate")
        t = self.cfg.train
        parts = {s: up.delta for s, up in uploads.items()}
        weights = {s: float(up.metrics.tokens) for s, up in uploads.items()}
        for s, up in stale.items():            # keyed apart: a site may have a fresh delta too
            parts[f"{s}@{up.round}"] = up.delta
            weights[f"{s}@{up.round}"] = stale_weight(up.metrics.tokens, self.round - up.round, t.staleness_discount)
        keys = sorted(parts)
        total = sum(weights[k] for k in keys)
        coef = {k: np.float32(weights[k] / total) for k in keys}
        params = live_views(self.model)
        stats = EncodeStats()
        msgs = []
        for i, spec in enumerate(self.plan):
            part = slice(spec.offset, spec.offset + spec.length)
            avg = np.zeros(spec.length, np.float32)
            for k in keys:                      # sum_k w_k d_k / sum w, sites in name order
                avg += coef[k] * parts[k][i].values()
            update = self.outer.update_part(spec.tensor, self.shapes[spec.tensor], part, avg)
            if self.feedback is not None:
                update = self.feedback.compensate_part(spec.tensor, part, update)
            t0 = time.perf_counter()
            enc, sent = self.codec.encode(update, stats)
            stats.seconds += time.perf_counter() - t0
            if self.feedback is not None:
                self.feedback.record_part(spec.tensor, self.shapes[spec.tensor], part, update, sent)
            params[spec.tensor][part] += sent   # one float32 add per element, as every site does
            msgs.append(TensorChunk(UPDATE, self.round, i, len(self.plan), spec, enc))
        h = param_hash(self.model)
        val = self.evaluate()
        return RoundResult(self.round, h, tuple(uploads), val, tuple(stale)), stats, msgs

    def _assemble(self, site: str, up: _Upload) -> list[Extracted]:
        """Check a complete delta: the plan's chunks in order, decodable, finite. Keeps it as int8."""
        ordered = [up.chunks[i] for i in range(up.count)]
        for c, spec in zip(ordered, self.plan):
            if c.spec != spec:
                raise ProtocolError(f"delta chunk {c.index} from {site} covers {c.spec.tensor!r}"
                                    f"[{c.spec.offset}:{c.spec.offset + c.spec.length}], the plan says "
                                    f"{spec.tensor!r}[{spec.offset}:{spec.offset + spec.length}]")
        parts = Codec.extract_many([c.data for c in ordered])
        for c, x in zip(ordered, parts):
            if not x.finite():
                raise NonFiniteDeltaError(f"delta from {site} has non-finite values in {c.spec.tensor!r}; "
                                          f"the site is quarantined for round {up.round}")
        return parts

    @torch.no_grad()
    def evaluate(self) -> float:
        if not self.val:
            return math.nan
        self.model.eval()
        losses = [torch.nn.functional.cross_entropy(self.model(x).flatten(0, 1), y.flatten()).item() for x, y in self.val]
        self.model.train()
        return float(np.mean(losses))


# ---------------------------------------------------------------- gRPC adapter

_REJECT_STATUS = {
    "protocol_version": grpc.StatusCode.FAILED_PRECONDITION,
    "duplicate_site": grpc.StatusCode.ALREADY_EXISTS,
    "run_full": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "run_finished": grpc.StatusCode.FAILED_PRECONDITION,
    "unknown_site": grpc.StatusCode.PERMISSION_DENIED,
    "unauthenticated": grpc.StatusCode.UNAUTHENTICATED,
}


class Servicer(wire.pb_grpc.ParameterServerServicer):
    """Thin adapter: wire messages in and out, all decisions in ParameterServer."""

    def __init__(self, ps: ParameterServer) -> None:
        self.ps = ps

    async def Session(self, request_iterator, context):  # noqa: N802 (gRPC method name)
        # An async generator: gRPC writes what we yield, so no write is ever in flight when the
        # handler ends. A reader task feeds the site's messages to the PS.
        ps = self.ps
        peer = context.peer()
        try:
            first = wire.site_message_from_proto(await anext(request_iterator))
        except (StopAsyncIteration, ProtocolError) as e:
            log.warning("rejected stream from %s: %s", peer, e or "closed before joining")
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"the first message must be a valid Join ({e})")
            return
        if not isinstance(first, Join):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first message must be a Join")
            return
        try:
            link = ps.join(first)
        except RejectedError as e:
            log.warning("rejected site %r from %s: %s", first.site, peer, e)
            ps.recorder.emit("error", site=first.site, code=e.code, message=str(e))
            yield wire.server_message(ErrorMessage(e.code, str(e)))
            await context.abort(_REJECT_STATUS.get(e.code, grpc.StatusCode.FAILED_PRECONDITION), str(e))
            return

        failure: list[Exception] = []

        async def read() -> None:
            try:
                async for raw in request_iterator:
                    msg = wire.site_message_from_proto(raw)
                    if isinstance(msg, TensorChunk):
                        ps.on_chunk(link, msg)
                    elif isinstance(msg, RoundMetrics):
                        await ps.on_metrics(link, msg)
                    elif isinstance(msg, HashReport):
                        ps.on_hash_report(link, msg)
                    elif isinstance(msg, Ready):
                        ps.on_ready(link, msg)
                    elif isinstance(msg, LinkProbe):
                        ps.on_link_probe(link, msg)
                    else:
                        raise ProtocolError(f"unexpected {type(msg).__name__} after joining")
            except (ProtocolError, CodecError) as e:
                failure.append(e)
                log.warning("site %s sent a bad message: %s", link.name, e)
                ps.recorder.emit("error", site=link.name, code="invalid_message", message=str(e))
            except Exception as e:  # the connection broke
                failure.append(ConnectionError(str(e) or type(e).__name__))
            finally:
                link.outbox.put_nowait(None)

        reader = asyncio.create_task(read())
        try:
            while True:
                msg = await link.outbox.get()
                if msg is None:
                    break
                if isinstance(msg, ModelDownload):     # chunks encoded one at a time as they go out
                    try:
                        for part in msg.messages():
                            yield wire.server_message(part)
                    finally:
                        msg.finished = True
                    continue
                yield wire.server_message(msg)
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            reason = f"rejected: {failure[0]}" if failure else "stream closed by the site"
            ps.leave(link, reason)
        if failure and not isinstance(failure[0], ConnectionError):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(failure[0]))

    async def Ping(self, request, context):  # noqa: N802
        return wire.pb.PingReply(server_time=time.time())

    async def Watch(self, request, context):  # noqa: N802
        rec = self.ps.recorder
        loop = asyncio.get_running_loop()
        wake = asyncio.Event()
        unsubscribe = rec.subscribe(lambda: loop.call_soon_threadsafe(wake.set))
        seq = request.from_seq
        closing = asyncio.ensure_future(self.ps.closing.wait())
        try:
            while True:
                wake.clear()
                for line in rec.since(seq):
                    yield wire.event_to_proto(seq, line)
                    seq += 1
                if self.ps.closing.is_set():
                    return
                waiter = asyncio.ensure_future(wake.wait())
                await asyncio.wait([waiter, closing], return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
        finally:
            closing.cancel()
            unsubscribe()


def server_options() -> list[tuple[str, int]]:
    """Channel options for the PS side: message caps, and tolerant keepalive (see DESIGN.md)."""
    return [
        ("grpc.max_receive_message_length", wire.MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", wire.MAX_MESSAGE_BYTES),
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.keepalive_timeout_ms", 20_000),
        ("grpc.http2.ping_timeout_ms", 120_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", 5_000),
        ("grpc.http2.max_ping_strikes", 0),
    ]


async def serve(ps: ParameterServer, host: str = "127.0.0.1", port: int = 0,
                port_file: str | Path | None = None, linger_s: float = 1.0, straggler_wait_s: float = 20.0,
                tls: TLSServer | None = None) -> None:
    """Run the PS until the run is done (if exit_when_done) or forever; port 0 picks a free port.

    After the last round it waits (up to straggler_wait_s) for sites that were away at the end
    (a reset, an outage) to reconnect and be told the run is over, so none retries in vain.
    """
    server = grpc.aio.server(options=server_options())
    wire.pb_grpc.add_ParameterServerServicer_to_server(Servicer(ps), server)
    if tls is not None:
        bound = server.add_secure_port(f"{host}:{port}", tls.credentials())
    else:
        bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot listen on {host}:{port}")
    await server.start()
    log.info("parameter server %s listening on %s:%d (%s)", ps.run_id, host, bound,
             "plaintext" if tls is None else "TLS, client certificates required" if tls.client_ca else "TLS")
    if port_file:
        tmp = Path(str(port_file) + ".tmp")
        tmp.write_text(f"{bound}\n")
        tmp.replace(port_file)
    try:
        if ps.exit_when_done:
            await ps.done.wait()
            deadline = time.time() + 30
            while ps.links and time.time() < deadline:   # let sites receive the last result
                await asyncio.sleep(0.05)
            deadline = time.time() + straggler_wait_s
            while set(ps.registry) - ps.told_finished and time.time() < deadline:
                await asyncio.sleep(0.05)
            await asyncio.sleep(linger_s)                  # and watchers the last events
        else:
            await server.wait_for_termination()
    finally:
        ps.closing.set()            # watchers get their last events and end their streams
        await asyncio.sleep(0.2)
        await server.stop(grace=1.0)
        ps.recorder.close()
