"""The INT8 quantizer's loop, compiled with numba (quantize.py holds the rule and calls it)."""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["quantize_blocks"]


@njit(nogil=True, cache=True)
def quantize_blocks(x: np.ndarray, bits: np.ndarray, block: int, q: np.ndarray, scales: np.ndarray,
                    qmax: np.float32, tiny: np.float32) -> bool:
    """One pass per block for its absmax, one for round-half-even(x / scale) in float32 (the rule
    above, bit for bit). `bits` is x viewed as uint32: with the sign bit cleared, the integer order
    of finite floats is their order, and NaN and infinities lie above them, so the absmax is an
    integer max (vectorized, where a float max with NaN checks is not). False at a non-finite value.
    `qmax` and `tiny` are quantize.py's QMAX and TINY, passed in: this module imports nothing of it."""
    for b in range(scales.size):
        lo, hi = b * block, min(x.size, (b + 1) * block)
        xb, bb, qb = x[lo:hi], bits[lo:hi], q[lo:hi]     # views from 0, no branch inside the loops
        top = np.uint32(0)
        for j in range(hi - lo):
            top = max(top, bb[j] & np.uint32(0x7FFFFFFF))
        if top >= np.uint32(0x7F800000):                          # NaN or infinite
            return False
        absmax = np.array([top], np.uint32).view(np.float32)[0]
        scale = absmax / qmax if absmax >= tiny else np.float32(0)
        scales[b] = scale
        safe = scale if scale > 0 else np.float32(1)
        for j in range(hi - lo):
            qb[j] = np.int8(min(max(np.rint(xb[j] / safe), -qmax), qmax))
    return True
