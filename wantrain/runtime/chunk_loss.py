"""Seeded, deterministic chunk loss for one link and direction: i.i.d. or in bursts.

`ChunkLoss(rate, burst)` decides, transmission after transmission in the order a sender sends them,
whether each one is lost. Sizes count: `rate` is the loss of a transmission of the mean size of
those decided together (`mask(sizes)`), and one of u times that size is lost as u of them would be.
`burst` is the mean length of a run of losses: 1 is i.i.d. loss, a transmission lost with
probability 1 - (1 - rate)^u, so that a 300-byte norm gain beside 100 KB chunks is almost never
lost (as on a link that drops packets); more is a two-state Gilbert-Elliott chain whose time runs
in bytes (a transmission is lost when it starts in the bad state; the chain then moves on by u
steps), with its stationary loss rate equal to `rate` (as netem's `loss gemodel` with h = 0,
1 - k = 1) and a bad run `burst` mean-sized transmissions long: an outage takes whatever is sent
during it, large or small. The same seed, link and direction give the same decisions, so every
arm of a benchmark meets the same losses.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np

from ..errors import ConfigError

__all__ = ["ChunkLoss", "GilbertElliott"]


class GilbertElliott:
    """The two-state chain: p_enter = P(good -> bad), r_exit = P(bad -> good), per chunk."""

    def __init__(self, rate: float, burst: float, rng: np.random.Generator) -> None:
        self.r_exit = 1.0 / burst
        self.p_enter = rate * self.r_exit / (1.0 - rate) if rate < 1 else 1.0
        self.rng = rng
        self.bad = bool(rng.random() < rate)           # start in the stationary distribution

    def lost(self, units: float = 1.0) -> bool:
        """Is a transmission `units` mean sizes long lost? Then the chain moves on by that much."""
        lost = self.bad
        u = self.rng.random()
        if self.bad:
            self.bad = u >= 1.0 - (1.0 - self.r_exit) ** units
        else:
            self.bad = u < 1.0 - (1.0 - self.p_enter) ** units
        return lost


class ChunkLoss:
    """Which chunks a link loses, in sending order (see the module's docstring)."""

    def __init__(self, rate: float, burst: float = 1.0, seed: int = 0, link: str = "", direction: str = "up") -> None:
        if not 0.0 <= rate < 1.0:
            raise ConfigError(f"chunk loss rate must be in [0, 1), got {rate!r}")
        if not burst >= 1.0:
            raise ConfigError(f"mean loss burst must be >= 1 chunk, got {burst!r}")
        self.rate, self.burst = rate, burst
        rng = np.random.default_rng([seed, zlib.crc32(link.encode()), zlib.crc32(direction.encode())])
        self._rng = rng
        self._chain = GilbertElliott(rate, burst, rng) if burst > 1.0 and rate > 0 else None

    def lost(self, units: float = 1.0) -> bool:
        """Is the next transmission, `units` mean sizes long, lost?"""
        if self._chain is not None:
            return self._chain.lost(units)
        return bool(self._rng.random() < 1.0 - (1.0 - self.rate) ** units)

    def mask(self, sizes: int | Sequence[int], mean: float = 0.0) -> np.ndarray:
        """The next decisions at once (True: lost): for `sizes` transmissions of equal size, or one
        per size in `sizes` (bytes), each weighed against `mean` (0: their own mean)."""
        if isinstance(sizes, int):
            units = np.ones(sizes)
        else:
            units = np.asarray(sizes, float)
            mean = mean or (float(units.mean()) if len(units) else 0.0)
            units = units / mean if mean > 0 else np.ones(len(units))
        return np.array([self.lost(float(u)) for u in units], bool)
