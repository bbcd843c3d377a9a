"""The only module that imports the generated protobuf code.

`to_proto` turns a domain object (wantrain.messages) into the wire message for its direction;
`site_message_from_proto` / `server_message_from_proto` turn what arrives back into domain
objects, checking it on the way: a malformed message raises ProtocolError with a sentence that
says what is wrong, and never yields a half-built object.
"""

from __future__ import annotations

import dataclasses
import math
import zlib

from .codec import ChunkSpec, Encoded
from .config import RunConfig
from .errors import CodecError, ConfigError, ProtocolError
from .messages import (DELTA, MODEL, UPDATE, ErrorMessage, HashReport, Join, LinkProbe, Ready, RoundMetrics,
                       RoundResult, RoundStart, TensorChunk, Welcome)
from .proto.v1 import ps_pb2 as pb
from .proto.v1 import ps_pb2_grpc as pb_grpc

__all__ = ["pb", "pb_grpc", "site_message", "server_message", "site_message_from_proto",
           "server_message_from_proto", "event_to_proto", "MAX_MESSAGE_BYTES", "MAX_NAME_LEN"]

MAX_MESSAGE_BYTES = 4 << 20      # a chunk carries at most ~1 MiB of payload; leave headroom
MAX_NAME_LEN = 256

_ENCODING = {"fp32": pb.ENCODING_FP32, "int8": pb.ENCODING_INT8, "int8-huffman": pb.ENCODING_INT8_HUFFMAN}
_ENCODING_BACK = {v: k for k, v in _ENCODING.items()}
_KIND = {MODEL: pb.CHUNK_KIND_MODEL, DELTA: pb.CHUNK_KIND_DELTA, UPDATE: pb.CHUNK_KIND_UPDATE}
_KIND_BACK = {v: k for k, v in _KIND.items()}


# ------------------------------------------------------------------ domain -> proto

def chunk_to_proto(c: TensorChunk) -> pb.Chunk:
    d = c.data
    return pb.Chunk(kind=_KIND[c.kind], round=c.round, index=c.index, count=c.count, tensor=c.spec.tensor,
                    offset=c.spec.offset, length=c.spec.length, encoding=_ENCODING[d.encoding],
                    quant_block=d.quant_block, scales=d.scales, payload=d.payload,
                    crc32=zlib.crc32(d.payload, zlib.crc32(d.scales)))


def site_message(obj: Join | TensorChunk | RoundMetrics | Ready | HashReport | LinkProbe) -> pb.SiteMessage:
    if isinstance(obj, Join):
        return pb.SiteMessage(join=pb.Join(**dataclasses.asdict(obj)))
    if isinstance(obj, TensorChunk):
        return pb.SiteMessage(chunk=chunk_to_proto(obj))
    if isinstance(obj, RoundMetrics):
        return pb.SiteMessage(metrics=pb.RoundMetrics(**dataclasses.asdict(obj)))
    if isinstance(obj, HashReport):
        return pb.SiteMessage(hash_report=pb.HashReport(round=obj.round, model_hash=obj.model_hash))
    if isinstance(obj, Ready):
        return pb.SiteMessage(ready=pb.Ready(round=obj.round, model_hash=obj.model_hash))
    if isinstance(obj, LinkProbe):
        return pb.SiteMessage(link_probe=pb.LinkProbe(t=list(obj.t), rtt_ms=list(obj.rtt_ms)))
    raise TypeError(f"not a site message: {type(obj).__name__}")


def server_message(obj: Welcome | TensorChunk | RoundStart | RoundResult | ErrorMessage) -> pb.ServerMessage:
    if isinstance(obj, Welcome):
        return pb.ServerMessage(welcome=pb.Welcome(
            run_id=obj.run_id, site_index=obj.site_index, config_json=obj.config.to_json(), round=obj.round,
            model_hash=obj.model_hash, model_chunks=obj.model_chunks, data_position=obj.data_position))
    if isinstance(obj, TensorChunk):
        return pb.ServerMessage(chunk=chunk_to_proto(obj))
    if isinstance(obj, RoundStart):
        return pb.ServerMessage(round_start=pb.RoundStart(round=obj.round, model_hash=obj.model_hash,
                                                                 train_s=obj.train_s))
    if isinstance(obj, RoundResult):
        return pb.ServerMessage(round_result=pb.RoundResult(
            round=obj.round, model_hash=obj.model_hash, sites=list(obj.sites), val_loss=obj.val_loss,
            late_sites=list(obj.late_sites)))
    if isinstance(obj, ErrorMessage):
        return pb.ServerMessage(error=pb.Error(code=obj.code, message=obj.message))
    raise TypeError(f"not a server message: {type(obj).__name__}")


