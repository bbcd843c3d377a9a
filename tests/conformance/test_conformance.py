"""Conformance: a site implemented from docs/protocol.md alone drives a real parameter server.

The PS is a real `wantrain ps` process; everything on this side (the examples of the spec, the
chunk plan, the quantizer, the Huffman coder and decoder, the hash, the float32 rules) comes
from spec_site.py, which imports only the generated stubs. Two rounds with the PS's own
int8 + Huffman updates end with this replica bit-identical to the PS's.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import numpy as np
import pytest

from wantrain.transport.proto.v1 import ps_pb2 as pb
from wantrain.transport.proto.v1 import ps_pb2_grpc as pb_grpc

from . import spec_site as spec

SECRET = "conformance-secret-0123456789"      # the token of the spec's example Join


# ------------------------------------------------------------------ the examples of section 11

def test_example_join_is_what_the_spec_says():
    m = pb.SiteMessage.FromString(bytes.fromhex(spec.golden("join")))
    j = m.join
    assert (j.site, j.protocol_version, j.device, j.token) == ("conformance", 5, "spec-example", SECRET)


def test_example_huffman_payload_decodes_and_encodes_as_the_spec_derives_it():
    payload = bytes.fromhex(spec.golden("huffman_payload"))
    symbols = np.array([0, 0, 1, -1, 0, 2, 0, 0, -1, 1], np.int8)
    assert list(spec.huffman_decode(payload).view(np.int8)) == list(symbols)
    lengths = np.zeros(256, np.uint8)
    lengths[[0, 255, 1, 2]] = [1, 2, 3, 3]                 # as the spec derives them
    assert [format(int(c), "b") for c in spec.canonical_codes(lengths)[[0, 255, 1, 2]]] == ["0", "10", "110", "111"]
    assert spec.huffman_encode(symbols, lengths, block=4) == payload


def test_example_delta_chunk_decodes_to_its_values():
    c = pb.SiteMessage.FromString(bytes.fromhex(spec.golden("delta_chunk"))).chunk
    assert (c.kind, c.tensor, c.length, c.encoding, c.quant_block, c.crc32) == (
        pb.CHUNK_KIND_DELTA, "w", 10, pb.ENCODING_INT8_HUFFMAN, 8, 791083444)
    assert list(spec.decode_chunk(c)) == [0, 0, 0.5, -0.5, 0, 1, 0, 0, -0.25, 0.25]


GOLDEN_CODEC = Path(__file__).resolve().parents[1] / "codec" / "golden"


@pytest.mark.parametrize("mode", ["int4-huffman", "ternary-huffman", "sign", "topk"])
def test_chunks_below_8_bits_decode_from_the_spec_as_the_codec_decodes_them(mode):
    """The codec's golden chunk of each encoding below 8 bits (tests/codec/test_golden.py), decoded
    from section 5 alone: the values whose hash the codec's own decoder is held to."""
    c = pb.SiteMessage.FromString((GOLDEN_CODEC / f"delta_{mode}.bin").read_bytes()).chunk
    values = spec.decode_chunk(c).astype("<f4")
    assert hashlib.sha256(values.tobytes()).hexdigest() == json.loads(
        (GOLDEN_CODEC / "decoded_sha256.json").read_text())[mode]


def test_example_manifest_describes_the_example_chunk():
    m = pb.SiteMessage.FromString(bytes.fromhex(spec.golden("manifest"))).manifest
    chunk = pb.SiteMessage.FromString(bytes.fromhex(spec.golden("delta_chunk"))).chunk
    (e,) = m.chunks
    assert (m.round, m.tokens, m.steps) == (0, 64, 1)
    assert (e.index, e.tensor, e.offset, e.length, e.role, e.parity_group) == (0, "w", 0, 10, pb.ROLE_MLP, 0)
    assert e.energy == float(np.sum(spec.decode_chunk(chunk).astype(np.float64) ** 2)) == 1.625
    assert e.importance == 1.0 and e.nbytes == len(chunk.scales) + len(chunk.payload) and e.crc32 == chunk.crc32


