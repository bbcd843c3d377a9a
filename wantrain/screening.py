"""Screening of site deltas at the parameter server: what a site may claim, how large its delta may be.

One site, buggy or hostile, must not be able to destroy the run with one message. Every bound
is derived from the run's config (`RunConfig.robust`, see config.py) and from what the PS has
seen, so it needs no tuning per model:

- claims: the steps and tokens a site reports bound its weight in the average; they may not
  exceed what the round asked for (`check_claims`);
- magnitude: a delta's L2 norm may not exceed `max_delta_ratio` x the larger of the global
  parameters' norm and how far its inner steps could have moved them (AdamW moves an element by
  about the learning rate per step), checked when the delta arrives (the site's stream is
  ended: no honest site gets there). This also keeps every float32 of the outer step finite;
- outliers: at the round's commit each delta's norm is compared with a reference, the median
  of the round's other deltas and of recently accepted ones; one over `norm_factor` x the
  reference is rejected (quarantined for the round) or clipped to the bound (`Screen`);
- optionally, a coordinate-wise trimmed mean replaces the token-weighted mean (`trimmed_mean`).

Norms are computed from the int8 symbols and scales the PS keeps, without dequantizing.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass

import numpy as np

from .codec import Extracted
from .codec.quantize import num_blocks
from .config import RunConfig
from .errors import ProtocolError
from .messages import RoundMetrics

__all__ = ["check_claims", "max_delta_scale", "sum_of_squares", "l2_norm", "clipped", "Verdict", "Screen",
           "trim_count", "trimmed_mean", "max_steps"]


def max_steps(cfg: RunConfig, train_s: float) -> int:
    """The most inner steps a site may claim for a round it was asked to train for `train_s` s (0: fixed steps)."""
    if train_s > 0:
        return max(1, math.ceil(train_s * cfg.robust.max_steps_per_s))
    return cfg.train.inner_steps


def max_delta_scale(cfg: RunConfig, param_norm: float, steps: int, num_params: int) -> float:
    """What a delta's norm is measured against: the model's norm, or the distance `steps` AdamW steps
    of at most inner_lr per element can cover, whichever is larger."""
    return max(param_norm, steps * cfg.train.inner_lr * math.sqrt(num_params))


def check_claims(cfg: RunConfig, m: RoundMetrics, train_s: float, num_params: int, received_wire_bytes: int,
                 committed_rounds: int) -> None:
    """ProtocolError unless a site's RoundMetrics stay within what its round allowed."""
    steps_cap = max_steps(cfg, train_s)
    if not 1 <= m.steps <= steps_cap:
        raise ProtocolError(f"round {m.round} metrics claim {m.steps} inner steps; the round allowed 1 to {steps_cap}")
    if m.steps_ahead > m.steps:
        raise ProtocolError(f"round {m.round} metrics claim {m.steps_ahead} of {m.steps} inner steps taken ahead")
    tokens_cap = m.steps * cfg.train.batch_size * cfg.model.block_size
    if not 1 <= m.tokens <= tokens_cap:
        raise ProtocolError(f"round {m.round} metrics claim {m.tokens} tokens; {m.steps} steps of "
                            f"{cfg.train.batch_size} x {cfg.model.block_size} tokens allow 1 to {tokens_cap}")
    if m.raw_bytes != 4 * num_params:
        raise ProtocolError(f"round {m.round} metrics claim raw_bytes {m.raw_bytes}; a delta of {num_params} "
                            f"elements has {4 * num_params} bytes as float32")
    if m.wire_bytes != received_wire_bytes:
        raise ProtocolError(f"round {m.round} metrics claim wire_bytes {m.wire_bytes}; the PS received "
                            f"{received_wire_bytes} bytes of scales and payload")
    if not 0 <= m.huffman_bits_per_symbol <= 16:
        raise ProtocolError(f"round {m.round} metrics claim {m.huffman_bits_per_symbol} Huffman bits per symbol")
    # A restarted PS may be up to checkpoint_every rounds behind what its sites trained.
    position_cap = (committed_rounds + 2 + cfg.train.checkpoint_every) * max_steps(cfg, cfg.train.round_budget_s)
    if m.data_position > position_cap:
        raise ProtocolError(f"round {m.round} metrics claim data position {m.data_position}; at most "
                            f"{position_cap} batches can have been drawn by now")


