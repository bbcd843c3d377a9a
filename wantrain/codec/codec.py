"""The codec: fp32, INT8, INT8 + Huffman, or an encoding below 8 bits (formats.py), on flat float32 arrays.

`Codec.encode` turns one chunk of numbers into an `Encoded` (what travels) and also returns
exactly what the receiver will decode, so the sender can keep the error-feedback residual
and (on the PS) apply the very same values to its own replica.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, fields

import numpy as np

from ..config import CODEC_MODES, CodecConfig
from ..errors import CodecError
from . import huffman
from .chunks import ChunkSpec, plan_chunks
from .feedback import ErrorFeedback
from .formats import LOWBIT_ENCODINGS, compress_lowbit, decode_lowbit, payload_ok
from .quantize import QMAX, dequantize_int8, num_blocks, quantize_int8

__all__ = ["Encoded", "Extracted", "Codec", "EncodeStats", "encode_arrays"]

ENCODINGS = CODEC_MODES    # the one list of encodings (config.py), which wire.py maps to the proto enum


@dataclass(frozen=True)
class Encoded:
    """One chunk's numbers as they travel."""

    encoding: str        # one of ENCODINGS
    length: int          # elements
    quant_block: int     # elements per scale (int8 and lower encodings), 0 for fp32
    scales: bytes        # float32 LE, one per quantization block
    payload: bytes

    @property
    def wire_bytes(self) -> int:
        return len(self.scales) + len(self.payload)

    def scale_array(self) -> np.ndarray:
        """The float32 scales, checked finite (CodecError otherwise)."""
        scales = np.frombuffer(self.scales, dtype="<f4").astype(np.float32)
        if not np.all(np.isfinite(scales)):
            raise CodecError("chunk carries non-finite scales")
        return scales

    def check(self) -> None:
        """Sizes must agree with the declared length; raises CodecError otherwise."""
        if self.encoding not in ENCODINGS:
            raise CodecError(f"unknown encoding {self.encoding!r}")
        if self.encoding == "fp32":
            if len(self.payload) != 4 * self.length or self.scales:
                raise CodecError(f"fp32 chunk of {self.length} elements has {len(self.payload)} payload bytes")
            return
        if self.quant_block <= 0:
            raise CodecError(f"{self.encoding} chunk has quantization block {self.quant_block}")
        if len(self.scales) != 4 * num_blocks(self.length, self.quant_block):
            raise CodecError(f"{self.encoding} chunk of {self.length} elements has {len(self.scales)} bytes of scales")
        if self.encoding in LOWBIT_ENCODINGS and not payload_ok(self.encoding, self.length, self.payload):
            raise CodecError(f"{self.encoding} chunk of {self.length} elements has a payload of "
                             f"{len(self.payload)} bytes that cannot hold them")
        if self.encoding == "int8" and len(self.payload) != self.length:
            raise CodecError(f"int8 chunk of {self.length} elements has {len(self.payload)} payload bytes")
        if self.encoding == "int8-huffman" and huffman.payload_symbols(self.payload) != self.length:
            raise CodecError(f"Huffman chunk of {self.length} elements announces "
                             f"{huffman.payload_symbols(self.payload)} symbols")


@dataclass
class EncodeStats:
    raw_bytes: int = 0
    wire_bytes: int = 0
    symbols: int = 0
    huffman_bits: int = 0
    seconds: float = 0.0
    chunks: int = 0

    @property
    def ratio(self) -> float:
        return self.raw_bytes / self.wire_bytes if self.wire_bytes else 0.0

    @staticmethod
    def total(parts: Iterable[EncodeStats]) -> EncodeStats:
        """The sum of several chunks' stats (in the order given)."""
        out = EncodeStats()
        for p in parts:
            for f in fields(EncodeStats):
                setattr(out, f.name, getattr(out, f.name) + getattr(p, f.name))
        return out

    def count(self, enc: Encoded) -> None:
        """Add one encoded chunk (the CPU and the device path both count through here)."""
        self.raw_bytes += 4 * enc.length
        self.wire_bytes += enc.wire_bytes
        self.chunks += 1
        if enc.encoding != "fp32":
            self.symbols += enc.length
        if enc.encoding == "int8-huffman":
            self.huffman_bits += 8 * len(enc.payload)

    @property
    def huffman_bits_per_symbol(self) -> float:
        return self.huffman_bits / self.symbols if self.symbols and self.huffman_bits else 0.0


