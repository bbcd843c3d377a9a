"""The top-k selection's loop, compiled with numba (lowbit.py holds the rule and calls it)."""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["topk_blocks"]

_SHIFT = 20          # a magnitude's top 11 bits (8 of exponent, 3 of mantissa) name its bucket


@njit(nogil=True, cache=True)
def topk_blocks(bits: np.ndarray, block: int, k: int, k_last: int, out: np.ndarray) -> None:
    """Per block of `block` elements, the positions (ascending, into `out`) of its k largest |x|
    (k_last for the last block), ties to the lower position. `bits` is x viewed as uint32: with the
    sign bit cleared, the integer order of finite floats is the order of their magnitudes.

    A selection, not a sort: a histogram of the magnitudes' top bits finds the bucket that holds
    the k-th largest, a partial sort of that bucket's few members finds it exactly, and one pass
    keeps every magnitude above it and the first ones equal to it."""
    n = bits.size
    nb = (n + block - 1) // block
    hist = np.zeros(1 << (31 - _SHIFT), np.int64)
    members = np.empty(block, np.uint32)
    at = 0
    for b in range(nb):
        lo = b * block
        hi = min(n, lo + block)
        keep = k if b < nb - 1 else k_last
        hist[:] = 0
        for j in range(lo, hi):
            hist[(bits[j] & np.uint32(0x7FFFFFFF)) >> _SHIFT] += 1
        bucket = hist.size - 1
        above = 0                                   # elements in buckets over `bucket`
        while above + hist[bucket] < keep:
            above += hist[bucket]
            bucket -= 1
        count = 0
        for j in range(lo, hi):
            m = bits[j] & np.uint32(0x7FFFFFFF)
            if (m >> _SHIFT) == bucket:
                members[count] = m
                count += 1
        need = keep - above                         # taken from the bucket, largest first
        threshold = np.partition(members[:count], count - need)[count - need]
        equal_left = need
        for i in range(count):
            if members[i] > threshold:
                equal_left -= 1
        for j in range(lo, hi):
            m = bits[j] & np.uint32(0x7FFFFFFF)
            if m > threshold or (m == threshold and equal_left > 0):
                if m == threshold:
                    equal_left -= 1
                out[at] = j
                at += 1


@njit(inline="always")
def fixed_point_shift(absmax_bits: np.uint32) -> int:
    """s such that every magnitude up to the one with these float32 bits, times 2**s, is under 2**40:
    from the biased exponent (subnormals as the least normal), so numpy and torch agree on it."""
    return 40 - (max(np.int64((absmax_bits >> 23) & 0xFF), 1) - 126)


@njit(inline="always")
def pow2(s: int) -> np.float64:
    return np.array([np.int64(s + 1023) << 52], np.int64).view(np.float64)[0]


@njit(inline="always")
def block_top(bits: np.ndarray, lo: int, hi: int) -> np.uint32:
    """The bits of the largest magnitude in [lo, hi)."""
    top = np.uint32(0)
    for j in range(lo, hi):
        top = max(top, bits[j] & np.uint32(0x7FFFFFFF))
    return top


@njit(inline="always")
def block_mean(x: np.ndarray, lo: int, hi: int, s: int) -> np.float32:
    """The mean |x| of [lo, hi) as every low-bit mean is taken: an exact int64 sum of
    floor(|x| 2**s), then one divide."""
    up = pow2(s)
    total = np.int64(0)
    for j in range(lo, hi):
        total += np.int64(np.floor(np.float64(abs(x[j])) * up))
    return np.float32(np.float64(total) / (hi - lo) * pow2(-s))


@njit(nogil=True, cache=True)
def ternary_blocks(x: np.ndarray, bits: np.ndarray, block: int, ratio: np.float32, tiny: np.float32, q: np.ndarray,
                   scales: np.ndarray) -> None:
    """Per block: keep |x| over `ratio` x its mean |x|, at the mean |x| of those kept (0, and every
    symbol 0, when that is under `tiny`); q is the sign of those kept. Means are exact sums of
    fixed-point magnitudes (floor(|x| 2**s), s from the block's largest: every sum is exact in
    int64, so its order, and the device that sums, cannot change a bit), then one divide."""
    n = x.size
    for b in range(scales.size):
        lo, hi = b * block, min(n, (b + 1) * block)
        s = fixed_point_shift(block_top(bits, lo, hi))
        up, down = pow2(s), pow2(-s)
        threshold = ratio * block_mean(x, lo, hi, s)
        kept_sum, kept = np.int64(0), 0
        for j in range(lo, hi):
            a = abs(x[j])
            if a > threshold:
                kept_sum += np.int64(np.floor(np.float64(a) * up))
                kept += 1
        scale = np.float32(np.float64(kept_sum) / max(kept, 1) * down)
        if scale < tiny:
            scale = np.float32(0)
        scales[b] = scale
        for j in range(lo, hi):
            q[j] = 0 if scale == 0 or abs(x[j]) <= threshold else (1 if x[j] > 0 else -1)


@njit(nogil=True, cache=True)
def sign_blocks(x: np.ndarray, bits: np.ndarray, block: int, tiny: np.float32, q: np.ndarray,
                scales: np.ndarray) -> None:
    """Per block: q = -1 where x < 0, else 1, at the block's mean |x| (as ternary_blocks takes a
    mean; 0 when under `tiny`)."""
    n = x.size
    for b in range(scales.size):
        lo, hi = b * block, min(n, (b + 1) * block)
        scale = block_mean(x, lo, hi, fixed_point_shift(block_top(bits, lo, hi)))
        scales[b] = scale if scale >= tiny else np.float32(0)
        for j in range(lo, hi):
            q[j] = -1 if x[j] < 0 else 1


@njit(nogil=True, cache=True)
def clipped_blocks(x: np.ndarray, bits: np.ndarray, block: int, levels: np.float32, clip: np.float32,
                   tiny: np.float32, q: np.ndarray, scales: np.ndarray) -> None:
    """Per block: the top level at min(absmax, `clip` x the block's mean |x|) (the mean as
    ternary_blocks takes it), `levels` steps each side, q = rint(x / scale) clipped to them (round
    half to even, in float32, as quantize_kernels does); a top under `tiny` sends zeros."""
    n = x.size
    for b in range(scales.size):
        lo, hi = b * block, min(n, (b + 1) * block)
        top = block_top(bits, lo, hi)
        absmax = np.array([top], np.uint32).view(np.float32)[0]
        level = min(absmax, clip * block_mean(x, lo, hi, fixed_point_shift(top)))
        scale = level / levels if level >= tiny else np.float32(0)
        scales[b] = scale
        safe = scale if scale > 0 else np.float32(1)
        for j in range(lo, hi):
            q[j] = np.int8(min(max(np.rint(x[j] / safe), -levels), levels))
