"""Golomb-Rice coding's bit loops, compiled with numba (packing.py owns the format and calls these).

A value v >= 0 with parameter r is v >> r in unary (that many 1 bits, then a 0) followed by the
r low bits of v, most significant first; values follow each other with no padding, and the stream
is written most significant bit first into bytes. For geometric values (the gaps between the
positions a top-k keeps) the best r spends within about 2 % of their entropy.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["rice_encode", "rice_decode"]


@njit(nogil=True, cache=True)
def rice_encode(values: np.ndarray, r: int, out: np.ndarray) -> int:
    """Write `values` (int64, >= 0) into `out` (uint8, large enough); returns the bytes used."""
    acc = np.int64(0)          # the bits not yet written, in its low `held` bits
    held = 0
    pos = 0
    low_mask = (np.int64(1) << r) - 1
    for v in values:
        q = v >> r
        while q > 0:                               # the quotient in unary, up to 32 ones at a time
            take = min(q, 32)
            acc = (acc << take) | ((np.int64(1) << take) - 1)
            held += take
            q -= take
            while held >= 8:
                held -= 8
                out[pos] = (acc >> held) & 0xFF
                pos += 1
            acc &= (np.int64(1) << held) - 1
        acc = (acc << (r + 1)) | (v & low_mask)    # its closing 0, then the r low bits
        held += r + 1
        while held >= 8:
            held -= 8
            out[pos] = (acc >> held) & 0xFF
            pos += 1
        acc &= (np.int64(1) << held) - 1
    if held:
        out[pos] = (acc << (8 - held)) & 0xFF
        pos += 1
    return pos


@njit(nogil=True, cache=True)
def rice_decode(data: np.ndarray, r: int, limit: int, out: np.ndarray) -> int:
    """Read out.size values from `data` (uint8) into `out` (int64). Returns the bits read, or -1
    if the stream ends first or a value would exceed `limit` (a damaged or hostile payload)."""
    total = data.size * 8
    bit = 0
    for i in range(out.size):
        q = 0
        while True:
            if bit >= total:
                return -1
            b = (data[bit >> 3] >> (7 - (bit & 7))) & 1
            bit += 1
            if b == 0:
                break
            q += 1
            if (q << r) > limit:
                return -1
        if bit + r > total:
            return -1
        low = 0
        for _ in range(r):
            low = (low << 1) | ((data[bit >> 3] >> (7 - (bit & 7))) & 1)
            bit += 1
        v = (np.int64(q) << r) | low
        if v > limit:
            return -1
        out[i] = v
    return bit
