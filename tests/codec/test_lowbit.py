"""The encodings below 8 bits (codec/formats.py, lowbit.py, packing.py): exact for what they keep,
error feedback that conserves mass, damaged payloads refused or decoded as the sender's, and the
torch path's bytes those of the CPU path."""

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from wantrain.codec import Codec, Encoded, ErrorFeedback, encode_arrays
from wantrain.codec.formats import LOWBIT_ENCODINGS
from wantrain.codec.lowbit import quantize_levels, quantize_sign, quantize_ternary, select_topk, topk_count
from wantrain.codec.packing import pack_base, rice_decode, rice_encode, rice_parameter, unpack_base
from wantrain.config import CodecConfig
from wantrain.errors import CodecError

# (mode, variant): top-k's value bits; int4's clip (0: absmax); ternary's threshold (0: 0.7, else the variant)
MODES = [("int4-huffman", 0), ("int4-huffman", 4), ("ternary-huffman", 0), ("ternary-huffman", 1), ("sign", 0),
         ("topk", 1), ("topk", 2)]
assert {m for m, _ in MODES} == set(LOWBIT_ENCODINGS)
finite = st.floats(-1e3, 1e3, width=32, allow_subnormal=False)


def codec(mode: str, variant: int = 0, block: int = 64, density: float = 0.1) -> Codec:
    return Codec(CodecConfig(mode=mode, quant_block=block, topk_density=density,
                             topk_value_bits=variant if mode == "topk" else 2,
                             int4_clip=variant if mode == "int4-huffman" else 0.0,
                             ternary_threshold=variant if mode == "ternary-huffman" and variant else 0.7))


@settings(max_examples=60, deadline=None)
@given(hnp.arrays(np.float32, st.integers(1, 2000), elements=finite), st.sampled_from([1, 3, 64, 256]),
       st.sampled_from(MODES), st.sampled_from([0.01, 0.1, 0.5, 1.0]))
@example(np.zeros(130, np.float32), 64, ("topk", 2), 0.1)             # blocks of zeros
@example(np.ones(5, np.float32), 64, ("ternary-huffman", 0), 0.1)     # one short block, every |x| alike
def test_the_receiver_decodes_exactly_what_the_sender_predicted(x, block, mode_bits, density):
    mode, variant = mode_bits
    enc, sent = codec(mode, variant, block, density).encode(x)
    enc.check()
    assert np.array_equal(Codec.decode_many([enc])[0], sent)
    assert sent.dtype == np.float32 and sent.shape == x.shape and np.all(np.isfinite(sent))


def test_each_quantizer_keeps_what_it_says():
    rng = np.random.default_rng(1)
    x = rng.standard_normal(1000).astype(np.float32)
    q, s = quantize_levels(x, 100, 7)
    assert q.min() >= -7 and q.max() <= 7 and np.allclose(s, np.abs(x.reshape(10, 100)).max(axis=1) / 7)
    assert np.all(np.abs(q.astype(np.float32) * np.repeat(s, 100) - x) <= np.repeat(s, 100) / 2 * (1 + 1e-6))
    q, s = quantize_levels(x, 100, 7, clip=1.5)                 # a top of 1.5 x the mean |x|: clipped
    top = np.minimum(np.abs(x.reshape(10, 100)).max(axis=1), 1.5 * np.abs(x.reshape(10, 100)).mean(axis=1))
    assert np.allclose(s, top / 7, rtol=1e-6) and np.abs(q).max() == 7
    q, s = quantize_ternary(x, 100)
    mag = np.abs(x.reshape(10, 100))
    kept = mag > 0.7 * mag.mean(axis=1, keepdims=True)
    assert np.array_equal(q.reshape(10, 100) != 0, kept)
    assert np.allclose(s, (mag * kept).sum(axis=1) / kept.sum(axis=1), rtol=1e-6)
    q, s = quantize_ternary(x, 100, 1.2)                        # a higher threshold keeps fewer
    kept = mag > np.float32(1.2) * mag.mean(axis=1, keepdims=True)
    assert np.array_equal(q.reshape(10, 100) != 0, kept) and 0 < kept.mean() < 0.5
    assert np.allclose(s, (mag * kept).sum(axis=1) / kept.sum(axis=1), rtol=1e-6)
    q, s = quantize_sign(x, 100)
    assert set(np.unique(q)) == {-1, 1} and np.array_equal(q < 0, x < 0)
    assert np.allclose(s, mag.mean(axis=1), rtol=1e-6)


def test_top_k_keeps_the_largest_of_each_block_and_its_own_share_of_a_short_one():
    rng = np.random.default_rng(2)
    x = rng.standard_normal(1050).astype(np.float32)            # 10 blocks of 100 and one of 50
    positions, values = select_topk(x, 100, 0.05)
    assert topk_count(100, 0.05) == 5 and topk_count(50, 0.05) == 3
    assert len(positions) == 10 * 5 + 3 and np.all(np.diff(positions.astype(np.int64)) > 0)
    assert np.array_equal(values, x[positions])
    for b in range(11):
        block = np.abs(x[b * 100:(b + 1) * 100])
        mine = positions[(positions >= b * 100) & (positions < (b + 1) * 100)] - b * 100
        assert np.all(block[mine].min() >= np.delete(block, mine)), b


@pytest.mark.parametrize("mode,variant", MODES)
def test_error_feedback_conserves_mass_over_rounds(mode, variant):
    """Over rounds, what was sent plus what is still owed is what there was to send."""
    rng = np.random.default_rng(3)
    c, feedback = codec(mode, variant, block=256, density=0.05), ErrorFeedback()
    true_sum = np.zeros(3000, np.float64)
    sent_sum = np.zeros(3000, np.float64)
    for _ in range(8):
        x = rng.standard_normal(3000).astype(np.float32)
        _, decoded = encode_arrays({"w": x}, c, feedback)
        true_sum += x
        sent_sum += decoded["w"]
    owed = feedback.residuals["w"].astype(np.float64)
    assert np.allclose(sent_sum + owed, true_sum, atol=1e-4)
    assert np.linalg.norm(owed) < np.linalg.norm(true_sum)   # and it is sent, not piled up without end


