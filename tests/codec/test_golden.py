"""Golden bytes of the codec's wire format: a fixed input must encode to exactly these bytes, and
these bytes must decode to exactly these values, release after release. A change to either is a
wire-format change (protocol version, docs/protocol.md), never an accident.

Regenerate (after such a change, on purpose): WANTRAIN_REGENERATE_GOLDEN=1 pytest tests/codec/test_golden.py
"""

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

from wantrain.transport import wire
from wantrain.codec import ChunkSpec, Codec
from wantrain.config import CODEC_MODES, CodecConfig
from wantrain.transport.messages import DELTA, TensorChunk

GOLDEN = Path(__file__).parent / "golden"
N = 6000          # three Huffman blocks of 2048, the last one short; 24 quantization blocks


def fixed_delta() -> np.ndarray:
    """A heavy-tailed float32 vector from integer arithmetic only (identical on every machine)."""
    i = np.arange(N, dtype=np.int64)
    u = ((i * 7919 + 13) % 2003 - 1001).astype(np.float32) / np.float32(1001)     # in [-1, 1]
    x = u * u * u * np.float32(3e-3)                                               # cubed: heavy tails
    x[(i % 997) == 5] *= np.float32(40)                                            # a few outliers
    return x


def chunk_bytes(mode: str) -> bytes:
    enc, _ = Codec(CodecConfig(mode=mode)).encode(fixed_delta())
    return wire.site_message(TensorChunk(DELTA, 3, 0, 1, ChunkSpec("h.0.mlp.w", 0, N), enc)).SerializeToString()


@pytest.mark.parametrize("mode", CODEC_MODES)
def test_a_fixed_delta_encodes_to_the_golden_bytes_and_back(mode):
    path, sums = GOLDEN / f"delta_{mode}.bin", GOLDEN / "decoded_sha256.json"
    got = chunk_bytes(mode)
    if os.environ.get("WANTRAIN_REGENERATE_GOLDEN"):
        path.write_bytes(got)
        table = json.loads(sums.read_text()) if sums.exists() else {}
        values = Codec.decode_many([wire.parse_site_message(got).data])[0]
        table[mode] = hashlib.sha256(values.astype("<f4").tobytes()).hexdigest()
        sums.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    golden = path.read_bytes()
    assert got == golden, f"{mode}: the encoder's bytes changed ({len(got)} bytes now, {len(golden)} golden)"
    msg = wire.parse_site_message(golden)
    values = Codec.decode_many([msg.data])[0]
    assert hashlib.sha256(values.astype("<f4").tobytes()).hexdigest() == json.loads(sums.read_text())[mode]
    if mode == "fp32":
        assert np.array_equal(values, fixed_delta())
    elif mode.startswith("int8"):   # within half a quantization step of the input, and never further
        assert np.max(np.abs(values - fixed_delta())) <= np.max(np.abs(fixed_delta())) / 127
    else:                           # below 8 bits: what the sender said the receiver decodes
        assert np.array_equal(values, Codec(CodecConfig(mode=mode)).encode(fixed_delta())[1])
