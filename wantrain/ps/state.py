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
from typing import TYPE_CHECKING

from ..aggregate import Contribution
from ..checkpoint import save_checkpoint
from ..config import RunConfig
from ..errors import CheckpointError, ConfigError
from ..messages import RoundResult
from ..screening import Verdict, clipped
from .catchup import Catchup
from .rounds import MAX_STALENESS

if TYPE_CHECKING:
    from .server import ParameterServer

__all__ = ["snapshot", "restore", "commit_record", "replay", "CheckpointWriter"]

log = logging.getLogger("wantrain.ps")


def _small_state(ps: ParameterServer) -> dict:
    """The PS's bookkeeping besides the arrays. In a snapshot "round" is the next round to run; a
    commit record overwrites it with the round it commits (the next is that + 1)."""
    return {"run_id": ps.run_id, "round": ps.round, "registry": dict(ps.registry),
            "data_positions": dict(ps.data_positions), "val_loss": ps.val_loss,
            "screen": ps.screen.state_dict()}


def snapshot(ps: ParameterServer) -> dict:
    """Everything a restarted PS needs to go on where this one stands (after a committed round).
    The arrays are the live ones, not copies: the next round must not change them while they are
    written (commit.py waits for the write)."""
    return {**_small_state(ps), "config_json": ps.cfg.to_json(), **ps.global_model.state_dict(copy=False),
            "hashes": dict(ps.hashes)}


def restore(ps: ParameterServer, saved: dict) -> None:
    """Load a snapshot into a freshly built PS; ConfigError if it belongs to another run or is damaged."""
    if RunConfig.from_json(saved["config_json"]) != ps.cfg:
        raise ConfigError(f"{ps.ckpt_path} was written by a run with a different config; "
                          "use a new run folder, or the config of that run")
    ps.global_model.load_state_dict(saved)
    ps.run_id, ps.round, ps.val_loss = saved["run_id"], int(saved["round"]), float(saved["val_loss"])
    ps.hashes = {int(k): v for k, v in saved["hashes"].items()}
    ps.registry = dict(saved["registry"])
    ps.data_positions = {k: int(v) for k, v in saved.get("data_positions", {}).items()}
    ps.screen.load_state_dict(saved.get("screen", {}))
    ps.hash = ps.global_model.hash()
    ps.catchup = Catchup(ps.round, ps.catchup.max_bytes)    # replayed rounds are kept for catch-ups
    if ps.hash != ps.hashes.get(ps.round):
        raise ConfigError(f"{ps.ckpt_path} is damaged: its parameters hash to {ps.hash}, "
                          f"it says {ps.hashes.get(ps.round)}")


def commit_record(ps: ParameterServer, round_: int, parts: dict[str, Contribution], verdicts: dict[str, Verdict],
                  upload_rounds: dict[str, int]) -> dict:
    """Round `round_`'s commit record, once the PS has applied it: the deltas that counted (keys
    "site" or "site@round" for a late one), each with its weight and clip factor, and the state after."""
    counted = [{"key": k, "site": k.partition("@")[0], "upload_round": upload_rounds[k], "weight": c.weight,
                "factor": None if verdicts[k].action == "accept" else verdicts[k].factor}
               for k, c in sorted(parts.items())]
    return {**_small_state(ps), "round": round_, "hash": ps.hash, "contributions": counted}


def replay(ps: ParameterServer) -> int:
    """Apply the journal's rounds after the loaded full state; returns how many. Each must give the
    parameter hash it recorded (CheckpointError otherwise: the journal belongs to other parameters)."""
    assert ps.journal is not None
    records = ps.journal.commits_from(ps.round)
    for rec in records:
        if rec["run_id"] != ps.run_id:
            raise CheckpointError(f"{ps.journal.folder}: round {rec['round']} belongs to run {rec['run_id']}, "
                                  f"the checkpoint to {ps.run_id}")
        parts = {}
        for c in rec["contributions"]:
            delta = ps.journal.read_delta(c["upload_round"], c["site"])
            parts[c["key"]] = Contribution(delta if c["factor"] is None else clipped(delta, c["factor"]), c["weight"])
        msgs, _, model_hash = ps.global_model.apply(rec["round"], parts)
        if model_hash != rec["hash"]:
            raise CheckpointError(f"{ps.journal.folder}: replaying round {rec['round']} gives parameters hashing to "
                                  f"{model_hash}, the round committed {rec['hash']}")
        ps.round, ps.hash, ps.val_loss = rec["round"] + 1, model_hash, float(rec["val_loss"])
        ps.hashes[ps.round] = model_hash
        ps.registry = dict(rec["registry"])
        ps.data_positions = {k: int(v) for k, v in rec["data_positions"].items()}
        ps.screen.load_state_dict(rec.get("screen", {}))
        keys = [c["key"] for c in rec["contributions"]]     # the round's result, as the sites got it
        ps.catchup.add(rec["round"], msgs, RoundResult(rec["round"], model_hash, tuple(k for k in keys if "@" not in k),
                                                       ps.val_loss, tuple(k.partition("@")[0] for k in keys if "@" in k)))
    return len(records)


class CheckpointWriter:
    """Full checkpoints written in a worker thread while the run goes on, one at a time.

    The writer holds the live arrays (snapshot), so the PS awaits `settled()` before it changes
    the model. A failed write is logged and reported; the journal still holds every round since
    the last good checkpoint, so nothing is lost (it only grows until a write succeeds)."""

    def __init__(self, ps: ParameterServer) -> None:
        self.ps = ps
        self.task: asyncio.Future | None = None

    def start(self) -> None:
        assert self.task is None or self.task.done(), "one checkpoint at a time: await settled() first"
        self.task = asyncio.ensure_future(asyncio.to_thread(self.write, snapshot(self.ps)))

    async def settled(self) -> None:
        if self.task is not None:
            await self.task

    def write(self, state: dict) -> None:
        ps, round_ = self.ps, int(state["round"])
        assert ps.ckpt_path is not None and ps.journal is not None
        t0 = time.time()
        try:
            save_checkpoint(ps.ckpt_path, state, before_rename=lambda: ps.stalls.sleep("checkpoint", round_))
            ps.journal.trim(round_, keep_deltas_from=round_ - MAX_STALENESS - 1)
        except OSError as e:
            log.error("the checkpoint of round %d was not written (%s); the journal keeps every round since the "
                      "last one", round_, e)
            ps.recorder.emit("error", code="checkpoint_failed", message=f"checkpoint of round {round_}: {e}")
            return
        ps.recorder.emit("checkpoint", round=round_, seconds=time.time() - t0, bytes=ps.ckpt_path.stat().st_size)
