"""The codec's two stages in torch, for numbers that live on a GPU: no copy of the float32 values
to the host, only the coded bytes.

Every function here gives exactly what the CPU path gives: the same int8 symbols and scales as
quantize.py (float32 divide, round half to even), the same Huffman payload bytes as huffman.py,
and the same float32 values on decode. The tests check it on the CPU build of torch, so a site on
a GPU and one without can share a run. What needs no more than a few numbers per block or table
(the block groups, the code lengths, the payload header) is computed on the host, with
huffman.py's own functions.

Encoding is data-parallel: each symbol's code and bit position come from a prefix sum, and each
code is added into the one or two 32-bit words it touches (the bits never overlap, so adding is
OR). Decoding is parallel across blocks (each has its own start bit) and sequential within one:
`block` steps, each a table lookup for every block of every payload at once.
"""

from __future__ import annotations

import numpy as np
import torch

from ..errors import CodecError
from . import huffman
from .huffman_codes import MAX_CODE_LEN
from .quantize import QMAX, TINY, num_blocks

__all__ = ["quantize_int8", "dequantize_int8", "huffman_encode", "huffman_decode_many"]


def quantize_int8(x: torch.Tensor, block: int, levels: int = QMAX) -> tuple[torch.Tensor, torch.Tensor]:
    """quantize.quantize_int8 on the tensor's device: (int8 symbols (n,), float32 scales (nblocks,));
    with `levels`, lowbit.quantize_levels (the same rule with another top)."""
    if x.dim() != 1 or x.dtype != torch.float32:
        raise CodecError(f"quantize_int8 wants a flat float32 tensor, got {x.dtype} {tuple(x.shape)}")
    if block <= 0:
        raise CodecError(f"quantization block must be positive, got {block}")
    if not bool(torch.isfinite(x).all()):
        raise CodecError("cannot quantize non-finite values")
    n, nb = x.numel(), num_blocks(x.numel(), block)
    blocks = torch.nn.functional.pad(x, (0, nb * block - n)).view(nb, block)     # zeros change no absmax
    absmax = blocks.abs().amax(dim=1)
    scales = torch.where(absmax >= float(TINY), absmax / levels, torch.zeros_like(absmax))
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    q = torch.round(blocks / safe[:, None]).clamp_(-levels, levels).to(torch.int8)
    return q.view(-1)[:n], scales


def dequantize_int8(q: torch.Tensor, scales: torch.Tensor, block: int) -> torch.Tensor:
    """float32 (n,) = q * the scale of its block (one float32 multiply, as on the CPU)."""
    n, nb = q.numel(), num_blocks(q.numel(), block)
    if scales.numel() != nb:
        raise CodecError(f"{n} elements in blocks of {block} need {nb} scales, got {scales.numel()}")
    flat = torch.nn.functional.pad(q.to(torch.float32), (0, nb * block - n)).view(nb, block)
    return (flat * scales.to(torch.float32)[:, None]).view(-1)[:n]


# ---------------------------------------------------------------- Huffman

