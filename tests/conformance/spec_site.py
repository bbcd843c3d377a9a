"""A second implementation of the wantrain site's protocol, written from docs/protocol.md alone.

It imports nothing of wantrain but the generated stubs (tests/test_layout.py checks), so what it
needs to know and the spec does not say would show up here as a failure, not as a shared bug.
Numbers in comments are section numbers of docs/protocol.md.
"""

from __future__ import annotations

import hashlib
import math
import re
import struct
import zlib
from pathlib import Path

import numpy as np

from wantrain.transport.proto.v1 import ps_pb2 as pb

SPEC = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"
PROTOCOL_VERSION = 5
MAX_CODE_LEN = 12


def golden(name: str) -> str:
    """A `hex golden=NAME` block of the spec (section 11), whitespace removed."""
    blocks = {m.group(1): re.sub(r"\s", "", m.group(2))
              for m in re.finditer(r"```hex golden=(\w+)\n(.*?)```", SPEC.read_text(), re.S)}
    return blocks[name]


# ------------------------------------------------------------------ 4: the chunk plan

def chunk_elements(codec: dict, fp32: bool) -> int:
    per_element = 4 if fp32 else 1
    n = codec["chunk_bytes"] // per_element
    return max(codec["quant_block"], n - n % codec["quant_block"])


def plan(tensors: list[tuple[str, int]], elements: int) -> list[tuple[str, int, int]]:
    return [(name, off, min(elements, size - off)) for name, size in tensors for off in range(0, size, elements)]


def crc(scales: bytes, payload: bytes) -> int:
    return zlib.crc32(payload, zlib.crc32(scales))


# ------------------------------------------------------------------ 5: encodings

