"""The codes of the Huffman stage: length-limited code lengths from symbol counts, canonical codes
from lengths, and the table the decoder looks 12-bit windows up in. huffman.py holds the
payload format; huffman_kernels.py the compiled coders."""

from __future__ import annotations

import numpy as np

from ..errors import CodecError

__all__ = ["MAX_CODE_LEN", "code_lengths", "canonical_codes", "decode_table", "pack_lengths",
           "unpack_lengths", "is_prefix_code"]

MAX_CODE_LEN = 12


def code_lengths(counts: np.ndarray, max_len: int = MAX_CODE_LEN) -> np.ndarray:
    """Optimal code lengths of at most `max_len` bits (uint8, 0 = absent) for 256 counts
    (package-merge: huffman_lengths.package_merge)."""
    counts = np.asarray(counts, dtype=np.int64)
    present = np.flatnonzero(counts)
    lengths = np.zeros(256, dtype=np.uint8)
    n = present.size
    if n == 0:
        return lengths
    if n == 1:
        lengths[present[0]] = 1
        return lengths
    if n > (1 << max_len):
        raise CodecError(f"{n} symbols do not fit in codes of {max_len} bits")
    order = np.argsort(counts[present], kind="stable")
    from .huffman_lengths import package_merge      # numba: only where something is encoded

    lengths[present[order]] = package_merge(counts[present][order], max_len)
    return lengths


def canonical_codes(lengths: np.ndarray) -> np.ndarray:
    """Canonical code of each symbol (uint32): shorter codes first, then by symbol value."""
    lengths = np.asarray(lengths, dtype=np.int64)
    codes = np.zeros(256, dtype=np.uint32)
    order = np.lexsort((np.arange(256), lengths))
    order = order[lengths[order] > 0]
    if order.size == 0:
        return codes
    ln = lengths[order]
    # The first code of each length L is (first code of L-1 + count of L-1) << 1.
    per_len = np.bincount(ln, minlength=MAX_CODE_LEN + 2)
    first = np.zeros(per_len.size, np.int64)
    for L in range(1, per_len.size):
        first[L] = (first[L - 1] + per_len[L - 1]) << 1
    rank = np.arange(order.size) - np.searchsorted(ln, ln)     # position within its length
    codes[order] = (first[ln] + rank).astype(np.uint32)
    return codes


def pack_lengths(lengths: np.ndarray) -> bytes:
    ln = lengths.astype(np.uint8)
    return (ln[0::2] | (ln[1::2] << 4)).astype(np.uint8).tobytes()


def unpack_lengths(raw: bytes) -> np.ndarray:
    b = np.frombuffer(raw, dtype=np.uint8)
    out = np.empty(256, dtype=np.uint8)
    out[0::2] = b & 0x0F
    out[1::2] = b >> 4
    return out


def is_prefix_code(lengths: np.ndarray) -> bool:
    """Can these lengths (0 = absent) be the code of a payload: some symbol, none over
    MAX_CODE_LEN bits, and Kraft's inequality."""
    present = lengths[lengths > 0].astype(np.int64)
    if present.size == 0 or int(present.max()) > MAX_CODE_LEN:
        return False
    return int((1 << (MAX_CODE_LEN - present)).sum()) <= (1 << MAX_CODE_LEN)


def decode_table(lengths: np.ndarray) -> np.ndarray:
    """2**MAX_CODE_LEN entries (uint16): symbol | code length << 8, for each MAX_CODE_LEN-bit window."""
    order = np.lexsort((np.arange(256), lengths))
    order = order[lengths[order] > 0]
    span = 1 << (MAX_CODE_LEN - lengths[order].astype(np.int64))
    entry = order.astype(np.uint16) | (lengths[order].astype(np.uint16) << 8)
    table = np.repeat(entry, span)
    size = 1 << MAX_CODE_LEN
    if table.size < size:  # incomplete code (a single symbol): unused windows decode to junk
        table = np.concatenate([table, np.full(size - table.size, 1 << 8, np.uint16)])
    return table
