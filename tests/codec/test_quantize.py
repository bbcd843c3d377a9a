import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from wantrain.codec import ErrorFeedback, dequantize_int8, quantize_int8
from wantrain.errors import CodecError

finite = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False, width=32)


@settings(max_examples=300, deadline=None)
@given(hnp.arrays(np.float32, st.integers(0, 3000), elements=finite), st.sampled_from([1, 7, 64, 4096]))
def test_error_per_element_is_at_most_half_a_step(x, block):
    q, scales = quantize_int8(x, block)
    assert q.dtype == np.int8 and np.all(np.abs(q.astype(int)) <= 127)
    y = dequantize_int8(q, scales, block)
    step = np.repeat(scales, block)[: x.size].astype(np.float64)
    err = np.abs(x.astype(np.float64) - y.astype(np.float64))
    # Half a step, plus the float32 rounding of the dequantized value itself; blocks of
    # magnitude below TINY are flushed to zero (error at most TINY).
    assert np.all(err <= step / 2 * (1 + 1e-6) + np.abs(y) * 2**-23 + (step == 0) * 1e-30)


def test_zero_block_and_extremes():
    x = np.zeros(10, np.float32)
    q, s = quantize_int8(x, 4)
    assert not q.any() and not s.any()
    x = np.array([-3.0, 3.0, 1.5], np.float32)
    q, s = quantize_int8(x, 3)
    assert list(q) == [-127, 127, 64]


def test_non_finite_is_rejected():
    with pytest.raises(CodecError):
        quantize_int8(np.array([1.0, np.nan], np.float32), 2)
    with pytest.raises(CodecError):
        quantize_int8(np.array([np.inf], np.float32), 2)


def test_error_feedback_carries_the_residual():
    """sum over rounds of what was sent == sum of the true deltas - the last residual."""
    rng = np.random.default_rng(0)
    fb = ErrorFeedback()
    true_sum = np.zeros(5000, np.float64)
    sent_sum = np.zeros(5000, np.float64)
    for _ in range(50):
        delta = (rng.standard_normal(5000) * rng.uniform(0.01, 1)).astype(np.float32)
        corrected = fb.compensate("w", delta)
        q, s = quantize_int8(corrected, 256)
        sent = dequantize_int8(q, s, 256)
        fb.record("w", corrected, sent)
        true_sum += delta
        sent_sum += sent
    residual = fb.residuals["w"].astype(np.float64)
    np.testing.assert_allclose(sent_sum + residual, true_sum, atol=1e-4)
    # And the residual stays bounded by half a step instead of growing with the rounds.
    assert np.abs(residual).max() < 0.05


def test_without_feedback_the_error_accumulates():
    delta = np.full(4096, 0.003, np.float32)
    delta[0] = 1.0   # one large element sets the scale; the small ones round to zero every round
    sent_sum = np.zeros(4096)
    fb = ErrorFeedback()
    fb_sum = np.zeros(4096)
    for _ in range(20):
        q, s = quantize_int8(delta, 4096)
        sent_sum += dequantize_int8(q, s, 4096)
        c = fb.compensate("w", delta)
        q, s = quantize_int8(c, 4096)
        y = dequantize_int8(q, s, 4096)
        fb.record("w", c, y)
        fb_sum += y
    assert sent_sum[1] == 0.0
    assert abs(fb_sum[1] - 20 * 0.003) < 0.004