def quantize(x: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """The reference quantizer: per block absmax / 127 in float32, rint, clip."""
    nb = -(-x.size // block)
    padded = np.zeros(nb * block, np.float32)
    padded[:x.size] = x
    absmax = np.abs(padded.reshape(nb, block)).max(axis=1)
    scales = np.where(absmax >= np.float32(1e-30), absmax / np.float32(127), np.float32(0)).astype(np.float32)
    q = np.rint(padded.reshape(nb, block) / np.where(scales > 0, scales, np.float32(1))[:, None])
    return np.clip(q, -127, 127).astype(np.int8).reshape(-1)[:x.size], scales


def canonical_codes(lengths: np.ndarray) -> np.ndarray:
    codes = np.zeros(256, np.int64)
    code, prev_len = 0, 0
    for length, symbol in sorted((int(ln), s) for s, ln in enumerate(lengths) if ln > 0):
        code <<= length - prev_len
        codes[symbol], code, prev_len = code, code + 1, length
    return codes


def huffman_encode(symbols: np.ndarray, lengths: np.ndarray, block: int) -> bytes:
    """One code table (T = 1) with the given code lengths; blocks of `block` symbols."""
    sym = symbols.view(np.uint8)
    n = sym.size
    nblocks = -(-n // block)
    lens = lengths.astype(np.int64)[sym]                     # (n,) bits of each symbol
    codes = canonical_codes(lengths)[sym]
    ends = np.cumsum(lens)
    starts = ends - lens
    bits = np.zeros(int(ends[-1]) if n else 0, np.uint8)
    for j in range(MAX_CODE_LEN):                             # bit j of every code, most significant first
        has = lens > j
        bits[starts[has] + j] = (codes[has] >> (lens[has] - 1 - j)) & 1
    block_bits = np.add.reduceat(lens, np.arange(0, n, block)) if n else np.zeros(0, np.int64)
    stream = np.packbits(np.concatenate([bits, np.zeros(-bits.size % 32, np.uint8)]))
    nibbles = (lengths[0::2] | (lengths[1::2] << 4)).astype(np.uint8)
    assert nblocks == block_bits.size
    return (struct.pack("<BBHI", 1, 1, block, n) + nibbles.tobytes() + block_bits.astype("<u2").tobytes()
            + stream.tobytes())


def huffman_decode(payload: bytes) -> np.ndarray:
    """The uint8 symbols of a payload (any number of tables), blocks decoded side by side."""
    version, tables, block, n = struct.unpack_from("<BBHI", payload, 0)
    assert version == 1 and 1 <= tables <= 4 and block > 0 and block % 2 == 0, (version, tables, block)
    nblocks = -(-n // block)
    pos = 8
    lookups = []
    for _ in range(tables):
        raw = np.frombuffer(payload, np.uint8, 128, pos)
        pos += 128
        lengths = np.empty(256, np.uint8)
        lengths[0::2], lengths[1::2] = raw & 15, raw >> 4
        assert sum(2.0 ** -int(ln) for ln in lengths if ln) <= 1.0, "Kraft"
        lookups.append(_lookup(lengths))
    table_of = np.zeros(nblocks, np.int64)
    if tables > 1:
        table_of = np.frombuffer(payload, np.uint8, nblocks, pos).astype(np.int64)
        pos += nblocks
    block_bits = np.frombuffer(payload, "<u2", nblocks, pos).astype(np.int64)
    pos += 2 * nblocks
    assert (len(payload) - pos) % 4 == 0
    stream = np.concatenate([np.unpackbits(np.frombuffer(payload, np.uint8, offset=pos)), np.zeros(32, np.uint8)])
    windows = np.zeros(stream.size - MAX_CODE_LEN, np.int64)     # the 12 bits from every position
    for j in range(MAX_CODE_LEN):
        windows = (windows << 1) | stream[j: j + windows.size]
    sym_of = np.stack([s for s, _ in lookups])
    len_of = np.stack([ln for _, ln in lookups])
    at = np.concatenate([[0], np.cumsum(block_bits)[:-1]])
    out = np.zeros((nblocks, block), np.uint8)
    for k in range(block):
        w = windows[np.minimum(at, windows.size - 1)]
        out[:, k] = sym_of[table_of, w]
        at = at + len_of[table_of, w]
    return out.reshape(-1)[:n]


def _lookup(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each 12-bit window: the symbol whose code starts it, and that code's length."""
    sym, ln = np.zeros(1 << MAX_CODE_LEN, np.uint8), np.ones(1 << MAX_CODE_LEN, np.int64)
    codes = canonical_codes(lengths)
    for s in np.flatnonzero(lengths):
        lo = int(codes[s]) << (MAX_CODE_LEN - int(lengths[s]))
        hi = (int(codes[s]) + 1) << (MAX_CODE_LEN - int(lengths[s]))
        sym[lo:hi], ln[lo:hi] = s, lengths[s]
    return sym, ln


def digits(packed: np.ndarray, base: int, per: int, n: int) -> np.ndarray:
    """The first n symbols of bytes that hold `per` symbols of `base` each, the first lowest (5)."""
    out = np.empty((packed.size, per), np.int64)
    rest = packed.astype(np.int64)
    assert np.all(rest < base ** per), "a byte that is no packing"
    for j in range(per):
        out[:, j], rest = rest % base, rest // base
    return out.reshape(-1)[:n]


def bits_msb_first(data: bytes) -> list[int]:
    return [(byte >> (7 - j)) & 1 for byte in data for j in range(8)]


def topk_q(length: int, block: int, payload: bytes) -> np.ndarray:
    """The q of an ENCODING_TOPK payload (5)."""
    version, b, r, zero, k, k_last, stream_bytes = struct.unpack_from("<BBBBIII", payload)
    assert version == 1 and b in (1, 2) and r <= 24 and zero == 0
    blocks = -(-length // block)
    m = k * (blocks - 1) + k_last
    stream = bits_msb_first(payload[16:16 + stream_bytes])
    q, at, p = np.zeros(length, np.int64), 0, -1
    positions = []
    for _ in range(m):
        unary = 0
        while stream[at]:
            unary, at = unary + 1, at + 1
        at += 1
        low = int("".join(map(str, stream[at:at + r])) or "0", 2)
        at += r
        p += 1 + (unary << r) + low
        positions.append(p)
    assert -(-at // 8) == stream_bytes and p < length
    values = payload[16 + stream_bytes:]
    if b == 1:
        assert len(values) == -(-m // 8)
        q[positions] = [1 if v else -1 for v in bits_msb_first(values)[:m]]
    else:
        assert len(values) == -(-m // 4)
        q[positions] = np.array([-3, -2, 2, 3])[digits(np.frombuffer(values, np.uint8), 4, 4, m)]
    return q


def decode_chunk(c) -> np.ndarray:
    """A Chunk's float32 values (5)."""
    assert crc(c.scales, c.payload) == c.crc32, "CRC"
    if c.encoding == pb.ENCODING_FP32:
        return np.frombuffer(c.payload, "<f4").astype(np.float32)
    if c.encoding == pb.ENCODING_INT8:
        q = np.frombuffer(c.payload, np.int8)
    elif c.encoding == pb.ENCODING_INT8_HUFFMAN:
        q = huffman_decode(c.payload).view(np.int8)
    elif c.encoding == pb.ENCODING_INT4_HUFFMAN:
        q = digits(huffman_decode(c.payload), 15, 2, c.length) - 7
    elif c.encoding == pb.ENCODING_TERNARY_HUFFMAN:
        q = digits(huffman_decode(c.payload), 3, 5, c.length) - 1
    elif c.encoding == pb.ENCODING_SIGN:
        assert len(c.payload) == -(-c.length // 8)
        q = np.array([1 if v else -1 for v in bits_msb_first(c.payload)[:c.length]])
    else:
        assert c.encoding == pb.ENCODING_TOPK, c.encoding
        q = topk_q(c.length, c.quant_block, c.payload)
    assert q.size == c.length
    scales = np.frombuffer(c.scales, "<f4").astype(np.float32)
    return q.astype(np.float32) * np.repeat(scales, c.quant_block)[:c.length]   # one float32 multiply each


def encode_chunk(kind: int, round_: int, index: int, count: int, spec: tuple[str, int, int], values: np.ndarray,
                 codec: dict) -> pb.Chunk:
    """A delta chunk in the run's codec.mode; int8-huffman with every code 8 bits long (a valid code)."""
    tensor, offset, length = spec
    if codec["mode"] == "fp32":
        scales, payload, block, encoding = b"", values.astype("<f4").tobytes(), 0, pb.ENCODING_FP32
    else:
        q, s = quantize(values, codec["quant_block"])
        scales, block = s.astype("<f4").tobytes(), codec["quant_block"]
        if codec["mode"] == "int8":
            payload, encoding = q.tobytes(), pb.ENCODING_INT8
        else:
            payload = huffman_encode(q, np.full(256, 8, np.uint8), codec["huffman_block"])
            encoding = pb.ENCODING_INT8_HUFFMAN
    return pb.Chunk(kind=kind, round=round_, index=index, count=count, tensor=tensor, offset=offset, length=length,
                    encoding=encoding, quant_block=block, scales=scales, payload=payload, crc32=crc(scales, payload))


def manifest(round_: int, chunks: list, tokens: int, steps: int) -> pb.DeltaManifest:
    """A delta's manifest (4a): every chunk's energy from its decoded values, importance its share
    (every role weighs the same here, so the role says nothing the PS needs; ROLE_OTHER)."""
    energies = [float(np.sum(decode_chunk(c).astype(np.float64) ** 2)) for c in chunks]
    total = sum(energies)
    return pb.DeltaManifest(round=round_, tokens=tokens, steps=steps, chunks=[
        pb.ManifestEntry(index=c.index, tensor=c.tensor, offset=c.offset, length=c.length, role=pb.ROLE_OTHER,
                         energy=e, importance=e / total if total > 0 else 1 / len(chunks),
                         nbytes=len(c.scales) + len(c.payload), crc32=c.crc32)
        for c, e in zip(chunks, energies)])


def parity(members: list[bytes]) -> bytes:
    """A parity group's payload (4a): the members padded with zeros to the longest, XORed."""
    out = bytearray(max(len(m) for m in members))
    for m in members:
        for i, b in enumerate(m):
            out[i] ^= b
    return bytes(out)


# ------------------------------------------------------------------ 6: the replica

class Replica:
    """The global parameters as flat float32 arrays, in the tensor order of the model download."""

    def __init__(self) -> None:
        self.tensors: dict[str, np.ndarray] = {}
        self.parts: dict[str, list[tuple[int, np.ndarray]]] = {}

    def add_model_chunk(self, c) -> None:
        self.parts.setdefault(c.tensor, []).append((c.offset, decode_chunk(c)))

    def finish_download(self) -> None:
        for name, parts in self.parts.items():
            size = sum(v.size for _, v in parts)
            flat = np.empty(size, np.float32)
            for off, v in parts:
                flat[off: off + v.size] = v
            self.tensors[name] = flat
        self.parts = {}

    def sizes(self) -> list[tuple[str, int]]:
        return [(k, v.size) for k, v in self.tensors.items()]

    def apply(self, chunks: list) -> None:
        """p = p + u, one float32 add per element."""
        for c in chunks:
            p = self.tensors[c.tensor][c.offset: c.offset + c.length]
            np.add(p, decode_chunk(c), out=p)

    def hash(self) -> str:
        return model_hash(self.tensors)


def model_hash(tensors: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for name, values in tensors.items():
        h.update(name.encode("utf-8"))
        h.update(np.asarray(values, "<f4").tobytes())
    return h.hexdigest()[:16]


def norm(arrays) -> float:
    return math.sqrt(sum(float(np.dot(a.astype(np.float64), a.astype(np.float64))) for a in arrays))
