"""Stage 1 of the codec: per-block absmax INT8 quantization.

A flat float32 array is cut into blocks of `block` elements; each block gets one float32
scale (its largest magnitude / 127) and every element becomes round(x / scale) in
[-127, 127]. The rounding error of an element is at most half a step (scale / 2), and the
sender keeps it as error feedback (see feedback.py) so nothing is lost for good.

Dequantization is a plain float32 multiply, kept separate from any later add, so that
every replica (CPU or GPU, numpy or torch) computes the same bits. The quantizing loop is compiled
(quantize_kernels.py), and imported only by what quantizes: numba costs a process about 30 MB and
a quarter of a second, which the notebook's panel and the command line need not pay.
"""

from __future__ import annotations

import numpy as np

from ..errors import CodecError

QMAX = 127
# Blocks whose largest magnitude is below this are sent as zeros: their scale would be a
# subnormal float32 with too few bits to quantize against (error feedback keeps the values).
TINY = np.float32(1e-30)


def num_blocks(n: int, block: int) -> int:
    return -(-n // block)


def quantize_int8(x: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """Quantize a flat float32 array; returns (int8 symbols (n,), float32 scales (nblocks,))."""
    if x.ndim != 1 or x.dtype != np.float32:
        raise CodecError(f"quantize_int8 wants a flat float32 array, got {x.dtype} {x.shape}")
    if block <= 0:
        raise CodecError(f"quantization block must be positive, got {block}")
    q = np.empty(x.size, np.int8)
    scales = np.empty(num_blocks(x.size, block), np.float32)
    x = np.ascontiguousarray(x)
    from .quantize_kernels import quantize_blocks      # numba: only where something is quantized

    if not quantize_blocks(x, x.view(np.uint32), block, q, scales, np.float32(QMAX), TINY):
        raise CodecError("cannot quantize non-finite values")
    return q, scales


def dequantize_int8(q: np.ndarray, scales: np.ndarray, block: int) -> np.ndarray:
    """Inverse of quantize_int8 up to rounding: float32 (n,) = q * scale of its block."""
    n = q.size
    nb = num_blocks(n, block)
    if scales.size != nb:
        raise CodecError(f"{n} elements in blocks of {block} need {nb} scales, got {scales.size}")
    flat = np.zeros(nb * block, dtype=np.float32)
    flat[:n] = q
    out = flat.reshape(nb, block)
    out *= scales.astype(np.float32, copy=False)[:, None]
    return out.reshape(-1)[:n]
