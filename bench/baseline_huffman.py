"""The baseline of bench/codec_bench.py: the Huffman coders as they were before they were compiled
(numpy only, wantrain 0.x up to commit dd1d28c), kept so that one run of the bench shows the
compiled coders beside them. Same payload format; the bench checks the payloads are identical.
Not part of the package; nothing but the bench imports it."""

from __future__ import annotations

import numpy as np

from wantrain.codec import huffman_kernels
from wantrain.codec.huffman import _HEADER, DEFAULT_BLOCK, DEFAULT_TABLES, VERSION, _Parsed, block_groups
from wantrain.codec.huffman_codes import MAX_CODE_LEN, canonical_codes, code_lengths, decode_table, pack_lengths


def package_merge(leaf_w: np.ndarray, max_len: int = MAX_CODE_LEN) -> np.ndarray:
    """The code lengths of n >= 2 symbols given their weights in ascending order, as numpy computed
    them before `huffman_codes._package_merge` was compiled (tests/codec/test_huffman.py checks the
    two agree). The baseline encoder below uses the compiled one: it was 2 % of its time."""
    n = leaf_w.size
    is_leaf = [np.ones(n, bool)]
    weights = leaf_w
    for _ in range(max_len - 1):
        k = weights.size // 2
        pack_w = weights[0:2 * k:2] + weights[1:2 * k:2]       # (k,)
        w = np.concatenate([leaf_w, pack_w])
        merged = np.argsort(w, kind="stable")                  # leaves before equal packages
        weights = w[merged]
        is_leaf.append(merged < n)
    depth = np.zeros(n, np.int64)
    m = 2 * n - 2
    for leaf in reversed(is_leaf):
        c = int(np.count_nonzero(leaf[:m]))
        depth[:c] += 1
        m = 2 * (m - c)
    return depth


