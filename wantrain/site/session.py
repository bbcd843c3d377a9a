"""A site: dials the parameter server, trains inner AdamW steps, pushes its delta, applies updates.

The site opens one gRPC stream to the PS, or one to each shard of a sharded PS (stream.py), always
outbound, and follows the PS's lead:

    Welcome + model chunks   load the global parameters (a fresh join, a rejoin or a resync); a
                             Welcome without chunks: keep them, the updates missed follow
                             (a catch-up, after the stream broke)
    RoundStart(r)            train `inner_steps` steps (or `train_s` seconds) from the global
                             model (schedule.py: with "overlap", some were taken ahead), send the
                             pseudo-gradient (start - end) through the codec with error
                             feedback, then the round's metrics
    update chunks + result   add exactly the decoded update, hash, report the hash

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

from ..codec import Codec, EncodeStats, ErrorFeedback, check_coverage, check_fits, encode_arrays, join_chunks
from ..config import RunConfig
from ..errors import (CodecError, ConfigError, CorruptModelError, ProtocolError, Reject,
                      RejectedError, ReplicaMismatchError)
from ..faults import Stalls
from ..messages import (DELTA, MAX_STALENESS, MODEL, UPDATE, ErrorMessage, HashReport, Join, LinkProbe, Ready,
                        RoundMetrics, RoundResult, RoundStart, TensorChunk, Welcome)
from ..replica import add_update, flat_copy, named_params
from ..shards import ShardLayout, combine_hashes
from ..tls import TLSClient
from .progress import DownloadProgress
from .retry import FAILURES, Reconnect
from .schedule import Schedule
from .sharded import ShardMemory
from .stream import Stream, addresses, probe_rtt, session_stream
from .group import build_inner
from .train import InnerLoop

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
        self.layout: ShardLayout | None = None
        self.part_hashes: list[str] = []       # the replica's hash per shard (one: the hash)
        self.device = torch.device(default_device() if opts.device == "auto" else opts.device)
        if opts.threads:
            torch.set_num_threads(opts.threads)
        self.cfg: RunConfig | None = None
        self.model: torch.nn.Module | None = None
        self.inner: InnerLoop | None = None
        self.schedule: Schedule | None = None
        self.replica: dict[str, np.ndarray] = {}    # the global model, flat float32 (the model trains)
        self.feedback: ErrorFeedback | None = None
        self.codec: Codec | None = None
        self.round = 0               # committed rounds this replica holds
        self.hash = ""
        self.finished = False
        self.last_decode_s = 0.0
        self.probes: list[tuple[float, float]] = []   # (Unix time, RTT ms) not yet reported
        self._probes_sent_at = -math.inf
        self.pushed_at: float | None = None           # when the last push ended (idle accounting)
        self.stalls = Stalls(opts.stalls, log)
        # Deltas pushed and not yet known to be applied: round -> values as decoded. One the PS
        # drops (late) goes back into the error feedback, so its mass is not lost.
        self.pending: dict[int, dict[str, np.ndarray]] = {}

    # ------------------------------------------------------------ connection

    async def run(self) -> None:
        """Join and follow the PS until the run is finished, reconnecting through failures."""
        retry = Reconnect(self.opts.ps, self.opts.name, self.opts.connect_timeout_s, self.opts.tls,
                          self.opts.tls_server_name)
        while not self.finished:
            try:
                await self._session()
                retry.succeeded()
            except FAILURES as e:
                self.finished = await retry.failed(e, joined_before=self.cfg is not None)

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
        """Handle what the PS sends until the run is finished or the stream breaks."""
        await stream.send(Join(self.opts.name, resume_round=self.round, resume_hash=self.hash,
                               device=str(self.device), token=self.opts.token))
        model_specs: list = []           # model chunks placed so far (each straight into the model)
        update_parts: list[TensorChunk] = []
        expected_model = 0
        while not self.finished:
            msg = await stream.receive()
            if isinstance(msg, ErrorMessage):
                raise RejectedError(Reject.from_wire(msg.code), msg.message)
            if isinstance(msg, Welcome):
                if self.schedule is not None:
                    await self.schedule.discard()      # a new global model: steps ahead belong to no round
                await asyncio.to_thread(self._on_welcome, msg)
                if msg.model_chunks == 0:       # the PS lets it keep its replica; missed updates follow
                    await stream.send(Ready(self.round, self.hash))
                    continue
                expected_model, model_specs = msg.model_chunks, []
                progress = DownloadProgress(self.opts.name, expected_model)
            elif isinstance(msg, TensorChunk) and msg.kind == MODEL:
                self._place_model_chunk(msg)      # memory: one chunk, never a second copy of the model
                model_specs.append(msg.spec)
                progress.update(msg.data.wire_bytes)
                if len(model_specs) == 1:
                    await self.stalls.asleep("download", self.round)
                if len(model_specs) == expected_model:
                    progress.close()
                    await asyncio.to_thread(self._finish_model, model_specs)
                    model_specs = []
                    await stream.send(Ready(self.round, self.hash))
                    if self.round >= self._config().train.rounds:   # joined as the run ended: the final model
                        await self._finish()
            elif isinstance(msg, RoundStart):
                if msg.model_hash != self.hash:
                    raise ReplicaMismatchError(f"round {msg.round} starts from {msg.model_hash}, "
                                               f"this replica has {self.hash}")
                await self._train_and_push(stream, msg)
            elif isinstance(msg, TensorChunk) and msg.kind == UPDATE:
                update_parts.append(msg)
            elif isinstance(msg, RoundResult):
                await asyncio.to_thread(self._apply_update, update_parts, msg)
                self._settle_pending(msg)
                update_parts = []
                await stream.send(HashReport(msg.round, self.hash))
                await self._flush_probes(stream)
                if self.round >= self._config().train.rounds:
                    await self._finish()
                elif self.schedule is not None:
                    await self.schedule.moved_to(self.replica)
            else:
                raise ProtocolError(f"unexpected message from the PS: {type(msg).__name__}")
        await stream.close()

    async def _finish(self) -> None:
        self.finished = True
        if self.schedule is not None:
            await self.schedule.discard()

    # ------------------------------------------------------------ state

    def _config(self) -> RunConfig:
        if self.cfg is None:
            raise ProtocolError("the parameter server sent a round message before any Welcome")
        return self.cfg

    def _loaded(self) -> tuple[RunConfig, torch.nn.Module, InnerLoop, Codec]:
        """What the first Welcome set up; a PS that sends round messages before any is broken."""
        if self.cfg is None or self.model is None or self.inner is None or self.codec is None:
            raise ProtocolError("the parameter server sent a round message before any Welcome")
        return self.cfg, self.model, self.inner, self.codec

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
            self.sizes = {k: p.numel() for k, p in named_params(self.model).items()}
            self.layout = ShardLayout.balanced(self.sizes, w.shards)
            t = w.config.train
            self.schedule = Schedule(self.inner, t.schedule == "overlap", t.round_budget_s)
            self.replica = flat_copy(self.model)
            self.feedback = ErrorFeedback() if w.config.codec.error_feedback else None
            self.codec = Codec(w.config.codec)
            log.info("site %s: run %s, site index %d, %s on %s, data position %d", self.opts.name, w.run_id,
                     w.site_index, w.config.model.preset, self.device, w.data_position)
        self.round = w.round
        self._expected_hash = w.model_hash
        if w.model_chunks:        # a fresh model: whatever was in flight is the PS's business now
            self.pending = {}     # (kept on a catch-up: the missed rounds' results settle it)

    def _rehash(self) -> None:
        assert self.layout is not None
        self.part_hashes = self.layout.hashes(self.replica)
        self.hash = combine_hashes(self.part_hashes)

    def _join(self, parts: list[TensorChunk]) -> dict[str, np.ndarray]:
        """Decode chunks that cover the whole model into flat arrays (ProtocolError if they don't)."""
        values = Codec.decode_many([c.data for c in parts])
        try:
            return join_chunks([c.spec for c in parts], values, self.sizes)
        except CodecError as e:
            raise ProtocolError(f"from the PS: {e}") from None

    def _place_model_chunk(self, c: TensorChunk) -> None:
        (values,) = Codec.decode_many([c.data])
        try:
            check_fits(c.spec, values, self.sizes)
        except CodecError as e:
            raise ProtocolError(f"model chunk from the PS: {e}") from None
        if not np.all(np.isfinite(values)):
            raise CorruptModelError(f"the model the parameter server sent (round {self.round}) holds NaN or Inf in "
                                    f"{c.spec.tensor!r}: the global model is corrupt; this site will not train on it")
        self.replica[c.spec.tensor][c.spec.offset: c.spec.offset + c.spec.length] = values

    def _finish_model(self, specs: list) -> None:
        try:
            check_coverage(specs, self.sizes)
        except CodecError as e:
            raise ProtocolError(f"model download from the PS: {e}") from None
        self._rehash()
        if self.hash != self._expected_hash:
            raise ReplicaMismatchError(f"downloaded model hashes to {self.hash}, the PS says {self._expected_hash}")
        log.info("site %s: model at round %d loaded (%s)", self.opts.name, self.round, self.hash)

    async def _train_and_push(self, stream: Stream, start: RoundStart) -> None:
        round_ = start.round
        since_push_s = time.time() - self.pushed_at if self.pushed_at else 0.0
        log.info("site %s: round %d starts%s", self.opts.name, round_,
                 f" ({start.train_s:.1f} s budget)" if start.train_s else "")
        await self.stalls.asleep("train", round_)
        codec = self._loaded()[3]
        assert self.schedule is not None
        delta, info = await self.schedule.round(round_, start.train_s, self.replica, self.hash)
        wait_s = max(0.0, since_push_s - info.pop("ahead_s"))     # idle, not computing ahead
        stats = EncodeStats()
        chunks, sent = await asyncio.to_thread(encode_arrays, delta, codec, self.feedback, stats)
        if self.feedback is not None:
            self.pending[round_] = sent
        t0 = time.perf_counter()
        for i, (spec, enc) in enumerate(chunks):
            await stream.send(TensorChunk(DELTA, round_, i, len(chunks), spec, enc))
            if i == 0:
                await self.stalls.asleep("push", round_)
        comm_s = time.perf_counter() - t0
        await self._flush_probes(stream)
        await stream.send(RoundMetrics(
            round=round_, raw_bytes=stats.raw_bytes, wire_bytes=stats.wire_bytes,
            huffman_bits_per_symbol=stats.huffman_bits_per_symbol, encode_s=stats.seconds,
            decode_s=self.last_decode_s, comm_s=comm_s, chunks=len(chunks), wait_s=wait_s, **info))
        self.pushed_at = time.time()
        log.info("site %s: round %d pushed, %d steps, loss %.4f, %.2f MB on the wire (%.2fx)", self.opts.name, round_,
                 info["steps"], info["train_loss"], stats.wire_bytes / 1e6, stats.ratio)

    def _settle_pending(self, result: RoundResult) -> None:
        """After a round's result: were our pushed deltas applied? One that never will be is carried forward."""
        stale = self._config().train.late_policy == "stale"
        me = self.opts.name
        for r in sorted(self.pending):
            if (r == result.round and me in result.sites) or (r < result.round and me in result.late_sites):
                del self.pending[r]
                continue
            # A sharded PS may have counted some tensors' parts: only the others are still pending.
            counted = dict(result.partial_sites if r == result.round else
                           result.partial_late if r < result.round else ()).get(me, frozenset())
            self.pending[r] = {k: v for k, v in self.pending[r].items() if k not in counted}
            if not self.pending[r]:
                del self.pending[r]
            elif r <= result.round and not (stale and result.round - r < MAX_STALENESS):
                sent = self.pending.pop(r)
                if self.feedback is not None:    # what the PS never applied goes out again next round
                    self.feedback.carry(sent)
                log.warning("site %s: the delta of round %d was not applied (late)%s; carried forward", me, r,
                            f" for {len(sent)} of its tensors (the rest counted)" if counted else "")

    def _apply_update(self, parts: list[TensorChunk], result: RoundResult) -> None:
        if result.round != self.round:
            raise ProtocolError(f"result for round {result.round}, this replica is at round {self.round}")
        t0 = time.perf_counter()
        parts = sorted(parts, key=lambda c: c.index)
        if not parts or len(parts) != parts[0].count or any(c.round != result.round for c in parts):
            raise ProtocolError(f"round {result.round}: got {len(parts)} update chunks, "
                                f"expected {parts[0].count if parts else 'some'}")
        update = self._join(parts)
        for name, u in update.items():
            if not np.all(np.isfinite(u)):
                raise CorruptModelError(f"the update of round {result.round} from the parameter server holds NaN "
                                        f"or Inf in {name!r}: the global model is corrupt; this site stops here")
        add_update(self.replica, update)
        self.last_decode_s = time.perf_counter() - t0
        self.round = result.round + 1
        self._rehash()
        if self.hash != result.model_hash:
            log.error("site %s: replica hash %s differs from the PS's %s after round %d", self.opts.name,
                      self.hash, result.model_hash, result.round)
