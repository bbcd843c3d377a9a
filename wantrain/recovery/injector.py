"""Seeded, deterministic chunk loss for one link and direction: i.i.d. or in bursts.

`ChunkLoss(rate, burst)` decides, chunk after chunk in the order a sender sends them, whether each
one is lost. `burst` is the mean length of a run of lost chunks: 1 is i.i.d. Bernoulli loss; more
is a two-state Gilbert-Elliott chain (every chunk lost in the bad state, none in the good one,
the state kept between chunks), with its stationary loss rate equal to `rate` (as netem's
`loss gemodel` with h = 0, 1 - k = 1). The same seed, link and direction give the same decisions,
so every arm of a benchmark meets the same losses.
"""

from __future__ import annotations

import zlib

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

    def lost(self) -> bool:
        lost = self.bad
        u = self.rng.random()
        self.bad = u >= self.r_exit if self.bad else u < self.p_enter
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

    def lost(self) -> bool:
        """Is the next chunk lost?"""
        if self._chain is not None:
            return self._chain.lost()
        return bool(self._rng.random() < self.rate)

    def mask(self, n: int) -> np.ndarray:
        """The next `n` decisions at once (True: lost)."""
        return np.array([self.lost() for _ in range(n)], bool)
