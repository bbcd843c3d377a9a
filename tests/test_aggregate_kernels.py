"""The compiled loops of the PS round and of quantization give the same bits as the numpy
expressions they replace (written out here as the reference), on random and edge-case inputs."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import sys
from pathlib import Path

from wantrain.outer import kernels
from wantrain.outer.aggregate import apply_sent, weighted_mean
from wantrain.codec import Codec, Extracted, dequantize_int8, quantize_int8
from wantrain.config import CodecConfig
from wantrain.outer.nesterov import OuterNesterov

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from baseline_aggregate import quantize as numpy_quantize  # the numpy rule, kept for the bench

pytestmark = pytest.mark.timeout(300)

finite = st.floats(-2.0 ** 100, 2.0 ** 100, allow_nan=False, allow_infinity=False, allow_subnormal=True, width=32)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@settings(max_examples=300, deadline=None)
@given(hnp.arrays(np.float32, st.integers(0, 3000), elements=finite), st.sampled_from([1, 3, 64, 4096]))
def test_quantize_gives_the_bits_of_the_numpy_rule(x, block):
    q, scales = quantize_int8(x, block)
    rq, rscales = numpy_quantize(x, block)
    assert same_bits(q, rq) and same_bits(scales, rscales)


def test_quantize_edge_cases_keep_the_numpy_bits():
    rng = np.random.default_rng(11)
    cases = [np.full(100, -0.0, np.float32), np.full(9, 1e-31, np.float32),          # flushed to zero
             np.array([0.5, -0.5, 1.5, -1.5, 2.5] * 7, np.float32) * np.float32(127 / 2.5),  # halves: to even
             np.array([np.finfo(np.float32).max, -np.finfo(np.float32).max, 1.0], np.float32),
             (rng.standard_normal(10_000) * 1e-3).astype(np.float32)]
    for x in cases:
        for block in (2, 7, 4096):
            q, s = quantize_int8(x, block)
            rq, rs = numpy_quantize(x, block)
            assert same_bits(q, rq) and same_bits(s, rs), (x[:5], block)


def test_weighted_mean_of_int8_chunks_is_the_numpy_mean_of_their_values():
    rng = np.random.default_rng(3)
    codec = Codec(CodecConfig(quant_block=64))
    chunks = [codec.compress((rng.standard_normal(1000) * 10.0 ** -k).astype(np.float32))[1] for k in (1, 3, 5)]
    weights = [700.0, 2000.0, 1.5]
    ref = np.zeros(1000, np.float32)
    for w, c in zip(weights, chunks):
        ref += np.float32(w / sum(weights)) * dequantize_int8(c.data, c.scales, c.block)
    assert same_bits(weighted_mean(chunks, weights), ref)
    assert same_bits(weighted_mean([c.values() for c in chunks], weights), ref)    # fp32 values, same bits


@pytest.mark.parametrize("with_residual", [False, True])
def test_nesterov_step_is_the_numpy_expression(with_residual):
    rng = np.random.default_rng(4)
    lr, m = np.float32(0.7), np.float32(0.9)
    buf = rng.standard_normal(5000).astype(np.float32)
    residual = rng.standard_normal(5000).astype(np.float32) * np.float32(1e-4)
    ref_buf = buf.copy()
    for _ in range(3):
        g = (rng.standard_normal(5000) * 1e-2).astype(np.float32)
        ref_buf *= m
        ref_buf += g
        ref = -lr * (g + m * ref_buf)
        if with_residual:
            ref = ref + residual
        out = np.empty_like(g)
        kernels.nesterov_step(buf, g, lr, m, residual if with_residual else kernels.NO_RESIDUAL, out)
        assert same_bits(buf, ref_buf) and same_bits(out, ref)


def test_outer_update_of_parts_equals_the_whole_tensor():
    rng = np.random.default_rng(6)
    g = rng.standard_normal(1000).astype(np.float32)
    whole, parts = OuterNesterov(0.7, 0.9), OuterNesterov(0.7, 0.9)
    for _ in range(2):
        w = whole.update({"t": g})["t"]
        p = np.concatenate([parts.update_part("t", 1000, slice(a, a + 300), g[a:a + 300]) for a in range(0, 1000, 300)])
        assert same_bits(w, p)


@pytest.mark.parametrize("mode", ["int8-huffman", "fp32"])
@pytest.mark.parametrize("with_residual", [False, True])
def test_apply_sent_adds_what_was_sent_and_keeps_the_rest(mode, with_residual):
    rng = np.random.default_rng(7)
    corrected = (rng.standard_normal(3000) * 1e-3).astype(np.float32)
    _, sent = Codec(CodecConfig(mode=mode, quant_block=128)).compress(corrected)
    params = rng.standard_normal(3000).astype(np.float32)
    ref_params = params + sent.values()
    residual = np.full(3000, np.nan, np.float32) if with_residual else kernels.NO_RESIDUAL
    apply_sent(params, corrected, sent, residual)
    assert same_bits(params, ref_params)
    if with_residual:
        assert same_bits(residual, corrected - sent.values())


def test_compress_is_encode_without_the_dequantize():
    x = (np.random.default_rng(8).standard_normal(5000) * 1e-2).astype(np.float32)
    codec = Codec(CodecConfig())
    enc, values = codec.encode(x)
    enc2, sent = codec.compress(x)
    assert enc == enc2 and isinstance(sent, Extracted) and same_bits(sent.values(), values)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 3000), block=st.sampled_from([1, 7, 64, 4096]), seed=st.integers(0, 2**32 - 1))
def test_dot_products_match_float64_numpy(n, block, seed):
    """The screen's pair dot products (screening.gram) against numpy on the dequantized values."""
    rng = np.random.default_rng(seed)
    blocks = -(-n // block)
    qa, qb = (rng.integers(-127, 128, n).astype(np.int8) for _ in range(2))
    sa, sb = (rng.uniform(1e-6, 1.0, blocks).astype(np.float32) for _ in range(2))
    x = qa.astype(np.float64) * np.repeat(sa.astype(np.float64), block)[:n]
    y = qb.astype(np.float64) * np.repeat(sb.astype(np.float64), block)[:n]
    assert kernels.dot_int8(qa, sa, qb, sb, block) == pytest.approx(float(x @ y), rel=1e-9, abs=1e-9)
    fa, fb = x.astype(np.float32), y.astype(np.float32)
    assert kernels.dot_f32(fa, fb) == pytest.approx(float(fa.astype(np.float64) @ fb.astype(np.float64)), rel=1e-12,
                                                    abs=1e-12)
