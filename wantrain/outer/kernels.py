"""The PS round's element loops, compiled with numba: one pass over memory where numpy made five.

aggregate.py calls these once per chunk of the plan, on the CPU pool's threads (`nogil`); the
screen (screening.gram) calls the two dot products once per pair of deltas and chunk. Each
computes, element by element, exactly the float32 operations of the numpy expression in its
docstring, in that order (no fused multiply-add: numba leaves fastmath off), so the results are
the same bits as numpy's, and tests/test_aggregate_kernels.py checks that they are.

The loops run over views of one quantization block, indexed from 0, with no branch inside: that
is what lets LLVM vectorize them (indexing the whole array at b * block + j was 5x slower).
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["add_weighted_int8", "add_weighted", "nesterov_step", "record_and_apply", "dot_int8", "dot_f32",
           "NO_RESIDUAL", "load"]

NO_RESIDUAL = np.empty(0, np.float32)      # for a `residual` argument: a downlink without error feedback


@njit(nogil=True, cache=True)
def add_weighted_int8(acc: np.ndarray, q: np.ndarray, scales: np.ndarray, block: int, w: np.float32) -> None:
    """acc += w * dequantize_int8(q, scales, block)   (float32; q int8, one scale per block)."""
    for b in range(scales.size):
        lo, hi, s = b * block, min(q.size, (b + 1) * block), scales[b]
        a, qb = acc[lo:hi], q[lo:hi]
        for j in range(hi - lo):
            a[j] += w * (np.float32(qb[j]) * s)


@njit(nogil=True, cache=True)
def add_weighted(acc: np.ndarray, v: np.ndarray, w: np.float32) -> None:
    """acc += w * v   (float32)."""
    for i in range(v.size):
        acc[i] += w * v[i]


@njit(nogil=True, cache=True)
def nesterov_step(buf: np.ndarray, g: np.ndarray, lr: np.float32, momentum: np.float32,
                  residual: np.ndarray, out: np.ndarray) -> None:
    """buf = buf * momentum + g (in place); out = -lr * (g + momentum * buf) + residual.

    `residual` is the downlink's error feedback for these elements, or NO_RESIDUAL (then
    out = -lr * (g + momentum * buf))."""
    neg_lr = -lr
    for i in range(g.size):
        b = buf[i] * momentum
        b = b + g[i]
        buf[i] = b
        out[i] = neg_lr * (g[i] + momentum * b)
    if residual.size:
        for i in range(g.size):
            out[i] = out[i] + residual[i]


@njit(nogil=True, cache=True)
def record_and_apply(params: np.ndarray, corrected: np.ndarray, q: np.ndarray, scales: np.ndarray, block: int,
                     residual: np.ndarray) -> None:
    """sent = dequantize_int8(q, scales, block); residual = corrected - sent (unless NO_RESIDUAL);
    params += sent   (float32)."""
    for b in range(scales.size):
        lo, hi, s = b * block, min(q.size, (b + 1) * block), scales[b]
        p, qb = params[lo:hi], q[lo:hi]
        if residual.size:
            r, c = residual[lo:hi], corrected[lo:hi]
            for j in range(hi - lo):
                r[j] = c[j] - np.float32(qb[j]) * s
        for j in range(hi - lo):
            p[j] += np.float32(qb[j]) * s


@njit(nogil=True, cache=True)
def dot_int8(qa: np.ndarray, sa: np.ndarray, qb: np.ndarray, sb: np.ndarray, block: int) -> float:
    """dot(dequantize_int8(qa, sa), dequantize_int8(qb, sb)) in float64: per block an exact integer
    sum of products (at most 4096 x 127^2 < 2^31 per block for any block up to 2^17), times both scales."""
    total = np.float64(0.0)
    for b in range(sa.size):
        lo, hi = b * block, min(qa.size, (b + 1) * block)
        x, y = qa[lo:hi], qb[lo:hi]
        acc = np.int64(0)
        for j in range(hi - lo):
            acc += np.int32(x[j]) * np.int32(y[j])
        total += np.float64(acc) * (np.float64(sa[b]) * np.float64(sb[b]))
    return total


@njit(nogil=True, cache=True)
def dot_f32(a: np.ndarray, b: np.ndarray) -> float:
    """dot(a, b) of float32 arrays, summed in float64."""
    total = np.float64(0.0)
    for i in range(a.size):
        total += np.float64(a[i]) * np.float64(b[i])
    return total


def load() -> None:
    """Compile these loops for the argument types a PS round passes them, or load them from numba's
    cache, now: numba compiles (or loads) one signature on its first call, so without this a PS's
    first commit pays it (about 1 s a loop on a fresh install)."""
    f32, q = np.ones(8, np.float32), np.ones(8, np.int8)
    scales = np.ones(1, np.float32)
    add_weighted_int8(f32.copy(), q, scales, 8, np.float32(0.5))
    add_weighted(f32.copy(), f32, np.float32(0.5))
    nesterov_step(f32.copy(), f32, np.float32(0.7), np.float32(0.9), f32.copy(), f32.copy())
    nesterov_step(f32.copy(), f32, np.float32(0.7), np.float32(0.9), NO_RESIDUAL, f32.copy())
    record_and_apply(f32.copy(), f32, q, scales, 8, f32.copy())
    dot_int8(q, scales, q, scales, 8)
    dot_f32(f32, f32)
