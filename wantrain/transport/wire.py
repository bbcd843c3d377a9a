"""The only module that imports the generated protobuf code.

`site_message` / `server_message` turn a domain object (wantrain.transport.messages) into the wire message
for its direction; `parse_site_message` / `parse_server_message` turn the bytes that arrive back
into domain objects, checking them on the way. A message protobuf cannot parse, or one that
breaks a rule of docs/protocol.md that needs no state to check (a name, a hash, a number out of
range), raises ProtocolError with a sentence that says what is wrong, and never yields a
half-built object. Rules that depend on the run (which tensors, which round) are the PS's.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import zlib

from google.protobuf.message import DecodeError

from ..codec import ChunkSpec, Encoded
from ..config import CODEC_MODES, RunConfig, check_site_name
from ..errors import CodecError, ConfigError, ProtocolError
from .limits import Limits, safe_text
from .messages import (DELTA, DELTA_OUTCOMES, HASH_HEX_DIGITS, MODEL, UPDATE, ChunkEntry, DeltaOutcome, DeltaParity,
                       ErrorMessage, HashReport, Join, LaneAck, LaneOpen, LinkProbe, Manifest, Ready, RoundMetrics, RoundResult,
                       RoundStart, TensorChunk, Welcome)
from .proto.v1 import ps_pb2 as pb
from .manifest import checksum
from .roles import ROLES
from ..telemetry import REPORTED_KINDS

__all__ = ["site_message", "server_message", "parse_site_message", "parse_server_message",
           "site_message_from_proto", "server_message_from_proto", "event_to_proto", "ping_request", "ping_reply",
           "watch_request", "report_request", "report_reply", "parse_ping", "parse_watch", "parse_report",
           "MAX_MESSAGE_BYTES", "MAX_NAME_LEN", "MAX_DEVICE_LEN", "MAX_TOKEN_LEN", "MAX_PROBE_SAMPLES",
           "MAX_REPORTED_EVENTS", "MAX_REPORTED_EVENT_CHARS", "MAX_MANIFEST_CHUNKS", "framed_bytes", "framed_size"]

MAX_MESSAGE_BYTES = Limits.max_message_bytes   # a chunk carries at most ~1 MiB of payload; leave headroom
MAX_NAME_LEN = 256               # tensor names
MAX_DEVICE_LEN = 128
MAX_TOKEN_LEN = 4096
MAX_PROBE_SAMPLES = 1000         # per LinkProbe message
MAX_REPORTED_EVENTS = 1000       # per ReportRequest
MAX_REPORTED_EVENT_CHARS = 16384  # one reported event's JSON (a links_start event lists the plan)
MAX_SECONDS = 1e7                # any duration a message reports (about 116 days)
MAX_MANIFEST_CHUNKS = 100_000    # entries of a DeltaManifest (~40 bytes each: within one message)
_HASH = re.compile(rf"[0-9a-f]{{{HASH_HEX_DIGITS}}}")

# The codec's modes (config.CODEC_MODES) are the proto's encodings, by name: "int8-huffman" is
# ENCODING_INT8_HUFFMAN. Checked here, at import, both ways.
_ENCODING = {m: pb.Encoding.Value("ENCODING_" + m.upper().replace("-", "_")) for m in CODEC_MODES}
_ENCODING_BACK = {v: k for k, v in _ENCODING.items()}
assert set(_ENCODING_BACK) == set(pb.Encoding.values()) - {pb.ENCODING_UNSPECIFIED}, "codec modes != proto encodings"
_KIND = {MODEL: pb.CHUNK_KIND_MODEL, DELTA: pb.CHUNK_KIND_DELTA, UPDATE: pb.CHUNK_KIND_UPDATE}
_KIND_BACK = {v: k for k, v in _KIND.items()}
_ROLE = {r: pb.Role.Value("ROLE_" + r.upper()) for r in ROLES}
_ROLE_BACK = {v: k for k, v in _ROLE.items()}
assert set(_ROLE_BACK) == set(pb.Role.values()) - {pb.ROLE_UNSPECIFIED}, "recovery roles != proto roles"


def _hash(value: str, what: str, empty_ok: bool = False) -> str:
    if (empty_ok and value == "") or _HASH.fullmatch(value):
        return value
    raise ProtocolError(f"{what} must be {HASH_HEX_DIGITS} lowercase hex digits, got {safe_text(value, 40)!r}")


# ------------------------------------------------------------------ domain -> proto

def chunk_to_proto(c: TensorChunk) -> pb.Chunk:
    d = c.data
    return pb.Chunk(kind=_KIND[c.kind], round=c.round, index=c.index, count=c.count, tensor=c.spec.tensor,
                    offset=c.spec.offset, length=c.spec.length, encoding=_ENCODING[d.encoding],
                    quant_block=d.quant_block, scales=d.scales, payload=d.payload,
                    crc32=checksum(d))


def manifest_to_proto(m: Manifest) -> pb.DeltaManifest:
    return pb.DeltaManifest(round=m.round, tokens=m.tokens, steps=m.steps, chunks=[
        pb.ManifestEntry(index=c.index, tensor=c.tensor, offset=c.offset, length=c.length, role=_ROLE[c.role],
                         energy=c.energy, importance=c.importance, nbytes=c.nbytes, crc32=c.crc32,
                         parity_group=c.group + 1) for c in m.chunks])


SiteMessage = Join | TensorChunk | RoundMetrics | Ready | HashReport | LinkProbe | Manifest | DeltaParity | LaneOpen
_LANE_ITEM = {"manifest": pb.LANE_ITEM_MANIFEST, "chunk": pb.LANE_ITEM_CHUNK, "parity": pb.LANE_ITEM_PARITY}
_LANE_ITEM_NAME = {v: k for k, v in _LANE_ITEM.items()}


def site_message(obj: SiteMessage) -> pb.SiteMessage:
    if isinstance(obj, Manifest):
        return pb.SiteMessage(manifest=manifest_to_proto(obj))
    if isinstance(obj, DeltaParity):
        return pb.SiteMessage(parity=pb.DeltaParity(round=obj.round, group=obj.group, payload=obj.payload))
    if isinstance(obj, Join):
        return pb.SiteMessage(join=pb.Join(**dataclasses.asdict(obj)))
    if isinstance(obj, LaneOpen):
        return pb.SiteMessage(lane_open=pb.LaneOpen(site=obj.site, token=obj.token, lane=obj.lane))
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


GRPC_PREFIX_BYTES = 5     # gRPC frames each message with a compressed flag and a u32 length


def framed_size(obj: SiteMessage) -> int:
    """Bytes one site message takes on a gRPC stream: serialized, with gRPC's prefix (HTTP/2's frame
    headers and TCP/IP's below are not counted). A chunk takes the same as a ServerMessage."""
    return site_message(obj).ByteSize() + GRPC_PREFIX_BYTES


