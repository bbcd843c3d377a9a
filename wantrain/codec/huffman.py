"""Stage 2 of the codec: canonical, length-limited Huffman coding of byte symbols.

Layout of one encoded payload (all integers little-endian unless said otherwise):

    u8   format version (1)
    u8   number of code tables T (1 .. MAX_TABLES)
    u16  symbols per block B
    u32  number of symbols n
    T x 128  code lengths of symbols 0..255 per table, one nibble each (low nibble first)
    u8   table of each of the ceil(n / B) blocks (only when T > 1)
    u16  bit length of each block
    ...  the bit stream, as big-endian u32 words, blocks back to back with no padding

Blocks are independently decodable given their start bit (the prefix sum of the block bit
lengths) and their table, so a large payload's blocks are decoded by several threads at once.
Codes are at most 12 bits, so one lookup in a 4096-entry table decodes a symbol. The bit-level
loops are compiled (huffman_kernels.py); this module parses and builds the format around them.

Why several tables: the int8 symbols of a delta are a mixture (blocks whose scale was set by
an outlier hold narrow distributions, others wide ones). Splitting the blocks by their spread
into T groups with a code each takes back most of what one code loses to the mixture, at the
cost of one byte per block.
"""

from __future__ import annotations

import struct
import sys

import numpy as np

from ..runtime.cpu_pool import map_ordered
from ..errors import CodecError
from .huffman_codes import (MAX_CODE_LEN, canonical_codes, code_lengths, decode_table, is_prefix_code, pack_lengths,
                            unpack_lengths)

VERSION = 1
MAX_TABLES = 4
DEFAULT_BLOCK = 2048
DEFAULT_TABLES = 2
_HEADER = struct.Struct("<BBHI")
_LITTLE_ENDIAN = sys.byteorder == "little"
_LENGTHS_BYTES = 128


# ---------------------------------------------------------------- encoding

def _compiled():
    """The compiled loops (numba), imported by the first encode or decode: a process that only
    reads the format (the notebook, the command line) never loads numba."""
    from . import huffman_kernels

    return huffman_kernels


