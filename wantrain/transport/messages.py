"""The domain objects that travel between a site and the parameter server.

These are plain dataclasses; wire.py is the one place that turns them into protobuf messages
and back (and checks what arrives). Nothing else in wantrain touches the generated code.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..codec import ChunkSpec, Encoded
from ..config import RunConfig
from .manifest import ChunkEntry, Manifest

__all__ = ["PROTOCOL_VERSION", "HASH_HEX_DIGITS", "MAX_STALENESS", "MODEL", "DELTA", "UPDATE", "Join", "Welcome",
           "TensorChunk", "RoundStart", "RoundMetrics", "RoundResult", "Ready", "HashReport", "LinkProbe", "ErrorMessage",
           "DeltaOutcome", "DELTA_OUTCOMES", "Manifest", "ChunkEntry", "DeltaParity", "LaneOpen", "LaneAck", "LANE_ITEMS"]

# 2: Watch and Ping need a token; delta chunks must use the run's encoding and follow the PS's
# chunk plan; hashes are 16 lowercase hex digits; limits and status codes as in docs/protocol.md.
# 3: a site that missed a deadline is not counted on until heard from; DeltaOutcome tells a site
# what became of a delta that was not simply counted; RoundMetrics.comm_s is send_s.
# 4: a DeltaManifest may come before a delta's chunks (transport/manifest.py: the domain object).
PROTOCOL_VERSION = 5
MODEL, DELTA, UPDATE = "model", "delta", "update"   # chunk kinds
MAX_STALENESS = 2   # a late delta more rounds old than this is dropped even under the "stale" policy:
                    # both sides use it (the PS to drop, the site to carry the delta forward)
HASH_HEX_DIGITS = 16     # a parameter hash: the first 16 hex digits of a SHA-256 (see replica.param_hash)


@dataclass(frozen=True)
class Join:
    site: str
    protocol_version: int = PROTOCOL_VERSION
    resume_round: int = 0
    resume_hash: str = ""
    device: str = "cpu"
    token: str = field(default="", repr=False)


@dataclass(frozen=True)
class Welcome:
    run_id: str
    site_index: int
    config: RunConfig
    round: int
    model_hash: str
    model_chunks: int
    data_position: int = 0    # batches this site has drawn from its shard, as the PS last heard
    shard: int = 0            # which PS shard sent it (shards.py), of `shards`
    shards: int = 1


@dataclass(frozen=True)
class TensorChunk:
    kind: str            # MODEL | DELTA | UPDATE
    round: int
    index: int
    count: int
    spec: ChunkSpec
    data: Encoded


@dataclass(frozen=True)
class DeltaParity:
    """The XOR parity of one parity group of a delta (transport/parity.py): the manifest's entries
    with `group` are its members; `payload` is as long as the longest of them."""

    round: int
    group: int
    payload: bytes


@dataclass(frozen=True)
class LaneOpen:
    """The first message of a Lane: an extra connection of the joined site `site` for its deltas."""

    site: str
    token: str = field(default="", repr=False)
    lane: int = 0


LANE_ITEMS = ("manifest", "chunk", "parity")


@dataclass(frozen=True)
class LaneAck:
    """The PS took one message of a Lane: a delta's manifest, chunk `index` or the parity of group `index`."""

    round: int
    item: str            # one of LANE_ITEMS
    index: int = 0

    @classmethod
    def of(cls, msg: Manifest | TensorChunk | DeltaParity) -> LaneAck:
        if isinstance(msg, Manifest):
            return cls(msg.round, "manifest")
        if isinstance(msg, DeltaParity):
            return cls(msg.round, "parity", msg.group)
        return cls(msg.round, "chunk", msg.index)


@dataclass(frozen=True)
class RoundStart:
    round: int
    model_hash: str
    train_s: float = 0.0      # > 0: compute budget in seconds; 0: the configured inner steps
    codec: str = ""           # this round's delta encoding, the controller's choice ("": the site's own)


@dataclass(frozen=True)
class RoundMetrics:
    round: int
    train_loss: float
    last_train_loss: float
    tokens: int
    steps: int
    raw_bytes: int
    wire_bytes: int
    huffman_bits_per_symbol: float
    encode_s: float
    decode_s: float
    compute_s: float
    send_s: float             # in the send calls (gRPC buffers): not time on the wire
    chunks: int
    emulated_s: float = 0.0
    data_position: int = 0    # batches drawn from the shard so far, this round included
    wait_s: float = 0.0       # idle (not computing) between the previous push and this round's start
    steps_ahead: int = 0      # of `steps`, those taken before the RoundStart (overlap schedule)
    hedged: int = 0           # hedges: chunks sent again on another lane, once per hedge (recovery.hedge_s)
    download_s: float = 0.0   # the update this round started from: its first chunk to its result, at the site
    turnaround_s: float = 0.0  # the first chunk of that update (or the RoundStart) to the delta's first message sent


@dataclass(frozen=True)
class RoundResult:
    round: int
    model_hash: str
    sites: tuple[str, ...] = field(default_factory=tuple)
    val_loss: float = float("nan")
    late_sites: tuple[str, ...] = field(default_factory=tuple)   # late deltas applied (late_policy)
    # Sites of which the round counted the chunks in at its deadline, and which (recovery.partial_deltas).
    partial_chunks: tuple[tuple[str, frozenset[int]], ...] = ()
    # Update chunks that follow the result, after the next RoundStart (recovery.downlink_budget): the
    # site trains without them and patches each in as it lands.
    tail_chunks: int = 0
    # Only in a sharded PS's merged result (site/sharded.py), never on the wire: a site that some
    # shards counted and others did not, with the tensors whose part was counted.
    partial_sites: tuple[tuple[str, frozenset[str]], ...] = ()
    partial_late: tuple[tuple[str, frozenset[str]], ...] = ()


@dataclass(frozen=True)
class Ready:
    round: int          # committed rounds of the model the site loaded
    model_hash: str


@dataclass(frozen=True)
class HashReport:
    round: int
    model_hash: str


@dataclass(frozen=True)
class LinkProbe:
    t: tuple[float, ...]
    rtt_ms: tuple[float, ...]


DELTA_OUTCOMES = ("dropped", "deferred", "rejected", "clipped")


@dataclass(frozen=True)
class DeltaOutcome:
    round: int
    outcome: str        # one of DELTA_OUTCOMES
    reason: str


@dataclass(frozen=True)
class ErrorMessage:
    code: str
    message: str