def test_example_parity_is_the_xor_of_its_members_padded():
    p = pb.SiteMessage.FromString(bytes.fromhex(spec.golden("parity"))).parity
    chunk = pb.SiteMessage.FromString(bytes.fromhex(spec.golden("delta_chunk"))).chunk
    second = bytes.fromhex("0000803f00000040") + bytes(range(1, 11))
    assert (p.round, p.group) == (0, 0)
    assert p.payload == spec.parity([chunk.scales + chunk.payload, second])
    # and the PS's rebuild: the first member from the parity and the second
    assert spec.parity([p.payload, second]) == chunk.scales + chunk.payload


def test_example_hash():
    tensors = {"a": np.array([1.0, -2.0], np.float32), "b.weight": np.array([0.5], np.float32)}
    assert spec.model_hash(tensors) == spec.golden("model_hash")


def test_example_plan():
    assert spec.plan([("x", 10_000), ("y", 100)], spec.chunk_elements(
        {"chunk_bytes": 4096, "quant_block": 4096}, fp32=False)) == [
        ("x", 0, 4096), ("x", 4096, 4096), ("x", 8192, 1808), ("y", 0, 100)]


# ------------------------------------------------------------------ a real PS

CONFIG = {   # section 9: a partial config; the PS fills in the defaults and sends them all
    "num_sites": 1, "sites": ["conformance"],
    "model": {"preset": "tiny", "block_size": 64},
    # round 1's update comes with a tail (3.6): past the warm-up (1 round), before the last
    "train": {"rounds": 3, "inner_steps": 2, "batch_size": 4, "eval_batches": 1, "warmup_steps": 1},
    "recovery": {"reliable_rounds": 1, "downlink_budget": 0.3},
    "codec": {"mode": "int8-huffman"},
}


