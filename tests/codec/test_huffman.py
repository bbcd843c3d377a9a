import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from wantrain.codec import huffman
from wantrain.errors import CodecError
from wantrain.studies.compression import entropy_bits


def roundtrip(a: np.ndarray, block: int = huffman.DEFAULT_BLOCK, tables: int = huffman.DEFAULT_TABLES) -> np.ndarray:
    return huffman.decode(huffman.encode(a, block, tables))


@settings(max_examples=300, deadline=None)
@given(hnp.arrays(np.int8, st.integers(0, 5000)), st.sampled_from([2, 4, 64, 1024, 4096]), st.integers(1, 4))
def test_roundtrip_any_int8_array(a, block, tables):
    out = roundtrip(a, block, tables)
    assert out.dtype == np.uint8
    assert np.array_equal(out.view(np.int8), a)


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 255), st.integers(0, 3000))
def test_roundtrip_one_symbol(sym, n):
    a = np.full(n, sym, np.uint8)
    assert np.array_equal(roundtrip(a), a)


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 20000), st.floats(0.01, 0.9))
def test_roundtrip_skewed(seed, n, p):
    rng = np.random.default_rng(seed)
    a = (rng.geometric(p, n) % 256).astype(np.uint8)   # heavily skewed, long codes for rare symbols
    assert np.array_equal(roundtrip(a), a)


def test_roundtrip_edge_cases():
    for a in [np.empty(0, np.uint8), np.arange(256, dtype=np.uint8), np.arange(256, dtype=np.uint8).repeat(3),
              np.array([0, 255], np.uint8), np.array([7], np.uint8)]:
        assert np.array_equal(roundtrip(a), a)


