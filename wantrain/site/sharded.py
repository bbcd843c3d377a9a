"""A site's session with a sharded PS: one stream per shard, merged so the session sees one PS.

Each shard (wantrain/models/shards.py) is a parameter server of its own for its share of the tensors.
This stream fans the session's messages out and merges the shards' replies, so session.py keeps
the logic of one PS:

    sent                      to each shard
    Join, Ready, HashReport   with that shard's part of the replica's hash
    delta manifest            the entries of its tensors, numbered in its own plan, their importance
                              a share of that shard's part (parity groups are not kept)
    delta chunks, metrics     the chunks of its tensors, numbered in its own plan; metrics with its
                              counts (chunks, raw and wire bytes)
    link probes               to shard 0 only

    received                  handed to the session
    Welcome                   once every shard's is in, all at one round: one Welcome (model
                              chunks: the sum; hash: the combined hash)
    RoundStart                once every shard has started the round
    update chunks, result     once every shard's result is in: the chunks renumbered, one result
                              (its sites: those every shard counted)
    DeltaOutcome, Error       at once, naming the shard

A shard that restarts (it journals each commit before announcing it, so it loses no committed
round) asks again for a round whose delta the site had already pushed to it; the site replays
what it sent that shard (`ShardMemory`, which outlives a session) instead of training again, so
the shards' rounds stay one round. Shards that answer a join at different rounds (one has
committed a round it cannot catch the site up on) make the site join again, after a pause,
asking every shard for its whole model.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import deque
from dataclasses import dataclass, field, replace

import grpc

from ..transport import wire
from ..codec import ChunkSpec, plan_chunks
from ..errors import ConnectionLostError, ProtocolError
from ..transport.messages import (MODEL, UPDATE, DeltaOutcome, ErrorMessage, HashReport, Join, LinkProbe, Manifest,
                                  Ready, RoundMetrics, RoundResult, RoundStart, TensorChunk, Welcome)
from ..models.shards import combine_hashes
from .replica import Replica

__all__ = ["ShardedStream", "ShardMemory"]

log = logging.getLogger("wantrain.site")


@dataclass
class ShardMemory:
    """What outlives one session: the last round's pushed messages per shard (for a shard that lost
    them), and whether the next Join asks every shard for its whole model."""
    pushed_round: int = -1
    pushed: list[list] = field(default_factory=list)
    complete: bool = False        # the metrics went too: a shard that asks again gets it all
    whole_models: bool = False


CLOSE_S = 5.0        # how long a closing site waits for the PS (each shard) to end its stream


class ShardedStream:
    """The session's stream to N shards. `replica` (replica.py), the site's, gives the layout, the part
    hashes, the tensor sizes and the chunk plan once the first Welcome has built it."""

    protects = False        # each chunk once, no parity: a group would span shards

    def __init__(self, calls: list, site: str, replica: Replica, memory: ShardMemory) -> None:
        self.calls, self.site, self.replica, self.mem, self.n = calls, site, replica, memory, len(calls)
        self.sending = [asyncio.Lock() for _ in calls]    # one write at a time on each call
        self.inbox: asyncio.Queue = asyncio.Queue()
        self.out: deque = deque()
        self.readers = [asyncio.create_task(self._read(i, c)) for i, c in enumerate(calls)]
        self.welcomes: dict[int, Welcome] = {}
        self.early: list[TensorChunk] = []       # model chunks that came before every Welcome was in
        self.welcomed = False
        self.starts: dict[int, RoundStart] = {}
        self.updates: list[list[TensorChunk]] = [[] for _ in calls]
        self.results: dict[int, RoundResult] = {}
        self.sent_index: list[int] = []          # delta chunks sent to each shard this round
        self.sent_bytes: list[int] = []
        self._counts: tuple[list[int], list[int]] | None = None
        self._index: dict | None = None

    async def _read(self, i: int, call) -> None:
        try:
            while True:
                raw = await call.read()
                if raw is grpc.aio.EOF:
                    raise ConnectionLostError(f"shard {i}'s stream ended")
                self.inbox.put_nowait((i, wire.server_message_from_proto(raw)))
        except asyncio.CancelledError:
            raise
        except Exception as e:         # the session raises it (and retries or stops, as for one PS)
            self.inbox.put_nowait((i, e))

    async def lanes(self, n: int) -> None:
        """No lanes: each shard's Session carries its part of the delta."""
        return None

    def stop(self) -> None:
        for t in self.readers:
            t.cancel()

    async def close(self) -> None:
        """Half-close every call, then wait (bounded) for each shard to end its stream, as
        SingleStream.close does: the readers see each end."""
        for call in self.calls:
            await call.done_writing()
        await asyncio.wait(self.readers, timeout=CLOSE_S)

    # ------------------------------------------------------------ from the shards

    async def receive(self):
        while not self.out:
            i, m = await self.inbox.get()
            if isinstance(m, BaseException):
                raise m
            await self._take(i, m)
        return self.out.popleft()

    async def _take(self, i: int, m) -> None:
        if isinstance(m, ErrorMessage):
            self.out.append(replace(m, message=f"shard {i}: {m.message}"))
        elif isinstance(m, DeltaOutcome):
            self.out.append(replace(m, reason=f"shard {i}: {m.reason}"))
        elif isinstance(m, Welcome):
            self._welcome(i, m)
        elif isinstance(m, TensorChunk) and m.kind == MODEL:
            (self.out if self.welcomed else self.early).append(m)
        elif isinstance(m, RoundStart):
            await self._round_start(i, m)
        elif isinstance(m, TensorChunk) and m.kind == UPDATE:
            self.updates[i].append(m)
        elif isinstance(m, RoundResult):
            self._result(i, m)
        else:
            raise ProtocolError(f"unexpected {type(m).__name__} from shard {i}")

    def _welcome(self, i: int, w: Welcome) -> None:
        if (w.shard, w.shards) != (i, self.n):
            raise ProtocolError(f"address {i} of --ps is shard {w.shard} of {w.shards}; list the {w.shards} shards' "
                                f"addresses in shard order")
        if self.welcomed:      # one shard resyncs the site: start over with whole models from all
            self.mem.whole_models = True
            raise ConnectionLostError(f"shard {i} sends its model again; joining every shard again")
        self.welcomes[i] = w
        if len(self.welcomes) < self.n:
            return
        ws = [self.welcomes[k] for k in range(self.n)]
        if any((x.run_id, x.config, x.site_index) != (ws[0].run_id, ws[0].config, ws[0].site_index) for x in ws):
            raise ProtocolError("the shards serve different runs (run id, config or this site's index differ)")
        rounds = sorted({x.round for x in ws})
        downloads = sum(1 for x in ws if x.model_chunks)
        if len(rounds) > 1 or 0 < downloads < self.n:
            self.mem.whole_models = True
            raise ConnectionLostError(f"the shards hold rounds {rounds} for this site; joining again for whole "
                                      "models once they agree")
        self.welcomed = True
        self.out.append(replace(ws[0], model_hash=combine_hashes([x.model_hash for x in ws]),
                                model_chunks=sum(x.model_chunks for x in ws),
                                data_position=max(x.data_position for x in ws), shard=0))
        self.out.extend(self.early)
        self.early = []

    async def _round_start(self, i: int, s: RoundStart) -> None:
        if s.round == self.mem.pushed_round and self.mem.complete:
            log.info("site %s: shard %d starts round %d again (it lost the delta pushed to it): replaying it",
                     self.site, i, s.round)
            for m in self.mem.pushed[i]:
                await self._write(i, m)
            return
        self.starts[i] = s
        if len(self.starts) < self.n:
            return
        ss = [self.starts[k] for k in range(self.n)]
        self.starts = {}
        if len({x.round for x in ss}) > 1:
            self.mem.whole_models = True
            raise ConnectionLostError(f"the shards start rounds {sorted({x.round for x in ss})}; joining again")
        self.out.append(RoundStart(ss[0].round, combine_hashes([x.model_hash for x in ss]),
                                   min(x.train_s for x in ss)))

    def _result(self, i: int, r: RoundResult) -> None:
        self.results[i] = r
        if len(self.results) < self.n:
            return
        rs = [self.results[k] for k in range(self.n)]
        if len({x.round for x in rs}) > 1:
            raise ProtocolError(f"the shards' results are for rounds {sorted({x.round for x in rs})}")
        parts = [sorted(u, key=lambda c: c.index) for u in self.updates]
        for k, p in enumerate(parts):
            if not p or len(p) != p[0].count:
                raise ProtocolError(f"round {rs[0].round}: shard {k} sent {len(p)} update chunks of "
                                    f"{p[0].count if p else 'some'}")
        total, offset = sum(len(p) for p in parts), 0
        for p in parts:
            self.out.extend(replace(c, index=offset + c.index, count=total) for c in p)
            offset += len(p)
        sites, partial_sites = self._counted([x.sites for x in rs])
        late, partial_late = self._counted([x.late_sites for x in rs])
        self.out.append(RoundResult(
            rs[0].round, combine_hashes([x.model_hash for x in rs]), sites,
            next((x.val_loss for x in rs if not math.isnan(x.val_loss)), math.nan), late,
            partial_sites=partial_sites, partial_late=partial_late))
        self.updates, self.results = [[] for _ in range(self.n)], {}
        # The round is committed: no shard will ask for its delta again. (A push of it still going
        # on, late, keeps writing to the memory: the next push's start clears it.)
        if rs[0].round >= self.mem.pushed_round and not self.sent_index:
            self.mem.pushed, self.mem.complete = [], False

    def _counted(self, per_shard: list[tuple[str, ...]]) -> tuple[tuple[str, ...], tuple[tuple[str, frozenset[str]], ...]]:
        """(sites every shard counted, (site, tensors of the shards that counted it) for the others).

        Each shard decides alone which deltas its round counts, so a site late at one shard may be
        counted at another; its session then carries forward only the tensors that were not."""
        everywhere = tuple(s for s in per_shard[0] if all(s in x for x in per_shard))
        partial = []
        for site in dict.fromkeys(s for x in per_shard for s in x if s not in everywhere):
            partial.append((site, frozenset(t for k, x in enumerate(per_shard) if site in x
                                            for t in self.replica.layout.tensors[k])))
        return everywhere, tuple(partial)

    # ------------------------------------------------------------ to the shards

    async def send(self, msg) -> None:
        if isinstance(msg, Join):
            whole, self.mem.whole_models = self.mem.whole_models or not msg.resume_hash, False
            for i in range(self.n):
                await self._write(i, replace(msg, resume_round=0, resume_hash="") if whole
                                  else replace(msg, resume_hash=self.replica.part_hashes[i]))
        elif isinstance(msg, (Ready, HashReport)):
            for i in range(self.n):
                await self._write(i, replace(msg, model_hash=self.replica.part_hashes[i]))
        elif isinstance(msg, Manifest):
            await self._manifest(msg)
        elif isinstance(msg, TensorChunk):
            await self._delta_chunk(msg)
        elif isinstance(msg, RoundMetrics):
            counts, elements = self._plan_counts()
            for i in range(self.n):
                m = replace(msg, chunks=counts[i], raw_bytes=4 * elements[i], wire_bytes=self.sent_bytes[i])
                self.mem.pushed[i].append(m)
                await self._write(i, m)
            self.mem.complete, self.sent_index = True, []
        elif isinstance(msg, LinkProbe):
            await self._write(0, msg)
        else:
            raise TypeError(f"not a site message: {type(msg).__name__}")

    def _begin_push(self, round_: int) -> None:
        if not self.sent_index:      # a round's push begins (a push cut short by a failure is not replayed)
            self.mem.pushed_round, self.mem.pushed, self.mem.complete = round_, [[] for _ in range(self.n)], False
            self.sent_index, self.sent_bytes = [0] * self.n, [0] * self.n

    async def _manifest(self, m: Manifest) -> None:
        self._begin_push(m.round)
        index, layout = self._shard_index(), self.replica.layout
        for i in range(self.n):
            mine = [e for e in m.chunks if layout.shard_of(e.tensor) == i]
            total = math.fsum(e.importance for e in mine)
            part = sorted((replace(e, index=index[ChunkSpec(e.tensor, e.offset, e.length)], group=-1,
                                   importance=e.importance / total if total > 0 else 1 / len(mine)) for e in mine),
                          key=lambda e: e.index)
            msg = replace(m, chunks=tuple(part))
            self.mem.pushed[i].append(msg)
            await self._write(i, msg)

    async def _delta_chunk(self, c: TensorChunk) -> None:
        self._begin_push(c.round)
        i = self.replica.layout.shard_of(c.spec.tensor)
        m = replace(c, index=self._shard_index()[c.spec], count=self._plan_counts()[0][i])
        self.sent_index[i] += 1
        self.sent_bytes[i] += c.data.wire_bytes
        self.mem.pushed[i].append(m)
        await self._write(i, m)

    def _shard_index(self) -> dict:
        """Each chunk's index in its shard's own plan (the site may send a round's chunks in any order)."""
        if self._index is None:
            sizes, layout = self.replica.sizes, self.replica.layout
            per = self.replica.chunk_elements
            self._index = {spec: k for names in layout.tensors
                           for k, spec in enumerate(plan_chunks({t: sizes[t] for t in names}, per))}
        return self._index

    def _plan_counts(self) -> tuple[list[int], list[int]]:
        """Each shard's delta chunks and elements: its own plan over its tensors (as its PS plans)."""
        if self._counts is None:
            sizes, layout = self.replica.sizes, self.replica.layout
            per = self.replica.chunk_elements
            self._counts = ([len(plan_chunks({t: sizes[t] for t in names}, per)) for names in layout.tensors],
                            [sum(sizes[t] for t in names) for names in layout.tensors])
        return self._counts

    async def _write(self, i: int, msg) -> None:
        async with self.sending[i]:
            await self.calls[i].write(wire.site_message(msg))
