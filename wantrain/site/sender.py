"""How one push's transmissions reach the PS: on the Session, or spread over lanes, with hedges.

`Sender` turns recovery.transmissions' entries into messages and writes them. Without lanes every
message goes on the Session, in order. With lanes (lanes.py) the manifest goes first on lane 0 and
is acknowledged before any chunk leaves (the PS must hold it before the chunks it describes), then
the transmissions go round the lanes, a critical chunk's copy on another lane than its first copy;
`hedge` sends again, on a lane it has not used, each protected chunk (critical, or in a parity
group) the PS still lacks and cannot rebuild `hedge_s` after the delta started; `settled` waits
for every ack before the caller sends the round's metrics on the Session.

A transmission lost on purpose (the chunk-loss injector) is counted as sent on its lane and never
written, so it is never acknowledged, as a lost one would not be.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np

from ..messages import DELTA, DeltaParity, LaneAck, Manifest, TensorChunk
from ..recovery import ChunkLoss, Transmission, to_resend
from .lanes import Lanes

__all__ = ["Sender"]


class Sender:
    """One push's messages, on `stream` alone or on `lanes` (None: no lanes)."""

    def __init__(self, stream, lanes: Lanes | None, round_: int, chunks: list, parity: dict[int, bytes]) -> None:
        self.stream, self.lanes, self.round = stream, lanes, round_
        self.chunks, self.parity = chunks, parity
        self.used: dict[int, set[int]] = {}     # chunk -> lanes it went on
        self.next_lane = 0
        self.hedged = 0
        self.started = time.perf_counter()

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
        await self.lanes.until_acked(await self.lanes.send(0, m))
        self.started = time.perf_counter()

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

    async def hedge(self, manifest: Manifest, order: list[Transmission], lost: set[int], hedge_s: float,
                    loss: ChunkLoss | None, mean_bytes: float, every_chunk: bool = False) -> set[int]:
        """Send again, once, each protected chunk (`every_chunk`: each chunk) not acknowledged `hedge_s`
        after the delta started that the PS cannot rebuild; returns the chunks hedged (and not lost on
        purpose again)."""
        assert self.lanes is not None
        wait = self.started + hedge_s - time.perf_counter()
        if not lost:            # nothing lost on purpose: hedge only what is slow
            try:
                await asyncio.wait_for(self.lanes.settled(), max(0.0, wait))
                return set()
            except asyncio.TimeoutError:
                pass
        elif wait > 0:
            await asyncio.sleep(wait)
        unacked = [n for n, t in enumerate(order) if not self._acked(t)]
        entries = manifest.chunks
        todo = [i for i in to_resend(manifest, order, unacked)
                if every_chunk or entries[i].role == "critical" or entries[i].group >= 0]
        if not todo:
            return set()
        again = [Transmission("chunk", i) for i in todo]
        gone = (loss.mask([self.size(t) for t in again], mean_bytes) if loss is not None
                else np.zeros(len(again), bool))
        for t, g in zip(again, gone):
            await self.send(t, lost=bool(g))
        self.hedged += len(again)
        return {t.index for t, g in zip(again, gone) if not g}

    async def settled(self) -> None:
        """Every message of this push taken by the PS (with lanes: acknowledged, then forgotten)."""
        if self.lanes is not None:
            await self.lanes.settled()
            self.lanes.forget(self.round)
