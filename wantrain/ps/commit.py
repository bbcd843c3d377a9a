"""A round's commit: which deltas count and how much, the new model, and who hears of it.

`commit_round` runs when the round has closed (rounds.py). `weights` are what the deltas claim
(tokens trained, discounted per round of staleness); `judge` screens the round's deltas against
each other (screening.Screen) and says what it rejected, clipped or weighed less; what is left
(screening.counted) goes to the pure aggregation in aggregate.py; `round_end` is what the telemetry hears.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

import numpy as np

from ..aggregate import Contribution
from ..codec import EncodeStats
from ..memory import trim_heap
from ..messages import DeltaOutcome, RoundResult
from ..screening import Screen, Verdict, counted, gram
from ..telemetry import Recorder
from .rounds import stale_weight
from .state import commit_record
from .uploads import Upload

if TYPE_CHECKING:
    from .server import ParameterServer

__all__ = ["commit_round", "weights", "judge", "tell_sites", "round_end"]

log = logging.getLogger("wantrain.ps")


def weights(uploads: dict[str, Upload], stale: dict[str, Upload], round_: int, discount: float) -> dict[str, float]:
    """Each delta's weight as claimed: the tokens its site trained, discounted per round it is late."""
    out = {}
    for key, up in {**uploads, **stale}.items():
        assert up.metrics is not None                   # only complete, checked uploads commit
        out[key] = (stale_weight(up.metrics.tokens, round_ - up.round, discount) if key in stale
                    else float(up.metrics.tokens))
    return out


def judge(screen: Screen, round_: int, deltas: dict[str, Upload], claimed: dict[str, float], g: np.ndarray,
          recorder: Recorder) -> dict[str, Verdict]:
    """A verdict per delta (keys "site" or "site@round" for a late one; `g` their Gram matrix),
    each rejection or clip written as a `quarantine` event and a log line."""
    keys = list(deltas)
    verdicts = screen.judge(keys, g, [claimed[k] for k in keys])
    for key, v in verdicts.items():
        if not v.reason:
            continue
        site, _, late_round = key.partition("@")
        late = f" (late delta of round {late_round})" if late_round else ""
        recorder.emit("quarantine", round=round_, site=site, action=v.action, norm=v.norm, reference=v.reference,
                      factor=v.factor, weight=v.weight, claimed_weight=claimed[key], message=v.reason + late)
        log.warning("round %d: the delta of %s: %s", round_, key, v.reason)
    return verdicts


def tell_sites(ps: ParameterServer, verdicts: dict[str, Verdict]) -> None:
    """Each connected site whose delta was rejected or clipped hears so, and why, before the round's update."""
    for key, v in verdicts.items():
        site, _, late_round = key.partition("@")
        link = ps.links.get(site)
        if v.action == "accept" or link is None:
            continue
        outcome = "rejected" if v.action == "reject" else "clipped"
        link.outbox.put_nowait(DeltaOutcome(int(late_round) if late_round else ps.round, outcome,
                                            f"screened when round {ps.round} committed: {v.reason}"))


def round_end(round_: int, result: RoundResult, stats: EncodeStats, verdicts: dict[str, Verdict],
              accepted: dict[str, Upload], missed: list[str], round_s: float, aggregate_s: float) -> dict:
    """The fields of a `round_end` event: who counted, what the update cost, where the time went."""
    per_site = {s: {"steps": m.steps, "tokens": m.tokens, "compute_s": m.compute_s,
                    "idle_s": max(0.0, round_s - m.compute_s)}
                for s, m in ((s, up.metrics) for s, up in accepted.items()) if m is not None}
    return dict(round=round_, val_loss=result.val_loss, model_hash=result.model_hash, sites=list(result.sites),
                late_sites=list(result.late_sites), missed=missed,
                rejected=sorted(k for k, v in verdicts.items() if v.action == "reject"), per_site=per_site,
                raw_bytes=stats.raw_bytes, wire_bytes=stats.wire_bytes, ratio=stats.ratio,
                huffman_bits_per_symbol=stats.huffman_bits_per_symbol, encode_s=stats.seconds,
                aggregate_s=aggregate_s, round_s=round_s)