def l2_norm(arrays) -> float:
    """L2 norm of flat float32 arrays, summed in float64 a slice at a time (no whole-tensor copy)."""
    total = 0.0
    for a in arrays:
        for i in range(0, a.size, 1 << 20):
            v = a[i: i + (1 << 20)].astype(np.float64)
            total += float(np.dot(v, v))
    return math.sqrt(total)


def sum_of_squares(x: Extracted) -> float:
    """Squared L2 norm of one chunk kept as int8 symbols + scales (or fp32 values), in float64."""
    if x.scales is None:
        return l2_norm([x.data]) ** 2
    n, block = x.data.size, x.block
    q = np.zeros(num_blocks(n, block) * block, np.int32)
    q[:n] = x.data
    per_block = np.square(q).reshape(-1, block).sum(axis=1, dtype=np.int64)     # (nblocks,)
    return float(np.dot(per_block.astype(np.float64), np.square(x.scales.astype(np.float64))))


def clipped(parts: list[Extracted], factor: float) -> list[Extracted]:
    """The delta times `factor` (< 1), by scaling its scales: exact and cheap."""
    f = np.float32(factor)
    return [Extracted(x.data * f, None, 0) if x.scales is None else Extracted(x.data, x.scales * f, x.block)
            for x in parts]


@dataclass(frozen=True)
class Verdict:
    action: str          # "accept" | "reject" | "clip"
    norm: float
    reference: float     # 0.0: nothing to compare with
    factor: float = 1.0  # "clip": the delta is multiplied by this

    @property
    def reason(self) -> str:
        return (f"delta norm {self.norm:.4g} is {self.norm / self.reference:.1f}x the reference {self.reference:.4g} "
                f"(the median of the round's other deltas and recent accepted ones)")


class Screen:
    """Remembers the norms of recently accepted deltas and judges each round's deltas against them."""

    def __init__(self, cfg: RunConfig) -> None:
        self.robust = cfg.robust
        self.history: deque[float] = deque(maxlen=cfg.robust.norm_history)

    def judge(self, norms: dict[str, float]) -> dict[str, Verdict]:
        """A verdict per delta of a round (keys: whatever names the deltas). A delta is compared with
        the others and the history, never with itself, so one huge delta cannot raise its own bar."""
        r = self.robust
        out = {}
        for key, norm in norms.items():
            pool = [v for k, v in norms.items() if k != key] + list(self.history)
            reference = statistics.median(pool) if pool else 0.0
            bound = r.norm_factor * reference
            if not r.norm_factor or reference <= 0 or norm <= bound:
                out[key] = Verdict("accept", norm, reference)
            elif r.norm_action == "clip":
                out[key] = Verdict("clip", norm, reference, bound / norm)
            else:
                out[key] = Verdict("reject", norm, reference)
        return out

    def remember(self, verdicts: dict[str, Verdict]) -> None:
        """After a commit: the norms that went into the aggregate (clipped ones at their bound)."""
        for v in verdicts.values():
            if v.action != "reject":
                self.history.append(v.norm * v.factor)

    def state_dict(self) -> list[float]:
        return list(self.history)

    def load_state_dict(self, state: list[float]) -> None:
        self.history.clear()
        self.history.extend(float(x) for x in state)


def trim_count(n: int, fraction: float) -> int:
    """Deltas dropped at each end of every coordinate: ceil(fraction x n), leaving at least one."""
    t = math.ceil(fraction * n) if fraction > 0 else 0
    return max(0, min(t, (n - 1) // 2))


def trimmed_mean(values: list[np.ndarray], trim: int) -> np.ndarray:
    """Coordinate-wise: sort the deltas' values, drop `trim` at each end, average the rest (float32,
    summed in sorted order, so the result does not depend on the order of the sites)."""
    stacked = np.sort(np.stack(values), axis=0)                  # (n, length)
    kept = stacked[trim: stacked.shape[0] - trim]
    acc = np.zeros(stacked.shape[1], np.float32)
    for row in kept:
        acc += row
    acc /= np.float32(kept.shape[0])
    return acc
