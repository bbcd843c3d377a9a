"""The encodings below 8 bits: how a chunk's numbers become `scales` and `payload`, and back.

Every one keeps one float32 scale per block of `quant_block` elements in `scales`, as the INT8
encodings do, and the receiver's value of an element is `symbol * scale` (one float32 multiply),
so that the sender knows exactly what every replica will hold and keeps the rest as error feedback.

    int4-huffman     15 levels (absmax / 7, or codec.int4_clip's statistical top / 7), two symbols
                     a byte (pack_base), canonical Huffman
    ternary-huffman  -1, 0, 1 (lowbit.quantize_ternary, codec.ternary_threshold), five symbols a
                     byte, canonical Huffman
    sign             -1, 1 at the block's mean |x|, one bit each (most significant bit first)
    topk             the largest |x| of each block (codec.topk_density of it), their positions
                     and values; the payload, little-endian:

                         u8   version (1)
                         u8   value bits b (1: sign at the mean |value|; 2: +-2 or +-3 steps of the scale)
                         u8   Rice parameter r
                         u8   0
                         u32  k, positions kept in each whole block
                         u32  k of the last block (a short one keeps its own share)
                         u32  bytes of the Rice stream
                         ...  the Rice stream (packing.py): the gaps between kept positions
                         ...  the values' symbols: b = 1, one bit each (1: positive); b = 2, four
                              to a byte (pack_base of -3, -2, 2, 3 as 0 .. 3)

                     a block's scale is its values' scale; elements not kept decode as zeros
"""

from __future__ import annotations

import struct

import numpy as np

from ..config import CodecConfig
from ..errors import CodecError
from . import huffman
from .lowbit import exact_ratios, quantize_levels, quantize_sign, quantize_ternary, select_topk, topk_count
from .packing import pack_base, rice_decode, rice_encode, rice_parameter, symbols_per_byte, unpack_base
from .quantize import TINY, num_blocks

__all__ = ["LOWBIT_ENCODINGS", "BASE", "INT4_LEVELS", "compress_lowbit", "decode_lowbit", "payload_ok", "topk_payload"]

LOWBIT_ENCODINGS = ("int4-huffman", "ternary-huffman", "sign", "topk")
INT4_LEVELS = 7
TOPK_VERSION = 1
_TOPK_HEADER = struct.Struct("<BBBBIII")
_TWO_BIT = np.array([-3, -2, 2, 3], np.int8)        # the value symbols of b = 2, by their packed digit
BASE = {"int4-huffman": 2 * INT4_LEVELS + 1, "ternary-huffman": 3}   # symbols q + BASE // 2, packed in bytes


