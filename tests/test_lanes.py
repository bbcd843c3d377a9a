"""Lanes: a site's deltas spread over extra TCP connections (recovery.lanes; docs/protocol.md 4b), over
real gRPC in this process (tests/harness.py). The hostile side of a lane is test_hostile.py's."""

from __future__ import annotations

import asyncio
import contextlib
import time

import numpy as np
import pytest

from wantrain.codec import Codec, encode_arrays
from wantrain.config import CodecConfig
from wantrain.transport.messages import DELTA, DeltaParity, LaneAck, Manifest, TensorChunk
from wantrain.transport.sending import MAX_HEDGES, Transmission, transmissions
from wantrain.transport.manifest import build_manifest
from wantrain.transport.roles import roles_of
from wantrain.transport import wire
from wantrain.telemetry.charts import timeline_figure
from wantrain.site.lanes import Lanes
from wantrain.site.sender import Sender, Sent, overdue
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
        "train.rounds": rounds, "train.inner_steps": 4, "train.warmup_steps": 0, "recovery.reliable_rounds": 1,
        "schedule.deadline_s": 20.0, "schedule.quorum_wait_s": 1.0, "recovery.lanes": 3, "recovery.hedge_s": 0.3,
        "recovery.critical_copies": True, "recovery.parity_share": 0.5, "recovery.parity_group_size": 4})
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
    each at once, on its lane, but never a chunk in `deaf`."""

    def __init__(self, n: int, deaf: frozenset[int] = frozenset()) -> None:
        self.n, self.sent, self.acked, self.acked_on, self.deaf = n, [], set(), {}, deaf
        self.rate_Bps = 0.0

    def __len__(self) -> int:
        return self.n

    async def send(self, lane: int, msg) -> LaneAck:
        self.sent.append((lane, msg))
        if getattr(msg, "index", None) not in self.deaf:
            self.ack(lane, LaneAck.of(msg))
        return LaneAck.of(msg)

    def ack(self, lane: int, item: LaneAck) -> None:
        self.acked.add(item)
        self.acked_on.setdefault((lane, item), time.perf_counter())

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
    # under recovery.hedge_all.
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
        lanes.acked_on = {k: at for k, at in lanes.acked_on.items() if k[1] in lanes.acked}
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
        return await out.hedge(manifest, order, 0.05, None, 1.0, every_chunk=True)
    again = asyncio.run(go())
    on = [lane for lane, m in lanes.sent if m.index == deaf]
    assert again == {deaf} and len(on) == 1 + MAX_HEDGES and len(set(on)) == 4 and out.hedged == MAX_HEDGES


def _chunk(i: int, size: int, at: float) -> Sent:
    return Sent(Transmission("chunk", i), size, at)


def test_a_transmission_is_late_when_passed_on_its_lane_or_later_than_its_bytes_explain():
    # Two lanes at 1 MB/s in all (0.5 MB/s each while both are busy), 100 KB chunks written at t=0,
    # floor 0.2 s. Lane 0: chunk 0 acked at 0.5 s, chunk 2 not, chunk 4 acked at 0.9 s: 2 was passed
    # on its own lane, so lost. Lane 1: chunk 1 acked at 0.2 s; 3 and 5 queued behind it.
    log = [[_chunk(0, 100_000, 0.0), _chunk(2, 100_000, 0.0), _chunk(4, 100_000, 0.0)],
           [_chunk(1, 100_000, 0.0), _chunk(3, 100_000, 0.0), _chunk(5, 100_000, 0.0)]]
    acks = {(0, 0): 0.5, (0, 4): 0.9, (1, 1): 0.2}

    def late(now: float, rate: float = 1e6) -> set[int]:
        return overdue(log, lambda lane, t: acks.get((lane, t.index)), now, rate, 0.2, 1.0)

    # 3 has 0.2 + 3 x 100 KB / 0.5 MB/s = 0.8 s from lane 1's last ack (0.2 s); 5, 1.4 s
    assert late(0.95) == {2}
    assert late(1.05) == {2, 3}
    assert late(1.65) == {2, 3, 5}
    # A slow link (50 KB/s): the same silences are the bytes' time on the wire; nothing is late but 2
    assert late(1.65, rate=50_000) == {2}
    # No rate measured yet: the blind allowance (1 s) stands in for the bytes' time
    assert late(1.35, rate=0.0) == {2} and late(1.45, rate=0.0) == {2, 3, 5}
    # A chunk whose copy was acked on another lane is not acked on this one: what went before it
    # here was not passed by it
    copy = [[_chunk(7, 1000, 0.0), _chunk(8, 1000, 0.0)], [_chunk(8, 1000, 0.0)]]
    assert overdue(copy, lambda lane, t: 0.1 if (lane, t.index) == (1, 8) else None, 0.15, 1e6, 0.2, 1.0) == set()


def test_a_delta_queued_on_a_slow_link_is_not_hedged():
    # A slow link: 4 lanes share 50 KB/s; every written transmission is acknowledged, in order on
    # its lane, when its bytes have crossed. Nothing is hedged, though the delta takes seconds.
    chunks, manifest, order = _one_matrix_delta(2, (250, 400), chunk_bytes=2048)
    lanes = _Lanes(4, deaf=frozenset(t.index for t in order))
    out = Sender(None, lanes, 0, chunks, {})
    lanes.rate_Bps = 50_000.0

    async def go():
        for t in order:
            await out.send(t)
        t0 = time.perf_counter()

        async def deliver():        # the link carries one transmission after another, round the lanes
            for lane, m in list(lanes.sent):
                await asyncio.sleep(len(wire.site_message(m).SerializeToString()) / lanes.rate_Bps)
                lanes.ack(lane, LaneAck.of(m))
        feeder = asyncio.create_task(deliver())
        again = await out.hedge(manifest, order, 0.05, None, 1.0, every_chunk=True)
        await feeder
        return again, time.perf_counter() - t0
    again, took_s = asyncio.run(go())
    assert took_s > 1.0 and again == set() and out.hedged == 0


def test_a_hedge_sends_again_what_was_passed_on_its_lane_not_what_is_queued():
    # 4 lanes on a slow link (the next transmission of a lane has seconds to go), every chunk
    # hedged: of the first 13 transmissions all but two are acked. One was passed on its own lane
    # by a later one, and goes again; the other is next in line on its lane, and waits for its ack.
    chunks, manifest, order = _one_matrix_delta(2, (250, 400), chunk_bytes=2048)
    assert len(order) >= 20
    lanes = _Lanes(4, deaf=frozenset(t.index for t in order))
    out = Sender(None, lanes, 0, chunks, {})
    for t in order:
        asyncio.run(out.send(t))
    lanes.sent.clear()
    lanes.rate_Bps = 1000.0
    passed, next_in_line = order[3], order[12]           # on lane 3, with 7 after it; on lane 0, last of the 13
    assert [x.t for x in out.log[3]][:2] == [passed, order[7]] and out.log[0][3].t == next_in_line
    for lane, log in enumerate(out.log):
        for sent in log:
            if sent.t in order[:13] and sent.t not in (passed, next_in_line):
                lanes.ack(lane, LaneAck(0, "chunk", sent.t.index))

    async def go():
        task = asyncio.create_task(out.hedge(manifest, order, 0.5, None, 1.0, every_chunk=True))
        await asyncio.sleep(0.4)
        for lane, log in enumerate(out.log):      # then the rest comes in
            for sent in log:
                lanes.ack(lane, LaneAck(0, "chunk", sent.t.index))
        return await task
    again = asyncio.run(go())
    assert again == {passed.index} and [m.index for _, m in lanes.sent] == [passed.index]


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


async def _relay(target_port: int, drop_first: int) -> tuple[asyncio.AbstractServer, list[int]]:
    """A TCP relay on a port of its own to 127.0.0.1:`target_port` that closes the first `drop_first`
    connections it accepts before a byte passes (as a forward that is not ready yet does)."""
    accepted = [0]

    async def pipe(reader, writer) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(1 << 16):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def serve(reader, writer) -> None:
        accepted[0] += 1
        if accepted[0] <= drop_first:
            writer.close()
            return
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", target_port)
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    return await asyncio.start_server(serve, "127.0.0.1", 0), accepted


@pytest.mark.timeout(60)
def test_lanes_whose_first_connections_fail_open_once_they_connect_and_not_forever():
    """Real gRPC in this process: a relay drops the lanes' first two connections before their
    handshake; opening three lanes waits for gRPC to connect again, and the PS reads each LaneOpen.
    Where every connection is dropped, opening ends by name within its bound (the session's to retry)."""
    import grpc
    import types

    from wantrain.errors import ConnectionLostError
    from wantrain.transport import net

    opts = types.SimpleNamespace(name="a", token="t", tls=None, tls_server_name="", link_rtt_ms=0.0, link_mbps=0.0)

    async def scenario():
        opened: list[int] = []

        async def lane(requests, context):
            async for raw in requests:
                opened.append(wire.parse_site_message(raw).lane)

        server = grpc.aio.server()
        net.add_service(server, {"Lane": grpc.stream_stream_rpc_method_handler(lane, None, bytes)})
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        relay, accepted = await _relay(port, drop_first=2)
        dead, _ = await _relay(port, drop_first=10 ** 6)
        try:
            lanes = await Lanes.open(3, f"127.0.0.1:{relay.sockets[0].getsockname()[1]}", opts)
            deadline = time.monotonic() + 20
            while len(opened) < 3 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            await lanes.close()
            started = time.monotonic()
            with pytest.raises(ConnectionLostError, match=r"2 lanes to 127.0.0.1:\d+: not all connected within 1 s"):
                await Lanes.open(2, f"127.0.0.1:{dead.sockets[0].getsockname()[1]}", opts, connect_s=1.0)
            return sorted(opened), accepted[0], time.monotonic() - started
        finally:
            relay.close()
            dead.close()
            await server.stop(None)

    opened, accepted, gave_up_after = asyncio.run(scenario())
    assert opened == [0, 1, 2]
    assert accepted >= 5          # two dropped, then at least one connection per lane
    assert gave_up_after < 15     # bounded (1 s asked; margin for a busy machine)
