import numpy as np
import pytest

from wantrain.transport import wire
from wantrain.codec import ChunkSpec, Codec
from wantrain.config import CodecConfig, RunConfig
from wantrain.errors import ProtocolError
from wantrain.transport.messages import (DELTA, DeltaParity, ErrorMessage, HashReport, Join, LinkProbe, RoundMetrics,
                                         RoundResult, RoundStart, TensorChunk, Welcome)
from wantrain.transport.proto.v1 import ps_pb2 as pb

H = "0123456789abcdef"      # a parameter hash: 16 lowercase hex digits


def chunk():
    enc, _ = Codec(CodecConfig()).encode(np.linspace(-1, 1, 5000, dtype=np.float32))
    return TensorChunk(DELTA, 3, 1, 4, ChunkSpec("h.0.attn.c_attn.weight", 5000, 5000), enc)


def metrics():
    return RoundMetrics(round=3, train_loss=2.5, last_train_loss=2.4, tokens=1000, steps=10, raw_bytes=400,
                        wire_bytes=100, huffman_bits_per_symbol=7.0, encode_s=0.1, decode_s=0.1, compute_s=1.0,
                        send_s=0.2, chunks=4)


@pytest.mark.parametrize("make", [lambda: Join("us-east", 1, 2, H, "cpu"), chunk, metrics,
                                  lambda: LinkProbe((1.0, 2.0), (80.5, 90.0)),
                                  lambda: HashReport(3, H), lambda: DeltaParity(3, 2, b"\x01\x00\xff")])
def test_site_messages_round_trip(make):
    msg = make()
    raw = wire.site_message(msg).SerializeToString()
    back = wire.site_message_from_proto(pb.SiteMessage.FromString(raw))
    assert back == msg


@pytest.mark.parametrize("make", [
    lambda: Welcome("run", 2, RunConfig(), 5, H, 7), chunk, lambda: RoundStart(4, H),
    lambda: RoundStart(4, H, 2.5, "int4-huffman"),
    lambda: RoundResult(4, H, ("a", "b"), 2.5), lambda: ErrorMessage("duplicate_site", "taken"),
    lambda: RoundResult(4, H, ("a",), 2.5, ("c",), partial_chunks=(("b", frozenset({0, 3})),))])
def test_server_messages_round_trip(make):
    msg = make()
    raw = wire.server_message(msg).SerializeToString()
    assert wire.server_message_from_proto(pb.ServerMessage.FromString(raw)) == msg


def test_a_round_start_naming_no_codec_of_ours_is_rejected():
    m = wire.server_message(RoundStart(4, H, 2.5, "int4-huffman"))
    m.round_start.codec = "zip\n" + "x" * 500
    with pytest.raises(ProtocolError, match="codec 'zip") as e:
        wire.server_message_from_proto(m)
    assert len(str(e.value)) < 200            # the hostile text is cut short in the message


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
        wire.site_message_from_proto(pb.SiteMessage())
    with pytest.raises(ProtocolError, match="site"):
        wire.site_message_from_proto(pb.SiteMessage(join=pb.Join(site="")))
    bad = pb.ServerMessage(welcome=pb.Welcome(config_json='{"num_sites": -1}'))
    with pytest.raises(ProtocolError, match="num_sites"):
        wire.server_message_from_proto(bad)


@pytest.mark.parametrize("msg, match", [
    (pb.SiteMessage(join=pb.Join(site="a\nb")), "valid site"),
    (pb.SiteMessage(join=pb.Join(site="a", device="x" * 3_000_000)), "device"),
    (pb.SiteMessage(join=pb.Join(site="a", device="cpu\n2026 INFO forged")), "device"),
    (pb.SiteMessage(join=pb.Join(site="a", resume_hash="\x1b[31m")), "resume_hash"),
    (pb.SiteMessage(hash_report=pb.HashReport(round=1, model_hash="ABCDEF0123456789")), "hex"),
    (pb.SiteMessage(ready=pb.Ready(round=0, model_hash="")), "hex"),
    (pb.SiteMessage(link_probe=pb.LinkProbe(t=[float("nan")], rtt_ms=[1.0])), "Unix times"),
    (pb.SiteMessage(link_probe=pb.LinkProbe(t=[1e9] * 1001, rtt_ms=[1.0] * 1001)), "at most 1000"),
    (pb.SiteMessage(metrics=pb.RoundMetrics(round=0, compute_s=1e300)), "compute_s"),
    (pb.SiteMessage(parity=pb.DeltaParity(round=0, group=1)), "is empty"),
])
def test_strings_and_numbers_from_the_wire_are_bounded(msg, match):
    """Finding 5: what a peer names or claims is checked before it reaches a log line or an event."""
    with pytest.raises(ProtocolError, match=match):
        wire.parse_site_message(msg.SerializeToString())


@pytest.mark.parametrize("raw", [b"\xff\xff\xff\xff", b"\x0a\x05hello", b"\x12\x80\x80\x80\x80\x10"])
def test_bytes_protobuf_cannot_parse_are_a_protocol_error(raw):
    """Finding 6: garbage is a ProtocolError (the PS answers INVALID_ARGUMENT), never an exception of protobuf's."""
    with pytest.raises(ProtocolError, match="protobuf can parse"):
        wire.parse_site_message(raw)


def test_a_huffman_header_cannot_claim_more_symbols_than_its_chunk():
    m = wire.site_message(chunk())
    payload = bytearray(m.chunk.payload)
    payload[4:8] = (10**9).to_bytes(4, "little")        # n in the payload header
    m.chunk.payload = bytes(payload)
    m.chunk.crc32 = __import__("zlib").crc32(m.chunk.payload, __import__("zlib").crc32(m.chunk.scales))
    with pytest.raises(ProtocolError, match="announces 1000000000 symbols"):
        wire.parse_site_message(m.SerializeToString())


def manifest():
    from wantrain.transport.messages import ChunkEntry, Manifest

    return Manifest(3, (ChunkEntry(0, "h.0.ln_1.weight", 0, 64, "critical", 0.5, 0.25, 80, 7),
                        ChunkEntry(1, "h.0.attn.c_attn.weight", 0, 5000, "attention", 1.5, 0.75, 5100, 9, group=0)),
                    tokens=1000, steps=10)


def test_a_manifest_round_trips():
    m = manifest()
    assert wire.site_message_from_proto(pb.SiteMessage.FromString(wire.site_message(m).SerializeToString())) == m


@pytest.mark.parametrize("edit, match", [
    (lambda m: m.chunks[1].__setattr__("index", 5), "entries come in chunk order"),
    (lambda m: m.chunks[0].__setattr__("role", 0), "unknown role"),
    (lambda m: m.chunks[0].__setattr__("energy", float("nan")), "energy must be finite"),
    (lambda m: m.chunks[0].__setattr__("energy", -1.0), "energy must be finite"),
    (lambda m: m.chunks[0].__setattr__("importance", 0.5), "sum to 1.25"),
    (lambda m: m.chunks[0].__setattr__("tensor", ""), "names no tensor"),
    (lambda m: m.chunks[0].__setattr__("length", 0), "holds no elements"),
    (lambda m: m.chunks[0].__setattr__("parity_group", 3), "parity group 2 of a delta of 2"),
    (lambda m: m.__setattr__("steps", 0), "claims 0 steps"),
    (lambda m: m.ClearField("chunks"), "lists 1 to"),
])
def test_a_malformed_manifest_is_rejected(edit, match):
    m = wire.site_message(manifest())
    edit(m.manifest)
    with pytest.raises(ProtocolError, match=match):
        wire.site_message_from_proto(m)
