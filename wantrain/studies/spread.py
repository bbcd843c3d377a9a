"""Loss spread by a randomized Hadamard transform, then rescaled: the baseline B5 of the loss-recovery
study (OptiReduce's idea), measured in process (studies/late.py).

A sender transforms each tensor of its delta, y = H D x (D random signs from a seed both ends
share, H the orthonormal Walsh-Hadamard matrix over the tensor padded to a power of two, in blocks
of at most MAX_BLOCK), and chunks y. A lost chunk then loses a share of the coefficients of its
block, not a run of the tensor: after the inverse transform its loss is small noise over the whole
block, and dividing by the share that arrived makes the estimate unbiased (E over the signs and
the losses). `spread_loss(values, lost_ranges, seed)` is what the receiver reconstructs of `values`
when the coefficient ranges `lost_ranges` (per tensor, element ranges of the tensor) did not arrive.
"""

from __future__ import annotations

import zlib

import numpy as np

__all__ = ["hadamard", "spread_loss", "MAX_BLOCK"]

MAX_BLOCK = 1 << 20      # elements per transform block: a few chunks' worth at least


def hadamard(x: np.ndarray) -> np.ndarray:
    """The orthonormal Walsh-Hadamard transform of each row of `x` (n, 2^k); its own inverse."""
    y = x.astype(np.float64, copy=True)
    n = y.shape[-1]
    h = 1
    while h < n:
        y = y.reshape(*y.shape[:-1], n // (2 * h), 2, h)
        a, b = y[..., 0, :].copy(), y[..., 1, :]
        y[..., 0, :] += b
        y[..., 1, :] = a - b
        y = y.reshape(*y.shape[:-3], n)
        h *= 2
    return y / np.sqrt(n)


def _block(n: int) -> int:
    return min(MAX_BLOCK, 1 << max(0, (n - 1).bit_length()))


def spread_loss(values: dict[str, np.ndarray], lost: dict[str, list[tuple[int, int]]], seed: int | list[int]
                ) -> dict[str, np.ndarray]:
    """`values` as a receiver reconstructs them when the transformed coefficients in `lost` (per
    tensor, [start, stop) ranges) did not arrive: inverse transform with zeros there, divided by the
    share of each block that arrived. Tensors with nothing lost come back as they are."""
    out = dict(values)
    for name, ranges in lost.items():
        if not ranges:
            continue
        x = values[name].astype(np.float64)
        n = x.size
        b = _block(n)
        blocks = -(-n // b)
        padded = np.zeros(blocks * b)
        padded[:n] = x
        rng = np.random.default_rng([*np.atleast_1d(seed).tolist(), zlib.crc32(name.encode())])
        signs = rng.choice([-1.0, 1.0], size=padded.size)
        y = hadamard((padded * signs).reshape(blocks, b)).reshape(-1)
        arrived = np.ones(y.size, bool)
        for start, stop in ranges:
            arrived[start:stop] = False
        arrived[n:] = arrived[n - 1]          # the padding goes with the tensor's last chunk
        y[~arrived] = 0.0
        share = arrived.reshape(blocks, b).mean(axis=1, keepdims=True)
        back = hadamard(y.reshape(blocks, b)) / np.where(share > 0, share, 1.0)
        out[name] = (back.reshape(-1) * signs)[:n].astype(values[name].dtype)
    return out