async def commit_round(ps: ParameterServer) -> None:
    """Screen and aggregate the closed round, apply it, journal it, tell every site; start the next."""
    uploads = {s: ps.uploads[s] for s in sorted(ps.in_round)}
    stale = ps.rounds.take_stale(ps.round)
    deltas = {**uploads, **stale}
    if ps.screen.trusted or len(deltas) < 2:      # only the norms are used: no pass over the deltas
        g = np.diag([up.norm ** 2 for up in deltas.values()])
    else:
        g = await asyncio.to_thread(gram, [up.delta for up in deltas.values()], [up.norm for up in deltas.values()])
    claimed = weights(uploads, stale, ps.round, ps.cfg.train.staleness_discount)
    verdicts = judge(ps.screen, ps.round, deltas, claimed, g, ps.recorder)
    tell_sites(ps, verdicts)
    accepted = {k: up for k, up in uploads.items() if verdicts[k].action != "reject"}
    accepted_stale = {k: up for k, up in stale.items() if verdicts[k].action != "reject"}
    await ps.downloads.freeze(ps.round)
    t0 = time.time()
    parts = counted({k: up.delta for k, up in deltas.items()}, verdicts)
    used = {**accepted, **accepted_stale}
    # The model may change only once the last full checkpoint is written (it writes the live
    # arrays), and a round may commit only once the deltas it counts are in the journal.
    await ps.checkpoints.settled()
    await asyncio.gather(*(up.journaled for up in used.values() if up.journaled is not None))
    result, stats, update_chunks = await asyncio.to_thread(_aggregate, ps, parts, accepted, accepted_stale)
    for alert in ps.screen.record(ps.round, verdicts):
        ps.recorder.emit("alert", round=ps.round, **alert)
        log.warning("alert: %s", alert["message"])
    aggregate_s = time.time() - t0
    r = ps.round
    ps.round += 1
    ps.hash = result.model_hash
    ps.hashes[ps.round] = ps.hash
    ps.val_loss = result.val_loss
    if ps.journal is not None:      # the commit point: durable before anyone hears of the round
        record = commit_record(ps, r, parts, verdicts, {k: up.round for k, up in used.items()})
        await asyncio.to_thread(ps.journal.commit, record)
    every = ps.cfg.train.checkpoint_every
    if ps.journal is not None and (ps.round % every == 0 or ps.round >= ps.cfg.train.rounds):
        ps.checkpoints.start()
    round_s = time.time() - ps.rounds.started_at
    ps.recorder.emit("round_end", **round_end(r, result, stats, verdicts, accepted, sorted(ps.late),
                                                round_s, aggregate_s))
    # Every site that holds the round's starting model applies the update, late ones included; a
    # site that comes back later holding that model gets it from the catch-up (no await between).
    ps.catchup.add(r, update_chunks, result)
    for name, link in ps.links.items():
        if name in ps.awaiting_model:               # rejoined during aggregation: gets the model
            continue
        for c in update_chunks:
            link.outbox.put_nowait(c)
        link.outbox.put_nowait(result)
    if ps.round >= ps.cfg.train.rounds:
        ps.told_finished.update(ps.links)
    ps.rounds.finish()
    ps.last_commit_at = time.time()
    for name in sorted(ps.awaiting_model):
        if name in ps.links:
            ps.send_model(ps.links[name])
    ps.awaiting_model.clear()
    trim_heap()                             # the commit's scratch memory, back while the sites train
    if ps.round >= ps.cfg.train.rounds:
        ps.recorder.emit("run_end", rounds=ps.round, val_loss=ps.val_loss)
        log.info("run finished: %d rounds, validation loss %.4f", ps.round, ps.val_loss)
        ps.done.set()
    else:
        ps.maybe_start_round()


def _aggregate(ps: ParameterServer, parts: dict[str, Contribution], uploads: dict[str, Upload],
               stale: dict[str, Upload]) -> tuple[RoundResult, EncodeStats, list]:
    """The round's aggregate applied to the global model, in a worker thread."""
    ps.stalls.sleep("aggregate", ps.round)
    msgs, stats, model_hash = ps.global_model.apply(ps.round, parts)
    val = ps.global_model.evaluate()
    late_sites = tuple(k.partition("@")[0] for k in stale)
    return RoundResult(ps.round, model_hash, tuple(uploads), val, late_sites), stats, msgs
