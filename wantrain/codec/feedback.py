"""Error feedback: what quantization dropped this round is added to next round's input.

The sender keeps one residual per tensor. Before encoding it adds the residual to the true
value; after encoding it stores (corrected value - value actually sent). So over any number of
rounds, the sum of what was sent equals the sum of the true values minus the last residual.
"""

from __future__ import annotations

import numpy as np


class ErrorFeedback:
    """Per-tensor residuals of a lossy sender (a site's uplink or the PS's downlink)."""

    def __init__(self) -> None:
        self.residuals: dict[str, np.ndarray] = {}

    def compensate(self, name: str, value: np.ndarray) -> np.ndarray:
        """value + residual (a new array; `value` is not modified)."""
        residual = self.residuals.get(name)
        return value.copy() if residual is None else value + residual

    def record(self, name: str, corrected: np.ndarray, sent: np.ndarray) -> None:
        """Remember what `sent` (the decoded value the receiver will see) left out."""
        self.residuals[name] = corrected - sent

    def prepare(self, sizes: dict[str, int]) -> None:
        """Create a zero residual for every tensor in `sizes` that has none, so that parts of one
        tensor can then be written from several threads (the PS's round, aggregate.py)."""
        for name, size in sizes.items():
            if name not in self.residuals:
                self.residuals[name] = np.zeros(size, np.float32)

    def carry(self, sent: dict[str, np.ndarray]) -> None:
        """Values that were sent but never applied (a late delta the PS dropped) go out again next time."""
        for name, value in sent.items():
            residual = self.residuals.get(name)
            self.residuals[name] = value.copy() if residual is None else residual + value

    def state_dict(self) -> dict[str, np.ndarray]:
        return {k: v.copy() for k, v in self.residuals.items()}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        self.residuals = {k: np.asarray(v, dtype=np.float32).copy() for k, v in state.items()}
