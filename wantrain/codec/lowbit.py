"""Stage 1 below 8 bits: quantizers with few levels per block, top-k selection, and signs.

Each takes a flat float32 chunk cut into blocks of `block` elements (the last may be short) and
returns small integer symbols and one float32 scale per block; the receiver's values are always
`symbol * scale` as one float32 multiply (dequantize_int8 does it), so every replica computes the
same bits. What a quantizer drops, the sender's error feedback (feedback.py) sends later.

    levels    absmax with `levels` steps each side: symbols in [-levels, levels] (7: 4-bit)
    ternary   symbols in {-1, 0, 1}: an element is kept where |x| > t x the block's mean |x|
              (t 0.7 by default), at the mean |x| of those kept (the threshold and scale of ternary
              weight networks, which minimise the squared error for a bell-shaped block; a higher t
              keeps fewer, so its symbols cost fewer bits)
    sign      symbols in {-1, 1} (zero goes to 1) at the block's mean |x|: the scale that keeps
              the block's L1 mass
    top-k     the k largest |x| of each block, by position; their values quantized as `levels`
              (sign and mean |x| when levels is 1)

None of them reads outside its block, so a chunk's blocks are independent, as the INT8 stage's are.
"""

from __future__ import annotations

import numpy as np

from ..errors import CodecError
from .quantize import TINY, num_blocks

__all__ = ["quantize_levels", "quantize_ternary", "quantize_sign", "select_topk", "topk_count", "exact_ratios"]

TERNARY_THRESHOLD = np.float32(0.7)


def _checked(x: np.ndarray, block: int) -> np.ndarray:
    """x, contiguous; CodecError unless it is a flat float32 array of finite values and block > 0."""
    if x.ndim != 1 or x.dtype != np.float32:
        raise CodecError(f"the codec wants a flat float32 array, got {x.dtype} {x.shape}")
    if block <= 0:
        raise CodecError(f"quantization block must be positive, got {block}")
    if not np.all(np.isfinite(x)):
        raise CodecError("cannot quantize non-finite values")
    return np.ascontiguousarray(x)


def quantize_levels(x: np.ndarray, block: int, levels: int, clip: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Per-block absmax with `levels` steps each side, the INT8 stage's rule and loop with another
    top: (int8 symbols (n,) in [-levels, levels], float32 scales (blocks,)); a block whose largest
    magnitude is under TINY is sent as zeros. With `clip` > 0 the top is min(absmax, clip x the
    block's mean |x|), a statistical scale: finer steps for the many where a few outliers would set
    them coarse (those few clipped; error feedback sends the rest)."""
    if not 1 <= levels <= 127:
        raise CodecError(f"levels must be in [1, 127], got {levels}")
    x = _checked(x, block)
    q, scales = np.empty(x.size, np.int8), np.empty(num_blocks(x.size, block), np.float32)
    if clip > 0:
        from .lowbit_kernels import clipped_blocks

        clipped_blocks(x, x.view(np.uint32), block, np.float32(levels), np.float32(clip), TINY, q, scales)
        return q, scales
    from .quantize_kernels import quantize_blocks      # numba: only where something is quantized

    quantize_blocks(x, x.view(np.uint32), block, q, scales, np.float32(levels), TINY)
    return q, scales


def quantize_ternary(x: np.ndarray, block: int, threshold: float = TERNARY_THRESHOLD) -> tuple[np.ndarray, np.ndarray]:
    """Per block, {-1, 0, 1} at the mean |x| of the elements over `threshold` x the block's mean |x|."""
    x = _checked(x, block)
    q, scales = np.empty(x.size, np.int8), np.empty(num_blocks(x.size, block), np.float32)
    from .lowbit_kernels import ternary_blocks

    ternary_blocks(x, x.view(np.uint32), block, np.float32(threshold), TINY, q, scales)
    return q, scales


def quantize_sign(x: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """Per block, -1 or 1 (0 goes to 1) at the block's mean |x|."""
    x = _checked(x, block)
    q, scales = np.empty(x.size, np.int8), np.empty(num_blocks(x.size, block), np.float32)
    from .lowbit_kernels import sign_blocks

    sign_blocks(x, x.view(np.uint32), block, TINY, q, scales)
    return q, scales


def exact_ratios(values: np.ndarray, starts: np.ndarray, up: np.ndarray | None = None,
                 down: np.ndarray | None = None) -> np.ndarray:
    """float32 sum(|v| up) / sum(down) over each group of `values` (the groups back to back, each
    from its `starts`; `up` and `down` small integers, 1 when None: a mean |v|), as the kernels
    take a mean: exact int64 sums of floor(|v| 2**s), s from the group's largest |v|, one divide."""
    mag = np.abs(values)
    top = np.maximum.reduceat(mag, starts).view(np.uint32)
    shift = 40 - (np.maximum((top >> 23) & 0xFF, 1).astype(np.int64) - 126)           # fixed_point_shift
    sizes = np.diff(np.append(starts, values.size))
    fixed = np.floor(mag.astype(np.float64) * np.ldexp(1.0, np.repeat(shift, sizes))).astype(np.int64)
    num = np.add.reduceat(fixed if up is None else fixed * up.astype(np.int64), starts)
    den = sizes if down is None else np.add.reduceat(down.astype(np.int64), starts)
    return (num.astype(np.float64) / den * np.ldexp(1.0, -shift)).astype(np.float32)


def topk_count(size: int, density: float) -> int:
    """Elements kept of a block of `size`: at least one, at most all."""
    return min(size, max(1, int(np.ceil(density * size))))


def select_topk(x: np.ndarray, block: int, density: float) -> tuple[np.ndarray, np.ndarray]:
    """The topk_count(block size, density) largest |x| of each block (a short last block keeps its
    own share): (positions in the chunk, ascending, uint32; their values, float32). Ties go to the
    lower position."""
    if not 0 < density <= 1:
        raise CodecError(f"top-k density must be in (0, 1], got {density}")
    x = _checked(x, block)
    nb = num_blocks(x.size, block)
    if nb == 0:
        return np.zeros(0, np.uint32), np.zeros(0, np.float32)
    k, k_last = topk_count(block, density), topk_count(x.size - (nb - 1) * block, density)
    positions = np.empty(k * (nb - 1) + k_last, np.uint32)
    from .lowbit_kernels import topk_blocks            # numba: only where something is selected

    topk_blocks(x.view(np.uint32), block, k, k_last, positions)
    return positions, x[positions]