@pytest.fixture
def ps(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    (tmp_path / "secret").write_text(SECRET)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(tmp_path / "ps.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "wantrain", "ps", "--config", str(tmp_path / "config.json"),
                             "--port", str(port), "--port-file", str(tmp_path / "port"), "--run-dir",
                             str(tmp_path / "run"), "--shared-secret-file", str(tmp_path / "secret")],
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + 120
        while not (tmp_path / "port").exists():
            assert proc.poll() is None and time.time() < deadline, (tmp_path / "ps.log").read_text()
            time.sleep(0.1)
        yield f"127.0.0.1:{port}", proc, tmp_path
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        log.close()


class Session:
    """A Session stream: `send` SiteMessages, `recv` ServerMessages."""

    def __init__(self, address: str, first: pb.SiteMessage):
        self.channel = grpc.insecure_channel(address, options=[("grpc.max_receive_message_length", 4 << 20)])
        self.out: queue.Queue = queue.Queue()
        self.out.put(first)
        self.replies = pb_grpc.ParameterServerStub(self.channel).Session(iter(self.out.get, None), timeout=120)

    def send(self, **body) -> None:
        self.out.put(pb.SiteMessage(**body))

    def recv(self) -> pb.ServerMessage:
        return next(self.replies)

    def finish(self) -> None:
        """Done writing (3.8); wait for the PS to end the stream, so that every message was delivered."""
        self.out.put(None)
        for _ in self.replies:
            pass

    def close(self) -> None:
        self.out.put(None)
        self.channel.close()


@pytest.mark.timeout(120)
def test_refusals_carry_their_code_and_status(ps):
    address, _, _ = ps
    for join, code, status in [(pb.Join(site="conformance", protocol_version=1, token=SECRET), "protocol_version",
                                grpc.StatusCode.FAILED_PRECONDITION),
                               (pb.Join(site="conformance", protocol_version=5, token="wrong"), "unauthenticated",
                                grpc.StatusCode.UNAUTHENTICATED),
                               (pb.Join(site="conformance", protocol_version=5, token=SECRET, resume_hash="x"),
                                "invalid_message", grpc.StatusCode.INVALID_ARGUMENT)]:
        s = Session(address, pb.SiteMessage(join=join))
        try:
            reply = s.recv()
            assert reply.WhichOneof("body") == "error" and reply.error.code == code, reply
            with pytest.raises(grpc.RpcError) as info:
                s.recv()
            assert info.value.code() == status
        finally:
            s.close()


@pytest.mark.timeout(180)
def test_two_rounds_from_the_spec_alone(ps):
    address, proc, tmp = ps
    s = Session(address, pb.SiteMessage.FromString(bytes.fromhex(spec.golden("join"))))
    replica = spec.Replica()
    rng = np.random.default_rng(0)
    try:
        welcome = s.recv().welcome                                     # 3.2
        config = json.loads(welcome.config_json)
        assert welcome.round == 0 and config["num_sites"] == 1 and set(config) >= {"model", "train", "codec", "robust"}
        for i in range(welcome.model_chunks):
            c = s.recv().chunk
            assert (c.kind, c.index, c.count, c.encoding) == (pb.CHUNK_KIND_MODEL, i, welcome.model_chunks,
                                                              pb.ENCODING_FP32)
            replica.add_model_chunk(c)
        replica.finish_download()
        assert replica.hash() == welcome.model_hash                     # 6
        model_plan = spec.plan(replica.sizes(), spec.chunk_elements(config["codec"], fp32=True))
        assert welcome.model_chunks == len(model_plan)
        s.send(ready=pb.Ready(round=0, model_hash=replica.hash()))     # 3.3
        codec, train = config["codec"], config["train"]
        delta_plan = spec.plan(replica.sizes(), spec.chunk_elements(codec, fp32="fp32" in (codec["mode"], codec.get("update_mode"))))
        start = None
        for r in range(train["rounds"]):
            start = start or s.recv().round_start                      # 3.4
            assert start.round == r and start.model_hash == replica.hash() and start.train_s == 0
            chunks = [spec.encode_chunk(pb.CHUNK_KIND_DELTA, r, i, len(delta_plan), p,
                                        (rng.standard_normal(p[2]) * 1e-3).astype(np.float32), codec)
                      for i, p in enumerate(delta_plan)]
            tokens = train["batch_size"] * config["model"]["block_size"]
            if r == 1:                                                 # 4a: optional; round 0 goes without
                s.send(manifest=spec.manifest(r, chunks, tokens, steps=1))
            for c in chunks:                                           # 3.5
                s.send(chunk=c)
            s.send(link_probe=pb.LinkProbe(t=[time.time()], rtt_ms=[0.5]))
            s.send(metrics=pb.RoundMetrics(                            # 7
                round=r, train_loss=3.0, last_train_loss=3.0, steps=1, tokens=tokens,
                raw_bytes=4 * sum(n for _, n in replica.sizes()),
                wire_bytes=sum(len(c.scales) + len(c.payload) for c in chunks), chunks=len(chunks),
                data_position=r + 1))
            update = []
            while True:                                                # 3.6
                m = s.recv()
                if m.WhichOneof("body") == "round_result":
                    break
                assert m.chunk.kind == pb.CHUNK_KIND_UPDATE and m.chunk.round == r, m
                update.append(m.chunk)
            result = m.round_result
            start = None
            tail = result.tail_chunks
            assert (tail > 0) == (r == 1), result
            while tail:                                                # 3.6: the update's tail
                m = s.recv()
                if m.WhichOneof("body") == "round_start":                # may come before the tail
                    start = m.round_start
                    continue
                assert m.chunk.kind == pb.CHUNK_KIND_UPDATE and m.chunk.round == r, m
                update.append(m.chunk)
                tail -= 1
            assert [(c.tensor, c.offset, c.length) for c in sorted(update, key=lambda c: c.index)] == delta_plan
            replica.apply(update)
            assert result.round == r and list(result.sites) == ["conformance"]
            assert replica.hash() == result.model_hash                  # bit-identical to the PS
            s.send(hash_report=pb.HashReport(round=r, model_hash=replica.hash()))   # 3.7
        s.finish()
    finally:
        s.close()
    assert proc.wait(60) == 0, (tmp / "ps.log").read_text()[-2000:]
    events = [json.loads(line) for line in (tmp / "run" / "events.jsonl").read_text().splitlines()]   # 10
    assert all(e["v"] == 2 and {"seq", "kind", "t", "elapsed_s"} <= set(e) for e in events)
    checks = [e for e in events if e["kind"] == "hash_check"]
    assert [(e["round"], e["ok"]) for e in checks] == [(0, True), (1, True), (2, True)]
    assert [e["round"] for e in events if e["kind"] == "round_end"] == [0, 1, 2]
    assert [e["round"] for e in events if e["kind"] == "update_split"] == [1]
    assert not [e for e in events if e["kind"] in ("quarantine", "error")]
