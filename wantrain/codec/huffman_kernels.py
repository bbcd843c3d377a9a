"""The Huffman stage's inner loops, compiled with numba: count, encode and decode bit by bit.

huffman.py owns the payload format and calls these; they see only arrays. Each kernel releases
the GIL (`nogil`), so a caller decodes several payloads, or several ranges of one payload's
blocks, at once on a thread pool. numba's own parallel loops are not used: their default
threading layer aborts when two Python threads call into it at the same time.

Compiled code is cached next to this file (numba `cache=True`), so only the first process on
a machine pays for compiling (a few seconds); later ones load it in milliseconds.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .huffman_codes import MAX_CODE_LEN

_PEEK_SHIFT = 64 - MAX_CODE_LEN


@njit(nogil=True, cache=True)
def block_spread(s8: np.ndarray, block: int) -> np.ndarray:
    """Mean |value| of each block of `block` int8 symbols (the last block may be shorter).

    |-128| counts as -128, as numpy's int8 abs has it: the format's first coder used numpy, and
    the block groups (so the payload bytes) must not change. (Loops over slices vectorize.)"""
    n = s8.size
    nblocks = -(-n // block)
    spread = np.empty(nblocks, np.float64)
    for b in range(nblocks):
        end = min(n, (b + 1) * block)
        total = 0
        for v in s8[b * block:end]:
            a = abs(np.int32(v))
            total += a - ((a >> 7) << 8)        # 128 -> -128
        spread[b] = total / (end - b * block)
    return spread


@njit(nogil=True, cache=True)
def count_symbols(sym: np.ndarray, block: int, group: np.ndarray, tables: int) -> np.ndarray:
    """(tables, 256) int64: how often each symbol occurs in the blocks that use each table."""
    counts = np.zeros((tables, 256), np.int64)
    n = sym.size
    for b in range(group.size):
        c = counts[group[b]]
        for v in sym[b * block:min(n, (b + 1) * block)]:
            c[v] += 1
    return counts


@njit(inline="always")
def _word(value: np.int64, swap: bool) -> np.uint32:
    """The u32 whose bytes in memory are `value`'s 32 bits big-endian (swap on a little-endian machine)."""
    v = value & 0xFFFFFFFF
    if swap:
        v = ((v >> 24) & 0xFF) | ((v >> 8) & 0xFF00) | ((v << 8) & 0xFF0000) | ((v << 24) & 0xFF000000)
    return np.uint32(v)


@njit(nogil=True, cache=True)
def encode_blocks(sym: np.ndarray, block: int, group: np.ndarray, entries: np.ndarray,
                  words: np.ndarray, block_bits: np.ndarray, swap: bool) -> int:
    """Write the codes of `sym` (block b coded with table group[b]) as one bit stream into `words`
    (u32 words, most significant bit first, stored big-endian: the payload's bytes as they are, with
    `swap` true on a little-endian machine) and each block's bit length into `block_bits`.

    `entries` is (T, 256) int64: code << 5 | length. Symbols go in pairs; an odd count is padded
    with a second copy of the last symbol, coded in the last block (the format's first coder
    worked on pairs; the decoder stops at n). Returns the number of words written."""
    n = sym.size
    acc = np.int64(0)             # bits not yet written are its lowest `pending` (< 32 between pairs)
    pending = np.int64(0)
    w = 0
    for b in range(group.size):
        table = entries[group[b]]
        start = b * block
        end = min(n, start + block)
        bits = np.int64(0)
        for i in range(start, end, 2):
            e0 = table[sym[i]]
            e1 = table[sym[i + 1] if i + 1 < end else sym[n - 1]]
            l0 = e0 & 31
            l1 = e1 & 31
            acc = (((acc << l0) | (e0 >> 5)) << l1) | (e1 >> 5)   # older bits fall off the top
            pending += l0 + l1
            bits += l0 + l1
            if pending >= 32:
                pending -= 32
                words[w] = _word(acc >> pending, swap)
                w += 1
        block_bits[b] = bits
    if pending > 0:
        words[w] = _word(acc << (32 - pending), swap)
        w += 1
    return w


_MASK = (1 << MAX_CODE_LEN) - 1


@njit(inline="always")
def _decode_four(words: np.ndarray, table: np.ndarray, pos: int, out: np.ndarray, i: int) -> int:
    """Decode out[i:i + 4] from bit `pos`; returns the bit after them. The 64 bits from `pos`
    (three words) hold four whole codes of at most 12 bits."""
    k = pos >> 5
    sh = pos & 31
    win = (((np.int64(words[k]) << 32) | np.int64(words[k + 1])) << sh) | (np.int64(words[k + 2]) >> (32 - sh))
    for j in range(4):
        e = table[(win >> _PEEK_SHIFT) & _MASK]               # symbol | length << 8
        out[i + j] = e & 0xFF
        length = np.int64(e >> 8)
        win <<= length
        pos += length
    return pos


@njit(inline="always")
def _decode_one(words: np.ndarray, table: np.ndarray, pos: int, out: np.ndarray, i: int) -> int:
    k = pos >> 5
    win = ((np.int64(words[k]) << 32) | np.int64(words[k + 1])) << (pos & 31)
    e = table[(win >> _PEEK_SHIFT) & _MASK]
    out[i] = e & 0xFF
    return pos + np.int64(e >> 8)


@njit(nogil=True, cache=True)
def decode_blocks(words: np.ndarray, starts: np.ndarray, block_table: np.ndarray, tables: np.ndarray,
                  block: int, n: int, first: int, last: int, out: np.ndarray) -> None:
    """Decode blocks [first, last) into `out` (uint8, n symbols).

    `words` is the stream as native u32 followed by at least `words_after(block)` zero words, so a
    block that claims more bits than the stream holds reads zeros, never past the array.
    `starts` is each block's first bit, `tables` the (T, 4096) lookup tables of
    symbol | length << 8. Each symbol's position depends on the length of the one before, so
    two blocks are decoded side by side: two independent chains of lookups keep the CPU busy."""
    b = first
    while b + 1 < last and (b + 2) * block <= n:             # two whole blocks
        table_a, table_b = tables[block_table[b]], tables[block_table[b + 1]]
        pos_a, pos_b = np.int64(starts[b]), np.int64(starts[b + 1])
        a, c = b * block, (b + 1) * block
        for j in range(0, block - 3, 4):
            pos_a = _decode_four(words, table_a, pos_a, out, a + j)
            pos_b = _decode_four(words, table_b, pos_b, out, c + j)
        for j in range(block // 4 * 4, block):
            pos_a = _decode_one(words, table_a, pos_a, out, a + j)
            pos_b = _decode_one(words, table_b, pos_b, out, c + j)
        b += 2
    while b < last:                                           # the rest, one at a time
        table = tables[block_table[b]]
        pos = np.int64(starts[b])
        start = b * block
        end = min(n, start + block)
        fours = start + (end - start) // 4 * 4
        for i in range(start, fours, 4):
            pos = _decode_four(words, table, pos, out, i)
        for i in range(fours, end):
            pos = _decode_one(words, table, pos, out, i)
        b += 1


def words_after(block: int) -> int:
    """Zero words the decoder needs after the stream: a block's bits may point MAX_CODE_LEN
    bits per symbol past its start, and a read takes the two or three words from there."""
    return block * MAX_CODE_LEN // 32 + 3
