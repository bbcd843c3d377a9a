"""The parameter server as a domain object: ParameterServer holds the global model and runs the rounds.

It knows nothing of gRPC: each connected site is a `SiteLink` with an outbound queue of domain
messages, and tests drive it directly. `servicer.py` turns a site's gRPC stream into calls of
`handle()` and the site's queue back into wire messages; `serve()` runs both.

A round: when every site is connected and has said it is Ready (its model loaded), the PS
sends RoundStart; each site answers with its delta chunks and RoundMetrics. When every delta is
in, or at the round's deadline those that are (see rounds.py), the PS screens them
(screening.py), averages them, takes the outer Nesterov step, encodes the update with its own
error feedback, applies exactly the decoded update to its replica (aggregate.py), checkpoints,
and sends the update chunks and a RoundResult (with the new parameter hash) to every site. Late
deltas are dropped or applied in a later round; a site that (re)joins mid-round trains in it
with what is left of the budget.

Everything a site sends is checked before it touches any state: the message itself (wire.py),
its place in the protocol (here: rounds, plan, sequencing), its claims (screening.py), and the
rate of what it makes the PS do (limits.py). A violation raises ProtocolError or RejectedError
for that site alone.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from .aggregate import Contribution, aggregate_round
from .auth import Authenticator
from .checkpoint import CHECKPOINT_NAME, load_checkpoint, save_checkpoint
from .codec import Codec, EncodeStats, ErrorFeedback, Extracted, plan_chunks
from .config import CodecConfig, RunConfig
from .data import eval_batches, load_run_data
from .download import ModelDownload, live_views
from .errors import CodecError, ConfigError, DeltaRejectedError, NonFiniteDeltaError, ProtocolError, Reject, RejectedError
from .limits import Limits, TokenBucket, safe_text
from .messages import (DELTA, PROTOCOL_VERSION, HashReport, Join, LinkProbe, Ready, RoundMetrics, RoundResult,
                       RoundStart, TensorChunk, Welcome)
from .models import build_model, count_parameters
from .outer import OuterNesterov
from .replica import flat_copy, load_flat, named_params, param_hash
from .rounds import MAX_STALENESS, RoundClock, stale_weight
from .screening import Screen, Verdict, check_claims, clipped, delta_norm, l2_norm, max_delta_scale
from .telemetry import Recorder

__all__ = ["ParameterServer", "SiteLink"]

log = logging.getLogger("wantrain.ps")


@dataclass
class SiteLink:
    """One connected site, as the PS sees it."""

    name: str
    index: int
    device: str
    limits: Limits = field(default_factory=Limits, repr=False)
    outbox: asyncio.Queue = field(default_factory=asyncio.Queue)
    closed: bool = False
    ready: bool = False           # holds a model and can train (it said so after its download)
    base_round: int | None = None  # round of the model download in flight or last loaded
    last_hash_round: int = -1     # the last round whose hash the site reported
    joined_at: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        self.probe_messages = TokenBucket(self.limits.probe_messages_burst, self.limits.probe_messages_per_s)
        self.probe_samples = TokenBucket(self.limits.probe_samples_burst, self.limits.probe_samples_per_s)


@dataclass
class _Upload:
    """A site's delta for one round, as it arrives."""

    round: int
    train_s: float = 0.0           # the compute budget its RoundStart gave (0: fixed inner steps)
    count: int = -1
    chunks: dict[int, TensorChunk] = field(default_factory=dict)
    wire_bytes: int = 0
    metrics: RoundMetrics | None = None
    delta: list[Extracted] | None = None   # checked; int8 symbols + scales: a quarter of fp32
    norm: float = 0.0