@pytest.mark.parametrize("mode,variant", MODES)
@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), cut=st.integers(0, 64), flips=st.lists(st.integers(0, 10 ** 6), max_size=4))
def test_a_damaged_payload_is_refused_or_decodes_to_finite_values(mode, variant, seed, cut, flips):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(700).astype(np.float32)
    enc, _ = codec(mode, variant).encode(x)
    raw = bytearray(enc.payload)
    for f in flips:
        if raw:
            raw[f % len(raw)] ^= 1 << (f % 8)
    damaged = Encoded(enc.encoding, enc.length, enc.quant_block, enc.scales, bytes(raw[:len(raw) - cut]))
    try:
        values = Codec.decode_many([damaged])[0]
    except CodecError:
        return
    assert values.shape == (700,) and np.all(np.isfinite(values))


@settings(max_examples=80, deadline=None)
@given(hnp.arrays(np.float32, st.integers(1, 3000), elements=finite), st.sampled_from([1, 5, 64, 256]),
       st.sampled_from(MODES), st.sampled_from([0.02, 0.1, 1.0]), st.booleans())
@example(np.zeros(300, np.float32), 64, ("topk", 2), 0.1, False)
@example(np.full(130, -2.5, np.float32), 64, ("ternary-huffman", 0), 0.1, False)
def test_the_torch_path_gives_the_cpu_bytes_and_values(x, block, mode_bits, density, coarse):
    """Ties (coarse values), zeros, short blocks: the device path's bytes and values are the CPU's."""
    torch = pytest.importorskip("torch")
    if coarse:
        x = np.round(x / 100).astype(np.float32)           # many equal magnitudes: top-k's ties
    mode, variant = mode_bits
    c = codec(mode, variant, block, density)
    enc, sent = c.encode(x)
    enc_t, sent_t = c.encode_on_device(torch.from_numpy(x.copy()))
    assert enc_t == enc and np.array_equal(sent_t.numpy(), sent)
    assert np.array_equal(Codec.decode_on_device([enc], torch.device("cpu"))[0].numpy(), sent)


@settings(max_examples=100, deadline=None)
@given(st.integers(2, 256), st.integers(0, 3000), st.integers(0, 2 ** 32 - 1))
def test_symbols_packed_into_bytes_unpack_to_themselves(base, n, seed):
    symbols = np.random.default_rng(seed).integers(0, base, n).astype(np.uint8)
    assert np.array_equal(unpack_base(pack_base(symbols, base), base, n), symbols)


@settings(max_examples=100, deadline=None)
@given(hnp.arrays(np.int64, st.integers(0, 500), elements=st.integers(0, 10 ** 6)))
def test_rice_codes_decode_to_their_values(values):
    r = rice_parameter(values)
    assert np.array_equal(rice_decode(rice_encode(values, r), values.size, r, 10 ** 6), values)


def test_rice_codes_geometric_gaps_near_their_entropy():
    gaps = np.random.default_rng(5).geometric(1 / 64, 20000).astype(np.int64) - 1
    r = rice_parameter(gaps)
    bits = 8 * len(rice_encode(gaps, r)) / gaps.size
    p = 1 / 64
    entropy = -(p * np.log2(p) + (1 - p) * np.log2(1 - p)) / p          # bits a gap
    assert entropy <= bits < 1.02 * entropy                        # Rice's power-of-two step: within 2 %


def test_low_bit_encodings_cost_what_their_format_says():
    """Bits per parameter of each, every byte of the chunk counted (scales and headers too)."""
    x = np.random.default_rng(6).standard_normal(1 << 16).astype(np.float32)
    cost = {}
    for mode, variant in MODES:
        enc, _ = codec(mode, variant, block=4096, density=1 / 64).encode(x)
        cost[mode, variant] = 8 * enc.wire_bytes / x.size
    assert 2.9 < cost["int4-huffman", 0] < 4.1                 # 15 levels, under their 3.9 bits of entropy
    assert cost["int4-huffman", 0] < cost["int4-huffman", 4]   # clipped: the levels used spread wider
    assert 1.5 < cost["ternary-huffman", 0] < 1.7
    assert 1.0 < cost["sign", 0] < 1.01
    assert cost["topk", 1] < cost["topk", 2] < 0.17            # 1/64 kept: positions ~0.116 bits


@pytest.mark.parametrize("shape", ["normal", "laplace", "uniform"])
@pytest.mark.parametrize("mode", ["int4-huffman", "ternary-huffman"])
def test_huffman_on_packed_symbols_spends_within_005_bit_of_their_entropy(mode, shape):
    """Why these need no arithmetic coder: the static code over packed tuples, its tables and
    block index counted, is within 0.05 bit a symbol of the symbols' order-0 entropy."""
    from wantrain.codec.formats import compress_lowbit
    from wantrain.studies.compression import entropy_bits

    rng = np.random.default_rng(7)
    x = getattr(rng, shape)(size=1 << 18).astype(np.float32)
    q = quantize_levels(x, 4096, 7)[0] if mode == "int4-huffman" else quantize_ternary(x, 4096)[0]
    payload, _, _ = compress_lowbit(mode, x, CodecConfig(quant_block=4096, huffman_block=2048, huffman_tables=2))
    entropy = entropy_bits(np.bincount(q.astype(np.int64) + 7))
    assert entropy <= 8 * len(payload) / x.size < entropy + 0.05
