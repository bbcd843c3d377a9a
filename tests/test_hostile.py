"""Hostile input against a running PS with TLS and per-site tokens.

Each attack gets the right gRPC status, the PS stays up, and the global model is unchanged
(no round commits, and the model a legitimate site downloads afterwards has the same hash).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import queue
import socket
import ssl
import time

import grpc
import numpy as np
import pytest

from wantrain.transport import wire
from wantrain.codec import Codec, EncodeStats, encode_arrays
from wantrain.transport.messages import (DELTA, PROTOCOL_VERSION, HashReport, Join, LaneAck, LaneOpen, LinkProbe,
                                         Ready, RoundMetrics, RoundStart, TensorChunk, Welcome)
from wantrain.transport.proto.v1 import ps_pb2 as pb
from wantrain.telemetry import read_events, rows
from wantrain.transport.tls import make_dev_certs
from wantrain.launch.argv import ps_args

from .helpers import Proc, free_port, small_config

TOKENS = {"a": "token-of-a-0123456789", "b": "token-of-b-9876543210"}
# One PS (a module fixture) takes every attack in turn and the last tests read what it logged of
# them: the module's tests run on one xdist worker, in order (make test's --dist loadgroup), or a
# worker that got only those last tests would find a PS nobody attacked.
pytestmark = pytest.mark.xdist_group("hostile")
JOINS_SENT: collections.Counter[str] = collections.Counter()    # well-formed Joins with a true token, by site


class _Raw(bytes):
    """Bytes sent as a SiteMessage without serializing (see HandSite.send_raw)."""


def _serialize(m) -> bytes:
    return bytes(m) if isinstance(m, _Raw) else m.SerializeToString()


class HandSite:
    """A site driven by hand: every message it sends is chosen by the test."""

    def __init__(self, address: str, creds: grpc.ChannelCredentials | None, name: str, token: str,
                 version: int = PROTOCOL_VERSION, first: bytes | None = None, **join):
        opts = [("grpc.ssl_target_name_override", "localhost"), ("grpc.max_send_message_length", 64 << 20)]
        self.ch = grpc.secure_channel(address, creds, options=opts) if creds else grpc.insecure_channel(address)
        self.out: queue.Queue = queue.Queue()
        if first is not None:
            self.out.put(_Raw(first))
        else:
            self.out.put(wire.site_message(Join(name, protocol_version=version, token=token, **join)))
            JOINS_SENT[name] += TOKENS.get(name) == token
        session = self.ch.stream_stream("/wantrain.v1.ParameterServer/Session", request_serializer=_serialize,
                                        response_deserializer=pb.ServerMessage.FromString)
        self.stream = session(iter(self.out.get, None), timeout=60)
        self.sizes: dict[str, int] = {}
        self.welcome: Welcome | None = None

    def send(self, msg) -> None:
        self.out.put(msg if isinstance(msg, pb.SiteMessage) else wire.site_message(msg))

    def send_raw(self, raw: bytes) -> None:
        """Bytes as they are, whatever protobuf makes of them."""
        self.out.put(_Raw(raw))

    def recv(self):
        return wire.server_message_from_proto(next(self.stream))

    def enter(self) -> Welcome:
        """Read the Welcome and the model, say Ready."""
        self.welcome = self.recv()
        assert isinstance(self.welcome, Welcome), self.welcome
        for _ in range(self.welcome.model_chunks):
            c = self.recv()
            self.sizes[c.spec.tensor] = self.sizes.get(c.spec.tensor, 0) + c.spec.length
        self.send(Ready(self.welcome.round, self.welcome.model_hash))
        return self.welcome

    def wait_round(self) -> RoundStart:
        m = self.recv()
        assert isinstance(m, RoundStart), m
        return m

    def delta(self, round_: int, seed: int = 0, scale: float = 1e-3):
        rng = np.random.default_rng(seed)
        values = {k: (rng.standard_normal(n) * scale).astype(np.float32) for k, n in self.sizes.items()}
        stats = EncodeStats()
        chunks, _ = encode_arrays(values, Codec(self.welcome.config.codec), None, stats)
        msgs = [TensorChunk(DELTA, round_, i, len(chunks), spec, enc) for i, (spec, enc) in enumerate(chunks)]
        t = self.welcome.config.train
        metrics = RoundMetrics(round=round_, train_loss=3.0, last_train_loss=3.0,
                               tokens=t.batch_size * self.welcome.config.model.block_size, steps=1,
                               raw_bytes=stats.raw_bytes, wire_bytes=stats.wire_bytes, huffman_bits_per_symbol=0.0,
                               encode_s=0, decode_s=0, compute_s=1, send_s=0, chunks=len(msgs))
        return msgs, metrics

    def status(self) -> grpc.RpcError | None:
        """Say nothing more, then drain the stream until the PS ends it; its final status (None if
        it ended OK). The PS takes what was sent in order, so a bad message is judged first; and a
        stream whose peer is still open would be read for servicer.DRAIN_S before it ends."""
        self.out.put(None)
        try:
            for _ in self.stream:
                pass
        except grpc.RpcError as e:
            return e
        return None

    def close(self) -> None:
        self.out.put(None)
        self.stream.cancel()
        self.ch.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hostile")
    certs = make_dev_certs(tmp / "tls")
    # No round may commit while the attacks run: round 0 waits for b, which never sends (a valid
    # delta of a's would otherwise close it at 3x a's time).
    cfg = small_config(num_sites=2, sites=["a", "b"], **{"train.rounds": 2, "schedule.deadline_min_s": 3600.0,
                                                          "schedule.deadline_initial_s": 3600.0})
    (tmp / "c.json").write_text(cfg.to_json())
    (tmp / "tokens.json").write_text(json.dumps(TOKENS))
    port = free_port()
    proc = Proc(*ps_args(tmp / "c.json", port=port, run_dir=tmp / "run"),
                "--tokens", str(tmp / "tokens.json"), "--tls-cert", str(certs.server_cert),
                "--tls-key", str(certs.server_key), log=tmp / "ps.log")
    proc.wait_for("listening on")
    address = f"127.0.0.1:{port}"
    creds = certs.client().credentials()
    b = HandSite(address, creds, "b", TOKENS["b"])       # the honest other site, present throughout
    h0 = b.enter().model_hash
    yield address, creds, proc, tmp, h0
    b.close()
    proc.kill()


def attacker(server, name="a", token=TOKENS["a"], **kw) -> HandSite:
    address, creds, *_ = server
    return HandSite(address, creds, name, token, **kw)


def in_round(server) -> HandSite:
    """Site a joins properly and is in round 0 (b is already there)."""
    a = attacker(server)
    a.enter()
    assert a.wait_round().round == 0
    return a


def assert_unharmed(server) -> None:
    address, creds, proc, tmp, h0 = server
    assert proc.p.poll() is None, proc.text()[-2000:]
    assert not rows(read_events(tmp / "run"), "round_end"), "a round committed"
    probe = HandSite(address, creds, "a", TOKENS["a"])     # the model a site downloads is the same
    try:
        w = probe.recv()
        assert isinstance(w, Welcome) and w.model_hash == h0 and w.round == 0
    finally:
        probe.close()
    time.sleep(0.3)        # the PS notices the probe has gone before the next attack joins as a


def chunk_proto(c: TensorChunk, **override) -> pb.SiteMessage:
    m = wire.site_message(c)
    for k, v in override.items():
        setattr(m.chunk, k, v)
    return m


@pytest.mark.timeout(60)
@pytest.mark.parametrize("attack, code, needle", [
    ("duplicated_chunk", grpc.StatusCode.INVALID_ARGUMENT, "arrived twice"),
    ("replayed_old_round", grpc.StatusCode.INVALID_ARGUMENT, "not in that round"),
    ("out_of_range_offset", grpc.StatusCode.INVALID_ARGUMENT, "outside"),
    ("wrong_shape", grpc.StatusCode.INVALID_ARGUMENT, "elements has"),
    ("bad_crc", grpc.StatusCode.INVALID_ARGUMENT, "CRC"),
    ("nan_scales", grpc.StatusCode.INVALID_ARGUMENT, "non-finite"),
    ("inf_scales", grpc.StatusCode.INVALID_ARGUMENT, "non-finite"),
    ("wrong_encoding", grpc.StatusCode.INVALID_ARGUMENT, "codec.mode"),
    ("huge_delta", grpc.StatusCode.INVALID_ARGUMENT, "max_delta_ratio"),
    ("tokens_lie", grpc.StatusCode.INVALID_ARGUMENT, "tokens"),
    ("steps_lie", grpc.StatusCode.INVALID_ARGUMENT, "inner steps"),
    ("metrics_twice", grpc.StatusCode.INVALID_ARGUMENT, "arrived twice"),
    ("unparseable", grpc.StatusCode.INVALID_ARGUMENT, "protobuf can parse"),
    ("hash_of_future_round", grpc.StatusCode.INVALID_ARGUMENT, "not been committed"),
    ("ready_twice", grpc.StatusCode.INVALID_ARGUMENT, "no model download is waiting"),
    ("probe_flood", grpc.StatusCode.RESOURCE_EXHAUSTED, "RTT samples faster"),
    ("control_flood", grpc.StatusCode.RESOURCE_EXHAUSTED, "link probes faster"),
    ("wrong_hash_reports", grpc.StatusCode.INVALID_ARGUMENT, "not been committed"),
    ("oversized_message", grpc.StatusCode.RESOURCE_EXHAUSTED, ""),
    ("metrics_before_chunks", grpc.StatusCode.INVALID_ARGUMENT, "metrics after"),
])
def test_bad_messages_from_a_joined_site(server, attack, code, needle):
    a = in_round(server)
    try:
        msgs, metrics = a.delta(0)
        c0 = msgs[0]
        if attack == "duplicated_chunk":
            a.send(c0), a.send(c0)
        elif attack == "replayed_old_round":
            a.send(chunk_proto(c0, round=7))
        elif attack == "out_of_range_offset":
            a.send(chunk_proto(c0, offset=10**9))
        elif attack == "wrong_shape":
            a.send(chunk_proto(c0, encoding=pb.ENCODING_INT8, length=c0.spec.length + 5))
        elif attack == "bad_crc":
            a.send(chunk_proto(c0, crc32=c0.data.payload.__len__()))
        elif attack in ("nan_scales", "inf_scales", "wrong_encoding", "huge_delta"):
            from wantrain.codec import Encoded
            first = msgs[0]
            s = np.frombuffer(first.data.scales, np.float32).copy()
            if attack == "wrong_encoding":
                enc = Encoded("fp32", first.spec.length, 0, b"", np.zeros(first.spec.length, np.float32).tobytes())
            else:
                s[0] = {"nan_scales": np.nan, "inf_scales": np.inf, "huge_delta": 1e36}[attack]
                enc = Encoded(first.data.encoding, first.data.length, first.data.quant_block, s.tobytes(),
                              first.data.payload)
            for c in [TensorChunk(DELTA, 0, 0, first.count, first.spec, enc)] + msgs[1:]:
                a.send(c)
            a.send(metrics)
        elif attack in ("tokens_lie", "steps_lie", "metrics_twice"):
            for c in msgs:
                a.send(c)
            lie = {"tokens_lie": dict(tokens=2**64 - 1), "steps_lie": dict(steps=2**32 - 1), "metrics_twice": {}}
            a.send(dataclasses.replace(metrics, **lie[attack]))
            if attack == "metrics_twice":
                a.send(metrics)
        elif attack == "unparseable":
            a.send_raw(b"\x12\xff\xff\xff\xff\x0f")        # a chunk field whose length runs past the end
        elif attack == "hash_of_future_round":
            a.send(HashReport(0, a.welcome.model_hash))          # no round has been committed
        elif attack == "ready_twice":
            a.send(Ready(a.welcome.round, a.welcome.model_hash))
        elif attack == "control_flood":
            for i in range(200):
                a.send(LinkProbe((1.7e9 + i,), (10.0,)))
        elif attack == "wrong_hash_reports":                      # finding 4: 200 reports, 4.4 KB
            for _ in range(200):
                a.send(HashReport(0, "0" * 16))
        elif attack == "probe_flood":
            for _ in range(2100):                                 # 2.1 million samples, 1000 a message
                a.send(LinkProbe(tuple(1.7e9 + k for k in range(1000)), (10.0,) * 1000))
        elif attack == "oversized_message":
            a.send(chunk_proto(c0, payload=b"\0" * (8 << 20)))
        elif attack == "metrics_before_chunks":
            a.send(metrics)
        err = a.status()
    finally:
        a.close()
    assert err is not None and err.code() == code, err
    assert needle in (err.details() or "")
    if attack in ("nan_scales", "huge_delta"):
        assert rows(read_events(server[3] / "run"), "quarantine")
    assert_unharmed(server)


class HandLane(HandSite):
    """A Lane call driven by hand (docs/protocol.md 4b): `first` is its first message."""

    def __init__(self, server, first) -> None:
        address, creds, *_ = server
        self.ch = grpc.secure_channel(address, creds, options=[("grpc.ssl_target_name_override", "localhost")])
        self.out: queue.Queue = queue.Queue()
        self.send(first)
        lane = self.ch.stream_stream("/wantrain.v1.ParameterServer/Lane", request_serializer=_serialize,
                                     response_deserializer=pb.ServerMessage.FromString)
        self.stream = lane(iter(self.out.get, None), timeout=60)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("attack, code, needle", [
    ("wrong_token", grpc.StatusCode.UNAUTHENTICATED, "wrong token"),
    ("no_session", grpc.StatusCode.PERMISSION_DENIED, "no Session open"),
    ("join_on_a_lane", grpc.StatusCode.INVALID_ARGUMENT, "must be a LaneOpen"),
    ("metrics_on_a_lane", grpc.StatusCode.INVALID_ARGUMENT, "a lane carries"),
    ("bad_crc_on_a_lane", grpc.StatusCode.INVALID_ARGUMENT, "CRC"),
    ("too_many_lanes", grpc.StatusCode.RESOURCE_EXHAUSTED, "lanes open already"),
])
def test_bad_lanes(server, attack, code, needle):
    a = in_round(server) if attack not in ("wrong_token", "no_session", "join_on_a_lane") else None
    lanes: list[HandLane] = []
    try:
        if attack == "wrong_token":
            lanes.append(HandLane(server, LaneOpen("b", "not-the-token")))
        elif attack == "no_session":
            lanes.append(HandLane(server, LaneOpen("a", TOKENS["a"])))
        elif attack == "join_on_a_lane":
            lanes.append(HandLane(server, Join("a", token=TOKENS["a"])))
        elif attack == "too_many_lanes":
            msgs, _ = a.delta(0)
            for i in range(8):                         # eight lanes, each open: it takes a chunk
                lanes.append(HandLane(server, LaneOpen("a", TOKENS["a"], i)))
                lanes[-1].send(msgs[i])
                assert lanes[-1].recv() == LaneAck(0, "chunk", msgs[i].index)
            lanes.insert(0, HandLane(server, LaneOpen("a", TOKENS["a"], 8)))
        else:
            lane = HandLane(server, LaneOpen("a", TOKENS["a"]))
            lanes.append(lane)
            msgs, metrics = a.delta(0)
            lane.send(msgs[0])                     # taken as on the Session, and acknowledged
            assert lane.recv() == LaneAck(0, "chunk", 0)
            lane.send(metrics if attack == "metrics_on_a_lane" else chunk_proto(msgs[1], crc32=12345))
        err = lanes[0].status()
    finally:
        for lane in lanes:
            lane.close()
        if a is not None:
            a.close()
    assert err is not None and err.code() == code, err
    assert needle in (err.details() or "")
    assert_unharmed(server)


@pytest.mark.timeout(60)
def test_a_truncated_stream_changes_nothing(server):
    a = in_round(server)
    msgs, _ = a.delta(0)
    for c in msgs[: len(msgs) // 2]:
        a.send(c)
    time.sleep(0.3)
    a.close()                                  # the site vanishes mid-push
    server[2].wait_for("site a left")
    assert_unharmed(server)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("who, code", [
    (dict(name="a", token="wrong"), grpc.StatusCode.UNAUTHENTICATED),
    (dict(name="a", token=""), grpc.StatusCode.UNAUTHENTICATED),
    (dict(name="eve", token=TOKENS["a"]), grpc.StatusCode.UNAUTHENTICATED),
    (dict(name="a", token=TOKENS["a"], version=PROTOCOL_VERSION + 1), grpc.StatusCode.FAILED_PRECONDITION),
    # finding 5: strings and numbers from the wire
    (dict(name="a", token=TOKENS["a"], device="x" * 3_000_000), grpc.StatusCode.INVALID_ARGUMENT),
    (dict(name="a", token=TOKENS["a"], device="cpu\n2026-11-30 12:00:00 INFO wantrain.ps: forged"),
     grpc.StatusCode.INVALID_ARGUMENT),
    (dict(name="a", token=TOKENS["a"], resume_hash="\x1b[2J\x07"), grpc.StatusCode.INVALID_ARGUMENT),
    (dict(name="a", token=TOKENS["a"], resume_round=2**64 - 1), grpc.StatusCode.INVALID_ARGUMENT),
    (dict(name="a\nb", token=TOKENS["a"]), grpc.StatusCode.INVALID_ARGUMENT),
    # finding 6: a first message protobuf cannot parse
    (dict(name="a", token="", first=b"\x0a\x05hello"), grpc.StatusCode.INVALID_ARGUMENT),
    (dict(name="a", token="", first=b"\xff" * 64), grpc.StatusCode.INVALID_ARGUMENT),
])
def test_refused_joins(server, who, code):
    a = attacker(server, **who)
    try:
        err = a.status()
    finally:
        a.close()
    assert err is not None and err.code() == code, err
    assert_unharmed(server)


@pytest.mark.timeout(60)
def test_what_peers_sent_stays_bounded_in_the_log_and_the_events(server):
    """Finding 5, after the attacks above: no line of the PS's log or its event log was forged or
    blown up by what a peer sent, and no traceback (finding 6)."""
    _, _, proc, tmp, _ = server
    log_lines = proc.text().splitlines()
    event_lines = (tmp / "run" / "events.jsonl").read_text().splitlines()
    assert not [ln for ln in log_lines if "forged" in ln and not ln.startswith("20") or ln.startswith("2026-11-30")]
    assert max(map(len, log_lines)) < 2000
    long = {json.loads(ln)["kind"] for ln in event_lines if len(ln) > 4000}
    assert long <= {"run_start", "link_rtt"}, long      # the config; at most 1000 RTT samples a message
    assert not any("\x1b" in ln or "\x07" in ln for ln in log_lines + event_lines)
    assert "Traceback" not in proc.text()
    downloads = [e for e in rows(read_events(tmp / "run"), "join") if e["site"] == "a"]
    # finding 4: a join (a model download) for each Join a sent, never one per hash report; whether a
    # probe that hangs up at once is logged as joined depends on timing, so this bounds, not counts
    assert 0 < len(downloads) <= JOINS_SENT["a"] < 200


@pytest.mark.timeout(60)
def test_plaintext_and_garbage_on_a_tls_port(server):
    address, creds, proc, *_ = server
    plain = attacker((address, None, *server[2:]))
    try:
        err = plain.status()
    finally:
        plain.close()
    assert err is not None and err.code() == grpc.StatusCode.UNAVAILABLE
    host, port = address.split(":")
    for blob in (b"\x00GARBAGE" * 1000, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\xff" * 100):
        with socket.create_connection((host, int(port))) as s:
            s.sendall(blob)
            time.sleep(0.2)
    ctx = ssl.create_default_context(cafile=None)     # a TLS client that trusts nothing of ours
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    with socket.create_connection((host, int(port))) as raw, ctx.wrap_socket(raw) as s:
        s.sendall(b"\x00" * 4096)                      # TLS fine, then not HTTP/2
        time.sleep(0.2)
    assert_unharmed(server)
