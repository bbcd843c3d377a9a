"""Lanes: a site's deltas spread over extra TCP connections (train.lanes; docs/protocol.md 4b), over
real gRPC in this process (tests/harness.py). The hostile side of a lane is test_hostile.py's."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from wantrain.codec import Codec, encode_arrays
from wantrain.config import CodecConfig
from wantrain.messages import DELTA, DeltaParity, LaneAck, Manifest, TensorChunk
from wantrain.recovery import MAX_HEDGES, Transmission, build_manifest, roles_of, transmissions
from wantrain import wire
from wantrain.report import timeline_figure
from wantrain.site.lanes import Lanes
from wantrain.site.sender import HEDGE_FLOOR_S, Sender
from wantrain.telemetry import rows

from .cluster import check_run
from .harness import run_in_process
from .helpers import small_config


@pytest.mark.timeout(180)
def test_deltas_over_lanes_commit_every_round_with_replicas_equal(tmp_path):
    # Site b loses a third of its transmissions on purpose (chunk loss, i.i.d.): what the PS cannot
    # rebuild goes again, its protected chunks as hedges on another lane within 0.3 s, the rest 1 s
    # late. Every round commits once, every replica agrees at every hash check.
    rounds = 4
    cfg = small_config(num_sites=2, sites=["a", "b"], **{
        "train.rounds": rounds, "train.inner_steps": 4, "train.warmup_steps": 0, "train.reliable_rounds": 1,
        "train.deadline_s": 20.0, "train.quorum_wait_s": 1.0, "train.lanes": 3, "train.hedge_s": 0.3,
        "train.critical_copies": True, "train.parity_share": 0.5, "train.parity_group_size": 4})
    events, cluster = run_in_process(cfg, tmp_path / "run", timeout_s=150,
                                     site_options={"chunk_loss": (0.33, 1.0, 1.0)})
    check_run(events, rounds)
    lanes = rows(events, "lane")
    for site in ("a", "b"):      # three lanes each, each its own TCP connection (a port of its own)
        mine = [e for e in lanes if e["site"] == site]
        assert sorted(e["lane"] for e in mine) == [0, 1, 2], mine
        assert len({e["peer"] for e in mine}) == 3, mine
    assert len({e["peer"] for e in lanes}) == 6
    b_rounds = [e for e in rows(events, "site_round") if e["site"] == "b"]
    assert sum(e["hedged"] for e in b_rounds) > 0, b_rounds
    assert all(e["protection_bytes"] > 0 for e in b_rounds)
    # (a's chunks may be hedged too, on a busy machine: not acknowledged within 0.3 s)
    hedges = {tr.name: tr for tr in timeline_figure(events).data}["chunks hedged on another lane"]
    assert "b" in set(hedges.y) and len(hedges.x) == sum(e["hedged"] > 0 for e in rows(events, "site_round"))


class _Lanes:
    """Lanes that write nothing and remember which lane each message went on; the PS acknowledges
    each at once, but never a chunk in `deaf`."""

    def __init__(self, n: int, deaf: frozenset[int] = frozenset()) -> None:
        self.n, self.sent, self.acked, self.last_ack_at, self.deaf = n, [], set(), 0.0, deaf
        self.ack_times: list[float] = []

    def __len__(self) -> int:
        return self.n

    async def send(self, lane: int, msg) -> LaneAck:
        self.sent.append((lane, msg))
        if getattr(msg, "index", None) not in self.deaf:
            self.acked.add(LaneAck.of(msg))
            self.last_ack_at = time.perf_counter()
            self.ack_times.append(self.last_ack_at)
        return LaneAck.of(msg)

    def raise_failure(self) -> None:
        pass


def test_a_chunks_copy_and_hedge_each_take_another_lane():
    rng = np.random.default_rng(0)
    chunks, _ = encode_arrays({"w": rng.standard_normal(20000).astype(np.float32)}, Codec(CodecConfig(chunk_bytes=4096)),
                              None)
    lanes = _Lanes(3)
    out = Sender(None, lanes, 7, chunks, {0: b"\x01" * 10})
    order = [Transmission("chunk", 0), Transmission("chunk", 1), Transmission("copy", 0), Transmission("parity", 0),
             Transmission("chunk", 2)]

    async def go():
        for t in order:
            await out.send(t)
        await out.send(Transmission("chunk", 0))            # a hedge of chunk 0
    asyncio.run(go())
    on = [(lane, type(m).__name__, getattr(m, "index", getattr(m, "group", None))) for lane, m in lanes.sent]
    assert on[:5] == [(0, "TensorChunk", 0), (1, "TensorChunk", 1), (2, "TensorChunk", 0), (0, "DeltaParity", 0),
                      (1, "TensorChunk", 2)]
    assert on[5] == (1, "TensorChunk", 0)                  # the one lane chunk 0 had not taken
    assert all(isinstance(m, (TensorChunk, DeltaParity, Manifest)) and m.round == 7 for _, m in lanes.sent)
    assert all(m.kind == DELTA for _, m in lanes.sent if isinstance(m, TensorChunk))


def test_a_hedge_sends_again_only_protected_chunks_unless_hedge_all():
    # Every transmission acknowledged but the last plain chunk's (no parity: not protected) and
    # the first critical chunk's: a hedge sends the critical one again, and the plain one only
    # under train.hedge_all.
    rng = np.random.default_rng(1)
    arrays = {"h.w": rng.standard_normal(30000).astype(np.float32).reshape(100, 300),
              "h.b": rng.standard_normal(300).astype(np.float32)}
    chunks, decoded = encode_arrays({k: v.ravel() for k, v in arrays.items()}, Codec(CodecConfig(chunk_bytes=4096)),
                                    None)
    manifest = build_manifest(0, chunks, decoded, roles_of({k: v.shape for k, v in arrays.items()}))
    order = transmissions(manifest)
    critical = min(manifest.critical())
    plain = order[-1].index
    assert manifest.chunks[plain].role != "critical" and manifest.chunks[plain].group < 0

    def hedged(every_chunk: bool) -> tuple[set[int], list[int]]:
        lanes = _Lanes(3)
        out = Sender(None, lanes, 0, chunks, {})
        for t in order:
            asyncio.run(out.send(t, lost=t.index == plain))
        lanes.sent.clear()
        lanes.acked = {ack(t.index) for t in order if t.index not in (critical, plain)}
        again = asyncio.run(out.hedge(manifest, order, 0.0, None, 1.0, every_chunk))
        return again, [m.index for _, m in lanes.sent]

    def ack(i: int) -> LaneAck:
        return LaneAck.of(TensorChunk(DELTA, 0, i, len(chunks), *chunks[i]))

    assert hedged(False) == ({critical}, [critical])
    assert hedged(True) == ({critical, plain}, [critical, plain])


def _one_matrix_delta(seed: int, shape: tuple[int, int], chunk_bytes: int):
    """A delta of one weight matrix "h.w" of `shape`: its chunks, manifest and transmissions."""
    rng = np.random.default_rng(seed)
    chunks, decoded = encode_arrays({"h.w": rng.standard_normal(shape[0] * shape[1]).astype(np.float32)},
                                    Codec(CodecConfig(chunk_bytes=chunk_bytes)), None)
    manifest = build_manifest(0, chunks, decoded, roles_of({"h.w": shape}))
    return chunks, manifest, transmissions(manifest)


def test_a_hedge_that_looks_lost_goes_again_on_another_lane_a_few_times_at_most():
    # Every chunk acknowledged but one, whose every copy is lost: it is hedged once the acks have
    # stopped for hedge_s, then again each time its hedge has had hedge_s, MAX_HEDGES times in
    # all, each time on a lane it has not taken; then the hedging ends.
    chunks, manifest, order = _one_matrix_delta(3, (100, 400), chunk_bytes=4096)
    deaf = order[len(order) // 2].index
    lanes = _Lanes(4, deaf=frozenset({deaf}))
    out = Sender(None, lanes, 0, chunks, {})

    async def go():
        for t in order:
            await out.send(t)
        out.started = time.perf_counter() - 1.0
        return await out.hedge(manifest, order, 0.05, None, 1.0, every_chunk=True)
    again = asyncio.run(go())
    on = [lane for lane, m in lanes.sent if m.index == deaf]
    assert again == {deaf} and len(on) == 1 + MAX_HEDGES and len(set(on)) == 4 and out.hedged == MAX_HEDGES


def test_the_silence_taken_for_a_loss_follows_the_pace_of_the_acks():
    lanes = _Lanes(2)
    out = Sender(None, lanes, 0, [], {})
    out.started, out.rtt_s = 100.0, 0.01
    assert out.quiet_s(1.0, until=200.0) == 1.0                 # no ack yet: hedge_s
    lanes.ack_times = [100.02, 100.05, 100.06]                  # loopback: a few ms apart
    assert out.quiet_s(1.0, until=200.0) == HEDGE_FLOOR_S
    lanes.ack_times += [100.31, 100.32]                         # one gap of 0.25 s (a slow chunk)
    assert out.quiet_s(1.0, until=200.0) == pytest.approx(0.75)
    assert out.quiet_s(1.0, until=100.1) == HEDGE_FLOOR_S       # ... after the first hedge: not the flow's
    lanes.ack_times += [101.0]                                  # 0.68 s: a slow link
    assert out.quiet_s(1.0, until=200.0) == 1.0                 # never past hedge_s
    out.rtt_s = 0.3                                             # a long path: 2 round trips at least
    assert out.quiet_s(1.0, until=100.1) == pytest.approx(0.6)


class _SlowLanes(_Lanes):
    """Lanes on a slow link: the acks of what is still queued come while the hedge looks away."""

    def __init__(self, n: int, later: set) -> None:
        super().__init__(n)
        self.later = later

    def raise_failure(self) -> None:
        self.acked |= self.later
        self.last_ack_at = time.perf_counter()


def test_a_hedge_sends_again_what_was_passed_by_not_what_is_queued():
    # A delta on a slow link, 4 lanes, hedge_s 0.5 and every chunk hedged: of the first 13
    # transmissions all but two are in; the rest are queued, acks still coming. The one passed by
    # 9 later ones goes again; the one passed by 2 (lanes side by side reorder that much) and the
    # queued ones do not, and their acks come.
    chunks, manifest, order = _one_matrix_delta(2, (250, 400), chunk_bytes=2048)
    assert len(order) >= 20
    acks = [LaneAck.of(TensorChunk(DELTA, 0, t.index, len(chunks), *chunks[t.index])) for t in order]
    lanes = _SlowLanes(4, set(acks[13:]) | {acks[10]})
    out = Sender(None, lanes, 0, chunks, {})
    for t in order:
        asyncio.run(out.send(t))
    out.started = time.perf_counter() - 3.0
    lanes.sent.clear()
    lanes.acked = set(acks[:13]) - {acks[3], acks[10]}
    lanes.last_ack_at = time.perf_counter()
    again = asyncio.run(out.hedge(manifest, order, 0.5, None, 1.0, every_chunk=True))
    assert again == {order[3].index} and [m.index for _, m in lanes.sent] == [order[3].index]


class _EchoCall:
    """A Lane call whose PS acknowledges each message as it is written."""

    def __init__(self) -> None:
        self.acks: asyncio.Queue = asyncio.Queue()

    async def write(self, m) -> None:
        self.acks.put_nowait(wire.server_message(LaneAck.of(wire.site_message_from_proto(m))))

    async def read(self):
        return await self.acks.get()


def test_lanes_settle_on_every_ack_and_forget_a_settled_round():
    async def go():
        lanes = Lanes([], [_EchoCall(), _EchoCall()])
        for r in (3, 4):
            for g in range(5):
                await lanes.send(g % 2, DeltaParity(r, g, b"\x01"))
        await lanes.settled()
        assert not lanes.in_flight and len(lanes.acked) == 10
        lanes.forget(3)                           # nothing of a settled round stays behind
        assert {a.round for a in lanes.acked} == {4} and len(lanes.acked) == 5
        await lanes.close()
    asyncio.run(go())