class Codec:
    """Encodes and decodes chunks according to a CodecConfig."""

    def __init__(self, cfg: CodecConfig) -> None:
        self.cfg = cfg

    def encode(self, x: np.ndarray, stats: EncodeStats | None = None) -> tuple[Encoded, np.ndarray]:
        """(what travels, what the receiver will decode) for a flat float32 array."""
        enc, sent = self.compress(x, stats)
        return enc, sent.values()

    def compress(self, x: np.ndarray, stats: EncodeStats | None = None) -> tuple[Encoded, Extracted]:
        """(what travels, what the receiver will extract from it): encode() without dequantizing,
        for a sender that applies the int8 symbols itself (the PS's round, aggregate.py)."""
        x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
        mode = self.cfg.mode
        if mode == "fp32":
            enc = Encoded("fp32", x.size, 0, b"", x.astype("<f4").tobytes())
            sent = Extracted(x.copy(), None, 0)
        elif mode in LOWBIT_ENCODINGS:
            c = self.cfg
            payload, q, scales = compress_lowbit(mode, x, c)
            enc = Encoded(mode, x.size, c.quant_block, scales.astype("<f4").tobytes(), payload)
            sent = Extracted(q, scales, c.quant_block)
        else:
            q, scales = quantize_int8(x, self.cfg.quant_block)
            payload = (q.tobytes() if mode == "int8" else
                       huffman.encode(q, self.cfg.huffman_block, self.cfg.huffman_tables))
            enc = Encoded(mode, x.size, self.cfg.quant_block, scales.astype("<f4").tobytes(), payload)
            sent = Extracted(q, scales, self.cfg.quant_block)
        if stats is not None:
            stats.count(enc)
        return enc, sent

    def encode_on_device(self, x, stats: EncodeStats | None = None):
        """encode() of a flat float32 torch tensor where it lives (on_device.py): the same Encoded,
        byte for byte, and the values the receiver decodes as a tensor on the same device."""
        from . import on_device
        x = x.detach().reshape(-1).to(dtype=on_device.torch.float32)
        mode = self.cfg.mode
        if mode == "fp32":
            enc = Encoded("fp32", x.numel(), 0, b"", x.cpu().numpy().astype("<f4").tobytes())
            sent = x.clone()
        elif mode in LOWBIT_ENCODINGS:
            from . import on_device_lowbit
            c = self.cfg
            scale_bytes, lowbit_payload, sent = on_device_lowbit.compress_lowbit(mode, x, c)
            enc = Encoded(mode, x.numel(), c.quant_block, scale_bytes, lowbit_payload)
        else:
            q, scales = on_device.quantize_int8(x, self.cfg.quant_block)
            payload = (q.cpu().numpy().tobytes() if mode == "int8" else
                       on_device.huffman_encode(q, self.cfg.huffman_block, self.cfg.huffman_tables))
            enc = Encoded(mode, x.numel(), self.cfg.quant_block, scales.cpu().numpy().astype("<f4").tobytes(), payload)
            sent = on_device.dequantize_int8(q, scales, self.cfg.quant_block)
        if stats is not None:
            stats.count(enc)
        return enc, sent

    @staticmethod
    def decode_on_device(encs: list[Encoded], device) -> list:
        """decode_many() onto a torch device: float32 tensors, the same bits as on the CPU."""
        from . import on_device
        torch = on_device.torch
        for e in encs:
            e.check()
        huff = [i for i, e in enumerate(encs) if e.encoding == "int8-huffman"]
        symbols = dict(zip(huff, on_device.huffman_decode_many([encs[i].payload for i in huff], device)))
        out = []
        for i, e in enumerate(encs):
            if e.encoding == "fp32":
                out.append(torch.frombuffer(bytearray(e.payload), dtype=torch.float32).to(device))
                continue
            if e.encoding in LOWBIT_ENCODINGS:
                out.append(torch.from_numpy(Codec.extract_many([e])[0].values()).to(device))
                continue
            q = symbols[i].view(torch.int8) if i in symbols else torch.frombuffer(bytearray(e.payload), dtype=torch.int8).to(device)
            out.append(on_device.dequantize_int8(q, torch.from_numpy(e.scale_array()).to(device), e.quant_block))
        return out

    @staticmethod
    def extract_many(encs: list[Encoded]) -> list[Extracted]:
        """Undo the lossless stages only (Huffman): int8 symbols and scales, or fp32 values.

        Any mix of encodings; Huffman chunks are decoded together. An Extracted chunk keeps a
        quarter of the memory of its float32 values until `values()` dequantizes it."""
        for e in encs:
            e.check()
        out: list[Extracted | None] = [None] * len(encs)
        huff = [i for i, e in enumerate(encs) if e.encoding == "int8-huffman"]
        symbols = huffman.decode_many([encs[i].payload for i in huff])
        for i, sym in zip(huff, symbols):
            if sym.size != encs[i].length:
                raise CodecError(f"Huffman chunk decodes to {sym.size} symbols, header says {encs[i].length}")
            out[i] = Extracted.int8(encs[i], sym.view(np.int8))
        for i, e in enumerate(encs):
            if e.encoding == "fp32":
                # A read-only view of the payload (no copy) where float32 is little-endian already.
                out[i] = Extracted(np.frombuffer(e.payload, dtype="<f4").astype(np.float32, copy=False), None, 0)
            elif e.encoding == "int8":
                out[i] = Extracted.int8(e, np.frombuffer(e.payload, dtype=np.int8))
            elif e.encoding in LOWBIT_ENCODINGS:
                out[i] = Extracted.int8(e, decode_lowbit(e.encoding, e.length, e.quant_block, e.payload))
        return out  # type: ignore[return-value]

    @staticmethod
    def decode_many(encs: list[Encoded]) -> list[np.ndarray]:
        """Decode chunks (any mix of encodings) to float32 values."""
        return [x.values() for x in Codec.extract_many(encs)]


