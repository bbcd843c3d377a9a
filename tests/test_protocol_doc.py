"""docs/protocol.md stays true to the implementation: its examples, its tables, its numbers.

tests/conformance/ checks that the spec is enough to implement a site; this checks that what
the spec says is what wantrain does.
"""

import dataclasses
import re
from pathlib import Path

import numpy as np

from wantrain.transport import wire
from wantrain.codec import ChunkSpec, Codec, Encoded
from wantrain.codec import huffman
from wantrain.config import RunConfig
from wantrain.errors import Reject
from wantrain.transport.limits import Limits
from wantrain.transport.messages import DELTA, PROTOCOL_VERSION, DeltaParity, Join, TensorChunk
from wantrain.ps import STATUS
from wantrain.transport.manifest import build_manifest
from wantrain.transport.parity import xor_parity
from wantrain.models.params import param_hash
from wantrain.telemetry import EVENT_KINDS

DOC = (Path(__file__).resolve().parents[1] / "docs" / "protocol.md").read_text()


def golden(name: str) -> str:
    return re.sub(r"\s", "", re.search(rf"```hex golden={name}\n(.*?)```", DOC, re.S).group(1))


def test_examples_are_what_wantrain_sends():
    assert golden("join") == wire.site_message(Join("conformance", PROTOCOL_VERSION, 0, "", "spec-example",
                                                    "conformance-secret-0123456789")).SerializeToString().hex()
    symbols = np.array([0, 0, 1, -1, 0, 2, 0, 0, -1, 1], np.int8)
    payload = huffman.encode(symbols, block=4, tables=1)
    assert golden("huffman_payload") == payload.hex()
    enc = Encoded("int8-huffman", 10, 8, np.array([0.5, 0.25], "<f4").tobytes(), payload)
    chunk = TensorChunk(DELTA, 0, 0, 1, ChunkSpec("w", 0, 10), enc)
    assert golden("delta_chunk") == wire.site_message(chunk).SerializeToString().hex()
    assert list(Codec.decode_many([enc])[0]) == [0, 0, 0.5, -0.5, 0, 1, 0, 0, -0.25, 0.25]
    decoded = {"w": Codec.decode_many([enc])[0]}
    manifest = build_manifest(0, [(chunk.spec, enc)], decoded, {"w": "mlp"}, tokens=64, steps=1)
    assert golden("manifest") == wire.site_message(manifest).SerializeToString().hex()
    second = bytes.fromhex("0000803f00000040") + bytes(range(1, 11))
    parity = DeltaParity(0, 0, xor_parity([enc.scales + enc.payload, second]))
    assert golden("parity") == wire.site_message(parity).SerializeToString().hex()


def test_the_hash_example_is_param_hash():
    import torch

    class Two(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
            self.b = torch.nn.Linear(1, 1, bias=False)
            self.b.weight.data.fill_(0.5)

    assert param_hash(Two()) == golden("model_hash")


def test_version_limits_and_status_codes_are_as_documented():
    assert f"version {PROTOCOL_VERSION}" in DOC.splitlines()[0]
    assert f"`protocol_version` = **{PROTOCOL_VERSION}**" in DOC
    limits = Limits()
    assert f"{wire.MAX_MESSAGE_BYTES:,} bytes" in DOC and wire.MAX_MESSAGE_BYTES == limits.max_message_bytes
    for number in (limits.handshake_timeout_s, limits.join_timeout_s, limits.idle_connection_s):
        assert f"{number:g} s" in DOC
    assert f"default {limits.max_streams_per_peer}" in DOC
    assert f"{limits.probe_messages_burst} at once, then {limits.probe_messages_per_s:g} per second" in DOC
    assert f"{limits.probe_samples_burst} at once, then {limits.probe_samples_per_s:g} per second" in DOC
    assert f"{limits.downloads_per_site} per {limits.download_window_s:g} s" in DOC
    assert set(STATUS) == set(Reject) - {Reject.UNKNOWN}     # UNKNOWN: what a site calls a code it does not know
    for code in STATUS:
        row = re.search(rf"^\| `{code.value}` \| (\w+) \|", DOC, re.M)
        assert row and row.group(1) == STATUS[code].name, code


def test_every_config_field_and_event_kind_is_documented():
    cfg = RunConfig()
    for f in dataclasses.fields(cfg):
        section = getattr(cfg, f.name)
        names = [f"{f.name}.{g.name}" for g in dataclasses.fields(section)] if dataclasses.is_dataclass(section) \
            else [f.name]
        for name in names:
            assert f"`{name}`" in DOC, name
    for kind in EVENT_KINDS:
        assert f"| `{kind}` |" in DOC, kind
