"""The inner loop of DiLoCo: AdamW steps of one replica from the global parameters.

`InnerLoop.run` trains for a number of steps or a compute budget and returns the
pseudo-gradient (start - end) with what the round cost; the replica goes back to the global
parameters, which the PS's update then moves on. Sites use it every round; study.py uses it
to make real deltas for the codec's benchmarks.
"""

from __future__ import annotations

import contextlib
import math
import time

import numpy as np
import torch
import torch.nn.functional as F

from ..config import TrainConfig
from ..data import BatchSampler
from ..errors import DivergedError
from ..replica import flat_copy, load_flat

__all__ = ["InnerLoop", "lr_at"]


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


class InnerLoop:
    """A replica's inner optimizer and data: `run` takes one round of inner steps."""

    def __init__(self, model: torch.nn.Module, sampler: BatchSampler, train: TrainConfig, block_size: int,
                 device: torch.device, name: str = "site", speed_factor: float = 1.0) -> None:
        self.model, self.sampler, self.t, self.block_size = model, sampler, train, block_size
        self.device, self.name, self.speed_factor = device, name, speed_factor
        self.opt = torch.optim.AdamW(model.parameters(), lr=train.inner_lr, betas=(0.9, 0.95),
                                     weight_decay=train.inner_weight_decay)
        self.steps = 0                 # inner steps of this optimizer, over every round

    def run(self, round_: int, train_s: float = 0.0, start_hash: str = "") -> tuple[dict[str, np.ndarray], dict]:
        """Inner steps from the current (global) parameters; returns the pseudo-gradient and the
        round's figures. train_s > 0: step until that much (emulated) compute time has passed, at
        least once; otherwise take the configured inner_steps."""
        t = self.t
        start = flat_copy(self.model)
        autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if self.device.type == "cuda"
                    else contextlib.nullcontext())
        self.model.train()
        losses: list[float] = []
        emulated, i, t0 = 0.0, 0, time.perf_counter()
        while (time.perf_counter() - t0 < train_s) if train_s > 0 else (i < t.inner_steps):
            t_step = time.perf_counter()
            frac = (t_step - t0) / train_s if train_s > 0 else i / t.inner_steps
            lr = lr_at(t, self.steps, round_ + frac)
            self.steps += 1
            for g in self.opt.param_groups:
                g["lr"] = lr
            x, y = self.sampler.next()
            x, y = x.to(self.device), y.to(self.device)
            with autocast:
                logits = self.model(x)                                   # (B, T, vocab)
                loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            if t.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), t.grad_clip)
            self.opt.step()
            losses.append(loss.item())
            if not math.isfinite(losses[-1]):
                raise DivergedError(f"site {self.name}: the training loss became {losses[-1]} at inner step {i} "
                                    f"of round {round_} (learning rate {lr:.3g}), starting from the global model "
                                    f"{start_hash}; this site stops rather than send a broken delta")
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            if self.speed_factor > 1:   # act like a machine speed_factor times slower
                pad = (self.speed_factor - 1) * (time.perf_counter() - t_step)
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
            raise DivergedError(f"site {self.name}: the delta of round {round_} holds NaN or Inf in {bad!r} "
                                f"after {i} inner steps from the global model {start_hash}; not sending it")
        load_flat(self.model, start)      # back to the global parameters; the PS's update moves it on
        return delta, dict(train_loss=float(np.mean(losses)), last_train_loss=losses[-1],
                           tokens=i * t.batch_size * self.block_size, steps=i, compute_s=compute_s,
                           emulated_s=emulated, data_position=self.sampler.batches_drawn)