def framed_bytes(chunks) -> int:
    """Bytes these delta or update chunks (or any site messages) take on a gRPC stream."""
    return sum(framed_size(c) for c in chunks)


ServerMessage = Welcome | TensorChunk | RoundStart | RoundResult | DeltaOutcome | ErrorMessage | LaneAck


def server_message(obj: ServerMessage) -> pb.ServerMessage:
    if isinstance(obj, Welcome):
        return pb.ServerMessage(welcome=pb.Welcome(
            run_id=obj.run_id, site_index=obj.site_index, config_json=obj.config.to_json(), round=obj.round,
            model_hash=obj.model_hash, model_chunks=obj.model_chunks, data_position=obj.data_position,
            shard_index=obj.shard, shard_count=obj.shards))
    if isinstance(obj, TensorChunk):
        return pb.ServerMessage(chunk=chunk_to_proto(obj))
    if isinstance(obj, RoundStart):
        return pb.ServerMessage(round_start=pb.RoundStart(round=obj.round, model_hash=obj.model_hash,
                                                                 train_s=obj.train_s, codec=obj.codec))
    if isinstance(obj, RoundResult):
        return pb.ServerMessage(round_result=pb.RoundResult(
            round=obj.round, model_hash=obj.model_hash, sites=list(obj.sites), val_loss=obj.val_loss,
            late_sites=list(obj.late_sites),
            partial=[pb.CountedChunks(site=s, chunks=sorted(c)) for s, c in obj.partial_chunks],
            tail_chunks=obj.tail_chunks))
    if isinstance(obj, DeltaOutcome):
        return pb.ServerMessage(delta_outcome=pb.DeltaOutcome(round=obj.round, outcome=obj.outcome, reason=obj.reason))
    if isinstance(obj, ErrorMessage):
        return pb.ServerMessage(error=pb.Error(code=obj.code, message=obj.message))
    if isinstance(obj, LaneAck):
        return pb.ServerMessage(lane_ack=pb.LaneAck(round=obj.round, item=_LANE_ITEM[obj.item], index=obj.index))
    raise TypeError(f"not a server message: {type(obj).__name__}")


