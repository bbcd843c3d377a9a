"""A site that is a torch.distributed group: N processes (GPUs) train one replica together.

`wantrain worker --nproc N` starts the site under torchrun. Rank 0 runs the site's session, the
only rank that speaks to the PS; the other ranks hold the same model and follow rank 0's commands
(`follow`), each on its own batches of the site's shard. A round's inner steps run on every rank
with DDP (gradients averaged each step), so the ranks' replicas stay identical:

    rank 0                                   ranks 1..N-1
    setup: config, site index, data position  build the same model, sampler, optimizer
    train: round, budget, step count          the same
      broadcast the replica (the global model plus what the site applied since)
      per step: "go on?" (rank 0 decides: step count, time budget, overlap's stop)
      after: every rank's parameter hash, compared on rank 0 (ReplicaMismatchError if any differs)
    exit                                      return

Only rank 0 reports to the PS, and its figures are its own: the PS checks a site's token count
against steps x batch x block and weights deltas by it, and nothing on the wire says yet how many
ranks a site has, so a group's delta weighs like one process's. On CPU the group speaks
gloo, on CUDA NCCL. (The group's own rendezvous listens on this host only, as torchrun's does.)
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import NoReturn

import torch
import torch.distributed as dist

from ..config import RunConfig
from ..data import BatchSampler, eval_batches, load_run_data
from ..errors import ReplicaMismatchError
from ..models import build_model
from ..models.params import param_hash
from .train import InnerLoop, Segment

__all__ = ["group_rank", "build_inner", "site_sampler", "GroupInnerLoop", "follow", "leave"]

log = logging.getLogger("wantrain.site")


def group_rank() -> tuple[int, int]:
    """(rank, world size) of this process in its site's group; (0, 1) for a lone process."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def join_group(device: torch.device) -> None:
    if dist.is_available() and not dist.is_initialized() and group_rank()[1] > 1:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")


def _command(cmd: tuple | None = None) -> tuple:
    """Rank 0 sends `cmd` to the group; the other ranks receive it."""
    box = [cmd]
    dist.broadcast_object_list(box, src=0)
    return box[0]  # type: ignore[return-value]


def build_inner(cfg: RunConfig, site_index: int, data_position: int, device: torch.device, name: str,
                speed_factor: float = 1.0) -> InnerLoop:
    """The site's model, data and inner optimizer; in a group, every rank's (rank 0 tells the rest)."""
    rank, world = group_rank()
    if world > 1 and rank == 0:
        _command(("setup", cfg.to_json(), site_index, data_position, name, speed_factor))
    tok, corpus = load_run_data(cfg.data)
    model = build_model(cfg.model.preset, tok.vocab_size, cfg.model.seed, device)
    sampler = site_sampler(cfg, corpus, site_index, rank)
    sampler.seek(data_position)         # a restarted site picks up its shard where it left off
    cls = GroupInnerLoop if world > 1 else InnerLoop
    inner = cls(model, sampler, cfg.train, cfg.model.block_size, device, name, speed_factor)
    if cfg.recovery.probe_every:           # the sensitivity probe's: one batch of the held-out split
        inner.held_out = eval_batches(corpus.val, cfg.train.batch_size, cfg.model.block_size, 1)
    return inner


def site_sampler(cfg: RunConfig, corpus, site_index: int, rank: int = 0) -> BatchSampler:
    """The batches site `site_index` trains on: its shard of the corpus, in the order of its own seed
    (rank r of a group: its own seed too, the same count as every other rank)."""
    shard = corpus.shard(site_index, cfg.num_sites, cfg.data.sharding)
    t = cfg.train
    return BatchSampler(shard, t.batch_size, cfg.model.block_size, t.seed + 1000 * site_index + 100_003 * rank)


class GroupInnerLoop(InnerLoop):
    """InnerLoop on every rank of a group: DDP forward and backward, steps in lockstep."""

    takes_patches = False   # an update's tail waits for the next round: every rank must step alike

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.rank, self.world = group_rank()
        ids = [self.device.index] if self.device.type == "cuda" else None
        self.net = torch.nn.parallel.DistributedDataParallel(self.model, device_ids=ids)

    def train(self, seg: Segment, stop: threading.Event | None = None, start_hash: str = "",
              patch: Callable[[], None] | None = None) -> None:       # (never given: takes_patches)
        if self.rank == 0:
            _command(("train", seg.round, seg.train_s, seg.steps, seg.compute_s, self.steps))
        with torch.no_grad():                    # rank 0's replica is the site's: everyone starts from it
            for p in self.model.parameters():
                dist.broadcast(p.data, src=0)
        super().train(seg, stop, start_hash)
        hashes: list[str | None] = [None] * self.world
        dist.all_gather_object(hashes, param_hash(self.model))
        if len(set(hashes)) != 1:
            raise ReplicaMismatchError(f"site {self.name}: the ranks' replicas differ after round {seg.round}: "
                                       f"{hashes}")
        if self.rank == 0:
            log.info("site %s: round %d, %d ranks agree on replica %s after %d steps", self.name, seg.round,
                     self.world, hashes[0], seg.steps)

    def _keep_going(self, seg: Segment, stop: threading.Event | None) -> bool:
        go = torch.tensor([int(self.rank == 0 and super()._keep_going(seg, stop))])
        dist.broadcast(go, src=0)                 # rank 0 decides for all: budgets and stops are its
        return bool(go.item())


def follow(device: torch.device) -> int:
    """What ranks 1..N-1 do: rank 0's commands, until it says exit (or the group breaks)."""
    inner: InnerLoop | None = None
    while True:
        cmd = _command()
        if cmd[0] == "setup":
            _, cfg_json, site_index, data_position, name, speed_factor = cmd
            inner = build_inner(RunConfig.from_json(cfg_json), site_index, data_position, device, name, speed_factor)
        elif cmd[0] == "train" and inner is not None:
            _, round_, train_s, steps, compute_s, inner.steps = cmd
            inner.train(Segment(round_, train_s, steps, compute_s))
        elif cmd[0] == "exit":
            return 0


def leave(code: int) -> NoReturn:
    """At the site's normal end: rank 0 releases the other ranks; every rank leaves the group and
    exits with `code` at once. Not through the interpreter's teardown: the group's threads (gloo,
    DDP's reducer) may still be alive there, and a rank once aborted in it ("terminate called
    without an active exception") after a run that had gone well."""
    if group_rank()[0] == 0:
        _command(("exit",))
    dist.destroy_process_group()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
