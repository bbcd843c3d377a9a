"""A round's commit: which deltas count and how much, the new model, what is made durable.

`Committer.commit` runs when the round has closed (rounds.py) and returns what it committed
(`Committed`); the server then tells the sites. `weights` are what the deltas claim
(tokens trained, discounted per round of staleness); `judge` screens the round's deltas against
each other (screening.Screen) and says what it rejected, clipped or weighed less; what is left
(screening.counted) goes to the pure aggregation in aggregate.py; `round_end` is what the telemetry hears.

Under late_policy "zero-outside" (`zero_outside`) a member whose delta missed the round counts as
zeros at the mean weight of the deltas counted, and a late delta goes to the aggregation's side
path at that share of its own round, outside the outer momentum (outer/aggregate.py). Under "zero-carry"
the zeros are the same and no late delta comes: its site carries it into its next delta.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Collection, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np

from ..outer.aggregate import Contribution
from ..outer.checking import Checkable, CheckDecision, CommitCheck
from ..codec import EncodeStats, Extracted
from ..errors import DeltaRejectedError, NonFiniteDeltaError, ProtocolError
from ..config import LatePolicy, RunConfig
from ..runtime.faults import Stalls
from ..transport.messages import DeltaOutcome, RoundResult, TensorChunk
from .downlink import split_update, update_energies
from ..outer.screening import Screen, Verdict, counted, gram, norms_on_supports, parse_key, sum_of_squares
from ..telemetry import Recorder
from ..transport.wire import framed_bytes
from .downloads import Downloads
from .journal import Journal
from .ledger import Ledger
from .model import GlobalModel
from .rounds import stale_weight
from .state import CheckpointWriter, commit_record
from .uploads import Checked, Upload, assemble_part

__all__ = ["Committer", "Committed", "weights", "judge", "outcomes", "recovery", "round_end", "zero_outside"]

log = logging.getLogger("wantrain.ps")


def weights(uploads: dict[str, Upload], stale: dict[str, Upload], partial: dict[str, Upload], round_: int,
            discount: float) -> dict[str, float]:
    """Each delta's weight as claimed: the tokens its site trained, discounted per round it is late
    (a partial delta's, as its manifest claims them)."""
    out = {}
    for key, up in {**uploads, **stale}.items():
        assert up.metrics is not None                   # only complete, checked uploads commit
        out[key] = (stale_weight(up.metrics.tokens, round_ - up.round, discount) if key in stale
                    else float(up.metrics.tokens))
    for key, up in partial.items():
        assert up.manifest is not None
        out[key] = float(up.manifest.tokens)
    return out


def zero_outside(parts: dict[str, Contribution], late: dict[str, Upload], missing: list[str], claimed: dict[str, float],
                 chunks: int) -> tuple[dict[str, Contribution], dict[str, Contribution], dict[str, float]]:
    """late_policy "zero-outside": the round's contributions with each `missing` member that has no
    chunk counted as zeros at the mean weight of the deltas counted, the `late` deltas (keys
    "site@round", screened into `parts`) as side contributions at their share of their own round
    (less what screening took off their claimed weight), and the share each missing member's delta
    (or the rest of it, for one whose chunks in at the deadline count) will have when it comes."""
    side = {k: Contribution(c.parts, late[k].share * c.weight / claimed[k]) for k, c in parts.items() if k in late}
    current = {k: c for k, c in parts.items() if k not in late}
    if not current or not missing:
        return current, side, {}
    absent = [s for s in missing if s not in current]
    weight = sum(c.weight for c in current.values()) / len(current)
    total = sum(c.weight for c in current.values()) + weight * len(absent)
    for site in absent:
        current[site] = Contribution([None] * chunks, weight)
    return current, side, {site: current[site].weight / total for site in missing}


def judge(screen: Screen, round_: int, keys: list[str], claimed: dict[str, float], g: np.ndarray,
          recorder: Recorder, on_support: np.ndarray | None = None,
          check: CommitCheck | None = None) -> dict[str, Verdict]:
    """A verdict per delta (keys "site" or "site@round" for a late one; `g` their Gram matrix;
    `on_support` for partial ones: screening.norms_on_supports; the deltas of a site the `check`
    excluded rejected), each rejection or clip written as a `quarantine` event and a log line."""
    verdicts = screen.judge(keys, g, [claimed[k] for k in keys], on_support)
    if check is not None:
        verdicts = check.exclude(verdicts)
    report(round_, verdicts, claimed, recorder)
    return verdicts


def report(round_: int, verdicts: dict[str, Verdict], claimed: dict[str, float], recorder: Recorder,
           only: Collection[str] | None = None) -> None:
    """Each rejection or clip among `verdicts` (those keyed in `only`, if given) as a `quarantine`
    event and a log line."""
    for key, v in verdicts.items():
        if only is not None and key not in only:
            continue
        if not v.reason:
            continue
        site, late_round = parse_key(key)
        late = f" (late delta of round {late_round})" if late_round is not None else ""
        recorder.emit("quarantine", round=round_, site=site, action=v.action, norm=v.norm, reference=v.reference,
                      factor=v.factor, weight=v.weight, claimed_weight=claimed[key], message=v.reason + late)
        log.warning("round %d: the delta of %s: %s", round_, key, v.reason)


def outcomes(round_: int, verdicts: dict[str, Verdict]) -> dict[str, DeltaOutcome]:
    """What each site whose delta was rejected or clipped hears, and why, before the round's update."""
    out = {}
    for key, v in verdicts.items():
        site, late_round = parse_key(key)
        if v.action != "accept":
            out[site] = DeltaOutcome(round_ if late_round is None else late_round,
                                     "rejected" if v.action == "reject" else "clipped",
                                     f"screened when round {round_} committed: {v.reason}")
    return out


def recovery(policy: LatePolicy, close: str, missing: list[str], chunks: int,
             counted_chunks: dict[str, frozenset[int]], side: dict[str, Contribution]) -> dict:
    """What a round did about the deltas, or chunks, that were not in when it closed (`close`: why it
    closed): the recovery fields of its `round_end` event (docs/telemetry.md)."""
    return {"close": close, "substitute": policy.substitute,
            "partial": {s: len(c) for s, c in sorted(counted_chunks.items())},
            "substituted": {s: chunks - len(counted_chunks.get(s, ())) for s in missing},
            "reconciled": {k: sum(p is not None for p in c.parts) for k, c in sorted(side.items())}}


def round_end(round_: int, result: RoundResult, stats: EncodeStats, verdicts: dict[str, Verdict],
              accepted: dict[str, Upload], missed: list[str], closed_s: float, round_s: float,
              aggregate_s: float, recovered: dict, framed_bytes: int) -> dict:
    """The fields of a `round_end` event: who counted, what the update cost (`framed_bytes`: its
    chunks as gRPC messages, as each site downloads them), where the time went, what stood in for
    what was missing (`recovered`: `recovery`)."""
    per_site = {s: {"steps": m.steps, "tokens": m.tokens, "compute_s": m.compute_s,
                    "idle_s": max(0.0, round_s - m.compute_s)}
                for s, m in ((s, up.metrics) for s, up in accepted.items()) if m is not None}
    return dict(round=round_, val_loss=result.val_loss, model_hash=result.model_hash, sites=list(result.sites),
                late_sites=list(result.late_sites), missed=missed,
                rejected=sorted(k for k, v in verdicts.items() if v.action == "reject"), per_site=per_site,
                raw_bytes=stats.raw_bytes, wire_bytes=stats.wire_bytes, framed_bytes=framed_bytes,
                ratio=stats.raw_bytes / framed_bytes if framed_bytes else 0.0,
                huffman_bits_per_symbol=stats.huffman_bits_per_symbol, encode_s=stats.seconds,
                aggregate_s=aggregate_s, closed_s=closed_s, round_s=round_s, close=recovered["close"],
                substitute=recovered["substitute"], partial=recovered["partial"],
                substituted=recovered["substituted"], reconciled=recovered["reconciled"])


@dataclass
class Committed:
    """A committed round, for the server to act on: what every site hears, and who hears what first."""
    round: int                                  # the round committed (the ledger now stands after it)
    result: RoundResult
    update: list[TensorChunk]                   # the encoded update, as every site applies it, in sending order
    tail: int                                   # its last chunks, sent after the next RoundStart (downlink_budget)
    outcomes: dict[str, DeltaOutcome]           # sites whose delta was rejected or clipped
    finished: bool                              # the run's last round
    late_shares: dict[str, float]               # zero-outside: members that missed it, their delta's share
    counted_chunks: dict[str, frozenset[int]]   # partial_deltas: members of which it counted these chunks


class Committer:
    """Commits closed rounds: screens the deltas, aggregates what counts into the model, journals
    the round and advances the ledger. It owns none of them; the server builds it with them."""

    def __init__(self, cfg: RunConfig, ledger: Ledger, model: GlobalModel, screen: Screen, check: CommitCheck,
                 downloads: Downloads, journal: Journal | None, checkpoints: CheckpointWriter | None,
                 recorder: Recorder, stalls: Stalls) -> None:
        self.cfg, self.ledger, self.model, self.screen, self.downloads = cfg, ledger, model, screen, downloads
        self.check = check
        self.journal, self.checkpoints, self.recorder, self.stalls = journal, checkpoints, recorder, stalls

    async def commit(self, uploads: dict[str, Upload], stale: dict[str, Upload], late: dict[str, Upload],
                     started_at: float, close: str = "complete", partial: bool = False, split: bool = False,
                     update_mode: str = "") -> Committed:
        """Screen and aggregate the closed round (`uploads` of its members, `stale` late deltas kept
        for it, `late` the sites owing a delta, as it stands when the round ends; `close`: why it
        closed; `partial`: it counts the chunks in of a delta with a manifest), apply it and make it
        durable. `split`: its update goes in a head and a tail (ps/downlink.py). `update_mode`:
        the update's encoding, as the controller chose it ("": the run's; journaled, for the replay)."""
        round_ = self.ledger.round
        closed_s = time.time() - started_at      # the round's deltas are in (or its deadline came)
        outside = self.cfg.recovery.late_policy.zero_substitute      # zeros stand in (zero-outside, zero-carry)
        # Now, before any await: a late delta arriving meanwhile leaves `late` for the next round's
        # side, and a chunk arriving meanwhile joins the rest of its partial delta.
        missing = sorted(s for s, up in late.items() if up.round == round_)
        missed = sorted(late)
        # The chunks a partial delta counts, as they stand now: its metrics, arriving while the views
        # are built, empty the Upload's own dict (on_metrics).
        decoding = {s: dict(late[s].decoding) for s in missing if partial and late[s].counts_in_part}
        taking = {s: frozenset(d) for s, d in decoding.items()}
        parts_of = {s: late[s] for s in taking}
        views, refused = await asyncio.to_thread(self._views, uploads, stale, parts_of, decoding)
        for site, why in refused.items():
            del parts_of[site]
            self.recorder.emit("quarantine", round=round_, site=site, message=why, action="rejected")
            log.warning("round %d: the chunks of %s in at the deadline are not counted: %s", round_, site, why)
        # The rest of a delta whose round counted its head is judged as the whole delta it completes
        # (a few chunks are too little evidence of an angle); what is applied is the rest only.
        judged = {k: (stale[k].checked, stale[k].norm) if k in stale and stale[k].counted else v
                  for k, v in views.items()}
        on_support = None
        if self.screen.trusted or len(views) < 2:       # only the norms are used: no pass over the deltas
            g = np.diag([norm ** 2 for _, norm in judged.values()])
        else:
            g = await asyncio.to_thread(gram, [p for p, _ in judged.values()], [norm for _, norm in judged.values()])
            on_support = await asyncio.to_thread(norms_on_supports, [p for p, _ in judged.values()])
        claimed = weights(uploads, stale, parts_of, round_, 1.0 if outside else self.cfg.recovery.staleness_discount)
        verdicts = judge(self.screen, round_, list(views), claimed, g, self.recorder, on_support, self.check)
        accepted = {k: up for k, up in uploads.items() if verdicts[k].action != "reject"}
        accepted_stale = {k: up for k, up in stale.items() if verdicts[k].action != "reject"}
        counted_chunks = {s: taking[s] for s in parts_of if verdicts[s].action != "reject"}
        await self.downloads.freeze(round_)
        t0 = time.time()
        parts = counted({k: p for k, (p, _) in views.items()}, verdicts)
        side: dict[str, Contribution] = {}
        shares: dict[str, float] = {}
        if outside:
            parts, side, shares = zero_outside(parts, stale, missing, claimed, len(self.model.plan))
        used = {**accepted, **accepted_stale}
        # The model may change only once the last full checkpoint is written (it writes the live
        # arrays), and a round may commit only once the deltas it counts are in the journal.
        if self.checkpoints is not None:
            await self.checkpoints.settled()
        await asyncio.gather(*(up.journaled for up in used.values() if up.journaled is not None))
        if self.journal is not None:
            for site in counted_chunks:
                await asyncio.to_thread(self.journal.write_delta, round_, site, views[site][0], True)
        subjects = {*accepted, *accepted_stale, *counted_chunks}      # the deltas the check may leave out
        result, stats, update, decision = await asyncio.to_thread(self._aggregate, round_, parts, side, subjects,
                                                                  update_mode)
        if decision is not None:      # what the commit check decided (checking.py)
            verdicts = self.check.left_out_verdicts(verdicts, decision)
            report(round_, verdicts, claimed, self.recorder, only=decision.left_out)
            self.recorder.emit("check", **decision.event())
            left = set(decision.left_out)
            accepted = {k: up for k, up in accepted.items() if k not in left}
            accepted_stale = {k: up for k, up in accepted_stale.items() if k not in left}
            counted_chunks = {k: c for k, c in counted_chunks.items() if k not in left}
            parts = {k: c for k, c in parts.items() if k not in left}
            side = {k: c for k, c in side.items() if k not in left}
            used = {k: up for k, up in used.items() if k not in left}
            for alert in self.check.record(round_, [parse_key(k)[0] for k in subjects], decision):
                self.recorder.emit("alert", round=round_, **alert)
                log.warning("alert: %s", alert["message"])
        result = RoundResult(round_, result.model_hash, tuple(accepted), result.val_loss,
                             tuple(parse_key(k)[0] for k in accepted_stale),
                             partial_chunks=tuple(sorted(counted_chunks.items())))
        for alert in self.screen.record(round_, verdicts):
            self.recorder.emit("alert", round=round_, **alert)
            log.warning("alert: %s", alert["message"])
        aggregate_s = time.time() - t0
        self.ledger.advance(result.model_hash, result.val_loss)
        recovered = recovery(self.cfg.recovery.late_policy, close, missing, len(self.model.plan),
                             counted_chunks, side)
        framed = await asyncio.to_thread(framed_bytes, update)
        end = round_end(round_, result, stats, verdicts, accepted, missed, closed_s, time.time() - started_at,
                        aggregate_s, recovered, framed)
        if self.journal is not None:      # the commit point: durable before anyone hears of the round
            chunks = {**counted_chunks, **{k: frozenset(range(len(self.model.plan))) - up.counted
                                           for k, up in accepted_stale.items() if up.counted}}
            record = commit_record(self.ledger, self.screen, self.check, round_, parts, side, verdicts,
                                   {**{k: up.round for k, up in used.items()}, **dict.fromkeys(counted_chunks, round_)},
                                   self.cfg.recovery.late_policy, chunks, set(counted_chunks), update_mode)
            # with its round_end event: a PS stopped before it logged the event logs it when it replays the round
            await asyncio.to_thread(self.journal.commit, {**record, "round_end": end})
        self.recorder.emit("round_end", **{**end, "round_s": time.time() - started_at})     # the commit included
        finished = self.ledger.round >= self.cfg.train.rounds
        if self.checkpoints is not None and (self.ledger.round % self.cfg.train.checkpoint_every == 0 or finished):
            self.checkpoints.start()
        tail = 0
        if split:
            update, tail = await asyncio.to_thread(self._split, round_, update)
        return Committed(round_, result, update, tail, outcomes(round_, verdicts), finished, shares, counted_chunks)

    def _split(self, round_: int, update: list[TensorChunk]) -> tuple[list[TensorChunk], int]:
        """The update in sending order, head then tail, and the tail's length; in a worker thread."""
        energies = update_energies(update)
        head, tail = split_update(update, energies, self.model.roles, self.cfg.recovery.downlink_budget)
        total = sum(energies)
        tail_energy = sum(energies[c.index] for c in tail)
        self.recorder.emit("update_split", round=round_, head_chunks=len(head), tail_chunks=len(tail),
                           tail_energy=tail_energy / total if total > 0 else 0.0,
                           head_mb=sum(c.data.wire_bytes for c in head) / 1e6,
                           tail_mb=sum(c.data.wire_bytes for c in tail) / 1e6)
        return head + tail, len(tail)

    def _views(self, uploads: dict[str, Upload], stale: dict[str, Upload], partial: dict[str, Upload],
               decoding: dict[str, dict[int, Future[Checked]]]
               ) -> tuple[dict[str, tuple[Sequence[Extracted | None], float]], dict[str, str]]:
        """Each delta as the round takes it, its chunks and norm (keys in the order uploads, stale,
        partial): a late delta whose round counted some chunks without the rest (`counted`) gives
        only the rest; a partial one, the chunks in `decoding`, checked (assemble_part), or why
        they are refused. In a worker thread."""
        views: dict[str, tuple[Sequence[Extracted | None], float]] = {k: (up.checked, up.norm)
                                                                      for k, up in uploads.items()}
        for k, up in stale.items():
            rest = [None if i in up.counted else x for i, x in enumerate(up.checked)]
            views[k] = (rest, math.sqrt(math.fsum(sum_of_squares(x) for x in rest if x is not None))) \
                if up.counted else (up.checked, up.norm)
        refused = {}
        for site, up in partial.items():
            try:
                assert up.manifest is not None          # counts_in_part
                views[site] = assemble_part(self.cfg, site, up.manifest, decoding[site], self.model.norm,
                                            self.model.num_params)
            except (NonFiniteDeltaError, DeltaRejectedError, ProtocolError) as e:
                refused[site] = str(e)
        return views, refused

    def _aggregate(self, round_: int, parts: dict[str, Contribution], side: dict[str, Contribution],
                   subjects: Collection[str], update_mode: str = ""
                   ) -> tuple[RoundResult, EncodeStats, list, CheckDecision | None]:
        """The round's aggregate applied to the global model, checked (`subjects`: the keys of the deltas
        the check may leave out; the rest of `parts` are zeros standing in), in a worker thread. The
        result's sites are filled in by the caller, once it knows whom the check left out."""
        self.stalls.sleep("aggregate", round_)
        substitute = self.cfg.recovery.late_policy.substitute
        subjects = frozenset(k for k in (*parts, *side) if k in subjects)

        def apply(kept: frozenset[str]):
            main = {k: c for k, c in parts.items() if k in kept or k not in subjects}
            late = {k: c for k, c in side.items() if k in kept}
            if not main:        # only late deltas kept: the round's own mean is zeros
                main = {"": Contribution([None] * len(self.model.plan), 1.0)}
            return self.model.apply(round_, main, late or None, substitute, update_mode)

        (msgs, stats, model_hash), decision = self.check.run(round_, subjects, Checkable(
            apply, self.model.check_loss, self.model.state_dict, self.model.load_state_dict))
        val = self.model.evaluate()
        return RoundResult(round_, model_hash, (), val, ()), stats, msgs, decision