def event_to_proto(seq: int, json_line: str) -> pb.TelemetryEvent:
    return pb.TelemetryEvent(seq=seq, json=json_line)


# ------------------------------------------------------------------ bytes -> domain

def parse_site_message(raw: bytes) -> SiteMessage:
    """What a site sent, checked; ProtocolError if protobuf cannot parse it or it breaks a rule."""
    try:
        m = pb.SiteMessage.FromString(raw)
    except (DecodeError, ValueError) as e:
        raise ProtocolError(f"not a SiteMessage that protobuf can parse ({len(raw)} bytes): {e}") from None
    return site_message_from_proto(m)


def parse_server_message(raw: bytes) -> ServerMessage:
    try:
        m = pb.ServerMessage.FromString(raw)
    except (DecodeError, ValueError) as e:
        raise ProtocolError(f"not a ServerMessage that protobuf can parse ({len(raw)} bytes): {e}") from None
    return server_message_from_proto(m)


def _parse(cls, raw: bytes, what: str):
    try:
        return cls.FromString(raw)
    except (DecodeError, ValueError) as e:
        raise ProtocolError(f"not a {what} that protobuf can parse ({len(raw)} bytes): {e}") from None


def parse_ping(raw: bytes) -> str:
    """The caller's name in a PingRequest (for logs only)."""
    return _parse(pb.PingRequest, raw, "PingRequest").site


def parse_watch(raw: bytes) -> int:
    """The sequence number a WatchRequest asks to replay from."""
    return _parse(pb.WatchRequest, raw, "WatchRequest").from_seq


def parse_report(raw: bytes) -> list[dict]:
    """The events of a ReportRequest: JSON objects of a kind an operator may report, each bounded."""
    req = _parse(pb.ReportRequest, raw, "ReportRequest")
    if len(req.events) > MAX_REPORTED_EVENTS:
        raise ProtocolError(f"a report carries at most {MAX_REPORTED_EVENTS} events, got {len(req.events)}")
    events = []
    for i, text in enumerate(req.events):
        if len(text) > MAX_REPORTED_EVENT_CHARS:
            raise ProtocolError(f"reported event {i} has {len(text)} characters (at most {MAX_REPORTED_EVENT_CHARS})")
        try:
            ev = json.loads(text)
        except ValueError:
            raise ProtocolError(f"reported event {i} is not JSON") from None
        if not isinstance(ev, dict) or ev.get("kind") not in REPORTED_KINDS:
            raise ProtocolError(f"reported event {i} must be a JSON object whose kind is one of "
                                f"{', '.join(REPORTED_KINDS)}, got {safe_text(str(ev)[:80], 80)!r}")
        if ev["kind"] == "clear_site" and (why := check_site_name(ev.get("site"))):
            raise ProtocolError(f"reported event {i} (clear_site): {why}")
        events.append(ev)
    return events


def ping_request(site: str) -> pb.PingRequest:
    return pb.PingRequest(site=site)


def ping_reply(server_time: float) -> pb.PingReply:
    return pb.PingReply(server_time=server_time)


def watch_request(from_seq: int) -> pb.WatchRequest:
    return pb.WatchRequest(from_seq=from_seq)


def report_request(events: list[dict]) -> pb.ReportRequest:
    return pb.ReportRequest(events=[json.dumps(e, separators=(",", ":")) for e in events])


def report_reply(first_seq: int) -> pb.ReportReply:
    return pb.ReportReply(first_seq=first_seq)


def chunk_from_proto(m: pb.Chunk) -> TensorChunk:
    if m.kind not in _KIND_BACK:
        raise ProtocolError(f"chunk has unknown kind {m.kind}")
    if m.encoding not in _ENCODING_BACK:
        raise ProtocolError(f"chunk has unknown encoding {m.encoding}")
    if not m.tensor or len(m.tensor) > MAX_NAME_LEN or not m.tensor.isprintable():
        raise ProtocolError("chunk names no tensor (or an unprintable or overlong name)")
    if m.count == 0 or m.index >= m.count:
        raise ProtocolError(f"chunk index {m.index} is out of range for a sequence of {m.count}")
    if m.length == 0:
        raise ProtocolError(f"chunk {m.index} of tensor {m.tensor!r} holds no elements")
    if zlib.crc32(m.payload, zlib.crc32(m.scales)) != m.crc32:
        raise ProtocolError(f"chunk {m.index} of tensor {m.tensor!r} fails its CRC check")
    data = Encoded(_ENCODING_BACK[m.encoding], m.length, m.quant_block, m.scales, m.payload)
    try:
        data.check()
    except CodecError as e:
        raise ProtocolError(f"chunk {m.index} of tensor {m.tensor!r}: {e}") from None
    return TensorChunk(_KIND_BACK[m.kind], m.round, m.index, m.count, ChunkSpec(m.tensor, m.offset, m.length), data)