def test_code_lengths_are_limited_and_prefix_free():
    counts = np.array([2 ** min(i, 40) for i in range(256)], dtype=np.int64)  # would need 255-bit codes
    lengths = huffman.code_lengths(counts)
    assert lengths.max() <= huffman.MAX_CODE_LEN
    assert (2.0 ** -lengths.astype(float)).sum() <= 1.0 + 1e-12


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 2 ** 40), min_size=2, max_size=256), st.integers(8, 16))
@example([5] * 256, 8)                                       # every weight tied
@example([1] * 255 + [2 ** 40], 12)                          # one symbol dwarfs the rest
def test_compiled_package_merge_gives_the_numpy_lengths(weights, max_len):
    """The compiled package-merge picks exactly the lengths the numpy one did (ties included), so
    payloads keep their bytes (the golden fixtures check those too)."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from baseline_huffman import package_merge

    from wantrain.codec.huffman_lengths import package_merge as compiled
    w = np.sort(np.array(weights, np.int64))
    if w.size > 2 ** max_len:
        return
    assert np.array_equal(compiled(w, max_len), package_merge(w, max_len))


def test_code_is_optimal_when_unconstrained():
    # Dyadic probabilities: Huffman lengths equal -log2(p) exactly.
    counts = np.zeros(256, np.int64)
    counts[:4] = [8, 4, 2, 2]
    assert list(huffman.code_lengths(counts)[:4]) == [1, 2, 3, 3]


def test_within_005_bits_of_entropy_on_gaussian_symbols():
    rng = np.random.default_rng(0)
    q = np.clip(np.rint(rng.standard_normal(1_000_000) * 30), -127, 127).astype(np.int8)
    counts = np.bincount(q.view(np.uint8), minlength=256)
    lengths = huffman.code_lengths(counts)
    avg = float((counts * lengths).sum() / counts.sum())
    assert avg - entropy_bits(counts) < 0.06


def test_multiple_payloads_with_different_tables_decode_together():
    rng = np.random.default_rng(1)
    arrays = [rng.integers(0, 256, 3000).astype(np.uint8), np.full(10, 3, np.uint8), np.empty(0, np.uint8),
              (rng.geometric(0.2, 7777) % 256).astype(np.uint8)]
    out = huffman.decode_many([huffman.encode(a) for a in arrays])
    for a, b in zip(arrays, out):
        assert np.array_equal(a, b)


def test_blocks_shared_out_among_threads_decode_as_on_one():
    """A payload of many blocks is decoded in jobs on a thread pool, beside small payloads and an
    odd-length one; every thread count gives the same symbols."""
    rng = np.random.default_rng(5)
    big = np.clip(np.rint(rng.standard_t(3, 3 * 512 * 2048 + 1001) * 9), -127, 127).astype(np.int8)
    arrays = [big, rng.integers(-5, 5, 4097).astype(np.int8), big[:2048 * 513]]
    payloads = [huffman.encode(a) for a in arrays]
    for threads in (1, None):
        for a, b in zip(arrays, huffman.decode_many(payloads, threads=threads)):
            assert np.array_equal(a, b.view(np.int8))


@settings(max_examples=60, deadline=None)
@given(st.binary(min_size=0, max_size=600), st.integers(0, 2**32 - 1))
@example(b"\x01!", 107161)     # an unused table of lengths that are no code (found under a busy core)
def test_any_corruption_is_an_error_or_a_decode_never_a_crash(raw, seed):
    """The compiled decoder does no bounds checks of its own: whatever a hostile payload says,
    it must fail with CodecError or decode to the announced number of symbols."""
    rng = np.random.default_rng(seed)
    p = bytearray(huffman.encode(rng.integers(-20, 20, int(rng.integers(1, 9000))).astype(np.int8), 256, 2))
    for k in rng.integers(0, len(p), 1 + len(raw) % 8):
        p[k] = raw[k % len(raw)] if raw else int(rng.integers(0, 256))
    try:
        out = huffman.decode(bytes(p))
    except CodecError:
        return
    assert out.size == huffman.payload_symbols(bytes(p))


def test_several_tables_beat_one_on_a_mixture():
    rng = np.random.default_rng(3)
    narrow = np.clip(np.rint(rng.standard_normal(64 * 2048) * 3), -127, 127)
    wide = np.clip(np.rint(rng.standard_normal(64 * 2048) * 60), -127, 127)
    mix = np.stack([narrow.reshape(64, 2048), wide.reshape(64, 2048)], 1).reshape(-1).astype(np.int8)
    one, two = huffman.encode(mix, 2048, 1), huffman.encode(mix, 2048, 2)
    assert len(two) < 0.9 * len(one)
    assert np.array_equal(huffman.decode(two).view(np.int8), mix)


def test_block_naming_a_missing_table_is_rejected():
    a = np.random.default_rng(4).integers(-100, 100, 20 * 2048).astype(np.int8)
    p = bytearray(huffman.encode(a, 2048, 2))
    assert p[1] == 2
    p[8 + 2 * 128] = 7                     # first block's table id
    with pytest.raises(CodecError, match="table"):
        huffman.decode(bytes(p))


@pytest.mark.parametrize("mutate", [
    lambda p: p[:10],                      # truncated header
    lambda p: bytes([9]) + p[1:],          # unknown version
    lambda p: p[:-4],                      # stream shorter than the block index says
    lambda p: p[:2] + b"\x00\x00" + p[4:],  # zero block size
])
def test_malformed_payloads_are_rejected(mutate):
    p = huffman.encode(np.random.default_rng(2).integers(0, 256, 5000).astype(np.uint8))
    with pytest.raises(CodecError):
        huffman.decode(mutate(p))


def _huffman_cost(counts):
    """Total bits of an unconstrained Huffman code (sum of merged weights)."""
    import heapq
    h = [int(c) for c in counts if c > 0]
    heapq.heapify(h)
    cost = 0
    while len(h) > 1:
        a, b = heapq.heappop(h), heapq.heappop(h)
        cost += a + b
        heapq.heappush(h, a + b)
    return cost


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 10**6), min_size=256, max_size=256))
def test_package_merge_is_optimal(counts):
    counts = np.array(counts, np.int64)
    lengths = huffman.code_lengths(counts, max_len=12)
    present = counts > 0
    assert np.all((lengths > 0) == present) if present.sum() > 1 else True
    if present.sum() > 1:
        assert (2.0 ** -lengths[present].astype(float)).sum() <= 1.0
        cost = int((counts * lengths).sum())
        unconstrained = _huffman_cost(counts)
        assert cost >= unconstrained
        if huffman.code_lengths(counts, max_len=40).max() <= 12:
            assert cost == unconstrained