def event_to_proto(seq: int, json_line: str) -> pb.TelemetryEvent:
    return pb.TelemetryEvent(seq=seq, json=json_line)


# ------------------------------------------------------------------ proto -> domain

def chunk_from_proto(m: pb.Chunk) -> TensorChunk:
    if m.kind not in _KIND_BACK:
        raise ProtocolError(f"chunk has unknown kind {m.kind}")
    if m.encoding not in _ENCODING_BACK:
        raise ProtocolError(f"chunk has unknown encoding {m.encoding}")
    if not m.tensor or len(m.tensor) > MAX_NAME_LEN:
        raise ProtocolError("chunk names no tensor (or an overlong name)")
    if m.count == 0 or m.index >= m.count:
        raise ProtocolError(f"chunk index {m.index} is out of range for a sequence of {m.count}")
    if zlib.crc32(m.payload, zlib.crc32(m.scales)) != m.crc32:
        raise ProtocolError(f"chunk {m.index} of tensor {m.tensor!r} fails its CRC check")
    data = Encoded(_ENCODING_BACK[m.encoding], m.length, m.quant_block, m.scales, m.payload)
    try:
        data.check()
    except CodecError as e:
        raise ProtocolError(f"chunk {m.index} of tensor {m.tensor!r}: {e}") from None
    return TensorChunk(_KIND_BACK[m.kind], m.round, m.index, m.count, ChunkSpec(m.tensor, m.offset, m.length), data)


def site_message_from_proto(m: pb.SiteMessage) -> Join | TensorChunk | RoundMetrics | Ready | HashReport | LinkProbe:
    which = m.WhichOneof("body")
    if which == "join":
        j = m.join
        if not j.site or len(j.site) > MAX_NAME_LEN or not j.site.isprintable():
            raise ProtocolError("join names no site (or an unprintable or overlong name)")
        if len(j.token) > 4096:
            raise ProtocolError("join token is too long")
        return Join(j.site, j.protocol_version, j.resume_round, j.resume_hash, j.device, j.token)
    if which == "chunk":
        return chunk_from_proto(m.chunk)
    if which == "metrics":
        fields = {f.name: getattr(m.metrics, f.name) for f in dataclasses.fields(RoundMetrics)}
        for k, v in fields.items():
            if isinstance(v, float) and not (math.isfinite(v) and (v >= 0 or k.endswith("loss"))):
                raise ProtocolError(f"round metrics field {k} is {v}: not a finite, non-negative number")
        return RoundMetrics(**fields)
    if which == "hash_report":
        return HashReport(m.hash_report.round, m.hash_report.model_hash)
    if which == "ready":
        return Ready(m.ready.round, m.ready.model_hash)
    if which == "link_probe":
        p = m.link_probe
        if len(p.t) != len(p.rtt_ms) or len(p.t) > 1000:
            raise ProtocolError("link probe needs one time per RTT (at most 1000)")
        if not all(math.isfinite(x) and 0 <= x < 1e7 for x in p.rtt_ms):
            raise ProtocolError("link probe RTTs must be finite and non-negative")
        return LinkProbe(tuple(p.t), tuple(p.rtt_ms))
    raise ProtocolError("empty site message")


def server_message_from_proto(m: pb.ServerMessage) -> Welcome | TensorChunk | RoundStart | RoundResult | ErrorMessage:
    which = m.WhichOneof("body")
    if which == "welcome":
        w = m.welcome
        try:
            cfg = RunConfig.from_json(w.config_json)
        except ConfigError as e:
            raise ProtocolError(f"welcome carries a bad run config: {e}") from None
        return Welcome(w.run_id, w.site_index, cfg, w.round, w.model_hash, w.model_chunks, w.data_position)
    if which == "chunk":
        return chunk_from_proto(m.chunk)
    if which == "round_start":
        rs = m.round_start
        if not (math.isfinite(rs.train_s) and rs.train_s >= 0):
            raise ProtocolError(f"round start asks for {rs.train_s} s of training")
        return RoundStart(rs.round, rs.model_hash, rs.train_s)
    if which == "round_result":
        r = m.round_result
        return RoundResult(r.round, r.model_hash, tuple(r.sites), r.val_loss, tuple(r.late_sites))
    if which == "error":
        return ErrorMessage(m.error.code, m.error.message)
    raise ProtocolError("empty server message")
