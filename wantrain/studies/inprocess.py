"""A run's rounds in this process: the code a wantrain run executes, without processes or sockets.

`InProcessRun` holds what a run's parties hold: each site's inner loop on its own shard
(site/train.py) with its uplink codec and error feedback, and the PS's screen (screening.py),
weights and global model (ps/model.py). A round is `train` for each site, then `commit` of the
deltas, which screens, weighs and aggregates them as the PS's commit does (ps/commit.py). Studies
(studies.compression.diloco_vs_sync) and benchmarks (bench/robustness.py) drive it; a benchmark may hand
`commit` a delta no honest site would send, built from what the protocol lets a site see.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..outer.aggregate import Contribution
from ..outer.checking import Checkable, CheckDecision, CommitCheck
from ..codec import ChunkSpec, Codec, Encoded, EncodeStats, ErrorFeedback, Extracted, encode_arrays
from ..config import RunConfig
from ..transport.messages import DELTA, DeltaParity, TensorChunk
from ..transport.sending import ProtectionGauge, group_parities
from ..transport.manifest import build_manifest, protect
from ..transport.roles import roles_of
from ..models.params import named_params
from ..outer.screening import Screen, Verdict, counted, gram
from ..transport.wire import framed_bytes, framed_size

__all__ = ["Sent", "InProcessRun"]


@dataclass
class Sent:
    """A delta as the PS holds it once it arrived: its chunks (int8 + scales) and its claimed tokens."""

    parts: list[Extracted]
    tokens: float
    wire_bytes: int = 0
    values: dict[str, np.ndarray] | None = None     # per tensor, the values the PS decodes
    encoded: list[tuple[ChunkSpec, Encoded]] | None = None   # the chunks as they went on the wire
    framed_bytes: int = 0                            # those chunks as gRPC messages (wire.framed_bytes)
    protection_framed_bytes: int = 0                 # what a site sends beside them: `InProcessRun.protection`

    @property
    def on_wire(self) -> int:
        """Every byte the delta took as gRPC messages: its chunks and their protection."""
        return self.framed_bytes + self.protection_framed_bytes


class InProcessRun:
    """`cfg.num_sites` sites and the PS's side of a run, in this process (CPU)."""

    def __init__(self, cfg: RunConfig, tok, corpus) -> None:
        import torch

        from ..ps.model import GlobalModel
        from ..site.group import build_inner

        self.cfg = cfg
        self.model = GlobalModel(cfg, tok.vocab_size, corpus.val)
        self.screen = Screen(cfg)
        self.check = CommitCheck(cfg.robust, cfg.num_sites)
        self.checks: list[CheckDecision] = []   # each checked round's decision
        self.names = self.site_names(cfg)
        self.sites = {n: build_inner(cfg, k, 0, torch.device("cpu"), n) for k, n in enumerate(self.names)}
        self.uplinks = {n: Codec(cfg.codec) for n in self.names}
        self.feedback = {n: ErrorFeedback() if cfg.codec.error_feedback else None for n in self.names}
        self.gauges = {n: ProtectionGauge(cfg.recovery) for n in self.names}   # what each site protects
        self.roles = roles_of({k: tuple(p.shape) for k, p in named_params(self.sites[self.names[0]].model).items()})
        self.alerts: list[dict] = []
        self.update_bytes: list[int] = []     # each committed round's encoded update (scales and payloads)
        self.update_framed_bytes: list[int] = []   # ... as the gRPC messages every site downloads

    @staticmethod
    def site_names(cfg: RunConfig) -> list[str]:
        return list(cfg.sites) or [f"site-{k}" for k in range(cfg.num_sites)]

    def start(self) -> dict[str, np.ndarray]:
        """A copy of the global model's parameters: what every site starts the round from."""
        return {k: v.copy() for k, v in self.model.views.items()}

    def train(self, name: str, round_: int, start: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], Sent]:
        """Site `name`'s round from `start`: its fp32 delta, and that delta as sent (through its
        codec, with its error feedback)."""
        from ..models.params import flat_copy, load_flat
        from ..site.train import Segment

        inner = self.sites[name]
        load_flat(inner.model, start)
        seg = Segment(round_, 0.0)
        inner.train(seg)
        delta, info = inner.delta(start, flat_copy(inner.model), seg)
        sent = self.encode(delta, info["tokens"], self.uplinks[name], self.feedback[name])
        sent.protection_framed_bytes = self.protection(name, round_, sent, info["tokens"], info["steps"])
        return delta, sent

    def protection(self, name: str, round_: int, sent: Sent, tokens: int, steps: int) -> int:
        """Bytes a site of this run sends beside its delta's chunks over a clean link (site/uplink.py):
        the manifest, and the copies of its critical chunks and the parity its gauge sizes (nothing lost,
        so with recovery.protection_adapts they stop after the first two rounds), each as a
        gRPC message."""
        assert sent.encoded is not None and sent.values is not None
        t = self.cfg.recovery
        manifest = build_manifest(round_, sent.encoded, sent.values, self.roles, tokens=int(tokens), steps=steps,
                                  by=t.importance)
        gauge = self.gauges[name]
        if (share := gauge.share()) > 0:
            manifest = protect(manifest, share, t.parity_group_size)
        copies = gauge.copies()
        gauge.saw_loss(0.0)
        total = framed_size(manifest)
        if copies:
            total += sum(framed_size(TensorChunk(DELTA, round_, i, len(sent.encoded), *sent.encoded[i]))
                         for i in manifest.critical())
        return total + sum(framed_size(DeltaParity(round_, g, p)) for g, p in group_parities(manifest, sent.encoded).items())

    @staticmethod
    def encode(delta: dict[str, np.ndarray], tokens: float, codec: Codec, feedback: ErrorFeedback | None) -> Sent:
        stats = EncodeStats()
        chunks, values = encode_arrays(delta, codec, feedback, stats)
        framed = framed_bytes(TensorChunk(DELTA, 0, i, len(chunks), spec, e) for i, (spec, e) in enumerate(chunks))
        return Sent(Codec.extract_many([e for _, e in chunks]), float(tokens), stats.wire_bytes, values, chunks, framed)

    def commit(self, round_: int, deltas: dict[str, Sent], lost: dict[str, frozenset[int]] | None = None,
               side: dict[str, Contribution] | None = None, substitute: str = "peer") -> dict[str, Verdict]:
        """Screen, weigh, check and aggregate the round's deltas into the global model, as the PS's
        commit does; the verdicts. `lost`: per delta, the chunks that did not arrive in time (the
        screen judges the whole deltas; the aggregate goes without those chunks); `side`,
        `substitute`: aggregate.py. A delta the commit check leaves out (checking.py) is
        rejected, and its site carries it in its error feedback, as a PS's site does."""
        keys = sorted(deltas)
        verdicts = self.screen.judge(keys, gram([deltas[k].parts for k in keys]), [deltas[k].tokens for k in keys])
        verdicts = self.check.exclude(verdicts)
        counts = counted({k: d.parts for k, d in deltas.items()}, verdicts)
        for k, chunks in (lost or {}).items():
            if k in counts and chunks:
                counts[k] = Contribution([None if i in chunks else p for i, p in enumerate(counts[k].parts)],
                                         counts[k].weight)

        def apply(kept: frozenset[str]):
            main = {k: c for k, c in counts.items() if k in kept} or {"": Contribution([None] * len(self.model.plan), 1.0)}
            return self.model.apply(round_, main, side, substitute)

        (update, stats, _), decision = self.check.run(round_, counts, Checkable(
            apply, self.model.check_loss, self.model.state_dict, self.model.load_state_dict))
        verdicts = self.check.left_out_verdicts(verdicts, decision)
        if decision is not None:
            self.checks.append(decision)
            self.alerts += [dict(a, round=round_) for a in self.check.record(round_, counts, decision)]
        if self.cfg.recovery.late_policy.carries_unapplied:
            for k, v in verdicts.items():    # what a site hears was not applied goes into its next delta
                if v.action == "reject" and (fb := self.feedback.get(k)) is not None and (sent := deltas[k].values):
                    fb.carry(sent)
        self.update_bytes.append(stats.wire_bytes)       # the round's update, as every site downloads it
        self.update_framed_bytes.append(framed_bytes(update))
        self.alerts += [dict(a, round=round_) for a in self.screen.record(round_, verdicts)]
        return verdicts

    def evaluate(self) -> float:
        return self.model.evaluate()
