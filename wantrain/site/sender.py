"""How one push's transmissions reach the PS: on the Session, or spread over lanes, with hedges.

`Sender` turns recovery.transmissions' entries into messages and writes them. Without lanes every
message goes on the Session, in order. With lanes (lanes.py) the manifest goes first on lane 0 and
is acknowledged before any chunk leaves (the PS must hold it before the chunks it describes), then
the transmissions go round the lanes, a critical chunk's copy on another lane than its first copy;
`hedge` sends again, on a lane it has not used, each protected chunk (critical, or in a parity
group; with hedge_all every chunk) the PS still lacks and cannot rebuild, once enough sent after
it was acknowledged or the acks have stopped for longer than their pace explains (at most
`hedge_s`), and again (up to MAX_HEDGES times) if its hedge looks lost in turn; `settled` waits
for every ack before the caller sends the round's metrics on the Session.

A transmission lost on purpose (the chunk-loss injector) is counted as sent on its lane and never
written, so it is never acknowledged, as a lost one would not be.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time

import numpy as np

from ..messages import DELTA, DeltaParity, LaneAck, Manifest, TensorChunk
from ..recovery import MAX_HEDGES, ChunkLoss, Transmission, to_resend
from .lanes import Lanes

__all__ = ["Sender", "HEDGE_FLOOR_S"]

HEDGE_FLOOR_S = 0.2     # the shortest silence taken for a loss (Linux's least retransmission timeout)
LOOK_S = 0.05           # the hedge's shortest look interval


class Sender:
    """One push's messages, on `stream` alone or on `lanes` (None: no lanes)."""

    def __init__(self, stream, lanes: Lanes | None, round_: int, chunks: list, parity: dict[int, bytes]) -> None:
        self.stream, self.lanes, self.round = stream, lanes, round_
        self.chunks, self.parity = chunks, parity
        self.used: dict[int, set[int]] = {}     # chunk -> lanes it went on
        self.next_lane = 0
        self.hedged = 0
        self.started = time.perf_counter()
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
        self.started = time.perf_counter()
        self.rtt_s = self.started - t0

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
        if not lost:
            await self.lanes.send(lane, self.message(t))

    def _acked(self, t: Transmission) -> bool:
        assert self.lanes is not None
        item = LaneAck(self.round, "parity", t.index) if t.kind == "parity" else LaneAck(self.round, "chunk", t.index)
        return item in self.lanes.acked

    def quiet_s(self, hedge_s: float, until: float) -> float:
        """How long without an ack means lost, not queued: 3 x the longest gap between this push's
        acks before `until` (its first hedge: the silence a loss makes is no gap of the flow; on a
        slow link a chunk's time on the wire spaces them), at least 2 x the manifest's round trip
        and HEDGE_FLOOR_S, at most `hedge_s` (and that until an ack comes)."""
        assert self.lanes is not None
        times = [self.started] + [t for t in self.lanes.ack_times if self.started < t <= until]
        gap = max(b - a for a, b in zip(times, times[1:])) if len(times) > 1 else hedge_s
        return min(hedge_s, max(HEDGE_FLOOR_S, 2 * self.rtt_s, 3 * gap))

    async def hedge(self, manifest: Manifest, order: list[Transmission], hedge_s: float, loss: ChunkLoss | None,
                    mean_bytes: float, every_chunk: bool = False) -> set[int]:
        """Send again each protected chunk (`every_chunk`: each chunk) the PS has neither acknowledged
        nor can rebuild, once its latest transmission looks lost rather than queued (TCP's fast
        retransmit and tail-loss probe, by chunk): from `quiet_s` after the delta started, more of
        what was sent after it has been acknowledged than lanes running side by side reorder (2 per
        lane, or all of it near the end: a lane is in order, so another lane passed it), or no ack
        has come, nor a hedge gone, for `quiet_s`: `hedge_s` at most, less where the acks have come
        faster (quiet_s). A hedge still not acknowledged when the acks stop again goes again,
        MAX_HEDGES times a chunk at most, each on a lane the chunk has not used while there is one.
        On a slow link the chunks waiting their turn are acknowledged in about the order they went,
        and only one passed by the rest goes again. Returns the chunks with a hedge written (not
        lost on purpose). A transmission lost on purpose is judged by the acks alone, as a real loss
        would be."""
        assert self.lanes is not None
        entries = manifest.chunks
        hedges: dict[int, int] = {}            # chunk -> times it was hedged
        written: set[int] = set()              # chunks with a hedge written
        hedged_at, first_hedge_at = self.started, math.inf
        while True:
            acked = [self._acked(t) for t in order]
            unacked = [n for n, a in enumerate(acked) if not a]
            wanted = [i for i in to_resend(manifest, order, unacked) if hedges.get(i, 0) < MAX_HEDGES
                      and (every_chunk or entries[i].role == "critical" or entries[i].group >= 0)]
            if not wanted:
                return written
            now = time.perf_counter()
            quiet_s = self.quiet_s(hedge_s, min(now, first_hedge_at))
            if now < self.started + quiet_s:     # until then, only wait: for every ack, or the time
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.lanes.settled(), min(LOOK_S, self.started + quiet_s - now))
                continue
            quiet = now - max(hedged_at, self.lanes.last_ack_at) >= quiet_s
            # Passed by: judged on the delta's own transmissions (a hedge on an idle lane passes
            # what is queued on the others), so a chunk already hedged goes again on quiet alone.
            acked_after = np.cumsum(acked[::-1])[::-1]      # at n: of order[n:]
            latest = {t.index: n for n, t in enumerate(order) if t.kind != "parity"}
            reorder = 2 * len(self.lanes)           # lanes run side by side: a few may pass it anyway
            passed = {i for i in wanted if i not in hedges and latest[i] + 1 < len(order)
                      and acked_after[latest[i] + 1] >= min(reorder, len(order) - latest[i] - 1)}
            todo = [i for i in wanted if quiet or i in passed]
            if todo:
                again = [Transmission("chunk", i) for i in todo]
                gone = (loss.mask([self.size(t) for t in again], mean_bytes) if loss is not None
                        else np.zeros(len(again), bool))
                for t, g in zip(again, gone):
                    await self.send(t, lost=bool(g))
                    hedges[t.index] = hedges.get(t.index, 0) + 1
                    if not g:
                        written.add(t.index)
                self.hedged += len(again)
                hedged_at = time.perf_counter()
                first_hedge_at = min(first_hedge_at, now)
                continue
            await asyncio.sleep(max(LOOK_S, quiet_s / 4))      # a look a few times per quiet_s: O(order) each
            self.lanes.raise_failure()

    async def settled(self) -> None:
        """Every message of this push taken by the PS (with lanes: acknowledged, then forgotten)."""
        if self.lanes is not None:
            await self.lanes.settled()
            self.lanes.forget(self.round)
