"""Random training batches from a shard, with a position that can be saved and resumed."""

from __future__ import annotations

import numpy as np
import torch

from ..errors import DataError

__all__ = ["BatchSampler", "eval_batches", "check_batches"]


class BatchSampler:
    """Draws (x, y) batches of `block_size` tokens at seeded random offsets of a shard.

    The generator's state is the data position: `state()` / `load_state()` resume exactly.
    """

    def __init__(self, tokens: np.ndarray, batch_size: int, block_size: int, seed: int) -> None:
        if tokens.size <= block_size + 1:
            raise DataError(f"shard of {tokens.size} tokens is too small for sequences of {block_size}")
        self.tokens = np.ascontiguousarray(tokens)     # as compact as it came: int64 only per batch
        self.batch_size, self.block_size = batch_size, block_size
        self.rng = np.random.default_rng(seed)
        self.batches_drawn = 0

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        starts = self.rng.integers(0, self.tokens.size - self.block_size - 1, self.batch_size)
        idx = starts[:, None] + np.arange(self.block_size + 1)                       # (B, T+1)
        seq = torch.from_numpy(self.tokens[idx].astype(np.int64))
        self.batches_drawn += 1
        return seq[:, :-1], seq[:, 1:]                                               # (B, T), (B, T)

    def seek(self, batches: int) -> None:
        """Skip ahead to the state after `batches` draws from a fresh sampler (a restarted site)."""
        if batches < self.batches_drawn:
            raise DataError(f"cannot seek back from batch {self.batches_drawn} to {batches}")
        while self.batches_drawn < batches:
            self.rng.integers(0, self.tokens.size - self.block_size - 1, self.batch_size)
            self.batches_drawn += 1

    def state(self) -> dict:
        return {"rng": self.rng.bit_generator.state, "batches_drawn": self.batches_drawn}

    def load_state(self, state: dict) -> None:
        self.rng.bit_generator.state = state["rng"]
        self.batches_drawn = state["batches_drawn"]


def _window_starts(span: int, n: int) -> torch.Tensor:
    """The first tokens of the n evenly spaced validation windows over `span` tokens."""
    return torch.linspace(0, span, n).long()


def _windows(t: torch.Tensor, starts: torch.Tensor, batch_size: int, block_size: int) -> list:
    idx = starts[:, None] + torch.arange(block_size + 1)
    seq = t[idx].view(-1, batch_size, block_size + 1)
    return [(s[:, :-1], s[:, 1:]) for s in seq]


def eval_batches(tokens: np.ndarray, batch_size: int, block_size: int, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A fixed set of n validation batches (evenly spaced windows), the same every round."""
    t = torch.from_numpy(tokens.astype(np.int64))
    span = t.numel() - block_size - 1
    if span <= 0:
        raise DataError(f"validation split of {t.numel()} tokens is too small for sequences of {block_size}")
    return _windows(t, _window_starts(span, batch_size * n), batch_size, block_size)


def check_batches(tokens: np.ndarray, batch_size: int, block_size: int, n: int,
                  eval_n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """n held-out batches that share no token with the `eval_n` validation batches of eval_batches:
    windows in the gaps between theirs, spread over the whole split (the PS checks a commit on
    these, and reports the others, so that what it reports is not what it selected on). The sites
    never train on either."""
    t = torch.from_numpy(tokens.astype(np.int64))
    window = block_size + 1
    span = t.numel() - window
    val = _window_starts(span, batch_size * eval_n) if span > 0 else torch.zeros(1, dtype=torch.long)
    gaps, need = val.numel() - 1, batch_size * n
    per_gap = -(-need // gaps) if gaps else 0                  # windows in each gap between two of theirs
    if not gaps or int((val[1:] - val[:-1]).min()) < (per_gap + 1) * window:
        raise DataError(f"the validation split of {t.numel()} tokens has no room for {n} check batches of "
                        f"{batch_size} x {block_size} tokens between its {eval_n} validation batches; lower "
                        f"robust.check_batches or raise train.eval_batches, or use a larger corpus")
    starts = torch.tensor([int(val[i]) + window * (1 + j) for j in range(per_gap) for i in range(gaps)][:need])
    return _windows(t, starts, batch_size, block_size)
