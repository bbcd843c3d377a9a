"""What the parameter server makes durable, and how it comes back from it.

Two records (journal.py explains why): the full state, written in the background every
`train.checkpoint_every` rounds (checkpoint.py writes the file), and a commit record per round,
written before any site hears of the round. A restarted PS loads the full state and replays the
commit records after it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from collections.abc import Callable, Collection

from ..outer.aggregate import Contribution
from ..outer.checking import CommitCheck
from .checkpoint import save_checkpoint
from ..config import LatePolicy, RunConfig
from ..errors import CheckpointError, ConfigError
from ..runtime.faults import Stalls
from ..transport.messages import RoundResult
from ..outer.screening import Screen, Verdict, clipped, parse_key
from ..telemetry import Recorder
from .catchup import Catchup
from .journal import Journal
from .ledger import Ledger
from .model import GlobalModel
from .rounds import MAX_STALENESS

__all__ = ["snapshot", "restore", "commit_record", "replay", "come_up", "CheckpointWriter"]

log = logging.getLogger("wantrain.ps")


def _small_state(ledger: Ledger, screen: Screen, check: CommitCheck) -> dict:
    """The PS's bookkeeping besides the arrays. In a snapshot "round" is the next round to run; a
    commit record overwrites it with the round it commits (the next is that + 1)."""
    return {**ledger.state_dict(), "screen": screen.state_dict(), "check": check.state_dict()}


def snapshot(cfg: RunConfig, ledger: Ledger, model: GlobalModel, screen: Screen, check: CommitCheck) -> dict:
    """Everything a restarted PS needs to go on where this one stands (after a committed round).
    The arrays are the live ones, not copies: the next round must not change them while they are
    written (commit.py waits for the write)."""
    return {**_small_state(ledger, screen, check), "config_json": cfg.to_json(), **model.state_dict(copy=False),
            "hashes": dict(ledger.hashes)}


def restore(cfg: RunConfig, ledger: Ledger, model: GlobalModel, screen: Screen, check: CommitCheck, saved: dict,
            path: Path) -> None:
    """Load a snapshot (read from `path`) into a freshly built PS's owners; ConfigError if it belongs
    to another run or is damaged."""
    if RunConfig.from_json(saved["config_json"]) != cfg:
        raise ConfigError(f"{path} was written by a run with a different config; "
                          "use a new run folder, or the config of that run")
    model.load_state_dict(saved)
    hashes = {int(k): v for k, v in saved["hashes"].items()}
    actual, said = model.hash(), hashes.get(int(saved["round"]))
    if actual != said:
        raise ConfigError(f"{path} is damaged: its parameters hash to {actual}, it says {said}")
    ledger.load_state_dict(saved, hashes)
    screen.load_state_dict(saved.get("screen", {}))
    check.load_state_dict(saved.get("check", {}))


def commit_record(ledger: Ledger, screen: Screen, check: CommitCheck, round_: int, parts: dict[str, Contribution],
                  side: dict[str, Contribution], verdicts: dict[str, Verdict], upload_rounds: dict[str, int],
                  late_policy: LatePolicy, chunks: dict[str, frozenset[int]] | None = None,
                  partial: Collection[str] = (), update_mode: str = "") -> dict:
    """Round `round_`'s commit record, once the PS has applied it: the deltas that counted (keys
    "site" or "site@round" for a late one), each with its weight and clip factor, whether it went
    outside the outer momentum (`side`) or was missing (counted as zeros), which of its chunks
    counted where not all did (`chunks`; `partial`: read from the journal's partial delta), and
    the state after; and the update's encoding where the controller chose one (`update_mode`)."""
    chunks = chunks or {}

    def entry(key: str, c: Contribution, side: bool) -> dict:
        if key not in upload_rounds:    # a member whose delta missed the round, or whose part in was rejected
            return {"key": key, "site": key, "missing": True, "weight": c.weight}
        out = {"key": key, "site": parse_key(key)[0], "upload_round": upload_rounds[key], "weight": c.weight,
               "factor": None if verdicts[key].action == "accept" else verdicts[key].factor, "side": side}
        if key in chunks:
            out.update(chunks=sorted(chunks[key]), partial=key in partial)
        return out

    counted = [entry(k, c, False) for k, c in sorted(parts.items())] + [entry(k, c, True) for k, c in sorted(side.items())]
    return {**_small_state(ledger, screen, check), "round": round_, "hash": ledger.hash, "contributions": counted,
            "substitute": late_policy.substitute, **({"update_mode": update_mode} if update_mode else {})}


def replay(journal: Journal, ledger: Ledger, model: GlobalModel, screen: Screen, check: CommitCheck,
           catchup: Catchup) -> list[dict]:
    """Apply the journal's rounds after the loaded full state; returns their commit records. Each
    must give the parameter hash it recorded (CheckpointError otherwise: the journal belongs to other
    parameters). The replayed rounds' updates go to `catchup`, for sites that come back holding an
    earlier model."""
    records = journal.commits_from(ledger.round)
    for rec in records:
        if rec["run_id"] != ledger.run_id:
            raise CheckpointError(f"{journal.folder}: round {rec['round']} belongs to run {rec['run_id']}, "
                                  f"the checkpoint to {ledger.run_id}")
        parts: dict[str, Contribution] = {}
        side: dict[str, Contribution] = {}
        for c in rec["contributions"]:
            if c.get("missing"):
                parts[c["key"]] = Contribution([None] * len(model.plan), c["weight"])
                continue
            delta = journal.read_delta(c["upload_round"], c["site"], partial=c.get("partial", False))
            if "chunks" in c:                   # only these chunks counted here
                taken = set(c["chunks"])
                delta = [x if i in taken else None for i, x in enumerate(delta)]
            into = side if c.get("side") else parts
            into[c["key"]] = Contribution(delta if c["factor"] is None else clipped(delta, c["factor"]), c["weight"])
        msgs, _, model_hash = model.apply(rec["round"], parts, side or None, rec.get("substitute", "peer"),
                                          rec.get("update_mode", ""))
        if model_hash != rec["hash"]:
            raise CheckpointError(f"{journal.folder}: replaying round {rec['round']} gives parameters hashing to "
                                  f"{model_hash}, the round committed {rec['hash']}")
        ledger.load_state_dict({**rec, "round": rec["round"] + 1}, {**ledger.hashes, rec["round"] + 1: model_hash})
        screen.load_state_dict(rec.get("screen", {}))
        check.load_state_dict(rec.get("check", {}))
        keys = [parse_key(c["key"]) for c in rec["contributions"] if not c.get("missing")]   # the result, as sent
        catchup.add(rec["round"], msgs, RoundResult(rec["round"], model_hash, tuple(s for s, r in keys if r is None),
                                                    ledger.val_loss, tuple(s for s, r in keys if r is not None)))
    return records


def come_up(cfg: RunConfig, ledger: Ledger, model: GlobalModel, screen: Screen, check: CommitCheck,
            saved: dict | None,
            path: Path | None, journal: Journal | None, checkpoints: CheckpointWriter | None, recorder: Recorder,
            corpus_summary: dict) -> Catchup:
    """Bring a freshly built PS's owners to where the run stands: the loaded checkpoint `saved`, then
    the journal's rounds after it (a restart); or, with nothing saved, begin the run's record (its
    run_start event and the first full checkpoint, the base later rounds are replayed onto). Returns
    the catch-up store, holding the replayed rounds' updates."""
    if saved is not None:
        assert path is not None
        restore(cfg, ledger, model, screen, check, saved, path)
    # A site that comes back holding an earlier model gets the updates it missed, not the model.
    catchup = Catchup(ledger.round, max_bytes=2 * model.num_params)
    if saved is None:
        recorder.emit("run_start", run_id=ledger.run_id, config=cfg.to_dict(), num_params=model.parameters(),
                      val_loss=ledger.val_loss, corpus=corpus_summary)
        if (warning := screen.cannot_decide(cfg.num_sites, check.enabled)) is not None:
            recorder.emit("alert", round=0, site="", sites=[], since=0, rounds=0, action="none", message=warning)
            log.warning("%s", warning)
        if checkpoints is not None:
            checkpoints.journal.clear()
            checkpoints.write(snapshot(cfg, ledger, model, screen, check))
        return catchup
    if journal is not None and (replayed := replay(journal, ledger, model, screen, check, catchup)):
        log.info("replayed %d journaled round(s) after the checkpoint of round %d", len(replayed),
                 ledger.round - len(replayed))
        # A PS stopped between a round's commit and its round_end event: the event, as the commit measured it
        logged = {e["round"] for e in recorder.rows("round_end")}
        for rec in replayed:
            if rec["round"] not in logged and "round_end" in rec:
                recorder.emit("round_end", **rec["round_end"], replayed=True)
    recorder.emit("restart", round=ledger.round, run_id=ledger.run_id)
    log.info("resumed run %s from its checkpoint at round %d (%s)", ledger.run_id, ledger.round, ledger.hash)
    return catchup


class CheckpointWriter:
    """Full checkpoints written in a worker thread while the run goes on, one at a time.

    The writer holds the live arrays (`snapshot`), so the PS awaits `settled()` before it changes
    the model. A failed write is logged and reported; the journal still holds every round since
    the last good checkpoint, so nothing is lost (it only grows until a write succeeds)."""

    def __init__(self, path: Path, journal: Journal, snapshot: Callable[[], dict], recorder: Recorder,
                 stalls: Stalls) -> None:
        self.path, self.journal, self.snapshot = path, journal, snapshot
        self.recorder, self.stalls = recorder, stalls
        self.task: asyncio.Future | None = None

    def start(self) -> None:
        assert self.task is None or self.task.done(), "one checkpoint at a time: await settled() first"
        self.task = asyncio.ensure_future(asyncio.to_thread(self.write, self.snapshot()))

    async def settled(self) -> None:
        if self.task is not None:
            await self.task

    def write(self, state: dict) -> None:
        round_ = int(state["round"])
        t0 = time.time()
        try:
            save_checkpoint(self.path, state, before_rename=lambda: self.stalls.sleep("checkpoint", round_))
            self.journal.trim(round_, keep_deltas_from=round_ - MAX_STALENESS - 1)
        except OSError as e:
            log.error("the checkpoint of round %d was not written (%s); the journal keeps every round since the "
                      "last one", round_, e)
            self.recorder.emit("error", code="checkpoint_failed", message=f"checkpoint of round {round_}: {e}")
            return
        self.recorder.emit("checkpoint", round=round_, seconds=time.time() - t0, bytes=self.path.stat().st_size)
