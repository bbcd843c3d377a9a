import numpy as np
import pytest

from wantrain import wire
from wantrain.codec import ChunkSpec, Codec
from wantrain.config import CodecConfig, RunConfig
from wantrain.errors import ProtocolError
from wantrain.messages import (DELTA, ErrorMessage, HashReport, Join, LinkProbe, RoundMetrics, RoundResult, RoundStart,
                               TensorChunk, Welcome)


def chunk():
    enc, _ = Codec(CodecConfig()).encode(np.linspace(-1, 1, 5000, dtype=np.float32))
    return TensorChunk(DELTA, 3, 1, 4, ChunkSpec("h.0.attn.c_attn.weight", 5000, 5000), enc)


def metrics():
    return RoundMetrics(round=3, train_loss=2.5, last_train_loss=2.4, tokens=1000, steps=10, raw_bytes=400,
                        wire_bytes=100, huffman_bits_per_symbol=7.0, encode_s=0.1, decode_s=0.1, compute_s=1.0,
                        comm_s=0.2, chunks=4)


@pytest.mark.parametrize("make", [lambda: Join("us-east", 1, 2, "abc", "cpu"), chunk, metrics,
                                  lambda: LinkProbe((1.0, 2.0), (80.5, 90.0)),
                                  lambda: HashReport(3, "abcd")])
def test_site_messages_round_trip(make):
    msg = make()
    raw = wire.site_message(msg).SerializeToString()
    back = wire.site_message_from_proto(wire.pb.SiteMessage.FromString(raw))
    assert back == msg


@pytest.mark.parametrize("make", [
    lambda: Welcome("run", 2, RunConfig(), 5, "abcd", 7), chunk, lambda: RoundStart(4, "h"),
    lambda: RoundResult(4, "h", ("a", "b"), 2.5), lambda: ErrorMessage("duplicate_site", "taken")])
def test_server_messages_round_trip(make):
    msg = make()
    raw = wire.server_message(msg).SerializeToString()
    assert wire.server_message_from_proto(wire.pb.ServerMessage.FromString(raw)) == msg


def test_payload_fits_one_mib():
    enc, _ = Codec(CodecConfig(mode="fp32")).encode(np.zeros(CodecConfig(mode="fp32").chunk_elements(), np.float32))
    assert len(enc.payload) <= 1 << 20


def test_corrupted_chunk_fails_crc():
    m = wire.site_message(chunk())
    m.chunk.payload = m.chunk.payload[:-1] + bytes([m.chunk.payload[-1] ^ 1])
    with pytest.raises(ProtocolError, match="CRC"):
        wire.site_message_from_proto(m)


@pytest.mark.parametrize("edit, match", [
    (lambda c: setattr(c, "index", 9), "out of range"),
    (lambda c: setattr(c, "kind", 77), "unknown kind"),
    (lambda c: setattr(c, "encoding", 0), "unknown encoding"),
    (lambda c: setattr(c, "tensor", ""), "names no tensor"),
    (lambda c: setattr(c, "length", 4), "scales"),
])
def test_malformed_chunks_are_rejected(edit, match):
    m = wire.site_message(chunk())
    edit(m.chunk)
    with pytest.raises(ProtocolError, match=match):
        wire.site_message_from_proto(m)


def test_empty_and_bad_messages():
    with pytest.raises(ProtocolError):
        wire.site_message_from_proto(wire.pb.SiteMessage())
    with pytest.raises(ProtocolError, match="site"):
        wire.site_message_from_proto(wire.pb.SiteMessage(join=wire.pb.Join(site="")))
    bad = wire.pb.ServerMessage(welcome=wire.pb.Welcome(config_json='{"num_sites": -1}'))
    with pytest.raises(ProtocolError, match="num_sites"):
        wire.server_message_from_proto(bad)