class ParameterServer:
    """Holds the global model and runs DiLoCo rounds over the connected sites."""

    def __init__(self, cfg: RunConfig, run_dir: str | Path | None = None, run_id: str | None = None,
                 exit_when_done: bool = True, resume: bool = True, auth: Authenticator | None = None,
                 stalls: dict[str, float] | None = None, limits: Limits | None = None) -> None:
        self.cfg = cfg
        self.auth = auth or Authenticator()
        self.limits = limits or Limits()
        self.stalls = dict(stalls or {})       # fault-injection points for tests: phase -> seconds
        self.run_id = run_id or time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
        self.run_dir = Path(run_dir) if run_dir else None
        self.recorder = Recorder(self.run_dir / "events.jsonl" if self.run_dir else None)
        self.exit_when_done = exit_when_done

        tok, corpus = load_run_data(cfg.data)
        self.corpus_summary = corpus.summary()
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
        self.screen = Screen(cfg)
        self.downloads_by_site: dict[str, deque[float]] = {}   # when each site's model downloads began

        self.round = 0                        # committed rounds
        self.hash = param_hash(self.model)
        self.param_norm = self._param_norm()
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
                               num_params=count_parameters(self.model), val_loss=self.val_loss,
                               corpus=self.corpus_summary)
        c = self.corpus_summary
        log.info("corpus %s: %d document(s), %d tokens (%d for training, %d held out)%s", cfg.data.corpus,
                 c["documents"], c["tokens"], c["train_tokens"], c["val_tokens"],
                 f"; skipped {c['skipped_files']} file(s) that are not text" if c.get("skipped_files") else "")

    # ------------------------------------------------------------ checkpoints

    def _checkpoint_state(self) -> dict:
        return {"run_id": self.run_id, "config_json": self.cfg.to_json(), "round": self.round,
                "params_np": flat_copy(self.model), "outer_np": self.outer.state_dict(),
                "feedback_np": self.feedback.state_dict() if self.feedback else {},
                "hashes": dict(self.hashes), "registry": dict(self.registry),
                "data_positions": dict(self.data_positions), "val_loss": self.val_loss,
                "screen_norms": self.screen.state_dict()}

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
        self.screen.load_state_dict(saved.get("screen_norms", []))
        self.hash = param_hash(self.model)
        self.param_norm = self._param_norm()
        if self.hash != self.hashes.get(self.round):
            raise ConfigError(f"{self.ckpt_path} is damaged: its parameters hash to {self.hash}, "
                              f"it says {self.hashes.get(self.round)}")

    def _save_checkpoint(self) -> None:
        t0 = time.time()
        save_checkpoint(self.ckpt_path, self._checkpoint_state(), before_rename=lambda: self._stall("checkpoint"))
        self.recorder.emit("checkpoint", round=self.round, seconds=time.time() - t0,
                           bytes=self.ckpt_path.stat().st_size)

    def _param_norm(self) -> float:
        """L2 norm of the global parameters (float64): the scale every delta is bounded against."""
        return l2_norm(live_views(self.model).values())

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
            raise RejectedError(Reject.PROTOCOL_VERSION, f"site {msg.site!r} speaks wire protocol "
                                f"{msg.protocol_version}, this parameter server speaks {PROTOCOL_VERSION}")
        why = self.auth.check(msg.site, msg.token)
        if why is not None:
            raise RejectedError(Reject.UNAUTHENTICATED, f"site {msg.site!r} is not allowed to join this run "
                                                        "(unknown site or wrong token)")
        if msg.resume_round > self.cfg.train.rounds:
            raise ProtocolError(f"join says the site's replica holds round {msg.resume_round}; "
                                f"the run has {self.cfg.train.rounds} rounds")
        if msg.site in self.links:
            raise RejectedError(Reject.DUPLICATE_SITE, f"a site named {msg.site!r} is already connected; "
                                                       "each site needs its own name")
        if self.cfg.sites and msg.site not in self.cfg.sites:
            raise RejectedError(Reject.UNKNOWN_SITE, f"{msg.site!r} is not one of the run's sites "
                                                     f"({', '.join(self.cfg.sites)})")
        if msg.site not in self.registry and len(self.registry) >= self.cfg.num_sites:
            raise RejectedError(Reject.RUN_FULL, f"the run already has its {self.cfg.num_sites} sites "
                                f"({', '.join(sorted(self.registry))}); {msg.site!r} is not one of them")
        if self.done.is_set():
            self.told_finished.add(msg.site)
            raise RejectedError(Reject.RUN_FINISHED, f"the run finished after {self.round} rounds")
        self._charge_download(msg.site)
        resumed = msg.site in self.registry
        # Named sites keep their place (and data shard) whatever order they join in.
        index = self.registry.setdefault(msg.site, self.cfg.sites.index(msg.site) if self.cfg.sites
                                         else len(self.registry))
        link = SiteLink(msg.site, index, msg.device, self.limits)
        self.links[msg.site] = link
        self.recorder.emit("join", site=msg.site, site_index=index, device=msg.device, resumed=resumed,
                           data_position=self.data_positions.get(msg.site, 0))
        log.info("site %s joined (index %d, %s)%s", msg.site, index, safe_text(msg.device, 64),
                 " again" if resumed else "")
        if self.aggregating:       # the model is about to change: send it after the round commits
            self.awaiting_model.add(link.name)
        else:
            self._send_model(link)
        return link

    def _charge_download(self, site: str) -> None:
        """A model download costs the PS the model's size in bandwidth: a site gets a bounded number."""
        recent = self.downloads_by_site.setdefault(site, deque())
        now = time.monotonic()
        while recent and now - recent[0] > self.limits.download_window_s:
            recent.popleft()
        if len(recent) >= self.limits.downloads_allowed(4 * self.num_params):
            wait = self.limits.download_window_s - (now - recent[0])
            raise RejectedError(Reject.RATE_LIMITED, f"site {site!r} has downloaded the model {len(recent)} times "
                                f"in {self.limits.download_window_s:.0f} s; try again in {wait:.0f} s")
        recent.append(now)

    async def handle(self, link: SiteLink, msg) -> None:
        """One message from a joined site, after wire.py has checked its form; raises ProtocolError or
        RejectedError for this site alone. Each kind is bounded by the protocol (metrics once per
        upload, Ready once per download, a hash report once per committed round) or by a rate
        (link probes), so a site can cause only a bounded number of events."""
        if isinstance(msg, TensorChunk):
            self.on_chunk(link, msg)
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
        if link.ready or link.base_round is None:
            raise ProtocolError(f"{link.name!r} says Ready, but no model download is waiting for it")
        if msg.round != link.base_round or self.hashes.get(msg.round) != msg.model_hash:
            raise ProtocolError(f"{link.name!r} says it loaded the model of round {msg.round} with hash "
                                f"{msg.model_hash}; the PS sent round {link.base_round} with hash "
                                f"{self.hashes.get(link.base_round)}")
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
        self.uploads[link.name] = _Upload(self.round, train_s)
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
        link.base_round = self.round
        welcome = Welcome(self.run_id, link.index, self.cfg, self.round, self.hash, 0,
                          self.data_positions.get(link.name, 0))
        def progress(sent: int, chunks: int, nbytes: int) -> None:     # for watchers: a tenth more is out
            self.recorder.emit("download", site=link.name, chunks=sent, of=chunks, mb=nbytes / 1e6)

        download = ModelDownload(welcome, live_views(self.model), self.model_codec, on_progress=progress)
        self.downloads = [d for d in self.downloads if not d.finished] + [download]
        link.outbox.put_nowait(download)

    async def _freeze_downloads(self) -> None:
        """Before the parameters change: downloads still reading the live parameters get one shared
        frozen copy of them. A download frozen at an earlier round keeps its copy: it must deliver
        the model its Welcome announced, however many rounds commit while it is in flight."""
        active = [d for d in self.downloads if not d.finished]
        self.downloads = active
        live = [d for d in active if not d.frozen]
        if live:
            frozen = await asyncio.to_thread(flat_copy, self.model)
            for d in live:
                d.freeze(frozen)
            self.recorder.emit("downloads_frozen", round=self.round, downloads=len(live))

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
        self.uploads = {name: _Upload(self.round, self.cfg.train.round_budget_s) for name in self.in_round}
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
        if up.metrics is not None:
            raise ProtocolError(f"delta chunk {c.index} of round {c.round} after the round's metrics")
        # Caps, so that one site holds at most one model's worth of delta in the PS's memory: the
        # chunks are exactly the plan's, each at most fp32-sized (+ headers), each index once.
        if c.count != self.delta_chunks:
            raise ProtocolError(f"a delta comes in {self.delta_chunks} chunks here, this one says {c.count}")
        numel = self.shapes.get(c.spec.tensor)
        if numel is None:
            raise ProtocolError(f"delta chunk names unknown tensor {c.spec.tensor!r}")
        if c.spec.offset + c.spec.length > numel:
            raise ProtocolError(f"delta chunk [{c.spec.offset}, {c.spec.offset + c.spec.length}) is outside "
                                f"tensor {c.spec.tensor!r} of {numel} elements")
        spec = self.plan[c.index]
        if c.spec != spec:
            raise ProtocolError(f"delta chunk {c.index} covers {c.spec.tensor!r}[{c.spec.offset}:"
                                f"{c.spec.offset + c.spec.length}], the plan says "
                                f"{spec.tensor!r}[{spec.offset}:{spec.offset + spec.length}]")
        if c.data.encoding != self.cfg.codec.mode:
            raise ProtocolError(f"delta chunk {c.index} is encoded {c.data.encoding}; this run's deltas are "
                                f"{self.cfg.codec.mode} (codec.mode)")
        if c.index in up.chunks:
            raise ProtocolError(f"delta chunk {c.index} of round {c.round} arrived twice")
        if c.data.wire_bytes > 4 * c.spec.length + 65536:
            raise ProtocolError(f"delta chunk {c.index} carries {c.data.wire_bytes} bytes for {c.spec.length} elements")
        up.count = c.count
        up.chunks[c.index] = c
        up.wire_bytes += c.data.wire_bytes

    async def on_metrics(self, link: SiteLink, m: RoundMetrics) -> None:
        up = self._upload_for(link, m.round)
        if up.metrics is not None:
            raise ProtocolError(f"round {m.round} metrics from {link.name!r} arrived twice")
        if len(up.chunks) != up.count or m.chunks != up.count:
            raise ProtocolError(f"metrics after {len(up.chunks)} of {max(up.count, m.chunks)} delta chunks")
        check_claims(self.cfg, m, up.train_s, self.num_params, up.wire_bytes, self.round)
        # Decode and check this site's delta now, while others still train: a bad delta is
        # rejected here, for this site alone, and never reaches the aggregate.
        try:
            delta, norm = await asyncio.to_thread(self._assemble, link.name, up, m.steps)
        except (NonFiniteDeltaError, DeltaRejectedError) as e:
            self.recorder.emit("quarantine", round=m.round, site=link.name, message=str(e), action="rejected")
            raise
        if self.uploads.get(link.name) is not up and self.late.get(link.name) is not up:
            return                  # the site left (or its upload was dropped) while its delta was checked
        self.data_positions[link.name] = max(self.data_positions.get(link.name, 0), m.data_position)
        up.delta, up.metrics, up.norm = delta, m, norm
        up.chunks = {}              # the decoded delta is kept, the wire bytes need not be
        fields = {k: getattr(m, k) for k in m.__dataclass_fields__ if k != "round"}
        late = self.late.get(link.name) is up
        self.recorder.emit("site_round", round=m.round, site=link.name, late=late,
                           ratio=m.raw_bytes / m.wire_bytes if m.wire_bytes else 0.0,
                           received_wire_bytes=up.wire_bytes, delta_norm=norm,
                           delta_to_model=norm / self.param_norm if self.param_norm else 0.0, **fields)
        if late:
            del self.late[link.name]
            self._on_late_delta(link.name, up)
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
        """RTTs the site measured: the one message the protocol does not bound per round, so rate-limited."""
        if not link.probe_messages.take():
            raise RejectedError(Reject.RATE_LIMITED, f"site {link.name!r} sends link probes faster than "
                                f"{self.limits.probe_messages_per_s:g} a second")
        if not link.probe_samples.take(len(p.rtt_ms)):
            raise RejectedError(Reject.RATE_LIMITED, f"site {link.name!r} reports RTT samples faster than "
                                f"{self.limits.probe_samples_per_s:g} a second")
        if p.rtt_ms:
            self.recorder.emit("link_rtt", site=link.name, t=list(p.t), rtt_ms=list(p.rtt_ms))

    def on_hash_report(self, link: SiteLink, h: HashReport) -> None:
        """A site's hash after applying round h.round's update: each committed round at most once, in order."""
        if h.round + 1 > self.round:
            raise ProtocolError(f"hash report for round {h.round}, which has not been committed "
                                f"({self.round} rounds are)")
        if h.round <= link.last_hash_round:
            raise ProtocolError(f"hash report for round {h.round} after one for round {link.last_hash_round}")
        link.last_hash_round = h.round
        if not link.ready and (link.base_round is None or h.round < link.base_round):
            return                   # an update applied before the resync in flight: that model is gone
        expected = self.hashes.get(h.round + 1)
        ok = expected == h.model_hash
        self.recorder.emit("hash_check", round=h.round, site=link.name, ok=ok, site_hash=h.model_hash,
                           ps_hash=expected)
        if ok and link.ready and h.round + 1 == self.round:
            self._admit_to_round(link)    # a rejoined site that caught up with the rounds it missed
        if not ok and link.ready:          # one resync at a time: reports during a download change nothing
            self.recorder.emit("error", site=link.name, code="replica_mismatch",
                               message=f"site {link.name} has hash {h.model_hash} after round {h.round}, "
                                       f"the PS has {expected}; resyncing the site")
            log.error("replica mismatch at %s after round %d; resyncing", link.name, h.round)
            self._charge_download(link.name)
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
        stale = {f"{s}@{up.round}": up for s, up in sorted(self.stale.items())
                 if self.round - up.round <= MAX_STALENESS}     # keyed apart: a site may have a fresh delta too
        self.stale = {}
        verdicts = self._screen({**uploads, **stale})
        accepted = {k: up for k, up in uploads.items() if verdicts[k].action != "reject"}
        accepted_stale = {k: up for k, up in stale.items() if verdicts[k].action != "reject"}
        await self._freeze_downloads()
        t0 = time.time()
        result, stats, update_chunks = await asyncio.to_thread(self._aggregate, accepted, accepted_stale, verdicts)
        self.screen.remember(verdicts)
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
                        "idle_s": max(0.0, round_s - up.metrics.compute_s)} for s, up in accepted.items()}
        self.recorder.emit("round_end", round=r, val_loss=result.val_loss, model_hash=result.model_hash,
                           sites=list(result.sites), late_sites=list(result.late_sites), missed=sorted(self.late),
                           rejected=sorted(k for k, v in verdicts.items() if v.action == "reject"),
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

    def _screen(self, deltas: dict[str, _Upload]) -> dict:
        """Judge the round's deltas against each other and recent history (screening.Screen); say what
        was rejected or clipped. Rejecting every delta would stall the run, so then they are clipped."""
        verdicts = self.screen.judge({k: up.norm for k, up in deltas.items()})
        if verdicts and all(v.action == "reject" for v in verdicts.values()):
            verdicts = {k: Verdict("clip", v.norm, v.reference, self.cfg.robust.norm_factor * v.reference / v.norm)
                        for k, v in verdicts.items()}
        for key, v in verdicts.items():
            if v.action == "accept":
                continue
            site, _, late_round = key.partition("@")
            action = "rejected" if v.action == "reject" else f"clipped to {v.factor:.3g}x"
            self.recorder.emit("quarantine", round=self.round, site=site, action=v.action, norm=v.norm,
                               reference=v.reference, factor=v.factor,
                               message=f"{v.reason}: {action}" + (f" (late delta of round {late_round})"
                                                                   if late_round else ""))
            log.warning("round %d: the delta of %s %s: %s", self.round, key, action, v.reason)
        return verdicts

    def _aggregate(self, uploads: dict[str, _Upload], stale: dict[str, _Upload], verdicts: dict
                   ) -> tuple[RoundResult, EncodeStats, list[TensorChunk]]:
        """The round's aggregate applied to the model, in a worker thread (aggregate.py); then hash and evaluate."""
        self._stall("aggregate")
        t = self.cfg.train
        contributions = {}
        for key, up in {**uploads, **stale}.items():
            parts = up.delta if verdicts[key].action == "accept" else clipped(up.delta, verdicts[key].factor)
            weight = float(up.metrics.tokens)
            if key in stale:
                weight = stale_weight(up.metrics.tokens, self.round - up.round, t.staleness_discount)
            contributions[key] = Contribution(parts, weight)
        msgs, stats = aggregate_round(self.round, self.plan, self.shapes, live_views(self.model), contributions,
                                      self.outer, self.feedback, self.codec, self.cfg.robust.aggregate,
                                      self.cfg.robust.trim_fraction)
        h = param_hash(self.model)
        self.param_norm = self._param_norm()
        val = self.evaluate()
        late_sites = tuple(k.partition("@")[0] for k in stale)
        return RoundResult(self.round, h, tuple(uploads), val, late_sites), stats, msgs

    def _assemble(self, site: str, up: _Upload, steps: int) -> tuple[list[Extracted], float]:
        """Check a complete delta: decodable, finite, not out of all proportion. Keeps it as int8."""
        ordered = [up.chunks[i] for i in range(up.count)]
        for c in ordered:
            if c.data.scales and not np.all(np.isfinite(np.frombuffer(c.data.scales, "<f4"))):
                raise NonFiniteDeltaError(f"delta from {site} has non-finite scales in {c.spec.tensor!r}; "
                                          f"the site is quarantined for round {up.round}")
        try:
            parts = Codec.extract_many([c.data for c in ordered])
        except CodecError as e:
            raise ProtocolError(f"delta from {site} cannot be decoded: {e}") from None
        for c, x in zip(ordered, parts):
            if not x.finite():
                raise NonFiniteDeltaError(f"delta from {site} has non-finite values in {c.spec.tensor!r}; "
                                          f"the site is quarantined for round {up.round}")
        norm = delta_norm(parts)
        scale = max_delta_scale(self.cfg, self.param_norm, steps, self.num_params)
        bound = self.cfg.robust.max_delta_ratio * scale
        if bound and not norm <= bound:
            raise DeltaRejectedError(f"delta from {site} has norm {norm:.4g}, more than robust.max_delta_ratio "
                                     f"({self.cfg.robust.max_delta_ratio:g}) x {scale:.4g} (the larger of the global "
                                     f"model's norm and how far {steps} inner steps can move it); the site is "
                                     f"quarantined for round {up.round}")
        return parts, norm

    @torch.no_grad()
    def evaluate(self) -> float:
        if not self.val:
            return math.nan
        self.model.eval()
        losses = [torch.nn.functional.cross_entropy(self.model(x).flatten(0, 1), y.flatten()).item() for x, y in self.val]
        self.model.train()
        return float(np.mean(losses))


