"""The inner loop of DiLoCo: AdamW steps of one replica from the global parameters.

`InnerLoop.train` takes a round's steps (a number of them or a compute budget), possibly in
several pieces (a `Segment` keeps the count), and `InnerLoop.delta` returns the pseudo-gradient
(start - end) with what the round cost. Sites use them through their schedule (schedule.py);
`InnerLoop.run` is one whole round, which studies/compression.py uses to make real deltas for the codec's
benchmarks.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from ..config import TrainConfig
from ..data import BatchSampler
from ..errors import DivergedError
from ..models.params import flat_copy, load_flat
from .adamw import InnerAdamW

__all__ = ["InnerLoop", "Segment", "lr_at"]


def lr_at(t: TrainConfig, step: int, progress: float) -> float:
    """Linear warm-up over a replica's first steps, then cosine over the run's rounds.

    `step` counts the inner steps of this process's optimizer: a restarted site starts with
    fresh AdamW moments, so it warms up again. `progress` is how far the run is, in rounds
    (a fraction within the current one), so fixed-step and time-budgeted rounds follow the
    same curve."""
    if step < t.warmup_steps:
        return t.inner_lr * (step + 1) / t.warmup_steps
    p = min(1.0, progress / t.rounds)
    return t.inner_lr * (t.min_lr_ratio + (1 - t.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * p)))


@dataclass
class Segment:
    """One round's inner steps so far (the overlap schedule takes some before the round's RoundStart)."""

    round: int
    train_s: float                   # > 0: a compute budget in seconds; 0: the configured inner_steps
    steps: int = 0
    compute_s: float = 0.0           # emulated compute included (a slow machine's padding)
    emulated_s: float = 0.0
    losses: list[float] = field(default_factory=list)

    def done(self, t: TrainConfig) -> bool:
        return self.compute_s >= self.train_s if self.train_s > 0 else self.steps >= t.inner_steps


class InnerLoop:
    """A replica's inner optimizer and data: `train` takes a round's inner steps, `delta` measures them."""

    def __init__(self, model: torch.nn.Module, sampler: BatchSampler, train: TrainConfig, block_size: int,
                 device: torch.device, name: str = "site", speed_factor: float = 1.0) -> None:
        self.model, self.sampler, self.t, self.block_size = model, sampler, train, block_size
        self.device, self.name, self.speed_factor = device, name, speed_factor
        self.opt = InnerAdamW(model.parameters(), lr=train.inner_lr, betas=(0.9, 0.95),
                              weight_decay=train.inner_weight_decay)
        self.steps = 0                 # inner steps of this optimizer, over every round
        self.held_out: list[tuple[torch.Tensor, torch.Tensor]] = []   # batches never trained on (probe.py)
        self.net: torch.nn.Module = model   # what the steps run through (a DDP wrapper in a group: group.py)

    def run(self, round_: int, train_s: float = 0.0, start_hash: str = "") -> tuple[dict[str, np.ndarray], dict]:
        """One whole round from the current parameters, which it then restores; returns the
        pseudo-gradient and the round's figures (what studies/compression.py needs)."""
        start = flat_copy(self.model)
        seg = Segment(round_, train_s)
        self.train(seg, start_hash=start_hash)
        delta, info = self.delta(start, flat_copy(self.model), seg, start_hash)
        load_flat(self.model, start)
        return delta, info

    takes_patches = True    # may the parameters change between two steps (schedule.py)? Not in a group

    def train(self, seg: Segment, stop: threading.Event | None = None, start_hash: str = "",
              patch: Callable[[], None] | None = None) -> None:
        """Inner steps from the current parameters until the segment's budget is spent (at least one
        step in a round) or `stop` is set: train_s > 0 steps until that much (emulated) compute time
        has passed; otherwise it takes the configured inner_steps. `patch()` runs before each step
        (the last update's tail, schedule.py)."""
        t = self.t
        autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if self.device.type == "cuda"
                    else contextlib.nullcontext())
        self.model.train()
        while self._keep_going(seg, stop):
            if patch is not None:
                patch()
            t_step = time.perf_counter()
            frac = seg.compute_s / seg.train_s if seg.train_s > 0 else seg.steps / t.inner_steps
            lr = lr_at(t, self.steps, seg.round + frac)
            self.steps += 1
            self.opt.lr = lr
            x, y = self.sampler.next()
            x, y = x.to(self.device), y.to(self.device)
            with autocast:
                logits = self.net(x)                                     # (B, T, vocab)
                loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
            self.opt.zero_grad()
            loss.backward()
            if t.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), t.grad_clip)
            self.opt.step()
            seg.losses.append(loss.item())
            if not math.isfinite(seg.losses[-1]):
                raise DivergedError(f"site {self.name}: the training loss became {seg.losses[-1]} at inner step "
                                    f"{seg.steps} of round {seg.round} (learning rate {lr:.3g}), starting from the "
                                    f"global model {start_hash}; this site stops rather than send a broken delta")
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            pad = 0.0
            if self.speed_factor > 1:   # act like a machine speed_factor times slower
                pad = (self.speed_factor - 1) * (time.perf_counter() - t_step)
                if seg.train_s > 0:              # never pad past the budget
                    pad = max(0.0, min(pad, seg.train_s - (seg.compute_s + time.perf_counter() - t_step)))
                time.sleep(pad)
            seg.emulated_s += pad
            seg.compute_s += time.perf_counter() - t_step
            seg.steps += 1

    def _keep_going(self, seg: Segment, stop: threading.Event | None) -> bool:
        return not seg.done(self.t) and not (stop is not None and stop.is_set())

    def delta(self, start: dict[str, np.ndarray], end: dict[str, np.ndarray], seg: Segment, start_hash: str = ""
              ) -> tuple[dict[str, np.ndarray], dict]:
        """The pseudo-gradient start - end (flat copies of the parameters) and the round's figures;
        DivergedError rather than a delta that holds NaN or Inf."""
        delta = {k: start[k] - end[k] for k in start}
        bad = next((k for k, v in delta.items() if not np.all(np.isfinite(v))), None)
        if bad is not None:
            raise DivergedError(f"site {self.name}: the delta of round {seg.round} holds NaN or Inf in {bad!r} "
                                f"after {seg.steps} inner steps from the global model {start_hash}; not sending it")
        t = self.t
        losses = seg.losses or [math.nan]       # no step: a round stopped before its first (its delta is 0)
        return delta, dict(train_loss=float(np.mean(losses)), last_train_loss=losses[-1],
                           tokens=seg.steps * t.batch_size * self.block_size, steps=seg.steps,
                           compute_s=seg.compute_s, emulated_s=seg.emulated_s, data_position=self.sampler.batches_drawn)