@dataclass(frozen=True)
class Extracted:
    """A received chunk with its lossless stages undone: int8 symbols + scales (INT8 and every
    encoding below 8 bits: small symbols, a top-k's zero where it sent nothing), or fp32 values."""

    data: np.ndarray               # int8 symbols, or float32 values when scales is None
    scales: np.ndarray | None      # float32, one per quantization block
    block: int

    @staticmethod
    def int8(e: Encoded, q: np.ndarray) -> Extracted:
        return Extracted(q, e.scale_array(), e.quant_block)

    def finite(self) -> bool:
        """Would values() be all finite? Without dequantizing: |q| <= 127, so q * scale is finite
        exactly when 127 * scale is (the same float32 multiply)."""
        if self.scales is None:
            return bool(np.all(np.isfinite(self.data)))
        return bool(np.all(np.isfinite(np.float32(QMAX) * self.scales)))

    def values(self) -> np.ndarray:
        """float32 values, exactly what the sender's `Codec.encode` said the receiver decodes."""
        if self.scales is None:
            return self.data
        return dequantize_int8(self.data, self.scales, self.block)



def encode_arrays(arrays: dict[str, np.ndarray], codec: Codec, feedback: ErrorFeedback | None,
                  stats: EncodeStats | None = None) -> tuple[list[tuple[ChunkSpec, Encoded]], dict[str, np.ndarray]]:
    """Encode named flat float32 arrays chunk by chunk.

    With error feedback, each tensor's residual is added first and the new residual kept.
    Returns the chunks and, per tensor, exactly the values the receiver will reconstruct.
    """
    t0 = time.perf_counter()
    sizes = {k: v.size for k, v in arrays.items()}
    plan = plan_chunks(sizes, codec.cfg.chunk_elements())
    corrected = {k: feedback.compensate(k, v) if feedback else v for k, v in arrays.items()}
    decoded = {k: np.empty(v.size, np.float32) for k, v in arrays.items()}
    chunks = []
    for spec in plan:
        part = corrected[spec.tensor][spec.offset: spec.offset + spec.length]
        enc, dec = codec.encode(part, stats)
        decoded[spec.tensor][spec.offset: spec.offset + spec.length] = dec
        chunks.append((spec, enc))
    if feedback is not None:
        for k in arrays:
            feedback.record(k, corrected[k], decoded[k])
    if stats is not None:
        stats.seconds += time.perf_counter() - t0
    return chunks, decoded


def load_kernels(modes: Iterable[str] = ("int8-huffman",)) -> None:
    """Compile the codec's loops for `modes` (those that have compiled loops: everything below
    fp32), or load them from numba's on-disk cache, in this process now rather than at its first
    delta. The first process after an edit (or in a fresh clone, or a fresh install on a host)
    compiles them, about 6 s of CPU for int8-huffman, and writes the cache that every later process
    reads."""
    # The argument types of real use (numba compiles or loads one signature at its first call): a
    # delta of several blocks with the default block sizes, and its chunks decoded from immutable
    # bytes, as they arrive off the wire.
    x = np.random.default_rng(0).standard_normal(3 * 4096, dtype=np.float32)
    for mode in dict.fromkeys(modes):
        if mode != "fp32":
            enc, _ = Codec(CodecConfig(mode=mode)).encode(x)
            Codec.decode_many([Encoded(enc.encoding, enc.length, enc.quant_block, bytes(enc.scales),
                                       bytes(enc.payload))])
