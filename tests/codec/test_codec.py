import numpy as np
import pytest

from wantrain.codec import Codec, Encoded, EncodeStats, ErrorFeedback, encode_arrays, plan_chunks
from wantrain.config import CodecConfig
from wantrain.errors import CodecError


@pytest.mark.parametrize("mode", ["fp32", "int8", "int8-huffman"])
def test_encode_then_decode_gives_what_the_sender_predicted(mode):
    rng = np.random.default_rng(0)
    codec = Codec(CodecConfig(mode=mode, chunk_bytes=8192, quant_block=512))
    arrays = {"a": rng.standard_normal(20000).astype(np.float32), "b": rng.standard_normal(7).astype(np.float32)}
    stats = EncodeStats()
    chunks, predicted = encode_arrays(arrays, codec, ErrorFeedback(), stats)
    decoded = Codec.decode_many([e for _, e in chunks])
    out = {k: np.zeros_like(v) for k, v in arrays.items()}
    for (spec, _), v in zip(chunks, decoded):
        out[spec.tensor][spec.offset: spec.offset + spec.length] = v
    for k in arrays:
        assert np.array_equal(out[k], predicted[k])           # bit-exact: what the sender will apply
    assert stats.wire_bytes == sum(e.wire_bytes for _, e in chunks)
    assert stats.raw_bytes == 4 * 20007
    if mode == "fp32":
        assert all(np.array_equal(out[k], arrays[k]) for k in arrays)
    else:
        assert stats.ratio > 3.5
    assert max(e.wire_bytes for _, e in chunks) <= 8192 + 4 * 16 + 1024


def test_plan_chunks_covers_each_tensor_once():
    plan = plan_chunks({"x": 10, "y": 3, "z": 0}, 4)
    assert [(c.tensor, c.offset, c.length) for c in plan] == [("x", 0, 4), ("x", 4, 4), ("x", 8, 2), ("y", 0, 3)]


@pytest.mark.parametrize("bad", [
    Encoded("fp32", 4, 0, b"", b"\x00" * 15),
    Encoded("int8", 4, 2, b"\x00" * 4, b"\x00" * 4),          # 2 blocks need 8 bytes of scales
    Encoded("int8", 4, 4, b"\x00" * 4, b"\x00" * 5),
    Encoded("int8", 4, 0, b"", b"\x00" * 4),
    Encoded("zstd", 4, 0, b"", b""),
])
def test_decode_rejects_inconsistent_chunks(bad):
    with pytest.raises(CodecError):
        Codec.decode_many([bad])


def test_decode_rejects_non_finite_scales():
    e = Encoded("int8", 2, 2, np.array([np.inf], "<f4").tobytes(), b"\x01\x02")
    with pytest.raises(CodecError):
        Codec.decode_many([e])


def test_join_chunks_needs_exact_cover():
    from wantrain.codec import ChunkSpec, join_chunks
    sizes = {"a": 6, "b": 2}
    specs = [ChunkSpec("a", 3, 3), ChunkSpec("a", 0, 3), ChunkSpec("b", 0, 2)]
    vals = [np.full(3, 2.0, np.float32), np.full(3, 1.0, np.float32), np.zeros(2, np.float32)]
    out = join_chunks(specs, vals, sizes)
    assert list(out["a"]) == [1, 1, 1, 2, 2, 2]
    for bad_specs in ([ChunkSpec("a", 0, 4), ChunkSpec("a", 3, 3), ChunkSpec("b", 0, 2)],   # overlap
                      [ChunkSpec("a", 0, 3), ChunkSpec("b", 0, 2)],                           # gap
                      [ChunkSpec("a", 0, 6), ChunkSpec("c", 0, 2)]):                          # unknown
        with pytest.raises(CodecError, match="tensor"):
            join_chunks(bad_specs, [np.zeros(s.length, np.float32) for s in bad_specs], sizes)


def test_the_update_may_travel_in_another_encoding_on_the_deltas_plan():
    delta_side = CodecConfig(mode="fp32", update_mode="topk")
    update_side = delta_side.for_update()
    assert update_side.mode == "topk" and Codec(update_side).encode(np.ones(5000, np.float32))[0].encoding == "topk"
    assert update_side.chunk_elements() == delta_side.chunk_elements() == CodecConfig(mode="fp32").chunk_elements()
    assert CodecConfig(mode="int8", update_mode="fp32").chunk_elements() == CodecConfig(mode="fp32").chunk_elements()
    assert CodecConfig(mode="topk").for_update().mode == "topk"            # "": as the deltas
    with pytest.raises(ValueError, match="codec.update_mode"):
        CodecConfig(update_mode="int3").validate()