def huffman_encode(symbols: torch.Tensor, block: int = huffman.DEFAULT_BLOCK,
                   tables: int = huffman.DEFAULT_TABLES) -> bytes:
    """huffman.encode of int8 or uint8 symbols on any device: the same payload, byte for byte."""
    if block <= 0 or block % 2 or block * MAX_CODE_LEN > 0xFFFF:
        raise CodecError(f"Huffman block must be even and at most {0xFFFF // MAX_CODE_LEN}, got {block}")
    if not 1 <= tables <= huffman.MAX_TABLES:
        raise CodecError(f"Huffman tables must be in [1, {huffman.MAX_TABLES}], got {tables}")
    sym8 = symbols.reshape(-1)
    n = sym8.numel()
    if n == 0:
        return huffman.encode(np.zeros(0, np.uint8), block, tables)
    dev = sym8.device
    sym = sym8.view(torch.uint8).to(torch.int64)                    # (n,) 0..255
    nblocks = -(-n // block)
    group = huffman.block_groups(lambda: _block_spread(sym8.view(torch.int8), block, nblocks).cpu().numpy(),
                                 nblocks, tables)
    group_t = torch.from_numpy(group).to(dev)
    if n % 2:                                  # pairs, as the CPU coder: the last symbol once more
        sym = torch.cat([sym, sym[-1:]])
    block_of = torch.arange(sym.numel(), device=dev) // block        # the pad falls in the last block
    table_of = group_t[block_of]
    T = int(group.max()) + 1
    counts = torch.bincount(table_of[:n] * 256 + sym[:n], minlength=T * 256).view(T, 256).cpu().numpy()
    lengths, entries = huffman.codes_of(counts)
    entry = torch.from_numpy(entries).to(dev).view(-1)[table_of * 256 + sym]
    length, code = entry & 31, entry >> 5
    end = torch.cumsum(length, 0)
    total_bits = int(end[-1])
    start = end - length                                                # each code's first bit
    block_bits = torch.zeros(nblocks, dtype=torch.int64, device=dev).index_add_(0, block_of, length)
    words = torch.zeros(-(-total_bits // 32) + 1, dtype=torch.int64, device=dev)
    word, offset = start >> 5, start & 31
    shift = 32 - offset - length                                       # < 0: the code spills into word + 1
    words.index_add_(0, word, torch.where(shift >= 0, code << shift.clamp(min=0), code >> (-shift).clamp(min=0)))
    spill = (-shift).clamp(min=0)
    words.index_add_(0, word + 1, torch.where(shift < 0, (code & ((1 << spill) - 1)) << (32 - spill),
                                              torch.zeros_like(code)))
    words = words[:-1]
    big_endian = torch.stack([(words >> s) & 0xFF for s in (24, 16, 8, 0)], dim=1).to(torch.uint8)
    return huffman.assemble(block, n, lengths, group, block_bits.cpu().numpy(),
                            big_endian.view(-1).cpu().numpy().data)


def _block_spread(s8: torch.Tensor, block: int, nblocks: int) -> torch.Tensor:
    """huffman_kernels.block_spread: mean |value| per block in float64, |-128| counted as -128."""
    a = s8.to(torch.int64).abs()
    a = a - ((a >> 7) << 8)
    n = s8.numel()
    totals = torch.nn.functional.pad(a, (0, nblocks * block - n)).view(nblocks, block).sum(dim=1)
    sizes = torch.full((nblocks,), block, dtype=torch.float64, device=s8.device)
    sizes[-1] = n - (nblocks - 1) * block
    return totals.to(torch.float64) / sizes


def huffman_decode_many(payloads: list[bytes], device: torch.device | str = "cpu") -> list[torch.Tensor]:
    """huffman.decode_many onto `device`: uint8 symbols, every block of every payload decoded side by side."""
    dev = torch.device(device)
    parsed = [huffman._Parsed(p) for p in payloads]
    out = [torch.empty(p.n, dtype=torch.uint8, device=dev) for p in parsed]
    for block in sorted({p.block for p in parsed if p.n}):
        group = [i for i, p in enumerate(parsed) if p.n and p.block == block]
        _decode_same_block(parsed, group, block, out, dev)
    return out


def _decode_same_block(parsed, group: list[int], block: int, out: list[torch.Tensor], dev: torch.device) -> None:
    """Decode payloads of one block size: one stream of all their words, all their blocks at once."""
    words, starts, tables, table_of, first_word, first_table = [], [], [], [], 0, 0
    for i in group:
        w, s, t = huffman._kernel_inputs(parsed[i])                     # validated, native-order words
        words.append(w)
        starts.append(s + 32 * first_word)
        tables.append(t)
        table_of.append(parsed[i].block_table.astype(np.int64) + first_table)
        first_word += w.size
        first_table += t.shape[0]
    words_t = torch.from_numpy(np.concatenate(words).astype(np.int64)).to(dev)
    pos = torch.from_numpy(np.concatenate(starts).astype(np.int64)).to(dev)
    lookup = torch.from_numpy(np.concatenate(tables).astype(np.int64)).to(dev).view(-1)
    base = torch.from_numpy(np.concatenate(table_of)).to(dev) << MAX_CODE_LEN
    symbols = torch.zeros((pos.numel(), block), dtype=torch.uint8, device=dev)
    mask = (1 << MAX_CODE_LEN) - 1
    for j in range(block):                         # step j: symbol j of every block
        k, sh = pos >> 5, pos & 31
        window = (words_t[k] << 32) | words_t[k + 1]                    # 64 bits from the word of pos
        e = lookup[base + ((window >> (64 - MAX_CODE_LEN - sh)) & mask)]    # symbol | length << 8
        symbols[:, j] = e & 0xFF
        pos = pos + (e >> 8)
    rows = 0
    for i in group:
        nb = parsed[i].block_bits.size
        # every block is whole but the last: the symbols are the first n of the blocks' rows
        out[i].copy_(symbols[rows:rows + nb].reshape(-1)[:parsed[i].n])
        rows += nb
