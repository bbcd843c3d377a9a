"""The encodings below 8 bits (formats.py) in torch, for numbers that live on a GPU: the same
payload bytes, scales and decoded float32 values as the CPU path.

The float work runs where the numbers are: quantizing, the top-k selection, and every mean, which
both paths take as an exact int64 sum of fixed-point magnitudes (lowbit.py), so that no order of
summation can change a bit. What leaves the device is small: int4 and ternary symbols packed into
bytes on the device and Huffman-coded by on_device.huffman_encode (which downloads only counts and
the coded words), signs as bits, and a top-k's positions and value symbols (a few per block), which
the host Rice-codes with formats.py's own function.
"""

from __future__ import annotations

import numpy as np
import torch

from ..config import CodecConfig
from ..errors import CodecError
from .formats import BASE, INT4_LEVELS, topk_payload
from .lowbit import topk_count
from .on_device import dequantize_int8, huffman_encode, quantize_int8
from .packing import symbols_per_byte
from .quantize import TINY, num_blocks

__all__ = ["compress_lowbit"]


def compress_lowbit(mode: str, x: torch.Tensor, c: CodecConfig) -> tuple[bytes, bytes, torch.Tensor]:
    """formats.compress_lowbit of a flat float32 tensor where it lives: (scales, payload, values)."""
    block = c.quant_block
    if x.dim() != 1 or x.dtype != torch.float32:
        raise CodecError(f"a quantizer wants a flat float32 tensor, got {x.dtype} {tuple(x.shape)}")
    if block <= 0:
        raise CodecError(f"quantization block must be positive, got {block}")
    if not bool(torch.isfinite(x).all()):
        raise CodecError("cannot quantize non-finite values")
    if mode == "topk":
        return _topk(x, block, c.topk_density, c.topk_value_bits)
    if mode == "int4-huffman":
        q, scales = (_clipped(x, block, INT4_LEVELS, c.int4_clip) if c.int4_clip > 0 else
                     quantize_int8(x, block, INT4_LEVELS))
    elif mode == "ternary-huffman":
        q, scales = _ternary(x, block, c.ternary_threshold)
    elif mode == "sign":
        q, scales = _sign(x, block)
    else:
        raise CodecError(f"unknown encoding {mode!r}")
    if mode == "sign":
        payload = _packbits(q > 0)
    else:
        payload = huffman_encode(_pack_base((q + BASE[mode] // 2).to(torch.uint8), BASE[mode]), c.huffman_block,
                                 c.huffman_tables)
    return _bytes(scales), payload, dequantize_int8(q, scales, block)


def _bytes(scales: torch.Tensor) -> bytes:
    return scales.cpu().numpy().astype("<f4").tobytes()


def _blocks(x: torch.Tensor, block: int, fill: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(x padded with `fill` to whole blocks, (blocks, block); each block's real size)."""
    n, nb = x.numel(), num_blocks(x.numel(), block)
    sizes = torch.full((nb,), block, dtype=torch.int64, device=x.device)
    sizes[-1] = n - (nb - 1) * block
    return torch.nn.functional.pad(x, (0, nb * block - n), value=fill).view(nb, block), sizes


def _pow2(s: torch.Tensor) -> torch.Tensor:
    """float64 2**s, built from its bits (exact)."""
    return ((s + 1023) << 52).view(torch.float64)


def _fixed(mag: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(floor(|x| 2**s) as int64 (blocks, block), s (blocks,)): lowbit_kernels.fixed_point_shift's s,
    from the block's largest magnitude."""
    top = mag.amax(dim=1).view(torch.int32).to(torch.int64)
    s = 40 - (((top >> 23) & 0xFF).clamp(min=1) - 126)
    return torch.floor(mag.to(torch.float64) * _pow2(s)[:, None]).to(torch.int64), s


def _ratio(num: torch.Tensor, den: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return (num.to(torch.float64) / den.to(torch.float64) * _pow2(-s)).to(torch.float32)


def _ternary(x: torch.Tensor, block: int, ratio: float) -> tuple[torch.Tensor, torch.Tensor]:
    blocks, sizes = _blocks(x, block)
    mag = blocks.abs()
    fixed, s = _fixed(mag)
    threshold = torch.tensor(np.float32(ratio), device=x.device) * _ratio(fixed.sum(dim=1), sizes, s)
    keep = mag > threshold[:, None]                              # the padding (zeros) never
    scales = _ratio((fixed * keep).sum(dim=1), keep.sum(dim=1).clamp(min=1), s)
    scales = torch.where(scales < float(TINY), torch.zeros_like(scales), scales)
    q = torch.where(keep & (scales[:, None] > 0), torch.where(blocks > 0, 1, -1), 0).to(torch.int8)
    return q.view(-1)[:x.numel()], scales


def _clipped(x: torch.Tensor, block: int, levels: int, clip: float) -> tuple[torch.Tensor, torch.Tensor]:
    """lowbit.quantize_levels with `clip`: the top at min(absmax, clip x the block's mean |x|)."""
    blocks, sizes = _blocks(x, block)
    mag = blocks.abs()
    fixed, s = _fixed(mag)
    mean = _ratio(fixed.sum(dim=1), sizes, s)
    top = torch.minimum(mag.amax(dim=1), torch.tensor(np.float32(clip), device=x.device) * mean)
    scales = torch.where(top >= float(TINY), top / torch.tensor(np.float32(levels), device=x.device),
                         torch.zeros_like(top))
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    q = torch.round(blocks / safe[:, None]).clamp_(-levels, levels).to(torch.int8)
    return q.view(-1)[:x.numel()], scales


def _sign(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    blocks, sizes = _blocks(x, block)
    fixed, s = _fixed(blocks.abs())
    scales = _ratio(fixed.sum(dim=1), sizes, s)
    scales = torch.where(scales < float(TINY), torch.zeros_like(scales), scales)
    return torch.where(x < 0, -1, 1).to(torch.int8), scales


def _topk(x: torch.Tensor, block: int, density: float, value_bits: int) -> tuple[bytes, bytes, torch.Tensor]:
    if not 0 < density <= 1:
        raise CodecError(f"top-k density must be in (0, 1], got {density}")
    if value_bits not in (1, 2):
        raise CodecError(f"top-k values take 1 or 2 bits, not {value_bits}")
    n = x.numel()
    blocks, sizes = _blocks(x, block)
    nb = blocks.shape[0]
    k, k_last = topk_count(block, density), topk_count(n - (nb - 1) * block, density)
    keep = torch.full((nb,), k, dtype=torch.int64, device=x.device)
    keep[-1] = k_last
    mag = blocks.abs()
    mag[-1, int(sizes[-1]):] = -1                                # the padding is never chosen
    # the keep-th largest of each block, then those above it and the first ones equal to it
    threshold = mag.sort(dim=1, descending=True).values.gather(1, (keep - 1)[:, None])      # (blocks, 1)
    above = mag > threshold
    equal = mag == threshold
    chosen = above | (equal & (equal.cumsum(dim=1) <= (keep - above.sum(dim=1))[:, None]))
    fixed, s = _fixed(mag.clamp(min=0))
    mean = _ratio((fixed * chosen).sum(dim=1), keep, s)
    sign = torch.where(blocks < 0, -1, 1)
    if value_bits == 1:
        scales, q = mean, sign
    else:
        steps = torch.where(mag > mean[:, None], 3, 2)
        scales = _ratio((fixed * steps * chosen).sum(dim=1), (steps * steps * chosen).sum(dim=1), s)
        q = sign * steps
    scales = torch.where(scales < float(TINY), torch.zeros_like(scales), scales)
    positions = chosen.view(-1).nonzero().view(-1)               # ascending: row-major order
    q_kept = q.view(-1)[positions].to(torch.int8)
    payload = topk_payload(positions.cpu().numpy(), q_kept.cpu().numpy(), k, k_last, value_bits)
    values = torch.zeros(n, dtype=torch.float32, device=x.device)
    values[positions] = q_kept.to(torch.float32) * scales[positions // block]      # one float32 multiply
    return _bytes(scales), payload, values


def _pack_base(symbols: torch.Tensor, base: int) -> torch.Tensor:
    """packing.pack_base on the device."""
    per = symbols_per_byte(base)
    n = symbols.numel()
    digits = torch.nn.functional.pad(symbols, (0, -(-n // per) * per - n)).view(-1, per)
    out = digits[:, per - 1].clone()
    for i in range(per - 2, -1, -1):                              # Horner, in uint8: no sum passes 255
        out = out * base + digits[:, i]
    return out


def _packbits(bits: torch.Tensor) -> bytes:
    """numpy.packbits of a bool tensor (most significant bit first), packed on the device."""
    n = bits.numel()
    padded = torch.nn.functional.pad(bits.to(torch.uint8), (0, -(-n // 8) * 8 - n)).view(-1, 8)
    weights = torch.tensor([128, 64, 32, 16, 8, 4, 2, 1], dtype=torch.uint8, device=bits.device)
    return (padded * weights).sum(dim=1, dtype=torch.uint8).cpu().numpy().tobytes()