def _metrics(m: pb.RoundMetrics) -> RoundMetrics:
    fields = {f.name: getattr(m, f.name) for f in dataclasses.fields(RoundMetrics)}
    for k, v in fields.items():
        if isinstance(v, float):
            limit = math.inf if k.endswith("loss") else MAX_SECONDS
            if not (math.isfinite(v) and (v >= 0 or k.endswith("loss")) and abs(v) <= limit):
                raise ProtocolError(f"round metrics field {k} is {v}: not a finite, non-negative number "
                                    f"of at most {limit:g}")
    return RoundMetrics(**fields)


def manifest_from_proto(m: pb.DeltaManifest) -> Manifest:
    """A DeltaManifest, checked for what needs no state: entries in index order, named, sized, with
    a known role, finite non-negative energies and importances that sum to 1 (the PS checks them
    against its chunk plan and the chunks as they come)."""
    n = len(m.chunks)
    if not 1 <= n <= MAX_MANIFEST_CHUNKS:
        raise ProtocolError(f"a delta manifest lists 1 to {MAX_MANIFEST_CHUNKS} chunks, this one {n}")
    if m.steps < 1 or m.tokens < 1:
        raise ProtocolError(f"delta manifest of round {m.round} claims {m.steps} steps and {m.tokens} tokens")
    entries = []
    for i, e in enumerate(m.chunks):
        what = f"delta manifest entry {i}"
        if e.index != i:
            raise ProtocolError(f"{what} is for chunk {e.index}: entries come in chunk order from 0")
        if not e.tensor or len(e.tensor) > MAX_NAME_LEN or not e.tensor.isprintable():
            raise ProtocolError(f"{what} names no tensor (or an unprintable or overlong name)")
        if e.length == 0:
            raise ProtocolError(f"{what} holds no elements")
        if e.role not in _ROLE_BACK:
            raise ProtocolError(f"{what} has unknown role {e.role}")
        if not (math.isfinite(e.energy) and e.energy >= 0 and math.isfinite(e.importance) and 0 <= e.importance <= 1):
            raise ProtocolError(f"{what} has energy {e.energy} and importance {e.importance}: energy must be "
                                f"finite and >= 0, importance in [0, 1]")
        if e.parity_group > n:
            raise ProtocolError(f"{what} is in parity group {e.parity_group - 1} of a delta of {n} chunks")
        entries.append(ChunkEntry(i, e.tensor, e.offset, e.length, _ROLE_BACK[e.role], e.energy, e.importance,
                                  e.nbytes, e.crc32, e.parity_group - 1))
    total = math.fsum(e.importance for e in entries)
    if abs(total - 1) > 1e-6:
        raise ProtocolError(f"delta manifest of round {m.round}: its chunks' importances sum to {total:.9g}, not 1")
    return Manifest(m.round, tuple(entries), m.tokens, m.steps)