def encode(symbols: np.ndarray, block: int = DEFAULT_BLOCK, tables: int = DEFAULT_TABLES) -> bytes:
    """Huffman-code a flat uint8 or int8 array into one self-describing payload.

    Up to `tables` codes are used, each block choosing one by its spread (mean |int8 value|),
    so the split helps int8 symbols centred on zero; any bytes round-trip exactly.
    """
    sym = np.ascontiguousarray(symbols).view(np.uint8).reshape(-1)
    if block <= 0 or block % 2 or block * MAX_CODE_LEN > 0xFFFF:
        raise CodecError(f"Huffman block must be even and at most {0xFFFF // MAX_CODE_LEN}, got {block}")
    if not 1 <= tables <= MAX_TABLES:
        raise CodecError(f"Huffman tables must be in [1, {MAX_TABLES}], got {tables}")
    n = sym.size
    nblocks = -(-n // block)
    if n == 0:
        return _HEADER.pack(VERSION, 1, block, 0) + pack_lengths(np.zeros(256, np.uint8))
    kernels = _compiled()
    group = block_groups(lambda: kernels.block_spread(sym.view(np.int8), block), nblocks, tables)
    counts = kernels.count_symbols(sym, block, group, int(group.max()) + 1)     # (T, 256)
    lengths, entries = codes_of(counts)
    # An odd count is padded with a second copy of the last symbol (see encode_blocks).
    total_bits = int((counts * lengths).sum()) + (int(lengths[group[-1], sym[-1]]) if n % 2 else 0)
    words = np.empty(-(-total_bits // 32), np.uint32)
    block_bits = np.empty(nblocks, "<u2")
    kernels.encode_blocks(sym, block, group, entries, words, block_bits, _LITTLE_ENDIAN)   # words big-endian
    return assemble(block, n, lengths, group, block_bits, words.data)


def codes_of(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(T, 256) symbol counts per table -> (code lengths uint8, entries int64: code << 5 | length)."""
    lengths = np.stack([code_lengths(c) for c in counts])      # (T, 256) uint8
    codes = np.stack([canonical_codes(ln) for ln in lengths])  # (T, 256) uint32
    return lengths, (codes.astype(np.int64) << 5) | lengths


def assemble(block: int, n: int, lengths: np.ndarray, group: np.ndarray, block_bits: np.ndarray,
             stream) -> bytes:
    """The payload around a coded bit stream (big-endian u32 words, as bytes or a buffer)."""
    T = lengths.shape[0]
    header = _HEADER.pack(VERSION, T, block, n) + b"".join(pack_lengths(ln) for ln in lengths)
    block_tables = group.astype(np.uint8).tobytes() if T > 1 else b""
    return b"".join((header, block_tables, np.asarray(block_bits, "<u2").data, stream))   # one copy of the stream


def block_groups(spread, nblocks: int, tables: int) -> np.ndarray:
    """Table index of each block: blocks split into `tables` groups by mean |int8 value|.
    `spread()` gives the (nblocks,) float64 means; it is called only when there is a choice."""
    if tables == 1 or nblocks < 2 * tables:
        return np.zeros(nblocks, np.int64)
    spread = spread()
    cuts = np.quantile(spread, np.arange(1, tables) / tables)
    group = np.searchsorted(cuts, spread, side="right")
    used = np.unique(group)                                    # ties can leave a group empty
    return np.searchsorted(used, group).astype(np.int64)


# ---------------------------------------------------------------- decoding

def payload_symbols(payload: bytes) -> int:
    """The number of symbols a payload's header announces (CodecError if there is no header).

    A receiver checks it against the chunk's length before decoding anything, so a header
    cannot make it allocate more than the chunk's own size."""
    if len(payload) < _HEADER.size:
        raise CodecError(f"Huffman payload too short ({len(payload)} bytes)")
    return _HEADER.unpack_from(payload, 0)[3]


class _Parsed:
    __slots__ = ("n", "block", "tables", "lengths", "block_table", "block_bits", "words", "used")

    def __init__(self, payload: bytes) -> None:
        if len(payload) < _HEADER.size + _LENGTHS_BYTES:
            raise CodecError(f"Huffman payload too short ({len(payload)} bytes)")
        version, self.tables, self.block, self.n = _HEADER.unpack_from(payload, 0)
        if version != VERSION:
            raise CodecError(f"unknown Huffman payload version {version}")
        if not 1 <= self.tables <= MAX_TABLES or self.block == 0 or self.block % 2:
            raise CodecError(f"bad Huffman header (tables={self.tables}, block={self.block})")
        nblocks = -(-self.n // self.block)
        need = _HEADER.size + self.tables * _LENGTHS_BYTES + (nblocks if self.tables > 1 else 0) + 2 * nblocks
        if len(payload) < need:
            raise CodecError(f"Huffman payload of {len(payload)} bytes is shorter than its header ({need})")
        pos = _HEADER.size
        self.lengths = [unpack_lengths(payload[pos + k * _LENGTHS_BYTES: pos + (k + 1) * _LENGTHS_BYTES])
                        for k in range(self.tables)]
        pos += self.tables * _LENGTHS_BYTES
        if self.tables > 1:
            self.block_table = np.frombuffer(payload, dtype=np.uint8, count=nblocks, offset=pos)
            pos += nblocks
            if self.block_table.size and int(self.block_table.max()) >= self.tables:
                raise CodecError("Huffman block names a table the payload does not have")
        else:
            self.block_table = np.zeros(nblocks, np.uint8)
        self.block_bits = np.frombuffer(payload, dtype="<u2", count=nblocks, offset=pos).astype(np.int64)
        pos += 2 * nblocks
        if (len(payload) - pos) % 4:
            raise CodecError("Huffman bit stream is not a whole number of words")
        self.words = np.frombuffer(payload, dtype=">u4", offset=pos)
        total = int(self.block_bits.sum())
        if total > 32 * self.words.size:
            raise CodecError("Huffman block index points past the end of the stream")
        self.used = set(np.unique(self.block_table).tolist())    # the tables some block codes with
        if self.n:
            if not all(is_prefix_code(self.lengths[k]) for k in self.used):
                raise CodecError("Huffman code lengths do not form a prefix code")


def decode(payload: bytes) -> np.ndarray:
    """Decode one payload into its uint8 symbols."""
    return decode_many([payload])[0]


def decode_many(payloads: list[bytes], threads: int | None = None) -> list[np.ndarray]:
    """Decode several payloads; their blocks are shared out on the process's thread pool (cpu_pool.py)
    when there are enough of them to be worth it, or decoded on this thread with `threads=1`."""
    parsed = [_Parsed(p) for p in payloads]
    results = [np.empty(p.n, np.uint8) for p in parsed]
    jobs = []                                                  # (payload, first block, last block)
    for i, p in enumerate(parsed):
        nblocks = p.block_bits.size
        jobs += [(i, b, min(b + _BLOCKS_PER_JOB, nblocks)) for b in range(0, nblocks if p.n else 0, _BLOCKS_PER_JOB)]
    if not jobs:
        return results
    inputs = [_kernel_inputs(p) for p in parsed]
    kernels = _compiled()

    def run(job: tuple[int, int, int]) -> None:
        i, first, last = job
        p = parsed[i]
        words, starts, tables = inputs[i]
        kernels.decode_blocks(words, starts, p.block_table, tables, p.block, p.n, first, last, results[i])

    map_ordered(run, jobs, threads)
    return results


def _kernel_inputs(p: _Parsed) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The decoder's arrays: native-order words with zeros after them, each block's first bit, tables."""
    words = np.zeros(p.words.size + _compiled().words_after(p.block), np.uint32)
    words[:p.words.size] = p.words
    starts = np.cumsum(p.block_bits) - p.block_bits
    # Only the tables some block uses were checked (a payload may carry others, of any lengths).
    tables = np.stack([decode_table(ln) if k in p.used else np.zeros(1 << MAX_CODE_LEN, np.uint16)
                       for k, ln in enumerate(p.lengths)])
    return words, starts, tables


# Blocks per decode job: about a million symbols at the default block, so a job's work dwarfs
# handing it to a thread; a payload smaller than that decodes on the calling thread.
_BLOCKS_PER_JOB = 512
