"""A site: dials the parameter server, trains inner AdamW steps, pushes its delta, applies updates.

The site opens one gRPC stream to the PS (outbound only) and follows the PS's lead:

    Welcome + model chunks   load the global parameters (a fresh join, a rejoin or a resync)
    RoundStart(r)            train `inner_steps` steps from the global model, send the
                             pseudo-gradient (start - end) through the codec with error
                             feedback, then the round's metrics
    update chunks + result   add exactly the decoded update, hash, report the hash

If the PS is not there (yet) or the stream breaks, the site retries with exponential backoff
and says so; when it reconnects it joins again under the same name.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import sys
import time
from dataclasses import dataclass, field

import grpc
import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from . import net, wire
from .auth import bearer
from .codec import Codec, EncodeStats, ErrorFeedback, check_coverage, check_fits, encode_arrays, join_chunks
from .config import RunConfig
from .data import BatchSampler, load_run_data
from .errors import (CodecError, ConfigError, ConnectionLostError, CorruptModelError, DivergedError, ProtocolError, RejectedError,
                     ReplicaMismatchError)
from .messages import (DELTA, MODEL, UPDATE, ErrorMessage, HashReport, Join, LinkProbe, Ready, RoundMetrics,
                       RoundResult, RoundStart, TensorChunk, Welcome)
from .models import build_model
from .replica import apply_update, flat_copy, load_flat, named_params, param_hash
from .rounds import MAX_STALENESS
from .tls import TLSClient

__all__ = ["Site", "SiteOptions", "default_device"]

log = logging.getLogger("wantrain.site")


_RETRY = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN,
          grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.INTERNAL}


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


class DownloadProgress:
    """Progress of a model download: a bar on a terminal, else a log line every quarter.

    Small models (fewer than 8 chunks) download in a blink and say nothing."""

    def __init__(self, site: str, chunks: int) -> None:
        self.site, self.chunks, self.done, self.bytes = site, chunks, 0, 0
        self.t0 = time.monotonic()
        self.quiet = chunks < 8
        self.bar = tqdm(total=chunks, unit="chunk", desc=f"{site}: model download", leave=False,
                        disable=self.quiet or not sys.stderr.isatty())
        self.next_quarter = 1

    def update(self, nbytes: int) -> None:
        self.done += 1
        self.bytes += nbytes
        self.bar.update(1)
        if self.bar.disable and not self.quiet and 4 * self.done >= self.next_quarter * self.chunks:
            self.next_quarter += 1
            mb, s = self.bytes / 1e6, time.monotonic() - self.t0
            log.info("site %s: model download %d %% (%.0f MB in %.1f s, %.1f MB/s)", self.site,
                     100 * self.done // self.chunks, mb, s, mb / max(s, 1e-9))

    def close(self) -> None:
        self.bar.close()


@dataclass(frozen=True)
class SiteOptions:
    ps: str                        # host:port of the parameter server
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
        self.device = torch.device(default_device() if opts.device == "auto" else opts.device)
        if opts.threads:
            torch.set_num_threads(opts.threads)
        self.cfg: RunConfig | None = None
        self.model: torch.nn.Module | None = None
        self.inner_opt: torch.optim.Optimizer | None = None
        self.sampler: BatchSampler | None = None
        self.feedback: ErrorFeedback | None = None
        self.codec: Codec | None = None
        self.round = 0               # committed rounds this replica holds
        self.hash = ""
        self.finished = False
        self.last_decode_s = 0.0
        self.probes: list[tuple[float, float]] = []   # (Unix time, RTT ms) not yet reported
        self._probes_sent_at = -math.inf
        self.pushed_at: float | None = None           # when the last push ended (idle accounting)
        self.local_steps = 0                          # inner steps of this process's optimizer
        # Deltas pushed and not yet known to be applied: round -> values as decoded. One the PS
        # drops (late) goes back into the error feedback, so its mass is not lost.
        self.pending: dict[int, dict[str, np.ndarray]] = {}

    # ------------------------------------------------------------ connection

    async def run(self) -> None:
        """Join and follow the PS until the run is finished, reconnecting through failures."""
        backoff, first_failure, cause = 0.5, None, ""
        while not self.finished:
            try:
                await self._session()
                backoff, first_failure, cause = 0.5, None, ""
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError, ConnectionLostError, RejectedError) as e:
                # A write on a call that broke raises InvalidStateError; a read returns EOF. After
                # a reset the PS may not have noticed our old stream yet and still holds our name.
                if isinstance(e, RejectedError) and e.code == "run_finished":
                    # Away at the end, or (re)started after it, e.g. by a supervisor: nothing to do.
                    log.info("site %s: the run has finished (%s); nothing left to do", self.opts.name, e)
                    self.finished = True
                    return
                # Retry a refusal only when waiting helps: a rate limit, or our old stream still open.
                if isinstance(e, RejectedError) and not (
                        e.code == "rate_limited" or (e.code == "duplicate_site" and self.cfg is not None)):
                    raise
                if isinstance(e, grpc.aio.AioRpcError) and e.code() not in _RETRY:
                    raise ConnectionLostError(f"parameter server at {self.opts.ps} refused {self.opts.name!r}: "
                                              f"{e.code().name}: {e.details()}") from None
                why = (e.details() or e.code().name) if isinstance(e, grpc.aio.AioRpcError) else str(e) or type(e).__name__
                now = time.time()
                if first_failure is None and isinstance(e, grpc.aio.AioRpcError) and \
                        e.code() == grpc.StatusCode.UNAVAILABLE:   # say why, once per streak of failures
                    cause = await asyncio.to_thread(net.explain_unreachable, self.opts.ps, self.opts.tls,
                                                    self.opts.tls_server_name)
                first_failure = first_failure or now
                because = f": {cause}" if cause else ""
                if now - first_failure > self.opts.connect_timeout_s:
                    raise ConnectionLostError(f"parameter server at {self.opts.ps} not reachable for "
                                              f"{self.opts.connect_timeout_s:.0f} s{because or f' ({why})'}; "
                                              "giving up") from None
                log.warning("parameter server at %s not reachable (%s)%s; retrying in %.1f s", self.opts.ps, why,
                            because, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    async def _session(self) -> None:
        channel = net.site_channel(self.opts.ps, self.opts.tls, self.opts.tls_server_name, self.opts.link_rtt_ms,
                                   self.opts.link_mbps)
        async with channel:
            stub = wire.pb_grpc.ParameterServerStub(channel)
            call = stub.Session(wait_for_ready=False)
            prober = asyncio.create_task(self._probe(stub)) if self.opts.probe_interval_s > 0 else None
            try:
                await self._follow(call)
            finally:
                if prober:
                    prober.cancel()

    async def _probe(self, stub) -> None:
        """Time a Ping on the site's own channel every probe_interval_s (through the real path)."""
        while True:
            await asyncio.sleep(self.opts.probe_interval_s)
            t0 = time.perf_counter()
            try:
                await stub.Ping(wire.pb.PingRequest(site=self.opts.name), metadata=bearer(self.opts.token),
                                timeout=max(30.0, 10 * self.opts.probe_interval_s))
            except grpc.aio.AioRpcError:
                continue
            self.probes.append((time.time(), (time.perf_counter() - t0) * 1000))

    async def _flush_probes(self, call) -> None:
        """Report RTT samples, at most once a second (the PS limits probe messages, not rounds)."""
        if self.probes and time.monotonic() - self._probes_sent_at >= 1.0:
            self._probes_sent_at = time.monotonic()
            batch, self.probes = self.probes[:1000], self.probes[1000:]
            await call.write(wire.site_message(LinkProbe(tuple(t for t, _ in batch), tuple(r for _, r in batch))))

    async def _follow(self, call) -> None:
        """Handle what the PS sends until the run is finished or the stream breaks."""
        await call.write(wire.site_message(Join(self.opts.name, resume_round=self.round, resume_hash=self.hash,
                                                device=str(self.device), token=self.opts.token)))
        model_specs: list = []           # model chunks placed so far (each straight into the model)
        update_parts: list[TensorChunk] = []
        expected_model = 0
        while not self.finished:
            raw = await call.read()
            if raw is grpc.aio.EOF:
                raise ConnectionLostError("the stream ended")
            msg = wire.server_message_from_proto(raw)
            if isinstance(msg, ErrorMessage):
                raise RejectedError(msg.code, msg.message)
            if isinstance(msg, Welcome):
                await asyncio.to_thread(self._on_welcome, msg)
                expected_model, model_specs = msg.model_chunks, []
                progress = DownloadProgress(self.opts.name, expected_model)
            elif isinstance(msg, TensorChunk) and msg.kind == MODEL:
                self._place_model_chunk(msg)      # memory: one chunk, never a second copy of the model
                model_specs.append(msg.spec)
                progress.update(msg.data.wire_bytes)
                if len(model_specs) == 1:
                    await self._stall("download", self.round)
                if len(model_specs) == expected_model:
                    progress.close()
                    await asyncio.to_thread(self._finish_model, model_specs)
                    model_specs = []
                    await call.write(wire.site_message(Ready(self.round, self.hash)))
                    if self.round >= self.cfg.train.rounds:   # joined as the run ended: the final model
                        self.finished = True
            elif isinstance(msg, RoundStart):
                if msg.model_hash != self.hash:
                    raise ReplicaMismatchError(f"round {msg.round} starts from {msg.model_hash}, "
                                               f"this replica has {self.hash}")
                await self._train_and_push(call, msg)
            elif isinstance(msg, TensorChunk) and msg.kind == UPDATE:
                update_parts.append(msg)
            elif isinstance(msg, RoundResult):
                await asyncio.to_thread(self._apply_update, update_parts, msg)
                self._settle_pending(msg)
                update_parts = []
                await call.write(wire.site_message(HashReport(msg.round, self.hash)))
                await self._flush_probes(call)
                if self.round >= self.cfg.train.rounds:
                    self.finished = True
            else:
                raise ProtocolError(f"unexpected message from the PS: {type(msg).__name__}")
        await call.done_writing()

    # ------------------------------------------------------------ state

    def _on_welcome(self, w: Welcome) -> None:
        first = self.cfg is None
        self.cfg = w.config
        self.run_id, self.index = w.run_id, w.site_index
        if first:
            tok, corpus = load_run_data(w.config.data)
            self.model = build_model(w.config.model.preset, tok.vocab_size, w.config.model.seed, self.device)
            self.params = named_params(self.model)
            self.sizes = {k: p.numel() for k, p in self.params.items()}
            shard = corpus.shard(w.site_index, w.config.num_sites, w.config.data.sharding)
            t = w.config.train
            self.sampler = BatchSampler(shard, t.batch_size, w.config.model.block_size, t.seed + 1000 * w.site_index)
            self.sampler.seek(w.data_position)     # a restarted site picks up its shard where it left off
            self.inner_opt = torch.optim.AdamW(self.model.parameters(), lr=t.inner_lr, betas=(0.9, 0.95),
                                               weight_decay=t.inner_weight_decay)
            self.feedback = ErrorFeedback() if w.config.codec.error_feedback else None
            self.codec = Codec(w.config.codec)
            log.info("site %s: run %s, site index %d, %s on %s, data position %d", self.opts.name, w.run_id,
                     w.site_index, w.config.model.preset, self.device, w.data_position)
        self.round = w.round
        self._expected_hash = w.model_hash
        self.pending = {}         # a fresh model: whatever was in flight is the PS's business now

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
        p = self.params[c.spec.tensor]
        with torch.no_grad():
            p.view(-1)[c.spec.offset: c.spec.offset + c.spec.length].copy_(torch.from_numpy(values))

    def _finish_model(self, specs: list) -> None:
        try:
            check_coverage(specs, self.sizes)
        except CodecError as e:
            raise ProtocolError(f"model download from the PS: {e}") from None
        self.hash = param_hash(self.model)
        if self.hash != self._expected_hash:
            raise ReplicaMismatchError(f"downloaded model hashes to {self.hash}, the PS says {self._expected_hash}")
        log.info("site %s: model at round %d loaded (%s)", self.opts.name, self.round, self.hash)

    def _lr(self, step: int, progress: float) -> float:
        """Linear warm-up over the site's first steps, then cosine over the run's rounds.

        `step` counts the inner steps of this process's optimizer: a restarted site starts with
        fresh AdamW moments, so it warms up again. `progress` is how far the run is, in rounds
        (a fraction within the current one), so fixed-step and time-budgeted rounds follow the
        same curve."""
        t = self.cfg.train
        if step < t.warmup_steps:
            return t.inner_lr * (step + 1) / t.warmup_steps
        p = min(1.0, progress / t.rounds)
        return t.inner_lr * (t.min_lr_ratio + (1 - t.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * p)))

    def _train(self, round_: int, train_s: float) -> tuple[dict[str, np.ndarray], dict]:
        """Inner steps from the current (global) parameters; returns the pseudo-gradient.

        train_s > 0: step until that much (emulated) compute time has passed, at least once;
        otherwise take the configured inner_steps."""
        t = self.cfg.train
        start = flat_copy(self.model)
        t0 = time.perf_counter()
        losses = []
        autocast = torch.autocast("cuda", dtype=torch.bfloat16) if self.device.type == "cuda" else contextlib.nullcontext()
        self.model.train()
        emulated = 0.0
        i = 0
        while (time.perf_counter() - t0 < train_s) if train_s > 0 else (i < t.inner_steps):
            t_step = time.perf_counter()
            frac = (t_step - t0) / train_s if train_s > 0 else i / t.inner_steps
            lr = self._lr(self.local_steps, round_ + frac)
            self.local_steps += 1
            for g in self.inner_opt.param_groups:
                g["lr"] = lr
            x, y = self.sampler.next()
            x, y = x.to(self.device), y.to(self.device)
            with autocast:
                logits = self.model(x)
                loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
            self.inner_opt.zero_grad(set_to_none=True)
            loss.backward()
            if t.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), t.grad_clip)
            self.inner_opt.step()
            losses.append(loss.item())
            if not math.isfinite(losses[-1]):
                raise DivergedError(f"site {self.opts.name}: the training loss became {losses[-1]} at inner step {i} "
                                    f"of round {round_} (learning rate {lr:.3g}), starting from the global model "
                                    f"{self.hash}; this site stops rather than send a broken delta")
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            if self.opts.speed_factor > 1:   # act like a machine speed_factor times slower
                pad = (self.opts.speed_factor - 1) * (time.perf_counter() - t_step)
                if train_s > 0:              # never pad past the budget
                    pad = max(0.0, min(pad, train_s - (time.perf_counter() - t0)))
                time.sleep(pad)
                emulated += pad
            i += 1
        compute_s = time.perf_counter() - t0
        end = flat_copy(self.model)
        delta = {k: start[k] - end[k] for k in start}
        bad = next((k for k, v in delta.items() if not np.all(np.isfinite(v))), None)
        if bad is not None:
            raise DivergedError(f"site {self.opts.name}: the delta of round {round_} holds NaN or Inf in {bad!r} "
                                f"after {i} inner steps from the global model {self.hash}; not sending it")
        # The replica goes back to the global parameters; the PS's update moves it on.
        load_flat(self.model, start)
        tokens = i * t.batch_size * self.cfg.model.block_size
        return delta, dict(train_loss=float(np.mean(losses)), last_train_loss=losses[-1], tokens=tokens,
                           steps=i, compute_s=compute_s, emulated_s=emulated, data_position=self.sampler.batches_drawn)

    async def _stall(self, phase: str, round_: int) -> None:
        """A fault-injection point: tests kill the process while it sleeps here ("phase" or "phase@round")."""
        stalls = dict(self.opts.stalls)
        seconds = stalls.get(f"{phase}@{round_}", stalls.get(phase, 0.0))
        if seconds:
            log.warning("site %s: stalling %.1f s in phase %s of round %d (fault injection)", self.opts.name,
                        seconds, phase, round_)
            await asyncio.sleep(seconds)

    async def _train_and_push(self, call, start: RoundStart) -> None:
        round_ = start.round
        wait_s = time.time() - self.pushed_at if self.pushed_at else 0.0
        log.info("site %s: round %d starts%s", self.opts.name, round_,
                 f" ({start.train_s:.1f} s budget)" if start.train_s else "")
        await self._stall("train", round_)
        delta, info = await asyncio.to_thread(self._train, round_, start.train_s)
        stats = EncodeStats()
        chunks, sent = await asyncio.to_thread(encode_arrays, delta, self.codec, self.feedback, stats)
        if self.feedback is not None:
            self.pending[round_] = sent
        t0 = time.perf_counter()
        for i, (spec, enc) in enumerate(chunks):
            await call.write(wire.site_message(TensorChunk(DELTA, round_, i, len(chunks), spec, enc)))
            if i == 0:
                await self._stall("push", round_)
        comm_s = time.perf_counter() - t0
        await self._flush_probes(call)
        await call.write(wire.site_message(RoundMetrics(
            round=round_, raw_bytes=stats.raw_bytes, wire_bytes=stats.wire_bytes,
            huffman_bits_per_symbol=stats.huffman_bits_per_symbol, encode_s=stats.seconds,
            decode_s=self.last_decode_s, comm_s=comm_s, chunks=len(chunks), wait_s=wait_s, **info)))
        self.pushed_at = time.time()
        log.info("site %s: round %d pushed, %d steps, loss %.4f, %.2f MB on the wire (%.2fx)", self.opts.name, round_,
                 info["steps"], info["train_loss"], stats.wire_bytes / 1e6, stats.ratio)

    def _settle_pending(self, result: RoundResult) -> None:
        """After a round's result: were our pushed deltas applied? One that never will be is carried forward."""
        stale = self.cfg.train.late_policy == "stale"
        for r in sorted(self.pending):
            if (r == result.round and self.opts.name in result.sites) or (
                    r < result.round and self.opts.name in result.late_sites):
                del self.pending[r]
            elif r <= result.round and not (stale and result.round - r < MAX_STALENESS):
                sent = self.pending.pop(r)
                if self.feedback is not None:
                    for k, v in sent.items():    # what the PS never applied goes out again next round
                        res = self.feedback.residuals.get(k)
                        self.feedback.residuals[k] = v.copy() if res is None else res + v
                log.warning("site %s: the delta of round %d was not applied (late); carried forward", self.opts.name, r)

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
        apply_update(self.model, update)
        self.last_decode_s = time.perf_counter() - t0
        self.round = result.round + 1
        self.hash = param_hash(self.model)
        if self.hash != result.model_hash:
            log.error("site %s: replica hash %s differs from the PS's %s after round %d", self.opts.name,
                      self.hash, result.model_hash, result.round)
