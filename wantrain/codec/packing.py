"""Lossless packings of small symbols, for the encodings below 8 bits (formats.py).

    pack_base   `per` symbols of an alphabet of `base` in one byte (base ** per <= 256): five
                ternary symbols (243 of 256 values), two of 15 levels (225). The existing
                canonical Huffman (huffman.py) then codes those bytes: a code over tuples loses
                far less to rounding code lengths to whole bits than one over single symbols of a
                small alphabet (about 0.07 bit a ternary symbol alone, a few thousandths in fives).
    rice        Golomb-Rice codes of non-negative integers (rice_kernels.py), for the gaps between
                the positions a top-k keeps: geometric, so Rice spends within about 2 % of their
                entropy at the densities used (a Golomb step that is not a power of two would do a
                little better, at a divide a value).
"""

from __future__ import annotations

import numpy as np

from ..errors import CodecError

__all__ = ["pack_base", "unpack_base", "symbols_per_byte", "rice_parameter", "rice_encode", "rice_decode",
           "MAX_RICE_PARAMETER"]

MAX_RICE_PARAMETER = 24


def symbols_per_byte(base: int) -> int:
    """The most symbols of an alphabet of `base` (2 .. 256) that fit one byte."""
    if not 2 <= base <= 256:
        raise CodecError(f"an alphabet of {base} symbols does not pack into bytes")
    per = 1
    while base ** (per + 1) <= 256:
        per += 1
    return per


def pack_base(symbols: np.ndarray, base: int) -> np.ndarray:
    """uint8 symbols in [0, base) -> bytes, `symbols_per_byte(base)` each, first symbol lowest
    (the last byte padded with zeros)."""
    per = symbols_per_byte(base)
    n = symbols.size
    padded = np.zeros(-(-n // per) * per, np.uint8)
    padded[:n] = symbols
    digits = padded.reshape(-1, per)                                  # (bytes, per)
    out = digits[:, per - 1].copy()
    for i in range(per - 2, -1, -1):                                  # Horner: no sum passes 255
        out *= np.uint8(base)
        out += digits[:, i]
    return out


def unpack_base(packed: np.ndarray, base: int, n: int) -> np.ndarray:
    """Inverse of pack_base: the first `n` symbols (uint8); CodecError if a byte is not a packing
    of `base` symbols or there are too few bytes."""
    per = symbols_per_byte(base)
    if packed.size != -(-n // per):
        raise CodecError(f"{n} symbols of base {base} take {-(-n // per)} bytes, the payload has {packed.size}")
    if packed.size and int(packed.max()) >= base ** per:
        raise CodecError(f"byte {int(packed.max())} is not {per} symbols of base {base}")
    if per == 1:
        return packed[:n].copy()
    digits = np.empty((packed.size, per), np.uint8)                   # (bytes, per)
    rest = packed.copy()
    for i in range(per):
        np.remainder(rest, base, out=digits[:, i])
        rest //= np.uint8(base)
    return digits.reshape(-1)[:n]


def rice_parameter(values: np.ndarray) -> int:
    """The Rice parameter that codes `values` (int64, >= 0) in the fewest bits."""
    if values.size == 0:
        return 0
    best, best_bits = 0, None
    for r in range(MAX_RICE_PARAMETER + 1):
        bits = int((values >> r).sum()) + values.size * (r + 1)
        if best_bits is None or bits < best_bits:
            best, best_bits = r, bits
        elif bits > best_bits:             # the cost is convex in r: past its least it only grows
            break
    return best


def rice_encode(values: np.ndarray, r: int) -> bytes:
    from .rice_kernels import rice_encode as kernel     # numba: only where something is coded

    values = np.ascontiguousarray(values, dtype=np.int64)
    bits = int((values >> r).sum()) + values.size * (r + 1)
    out = np.empty(-(-bits // 8), np.uint8)
    used = kernel(values, r, out)
    assert used == out.size
    return out.tobytes()


def rice_decode(data: bytes | np.ndarray, count: int, r: int, limit: int) -> np.ndarray:
    """`count` values of at most `limit` (int64); CodecError if the bytes do not hold them, or
    hold bits beyond the last value's byte."""
    from .rice_kernels import rice_decode as kernel

    if not 0 <= r <= MAX_RICE_PARAMETER:
        raise CodecError(f"Rice parameter {r} is outside [0, {MAX_RICE_PARAMETER}]")
    raw = np.frombuffer(data, np.uint8) if isinstance(data, bytes) else data
    out = np.empty(count, np.int64)
    bits = kernel(raw, r, limit, out)
    if bits < 0:
        raise CodecError(f"the Rice stream does not hold {count} values of at most {limit}")
    if -(-bits // 8) != raw.size:
        raise CodecError(f"the Rice stream has {raw.size} bytes, its {count} values take {-(-bits // 8)}")
    return out
