"""The torch path of the codec (on_device.py) gives the CPU path's bits: the same int8 symbols and
scales, the same Huffman payload bytes, the same decoded values, and on any payload the parser
accepts (hostile ones included) the same symbols as the compiled CPU decoder. Run on the CPU build
of torch; a GPU run of the same functions is bench/codec_bench.py --device cuda."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from wantrain.codec import Codec
from wantrain.codec import huffman, on_device, quantize
from wantrain.config import CodecConfig
from wantrain.errors import CodecError

pytestmark = pytest.mark.timeout(300)

finite = st.floats(-2.0 ** 100, 2.0 ** 100, allow_nan=False, allow_infinity=False, allow_subnormal=True, width=32)


def bits(a) -> bytes:
    a = a.numpy() if isinstance(a, torch.Tensor) else a
    return a.dtype.str.encode() + a.tobytes()


@settings(max_examples=200, deadline=None)
@given(hnp.arrays(np.float32, st.integers(0, 3000), elements=finite), st.sampled_from([1, 3, 64, 256]))
def test_quantize_and_dequantize_give_the_cpu_bits(x, block):
    q, s = quantize.quantize_int8(x, block)
    tq, ts = on_device.quantize_int8(torch.from_numpy(x), block)
    assert bits(q) == bits(tq) and bits(s) == bits(ts)
    assert bits(quantize.dequantize_int8(q, s, block)) == bits(on_device.dequantize_int8(tq, ts, block))


def test_non_finite_values_are_refused():
    with pytest.raises(CodecError, match="non-finite"):
        on_device.quantize_int8(torch.tensor([1.0, float("nan")]), 64)


symbols = hnp.arrays(np.int8, st.integers(0, 9000), elements=st.integers(-128, 127) | st.integers(-6, 6))


@settings(max_examples=150, deadline=None)
@given(symbols, st.sampled_from([2, 6, 64, 2048]), st.integers(1, huffman.MAX_TABLES))
def test_huffman_payload_is_byte_identical_and_decodes_back(q, block, tables):
    payload = huffman.encode(q, block, tables)
    assert on_device.huffman_encode(torch.from_numpy(q), block, tables) == payload
    (decoded,) = on_device.huffman_decode_many([payload])
    assert bits(decoded.view(torch.int8)) == bits(q)


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2 ** 32 - 1), st.lists(st.tuples(st.integers(0, 10 ** 6), st.integers(0, 255)), max_size=6))
def test_a_damaged_payload_decodes_as_on_the_cpu_or_is_refused(seed, flips):
    rng = np.random.default_rng(seed)
    q = np.clip(np.rint(rng.standard_normal(5000) * 9), -127, 127).astype(np.int8)
    payload = bytearray(huffman.encode(q, 512, 3))
    for at, value in flips:
        payload[at % len(payload)] = value
    try:
        expected = huffman.decode(bytes(payload))
    except CodecError:
        with pytest.raises(CodecError):
            on_device.huffman_decode_many([bytes(payload)])
        return
    (got,) = on_device.huffman_decode_many([bytes(payload)])
    assert bits(got) == bits(expected)


def test_codec_on_device_matches_the_cpu_codec_for_every_mode():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(300_001) * rng.choice([1e-4, 1e-2, 1.0], 300_001)).astype(np.float32)
    for mode in ("fp32", "int8", "int8-huffman"):
        codec = Codec(CodecConfig(mode=mode, chunk_bytes=1 << 16))
        step = codec.cfg.chunk_elements()
        parts = [x[i:i + step] for i in range(0, x.size, step)]
        cpu = [codec.encode(p) for p in parts]
        dev = [codec.encode_on_device(torch.from_numpy(p)) for p in parts]
        assert [e for e, _ in cpu] == [e for e, _ in dev], mode
        assert all(bits(a) == bits(b) for (_, a), (_, b) in zip(cpu, dev)), mode
        encs = [e for e, _ in cpu]
        decoded = Codec.decode_on_device(encs, "cpu")
        assert all(bits(a) == bits(b) for a, b in zip(Codec.decode_many(encs), decoded)), mode