def compress_lowbit(mode: str, x: np.ndarray, c: CodecConfig) -> tuple[bytes, np.ndarray, np.ndarray]:
    """(payload, the receiver's int8 symbols q (n,: zero where a top-k sends nothing), float32 scales)
    of a flat float32 chunk, by `c`'s block sizes and parameters: what it decodes is q * the scale of
    its block, as for INT8."""
    block = c.quant_block
    if mode == "topk":
        return _compress_topk(x, block, c.topk_density, c.topk_value_bits)
    if mode == "int4-huffman":
        q, scales = quantize_levels(x, block, INT4_LEVELS, c.int4_clip)
    elif mode == "ternary-huffman":
        q, scales = quantize_ternary(x, block, c.ternary_threshold)
    elif mode == "sign":
        q, scales = quantize_sign(x, block)
    else:
        raise CodecError(f"unknown encoding {mode!r}")
    payload = (np.packbits(q > 0).tobytes() if mode == "sign" else
               huffman.encode(pack_base((q + np.int8(BASE[mode] // 2)).view(np.uint8), BASE[mode]),
                              c.huffman_block, c.huffman_tables))
    return payload, q, scales


def _compress_topk(x: np.ndarray, block: int, density: float, value_bits: int
                   ) -> tuple[bytes, np.ndarray, np.ndarray]:
    positions, values = select_topk(x, block, density)
    nb = num_blocks(x.size, block)
    k, k_last = topk_count(block, density), topk_count(x.size - (nb - 1) * block, density)
    starts = np.arange(nb, dtype=np.int64) * k                     # each block's values, back to back
    sizes = np.diff(np.append(starts, values.size))
    mean = exact_ratios(values, starts)                             # each block's mean |value|
    if value_bits == 1:
        scales = mean
        q = np.where(values < 0, -1, 1).astype(np.int8)
    elif value_bits == 2:
        # Each value is two or three steps of its block's scale (what a top-k keeps lies in a narrow
        # band above its threshold: sizes 1 and 2 would fit it badly): three where |v| is over the
        # block's mean |v|, the step the least-squares fit of |v| to those multiples.
        steps = np.where(np.abs(values) > np.repeat(mean, sizes), 3, 2).astype(np.int64)
        scales = exact_ratios(values, starts, steps, steps * steps)
        q = (np.where(values < 0, -1, 1) * steps).astype(np.int8)
    else:
        raise CodecError(f"top-k values take 1 or 2 bits, not {value_bits}")
    scales[scales < TINY] = 0
    payload = topk_payload(positions, q, k, k_last, value_bits)
    return payload, _scatter(x.size, positions, q), scales


def topk_payload(positions: np.ndarray, q: np.ndarray, k: int, k_last: int, value_bits: int) -> bytes:
    """An ENCODING_TOPK payload of ascending `positions` and their value symbols `q`."""
    gaps = np.diff(positions.astype(np.int64), prepend=-1) - 1
    r = rice_parameter(gaps)
    stream = rice_encode(gaps, r)
    packed = (np.packbits(q > 0) if value_bits == 1 else
              pack_base(np.searchsorted(_TWO_BIT, q).astype(np.uint8), 4)).tobytes()
    return _TOPK_HEADER.pack(TOPK_VERSION, value_bits, r, 0, k, k_last, len(stream)) + stream + packed


def _scatter(n: int, positions: np.ndarray, q: np.ndarray) -> np.ndarray:
    """The dense int8 symbols of a top-k: q at its positions, zero elsewhere."""
    out = np.zeros(n, np.int8)
    out[positions] = q
    return out


def decode_lowbit(mode: str, length: int, block: int, payload: bytes) -> np.ndarray:
    """A chunk's int8 symbols (its values are each times its block's scale, as for INT8);
    CodecError if the payload is not what its header says."""
    if mode == "topk":
        return _decode_topk(length, block, payload)
    if mode in BASE:
        q = unpack_base(huffman.decode(payload), BASE[mode], length).view(np.int8) - np.int8(BASE[mode] // 2)
    elif mode == "sign":
        if len(payload) != -(-length // 8):
            raise CodecError(f"sign chunk of {length} elements has {len(payload)} payload bytes")
        q = np.unpackbits(np.frombuffer(payload, np.uint8), count=length).view(np.int8)     # 0 or 1, in place:
        q *= 2                                                                               # a byte an element
        q -= 1
    else:
        raise CodecError(f"unknown encoding {mode!r}")
    return q


def _decode_topk(length: int, block: int, payload: bytes) -> np.ndarray:
    if len(payload) < _TOPK_HEADER.size:
        raise CodecError("top-k chunk is shorter than its header")
    version, bits, r, zero, k, k_last, stream_bytes = _TOPK_HEADER.unpack_from(payload)
    nb = num_blocks(length, block)
    last = length - (nb - 1) * block
    if version != TOPK_VERSION or bits not in (1, 2) or zero or not (1 <= k <= block and 1 <= k_last <= last):
        raise CodecError(f"top-k header (version {version}, {bits} value bits, k {k} and {k_last}) does not fit "
                         f"a chunk of {length} elements in blocks of {block}")
    count = k * (nb - 1) + k_last
    start = _TOPK_HEADER.size
    values_at = start + stream_bytes
    per = 8 if bits == 1 else symbols_per_byte(4)
    if len(payload) != values_at + -(-count // per):
        raise CodecError(f"top-k chunk of {count} values has {len(payload)} payload bytes, its header says "
                         f"{values_at + -(-count // per)}")
    gaps = rice_decode(np.frombuffer(payload, np.uint8, stream_bytes, start), count, r, length)
    positions = np.cumsum(gaps + 1) - 1
    if count and positions[-1] >= length:
        raise CodecError(f"top-k positions run past the chunk's {length} elements")
    packed = np.frombuffer(payload, np.uint8, offset=values_at)
    if bits == 1:
        q = np.where(np.unpackbits(packed, count=count) > 0, 1, -1).astype(np.int8)
    else:
        q = _TWO_BIT[unpack_base(packed, 4, count)]
    return _scatter(length, positions, q)


def payload_ok(mode: str, length: int, payload: bytes) -> bool:
    """A cheap look at the payload's size before decoding (Encoded.check)."""
    if mode == "sign":
        return len(payload) == -(-length // 8)
    if mode == "topk":
        return len(payload) >= _TOPK_HEADER.size
    return huffman.payload_symbols(payload) == -(-length // symbols_per_byte(BASE[mode]))
