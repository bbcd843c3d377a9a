"""A site: dials the parameter server, trains inner AdamW steps, pushes its delta, applies updates.

The site opens one gRPC stream to the PS, or one to each shard of a sharded PS (stream.py), always
outbound, and follows the PS's lead:

    Welcome + model chunks   load the global parameters (a fresh join, a rejoin or a resync); a
                             Welcome without chunks: keep them, the updates missed follow
                             (a catch-up, after the stream broke)
    RoundStart(r)            train `inner_steps` steps (or `train_s` seconds) from the global
                             model (schedule.py: with "overlap", some were taken ahead), send the
                             pseudo-gradient (start - end) through the codec (or the one
                             `codec` names) with error feedback, then the round's metrics
    update chunks + result   add exactly the decoded update, hash, report the hash
    DeltaOutcome             what the PS did with a delta it did not simply count, and why: logged

A round trains and pushes in a task of its own while the session goes on reading, so the site
hears at once when its round closes without it: the round's result comes before its delta went
(its link was dark past the deadline, or its RoundStart came late). It then stops after the
inner step under way: under `late_policy` "drop" the PS would drop the delta, so its change goes
into the next delta instead of onto the wire (under "rescale" it is let go: the others' mean stood
in for it); under "stale" and "zero-outside" it is pushed at once, a late delta.
Either way the site follows the results of the rounds it missed and takes part in the current
one as soon as the PS hears from it (it is not counted on until then: ps/rounds.py). If its round
counted the chunks that were in (recovery.partial_deltas), the rest of its push, the delta's tail,
goes on in the background beside the next rounds, which count on the site.

If the PS is not there (yet) or the stream breaks, the site retries with exponential backoff
and says so; when it reconnects it joins again under the same name.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from ..config import RunConfig
from ..errors import ConfigError, ProtocolError, Reject, RejectedError, ReplicaMismatchError
from ..runtime.faults import Stalls
from ..runtime.memory import trim_heap
from ..runtime.chunk_loss import ChunkLoss
from ..transport.roles import roles_of
from .probe import role_sensitivity
from ..models.params import named_params
from ..transport.messages import (MODEL, UPDATE, DeltaOutcome, ErrorMessage, HashReport, Join, LinkProbe, Ready,
                                  RoundResult, RoundStart, TensorChunk, Welcome)
from ..transport.tls import TLSClient
from .progress import DownloadProgress
from .replica import Replica
from .retry import FAILURES, Reconnect
from .schedule import Schedule
from .sharded import ShardMemory
from .stream import Stream, addresses, probe_rtt, session_stream
from .group import build_inner
from .hand import Hands, RoundInHand
from .train import InnerLoop
from .uplink import Uplink

__all__ = ["Site", "SiteOptions", "default_device"]

log = logging.getLogger("wantrain.site")


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


@dataclass(frozen=True)
class SiteOptions:
    ps: str                        # host:port of the parameter server (of each shard, comma-separated)
    name: str                      # unique within the run
    device: str = "auto"           # "auto" | "cpu" | "cuda" | "cuda:1" ...
    connect_timeout_s: float = 120.0  # give up if the PS cannot be reached for this long
    threads: int = 0               # torch CPU threads (0: torch's default)
    speed_factor: float = 1.0      # > 1 pads every inner step to emulate a slower machine
    probe_interval_s: float = 1.0  # Ping the PS this often to measure the link's RTT (0: never)
    link_rtt_ms: float = 0.0       # what is known of the link, to size gRPC timeouts
    link_mbps: float = 0.0
    token: str = field(default="", repr=False)   # per-site token or the run's shared secret
    stalls: tuple[tuple[str, float], ...] = ()    # fault injection for tests: (phase, seconds)
    tls: TLSClient | None = None   # None: plaintext (only where the PS allows it)
    tls_server_name: str = ""      # check the PS's certificate for this name instead of the address's
    # Delta chunks lost on purpose (tests, benchmarks): (rate, mean burst, seconds a lost one comes late).
    chunk_loss: tuple[float, float, float] = (0.0, 1.0, 30.0)
    codec: str = ""                # this site's delta encoding, one of the run's codec.delta_modes() ("": codec.mode)


class Site:
    """One site of a run (usually its own OS process: `wantrain worker`)."""

    def __init__(self, opts: SiteOptions) -> None:
        if opts.probe_interval_s and not opts.probe_interval_s >= 0.05:
            raise ConfigError(f"probe interval must be 0 (no probes) or at least 0.05 s, got {opts.probe_interval_s}")
        self.opts = opts
        self.addresses = addresses(opts.ps)
        if not self.addresses:
            raise ConfigError("no parameter server address given")
        self.shard_memory = ShardMemory()      # for a sharded PS (sharded.py)
        self.device = torch.device(default_device() if opts.device == "auto" else opts.device)
        if opts.threads:
            torch.set_num_threads(opts.threads)
        self.cfg: RunConfig | None = None
        self.model: torch.nn.Module | None = None
        self.inner: InnerLoop | None = None
        self.schedule: Schedule | None = None
        self.replica = Replica(opts.name)           # the global model it holds (the model trains)
        self.uplink: Uplink | None = None             # its deltas: error feedback, pushed, settled
        self.finished = False
        self.probes: list[tuple[float, float]] = []   # (Unix time, RTT ms) not yet reported
        self._probes_sent_at = -math.inf
        self.pushed_at: float | None = None           # when the last push ended (idle accounting)
        self.welcomed = False                         # this session got its Welcome (retry.py counts from there)
        self.stalls = Stalls(opts.stalls, log)
        self.hands = Hands(opts.name)                 # the round training or pushing now, and tails

    @property
    def round(self) -> int:
        """Committed rounds of the global model this site holds (0 before any)."""
        return self.replica.round

    @property
    def hash(self) -> str:
        return self.replica.hash

    # ------------------------------------------------------------ connection

    async def run(self) -> None:
        """Join and follow the PS until the run is finished, reconnecting through failures."""
        retry = Reconnect(self.opts.ps, self.opts.name, self.opts.connect_timeout_s, self.opts.tls,
                          self.opts.tls_server_name)
        while not self.finished:
            self.welcomed = False
            try:
                await self._session()
                retry.succeeded()
            except FAILURES as e:
                self.finished = await retry.failed(e, joined_before=self.cfg is not None, welcomed=self.welcomed)

    async def _session(self) -> None:
        async with session_stream(self) as (stream, stub):
            prober = asyncio.create_task(probe_rtt(stub, self.opts, self.probes)) if self.opts.probe_interval_s > 0 else None
            try:
                await self._follow(stream)
            finally:
                if prober:
                    prober.cancel()

    async def _flush_probes(self, stream: Stream) -> None:
        """Report RTT samples, at most once a second (the PS limits probe messages, not rounds)."""
        if self.probes and time.monotonic() - self._probes_sent_at >= 1.0:
            self._probes_sent_at = time.monotonic()
            batch = self.probes[:1000]
            del self.probes[:1000]      # in place: the prober task appends to this very list
            await stream.send(LinkProbe(tuple(t for t, _ in batch), tuple(r for _, r in batch)))

    async def _follow(self, stream: Stream) -> None:
        """Handle what the PS sends until the run is finished or the stream breaks. The round in hand
        trains and pushes in its own task meanwhile (see the module's doc); a model, the next round
        or the update of its round are taken only once it is done with."""
        await stream.send(Join(self.opts.name, resume_round=self.round, resume_hash=self.hash,
                               device=str(self.device), token=self.opts.token))
        self.replica.new_session()
        model_specs: list = []           # model chunks placed so far (each straight into the model)
        expected_model = 0
        receiving: asyncio.Future | None = None       # the read under way (a read is never cancelled midway)
        try:
            while not self.finished:
                receiving = receiving or asyncio.ensure_future(stream.receive())
                await self.hands.until_received(receiving)
                msg, receiving = receiving.result(), None
                if isinstance(msg, ErrorMessage):
                    raise RejectedError(Reject.from_wire(msg.code), msg.message)
                if isinstance(msg, DeltaOutcome):
                    self._loaded()[3].heard(msg)
                    continue
                if isinstance(msg, TensorChunk) and msg.kind == UPDATE:
                    if self.replica.whole:
                        self.replica.receive(msg)
                    else:                       # the last update's tail, while the next round trains
                        await self._patch(stream, msg)
                    continue
                await self.hands.end(msg if isinstance(msg, RoundResult) else None)
                if isinstance(msg, Welcome):
                    self.welcomed = True
                    if self.schedule is not None:
                        await self.schedule.discard()      # a new global model: steps ahead belong to no round
                        self.schedule.reload()
                    await asyncio.to_thread(self._on_welcome, msg)
                    if msg.model_chunks == 0:       # the PS lets it keep its replica; missed updates follow
                        await stream.send(Ready(self.round, self.hash))
                        continue
                    expected_model, model_specs = msg.model_chunks, []
                    progress = DownloadProgress(self.opts.name, expected_model)
                elif isinstance(msg, TensorChunk) and msg.kind == MODEL:
                    self._held().place(msg)
                    model_specs.append(msg.spec)
                    progress.update(msg.data.wire_bytes)
                    if len(model_specs) == 1:
                        await self.stalls.asleep("download", self.round)
                    if len(model_specs) == expected_model:
                        progress.close()
                        await asyncio.to_thread(self._held().finish_download, model_specs)
                        model_specs = []
                        await stream.send(Ready(self.round, self.hash))
                        if self.round >= self._config().train.rounds:   # joined as the run ended: the final model
                            await self._finish()
                elif isinstance(msg, RoundStart):
                    if msg.model_hash != self.replica.promised_hash:
                        raise ReplicaMismatchError(f"round {msg.round} starts from {msg.model_hash}, "
                                                   f"this replica has {self.replica.promised_hash}")
                    self._start_round(stream, msg, self.replica.take_update_began() or time.perf_counter())
                elif isinstance(msg, RoundResult):
                    await asyncio.to_thread(self._held().apply_received, msg)
                    self._loaded()[3].settle(msg)
                    if self.replica.whole:          # else once the update's tail is in (_patch)
                        await stream.send(HashReport(msg.round, self.hash))
                    await self._flush_probes(stream)
                    if self.round >= self._config().train.rounds:
                        await self._finish()
                    elif self.schedule is not None:
                        await self.schedule.moved_to(self._held().arrays)
                else:
                    raise ProtocolError(f"unexpected message from the PS: {type(msg).__name__}")
        finally:
            if receiving is not None:
                receiving.cancel()
            await self.hands.abandon()
        await stream.close()

    async def _patch(self, stream: Stream, c: TensorChunk) -> None:
        """A chunk of the last update's tail: into the replica, and into the round training from it
        (schedule.py); the hash report once the last is in."""
        assert self.schedule is not None
        await asyncio.to_thread(self.schedule.patch, self._held(), c)
        if self.replica.whole:
            await stream.send(HashReport(c.round, self.hash))

    # ------------------------------------------------------------ the round in hand

    def _start_round(self, stream: Stream, start: RoundStart, began_at: float) -> None:
        planned = (f"a {start.train_s:.1f} s budget" if start.train_s
                   else f"{self._config().train.inner_steps} inner steps")
        self.hands.start(RoundInHand(start.round, planned, began_at=began_at),
                         lambda hand: self._train_and_push(stream, start, hand))

    async def _finish(self) -> None:
        self.finished = True
        if self.schedule is not None:
            await self.schedule.discard()

    # ------------------------------------------------------------ state

    def _config(self) -> RunConfig:
        if self.cfg is None:
            raise ProtocolError("the parameter server sent a round message before any Welcome")
        return self.cfg

    def _loaded(self) -> tuple[RunConfig, torch.nn.Module, InnerLoop, Uplink]:
        """What the first Welcome set up; a PS that sends round messages before any is broken."""
        if self.cfg is None or self.model is None or self.inner is None or self.uplink is None:
            raise ProtocolError("the parameter server sent a round message before any Welcome")
        return self.cfg, self.model, self.inner, self.uplink

    def _held(self) -> Replica:
        if not self.replica.built:
            raise ProtocolError("the parameter server sent a model or an update before any Welcome")
        return self.replica

    def _on_welcome(self, w: Welcome) -> None:
        first = self.cfg is None
        if w.shards != len(self.addresses):
            raise ProtocolError(f"the parameter server is sharded {w.shards} way(s); this site was given "
                                f"{len(self.addresses)} address(es): give every shard's, in order")
        if w.model_chunks == 0 and (first or (w.round, w.model_hash) != (self.round, self.hash)):
            raise ProtocolError(f"the PS sends no model, as if this site held round {w.round} ({w.model_hash}); "
                                f"it holds " + ("none" if first else f"round {self.round} ({self.hash})"))
        self.cfg = w.config
        self.run_id, self.index = w.run_id, w.site_index
        if first:       # (in a group of processes, every rank builds the same: group.py)
            self.inner = build_inner(w.config, w.site_index, w.data_position, self.device, self.opts.name,
                                     self.opts.speed_factor)
            self.model = self.inner.model
            t = w.config.train
            self.schedule = Schedule(self.inner, w.config.schedule.mode.trains_ahead, t.round_budget_s, t.fragments)
            self.replica.build(self.model, w.shards, w.config.codec.chunk_elements())
            rate, burst, late_s = self.opts.chunk_loss
            self.uplink = Uplink(self.opts.name, w.config,
                                 roles_of({k: tuple(p.shape) for k, p in named_params(self.model).items()}), self.stalls,
                                 ChunkLoss(rate, burst, seed=t.seed, link=self.opts.name) if rate > 0 else None, late_s,
                                 mode=self.opts.codec)
            log.info("site %s: run %s, site index %d, %s on %s, data position %d", self.opts.name, w.run_id,
                     w.site_index, w.config.model.preset, self.device, w.data_position)
        self._held().expect(w.round, w.model_hash)
        if w.model_chunks:
            self._loaded()[3].fresh_model()

    async def _train_and_push(self, stream: Stream, start: RoundStart, hand: RoundInHand) -> None:
        round_ = start.round
        since_push_s = time.time() - self.pushed_at if self.pushed_at else 0.0
        log.info("site %s: round %d starts%s", self.opts.name, round_,
                 f" ({start.train_s:.1f} s budget)" if start.train_s else "")
        await self.stalls.asleep("train", round_)
        uplink = self._loaded()[3]
        assert self.schedule is not None
        probe = self._probe if self._config().recovery.probe_every and round_ % self._config().recovery.probe_every == 0 \
            else None
        delta, info = await self.schedule.round(round_, start.train_s, self._held(), hand.stop, probe)
        wait_s = max(0.0, since_push_s - info.pop("ahead_s"))     # idle, not computing ahead
        if (sensitivity := info.pop("probe", None)) is not None:
            uplink.calibrate(sensitivity, delta)
        if hand.closed or hand.abandoned:
            if not self._push_anyway(hand, info["steps"], uplink):
                uplink.keep(delta)
                return
        stats = await uplink.push(stream, round_, delta, {**info, "wait_s": wait_s, "decode_s": self._held().decode_s,
                                                         "download_s": self._held().download_s}, hand.began_at, start.codec)
        await self._flush_probes(stream)
        self.pushed_at = time.time()
        trim_heap()                       # the round's scratch memory, back while the PS commits
        log.info("site %s: round %d pushed, %d steps, loss %.4f, %.2f MB on the wire (%.2fx)%s", self.opts.name,
                 round_, info["steps"], info["train_loss"], stats.wire_bytes / 1e6, stats.ratio,
                 " (late: its round committed without it)" if hand.closed else "")

    def _probe(self, end: dict[str, np.ndarray], delta: dict[str, np.ndarray]) -> dict[str, float]:
        """The sensitivity probe (site/probe.py), run while the model holds where the round ended."""
        _, model, inner, uplink = self._loaded()
        return role_sensitivity(model, end, delta, uplink.roles, inner.held_out)

    def _push_anyway(self, hand: RoundInHand, steps: int, uplink: Uplink) -> bool:
        """A round that committed without this site's delta (or whose session ended): push it all the
        same? Only under a late_policy that may still apply it ("stale", "zero-outside"); otherwise its
        change goes into the next delta (error feedback; under "rescale" it is let go) and nothing goes
        on the wire."""
        me, r = self.opts.name, hand.round
        if hand.abandoned:
            log.warning("site %s: the session ended during round %d (after %d steps); their change goes into "
                        "the next delta", me, r, steps)
            return False
        late = uplink.pushes_late and steps > 0
        policy = self._config().recovery.late_policy
        kept = ("its change goes into the next delta" if policy.carries_unapplied else
                f"nor carrying it: {policy.unapplied_fate()}")
        log.warning("site %s: round %d committed without this site's delta (the PS's deadline passed first: its "
                    "result came after %d inner step(s) of %s); %s", me, r, steps, hand.steps_planned,
                    f"late_policy {policy}: pushing what it has, a late delta" if late else
                    f"late_policy {policy}: not pushing it, {kept}" if steps else
                    "no step taken, nothing to push")
        return late