def site_message_from_proto(m: pb.SiteMessage) -> SiteMessage:
    which = m.WhichOneof("body")
    if which == "manifest":
        return manifest_from_proto(m.manifest)
    if which == "join":
        j = m.join
        why = check_site_name(j.site)
        if why:
            raise ProtocolError(f"join names no valid site: {why}")
        if len(j.token) > MAX_TOKEN_LEN:
            raise ProtocolError(f"join token is longer than {MAX_TOKEN_LEN} characters")
        if len(j.device) > MAX_DEVICE_LEN or not j.device.isprintable():
            raise ProtocolError(f"join device must be at most {MAX_DEVICE_LEN} printable characters, "
                                f"got {safe_text(j.device, 60)!r}")
        resume_hash = _hash(j.resume_hash, "join resume_hash", empty_ok=True)
        return Join(j.site, j.protocol_version, j.resume_round, resume_hash, j.device, j.token)
    if which == "lane_open":
        o = m.lane_open
        if why := check_site_name(o.site):
            raise ProtocolError(f"lane open names no valid site: {why}")
        if len(o.token) > MAX_TOKEN_LEN:
            raise ProtocolError(f"lane open token is longer than {MAX_TOKEN_LEN} characters")
        return LaneOpen(o.site, o.token, o.lane)
    if which == "chunk":
        return chunk_from_proto(m.chunk)
    if which == "parity":
        if not m.parity.payload:
            raise ProtocolError(f"the parity of group {m.parity.group} of round {m.parity.round} is empty")
        return DeltaParity(m.parity.round, m.parity.group, m.parity.payload)
    if which == "metrics":
        return _metrics(m.metrics)
    if which == "hash_report":
        return HashReport(m.hash_report.round, _hash(m.hash_report.model_hash, "hash report model_hash"))
    if which == "ready":
        return Ready(m.ready.round, _hash(m.ready.model_hash, "ready model_hash"))
    if which == "link_probe":
        p = m.link_probe
        if len(p.t) != len(p.rtt_ms) or len(p.t) > MAX_PROBE_SAMPLES:
            raise ProtocolError(f"link probe needs one time per RTT (at most {MAX_PROBE_SAMPLES})")
        if not all(math.isfinite(x) and 0 <= x < MAX_SECONDS * 1000 for x in p.rtt_ms):
            raise ProtocolError("link probe RTTs must be finite, non-negative milliseconds")
        if not all(math.isfinite(x) and 0 < x < 1e10 for x in p.t):
            raise ProtocolError("link probe times must be Unix times (finite seconds after 1970)")
        return LinkProbe(tuple(p.t), tuple(p.rtt_ms))
    raise ProtocolError("empty site message")


def server_message_from_proto(m: pb.ServerMessage) -> ServerMessage:
    which = m.WhichOneof("body")
    if which == "welcome":
        w = m.welcome
        try:
            cfg = RunConfig.from_json(w.config_json)
        except ConfigError as e:
            raise ProtocolError(f"welcome carries a bad run config: {e}") from None
        if not w.run_id.isprintable() or len(w.run_id) > MAX_NAME_LEN:
            raise ProtocolError(f"welcome names an unprintable or overlong run {safe_text(w.run_id, 60)!r}")
        shards = w.shard_count or 1
        if w.shard_index >= shards:
            raise ProtocolError(f"welcome from shard {w.shard_index} of {shards}")
        return Welcome(w.run_id, w.site_index, cfg, w.round, _hash(w.model_hash, "welcome model_hash"),
                       w.model_chunks, w.data_position, w.shard_index, shards)
    if which == "chunk":
        return chunk_from_proto(m.chunk)
    if which == "round_start":
        rs = m.round_start
        if not (math.isfinite(rs.train_s) and 0 <= rs.train_s <= MAX_SECONDS):
            raise ProtocolError(f"round start asks for {rs.train_s} s of training")
        if rs.codec and rs.codec not in CODEC_MODES:
            raise ProtocolError(f"round start asks for codec {safe_text(rs.codec, 40)!r}, not one of {CODEC_MODES}")
        return RoundStart(rs.round, _hash(rs.model_hash, "round start model_hash"), rs.train_s, rs.codec)
    if which == "round_result":
        r = m.round_result
        for name in (*r.sites, *r.late_sites, *(p.site for p in r.partial)):
            if check_site_name(name):
                raise ProtocolError(f"round result names an invalid site {safe_text(name, 60)!r}")
        for p in r.partial:
            if len(set(p.chunks)) != len(p.chunks) or any(i >= MAX_MANIFEST_CHUNKS for i in p.chunks):
                raise ProtocolError(f"round result counts chunks of {p.site!r} twice or out of range")
        return RoundResult(r.round, _hash(r.model_hash, "round result model_hash"), tuple(r.sites), r.val_loss,
                           tuple(r.late_sites), partial_chunks=tuple((p.site, frozenset(p.chunks)) for p in r.partial),
                           tail_chunks=r.tail_chunks)
    if which == "delta_outcome":
        o = m.delta_outcome
        if o.outcome not in DELTA_OUTCOMES:
            raise ProtocolError(f"delta outcome {safe_text(o.outcome, 40)!r} is not one of {', '.join(DELTA_OUTCOMES)}")
        return DeltaOutcome(o.round, o.outcome, safe_text(o.reason, 2000))
    if which == "error":
        return ErrorMessage(safe_text(m.error.code, 64), safe_text(m.error.message, 2000))
    if which == "lane_ack":
        a = m.lane_ack
        if a.item not in _LANE_ITEM_NAME:
            raise ProtocolError(f"lane ack of an unknown item {a.item}")
        return LaneAck(a.round, _LANE_ITEM_NAME[a.item], a.index)
    raise ProtocolError("empty server message")
