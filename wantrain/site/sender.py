"""How one push's transmissions reach the PS: on the Session, or spread over lanes, with hedges.

`Sender` turns recovery.transmissions' entries into messages and writes them. Without lanes every
message goes on the Session, in order. With lanes (lanes.py) the manifest goes first on lane 0 and
is acknowledged before any chunk leaves (the PS must hold it before the chunks it describes), then
the transmissions go round the lanes, a critical chunk's copy on another lane than its first copy;
`hedge` sends again, on a lane it has not used, each protected chunk (critical, or in a parity
group; with hedge_all every chunk) the PS still lacks and cannot rebuild once its latest
transmission looks lost (`overdue`), and again (up to MAX_HEDGES times) if its hedge looks lost in
turn; `settled` waits for every ack before the caller sends the round's metrics on the Session.

A transmission lost on purpose (the chunk-loss injector) is counted as sent on its lane and never
written, so it is never acknowledged, as a lost one would not be.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..transport.messages import DELTA, DeltaParity, LaneAck, Manifest, TensorChunk
from ..transport.sending import MAX_HEDGES, Transmission, to_resend
from ..runtime.chunk_loss import ChunkLoss
from .lanes import Lanes

__all__ = ["Sender", "Sent", "overdue", "HEDGE_FLOOR_S"]

HEDGE_FLOOR_S = 0.2     # the shortest silence taken for a loss (Linux's least retransmission timeout)
LOOK_S = 0.05           # the hedge's shortest look interval
SLACK = 3.0             # a transmission's time on the wire, at its lane's share of the rate, times this


@dataclass(frozen=True)
class Sent:
    """One transmission written on a lane (or lost there on purpose)."""

    t: Transmission
    size: int               # its bytes on the wire
    at: float               # when it was written (time.perf_counter())


def overdue(lanes: list[list[Sent]], acked_at: Callable[[int, Transmission], float | None], now: float,
            rate_Bps: float, floor_s: float, blind_s: float) -> set[int]:
    """The chunks whose latest transmission looks lost rather than queued, from each lane's log in
    write order (`acked_at(lane, t)`: when the PS acknowledged `t` on `lane`, or None). A lane is in
    order (one TCP connection, one stream), so what went before an acknowledged transmission on its
    lane and is not acknowledged there was lost (TCP's fast retransmit, by chunk). Past a lane's
    last ack, each transmission is given the time its lane needs to carry it and those ahead of it
    at an equal share of the lanes' delivery rate `rate_Bps`, SLACK times over, plus `floor_s`,
    counted from the lane's last ack or its writing, whichever is later: beyond that it is late (a
    tail loss, or a lane stalled by a lost segment). With no rate measured yet, `blind_s` in place
    of the bytes' time. On a slow link the acks keep pace with the bytes, and nothing queued is
    taken for lost."""
    latest: dict[int, tuple[float, int, int]] = {}          # chunk -> (written at, lane, n) of its latest
    for lane, log in enumerate(lanes):
        for n, s in enumerate(log):
            if s.t.kind == "chunk" and (s.at, lane, n) > latest.get(s.t.index, (-math.inf, 0, 0)):
                latest[s.t.index] = (s.at, lane, n)
    times = [[acked_at(lane, s.t) for s in log] for lane, log in enumerate(lanes)]
    share = rate_Bps / max(len(lanes), 1)      # each lane's, as if all were busy: a lane left alone at
                                               # the end waited its turn at that share till then
    late: set[int] = set()
    for lane, (log, ts) in enumerate(zip(lanes, times)):
        done = [n for n, a in enumerate(ts) if a is not None]
        last = done[-1] if done else -1
        since = max((a for a in ts if a is not None), default=-math.inf)
        ahead = 0                                  # bytes of this lane's log past its last ack
        for n, s in enumerate(log):
            if ts[n] is not None:
                continue
            if n < last:
                lost = True
            else:
                ahead += s.size
                wire_s = SLACK * ahead / share if share > 0 else blind_s
                lost = now - max(since, s.at) > floor_s + wire_s
            if lost and s.t.kind == "chunk" and latest[s.t.index][1:] == (lane, n):
                late.add(s.t.index)
    return late


class Sender:
    """One push's messages, on `stream` alone or on `lanes` (None: no lanes)."""

    def __init__(self, stream, lanes: Lanes | None, round_: int, chunks: list, parity: dict[int, bytes]) -> None:
        self.stream, self.lanes, self.round = stream, lanes, round_
        self.chunks, self.parity = chunks, parity
        self.used: dict[int, set[int]] = {}     # chunk -> lanes it went on
        self.log: list[list[Sent]] = [[] for _ in range(len(lanes))] if lanes is not None else []
        self.next_lane = 0
        self.hedged = 0
        self.rtt_s = 0.0          # the manifest's: written to acknowledged

    def message(self, t: Transmission) -> TensorChunk | DeltaParity:
        if t.kind == "parity":
            return DeltaParity(self.round, t.index, self.parity[t.index])
        spec, enc = self.chunks[t.index]
        return TensorChunk(DELTA, self.round, t.index, len(self.chunks), spec, enc)

    def size(self, t: Transmission) -> int:
        return len(self.parity[t.index]) if t.kind == "parity" else self.chunks[t.index][1].wire_bytes

    async def manifest(self, m: Manifest) -> None:
        if self.lanes is None:
            await self.stream.send(m)
            return
        t0 = time.perf_counter()
        await self.lanes.until_acked(await self.lanes.send(0, m))
        self.rtt_s = time.perf_counter() - t0

    def _lane_for(self, t: Transmission) -> int:
        assert self.lanes is not None
        n = len(self.lanes)
        lane = self.next_lane
        used = self.used.get(t.index, set()) if t.kind != "parity" else set()
        for step in range(n):                   # the next lane round the ring this chunk has not used
            if (self.next_lane + step) % n not in used:
                lane = (self.next_lane + step) % n
                break
        self.next_lane = (lane + 1) % n
        return lane

    async def send(self, t: Transmission, lost: bool = False) -> None:
        """Write one transmission (or, `lost`, count it as gone on its lane without writing it)."""
        if self.lanes is None:
            if not lost:
                await self.stream.send(self.message(t))
            return
        lane = self._lane_for(t)
        if t.kind != "parity":
            self.used.setdefault(t.index, set()).add(lane)
        self.log[lane].append(Sent(t, self.size(t), time.perf_counter()))
        if not lost:
            await self.lanes.send(lane, self.message(t))

    def _item(self, t: Transmission) -> LaneAck:
        return LaneAck(self.round, "parity" if t.kind == "parity" else "chunk", t.index)

    def _acked(self, t: Transmission) -> bool:
        assert self.lanes is not None
        return self._item(t) in self.lanes.acked

    def _acked_at(self, lane: int, t: Transmission) -> float | None:
        assert self.lanes is not None
        return self.lanes.acked_on.get((lane, self._item(t)))

    async def hedge(self, manifest: Manifest, order: list[Transmission], hedge_s: float, loss: ChunkLoss | None,
                    mean_bytes: float, every_chunk: bool = False) -> set[int]:
        """Send again each protected chunk (`every_chunk`: each chunk) the PS has neither acknowledged
        nor can rebuild, once its latest transmission looks lost (`overdue`: passed on its own lane,
        or later than its bytes explain by more than 2 round trips of the manifest, HEDGE_FLOOR_S
        at least and `hedge_s` at most; with no delivery rate measured yet, later than `hedge_s`),
        MAX_HEDGES times a chunk at most, each on a lane the chunk has not used while there is one.
        Returns the chunks with a hedge written (not lost on purpose)."""
        assert self.lanes is not None
        entries = manifest.chunks
        hedges: dict[int, int] = {}            # chunk -> times it was hedged
        written: set[int] = set()              # chunks with a hedge written
        floor_s = min(hedge_s, max(HEDGE_FLOOR_S, 2 * self.rtt_s))
        while True:
            unacked = [n for n, t in enumerate(order) if not self._acked(t)]
            wanted = {i for i in to_resend(manifest, order, unacked) if hedges.get(i, 0) < MAX_HEDGES
                      and (every_chunk or entries[i].role == "critical" or entries[i].group >= 0)}
            if not wanted:
                return written
            late = overdue(self.log, self._acked_at, time.perf_counter(), self.lanes.rate_Bps, floor_s, hedge_s)
            todo = [t.index for t in order if t.kind == "chunk" and t.index in wanted & late]
            todo = list(dict.fromkeys(todo))         # in the order they went (a copy comes twice)
            if todo:
                again = [Transmission("chunk", i) for i in todo]
                gone = loss.mask([self.size(t) for t in again], mean_bytes) if loss is not None else [False] * len(again)
                for t, g in zip(again, gone):
                    await self.send(t, lost=bool(g))
                    hedges[t.index] = hedges.get(t.index, 0) + 1
                    if not g:
                        written.add(t.index)
                self.hedged += len(again)
                continue
            await asyncio.sleep(max(LOOK_S, floor_s / 4))      # a look a few times per floor: O(order) each
            self.lanes.raise_failure()

    async def settled(self) -> None:
        """Every message of this push taken by the PS (with lanes: acknowledged, then forgotten)."""
        if self.lanes is not None:
            await self.lanes.settled()
            self.lanes.forget(self.round)