def pair_tables(lengths: np.ndarray, codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """65536-entry tables for symbol pairs: total length (u8), code left-aligned in 64 bits (u64).

    A pair is read as one little-endian u16, index = s0 + 256 * s1: row s1, column s0.
    """
    ln = lengths.astype(np.uint64)
    c = codes.astype(np.uint64)
    total = ln[:, None] + ln[None, :]                          # (256 s1, 256 s0)
    code = (c[None, :] << ln[:, None]) | c[:, None]            # s0's code, then s1's
    shift = np.where(total > 0, np.uint64(64) - total, np.uint64(0))
    aligned = np.where(total > 0, code << shift, np.uint64(0))
    return total.astype(np.uint8).reshape(-1), aligned.reshape(-1)


def encode(symbols: np.ndarray, block: int = DEFAULT_BLOCK, tables: int = DEFAULT_TABLES) -> bytes:
    """The numpy encoder of before, for non-empty arrays and valid arguments (the bench's)."""
    sym = np.ascontiguousarray(symbols).view(np.uint8).reshape(-1)
    n = sym.size
    nblocks = -(-n // block)
    group = block_groups(lambda: huffman_kernels.block_spread(sym.view(np.int8), block), nblocks, tables)
    T = int(group.max()) + 1
    if n % 2:  # pad to whole pairs with a symbol that has a code; the decoder stops at n
        sym = np.concatenate([sym, sym[-1:]])
    pairs = sym.view("<u2")                                    # (m,) = s0 | s1 << 8
    half = block // 2
    if T == 1:
        idx = pairs
    else:  # idx = pair | table << 16, one pass over the pairs block by block
        idx = np.empty(pairs.size, np.uint32)
        full = pairs.size // half
        np.bitwise_or(pairs[:full * half].reshape(full, half), group[:full, None].astype(np.uint32) << 16,
                      out=idx[:full * half].reshape(full, half))
        idx[full * half:] = pairs[full * half:] | (np.uint32(group[-1]) << 16)
    pair_counts = np.bincount(idx, minlength=T * 65536).reshape(T, 256, 256)   # [table, s1, s0]
    counts = pair_counts.sum(axis=1) + pair_counts.sum(axis=2)                  # (T, 256)
    if n % 2:
        counts[group[-1], sym[-1]] -= 1
    lengths = [code_lengths(c) for c in counts]
    pair_len, pair_code = zip(*(pair_tables(ln, canonical_codes(ln)) for ln in lengths))
    pair_len, pair_code = np.concatenate(pair_len), np.concatenate(pair_code)

    plen = np.take(pair_len, idx)                              # (m,) uint8, <= 24 bits
    ends = np.cumsum(plen, dtype=np.uint64)                    # (m,) bit end of each pair
    starts = ends - plen
    total_bits = int(ends[-1])

    # Block bit lengths: block k covers pairs [k*B/2, (k+1)*B/2).
    block_ends = np.append(ends[half - 1::half], total_bits)[:nblocks]
    block_bits = np.diff(block_ends, prepend=0).astype("<u2")

    # Each pair's code, left-aligned in 64 bits, is shifted to its offset within its start
    # word w, so it covers bits of words w and w+1. Codes never overlap, so the pairs that
    # start in the same word add up without carries (sum == OR). A pair is at most 24 bits, so
    # every word but the last has a pair starting in it: the segments are words 0..K-1. A
    # segment's sum is a difference of prefix sums; uint64 wrap-around cancels out exactly.
    word = starts >> np.uint64(5)                              # (m,) non-decreasing
    aligned = np.take(pair_code, idx)                          # (m,)
    np.right_shift(aligned, starts & np.uint64(31), out=aligned)
    prefix = np.cumsum(aligned, out=aligned)
    last = np.append(np.flatnonzero(word[1:] != word[:-1]), word.size - 1)   # (K,) last pair per word
    window = np.diff(prefix[last], prepend=np.uint64(0))       # (K,) words w, w+1 of segment w
    nwords = -(-total_bits // 32)
    stream = np.zeros(window.size + 1, np.uint64)
    stream[:-1] = window >> np.uint64(32)
    stream[1:] += window & np.uint64(0xFFFFFFFF)
    words = stream[:nwords].astype(">u4")
    header = _HEADER.pack(VERSION, T, block, n) + b"".join(pack_lengths(ln) for ln in lengths)
    block_tables = group.astype(np.uint8).tobytes() if T > 1 else b""
    return header + block_tables + block_bits.tobytes() + words.tobytes()


def _transpose(a: np.ndarray, rows: int = 64) -> np.ndarray:
    """a.T as a contiguous array, copied in bands of rows (about twice numpy's plain copy)."""
    out = np.empty(a.shape[::-1], a.dtype)
    for r in range(0, a.shape[0], rows):
        out[:, r:r + rows] = a[r:r + rows].T
    return out


def decode_many(payloads: list[bytes]) -> list[np.ndarray]:
    """Decode several payloads at once, all of their blocks advancing in lock step."""
    parsed = [_Parsed(p) for p in payloads]
    results: list[np.ndarray] = [np.empty(0, np.uint8) for _ in parsed]
    live = [i for i, p in enumerate(parsed) if p.n > 0]
    if not live:
        return results
    block = parsed[live[0]].block
    if any(parsed[i].block != block for i in live):  # rare: decode groups separately
        for i in live:
            results[i] = decode_many([payloads[i]])[0]
        return results

    # One concatenated word stream and one concatenated table; each lane (block) knows
    # its start bit and which table it uses.
    word_base = np.cumsum([0] + [parsed[i].words.size for i in live])
    pad = block * MAX_CODE_LEN // 32 + 2
    words = np.concatenate([parsed[i].words.astype(np.uint64) for i in live] + [np.zeros(pad, np.uint64)])
    w64 = (words[:-1] << np.uint64(32)) | words[1:]             # window source: word i and i+1
    starts, table_base = [], []
    tables: list[np.ndarray] = []
    for k, i in enumerate(live):
        p = parsed[i]
        bb = p.block_bits.astype(np.uint64)
        starts.append(np.cumsum(bb) - bb + np.uint64(32 * word_base[k]))
        table_base.append((p.block_table.astype(np.uint64) + np.uint64(len(tables))) << np.uint64(MAX_CODE_LEN))
        tables.extend(decode_table(ln) for ln in p.lengths)
    pos = np.concatenate(starts).astype(np.int64)              # (lanes,) bit position
    pos_u = pos.view(np.uint64)
    base = np.concatenate(table_base)                          # (lanes,) table offset
    single_table = len(tables) == 1
    table = np.concatenate(tables)
    lanes = pos.size

    # Row k of `out` holds symbols 2k and 2k+1 of every block, as one little-endian u16.
    # One 64-bit window read at a word boundary (shift <= 31) holds two whole codes
    # (2 * 12 bits), so each pass of the loop decodes two symbols per lane. Indices are int64
    # views so that np.take takes its fast path.
    out = np.empty((block // 2, lanes), dtype=np.uint16)
    idx = np.empty(lanes, np.int64)
    win = np.empty(lanes, np.uint64)
    sh = np.empty(lanes, np.uint64)
    t = np.empty(lanes, np.uint64)
    t_i = t.view(np.int64)
    e1 = np.empty(lanes, np.uint16)                            # table entry: symbol | length << 8
    e2 = np.empty(lanes, np.uint16)
    ln = np.empty(lanes, np.uint64)
    top = np.uint64(64 - MAX_CODE_LEN)
    low5, eight, low8 = np.uint64(31), np.uint16(8), np.uint16(0xFF)
    for k in range(block // 2):
        np.right_shift(pos, 5, out=idx)
        np.take(w64, idx, out=win, mode="clip")
        np.bitwise_and(pos_u, low5, out=sh)
        np.left_shift(win, sh, out=win)                        # next code at the top
        for e in (e1, e2):
            np.right_shift(win, top, out=t)
            if not single_table:
                np.add(t, base, out=t)
            np.take(table, t_i, out=e, mode="clip")
            np.right_shift(e, eight, out=ln)
            np.left_shift(win, ln, out=win)
            np.add(pos_u, ln, out=pos_u)
        np.bitwise_and(e1, low8, out=e1)
        np.left_shift(e2, eight, out=e2)                       # drops e2's length byte
        np.bitwise_or(e1, e2, out=out[k])

    by_block = _transpose(out)                                 # (lanes, block / 2) u16
    lane = 0
    for i in live:
        p = parsed[i]
        nb = p.block_bits.size
        results[i] = by_block[lane:lane + nb].reshape(-1).view(np.uint8)[: p.n]
        lane += nb
    return results
