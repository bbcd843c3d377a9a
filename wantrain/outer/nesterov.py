"""The outer step of DiLoCo at the parameter server: Nesterov SGD on the averaged deltas.

Sites send pseudo-gradients (start params minus end params). The PS averages them (outer/aggregate.py)
and turns the average into an update with Nesterov momentum (DiLoCo defaults: lr 0.7, momentum
0.9). The update is what every replica adds to its parameters.
"""

from __future__ import annotations

import numpy as np

from .kernels import NO_RESIDUAL, nesterov_step

__all__ = ["OuterNesterov"]


class OuterNesterov:
    """SGD with Nesterov momentum on pseudo-gradients: returns the update, not new params."""

    def __init__(self, lr: float = 0.7, momentum: float = 0.9) -> None:
        self.lr, self.momentum = np.float32(lr), np.float32(momentum)
        self.buf: dict[str, np.ndarray] = {}

    def update(self, grad: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {name: self.update_part(name, g.size, slice(0, g.size), g) for name, g in grad.items()}

    def prepare(self, sizes: dict[str, int]) -> None:
        """Create the momentum of every tensor in `sizes` that has none, so that parts of one tensor
        can then be stepped from several threads (update_part never adds a key)."""
        for name, size in sizes.items():
            if name not in self.buf:
                self.buf[name] = np.zeros(size, np.float32)

    def update_part(self, name: str, size: int, part: slice, g: np.ndarray, plus: np.ndarray = NO_RESIDUAL) -> np.ndarray:
        """The update of elements `part` of tensor `name` (of `size` elements) from their gradient,
        with `plus` (the downlink's error-feedback residual of those elements) added in the same pass.

        The PS steps the model one chunk at a time, so no whole-model temporary exists."""
        buf = self.buf.get(name)
        if buf is None:
            buf = self.buf[name] = np.zeros(size, np.float32)
        out = np.empty(g.size, np.float32)
        nesterov_step(buf[part], np.ascontiguousarray(g, np.float32), self.lr, self.momentum, plus, out)
        return out

    def state_dict(self) -> dict[str, np.ndarray]:
        return {k: v.copy() for k, v in self.buf.items()}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        self.buf = {k: np.asarray(v, np.float32).copy() for k, v in state.items()}
