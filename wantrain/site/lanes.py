"""A site's extra connections for its deltas: lanes (recovery.lanes; docs/protocol.md 4b).

One TCP connection stalls every HTTP/2 stream on it: a lost segment holds back all that follows
until it is retransmitted, and on a long lossy path one flow's rate is capped by its loss (about
MSS / (RTT sqrt(p))). `Lanes` opens `n` Lane calls, each on a channel of its own (a local
subchannel pool: gRPC does not share one connection between them), and sends a delta's manifest,
chunks and parities over them; the PS answers each message with a LaneAck once it has taken it,
as it would on the Session. `settled()` waits for the acks of everything written: the site sends
its RoundMetrics on its Session only then, so the PS never sees a round's metrics before one of its
chunks, and the order rules of the Session hold across connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter

import grpc

from ..transport import net, wire
from ..errors import ConnectionLostError, ProtocolError, Reject, RejectedError
from ..transport.messages import DeltaParity, ErrorMessage, LaneAck, LaneOpen, Manifest, TensorChunk

__all__ = ["Lanes"]

log = logging.getLogger("wantrain.site")

Item = LaneAck           # what an ack names: (round, item, index)
CONNECT_S = 30.0         # how long opening lanes waits for their connections (Lanes.open)


class Lanes:
    """`n` Lane calls to one PS (see the module's docstring). Open with `Lanes.open`."""

    def __init__(self, channels: list, calls: list) -> None:
        self.channels, self.calls = channels, calls
        self.writing = [asyncio.Lock() for _ in calls]
        self.in_flight: Counter[Item] = Counter()      # written and not acked yet
        self.sizes: dict[Item, int] = {}               # bytes of what is in flight
        self.busy_since = 0.0                          # since when something has been in flight ...
        self.busy_bytes = 0                            # ... and how many bytes of it were acked since
        self.rate_Bps = 0.0                            # the lanes' delivery rate in all (0: unknown)
        self.acked: set[Item] = set()                  # acked at least once, on any lane
        self.acked_on: dict[tuple[int, Item], float] = {}   # (lane, item) -> its first ack there (perf_counter)
        self.changed = asyncio.Event()                 # an ack came, or a lane failed
        self.failure: Exception | None = None
        self.readers = [asyncio.create_task(self._read(i)) for i in range(len(calls))]

    @classmethod
    async def open(cls, n: int, address: str, opts, connect_s: float = CONNECT_S) -> Lanes:
        """`n` lanes of the site `opts.name` to the PS at `address` (its own channel each).

        A lane's first connection may fail where the session's did not (a forward over SSH that
        drops a new connection before its TLS handshake, a reset on the link): gRPC connects again
        with backoff while this waits for every channel, and only a lane still down after
        `connect_s` ends the session (ConnectionLostError), as a lane that breaks later does."""
        channels = [net.site_channel(address, opts.tls, opts.tls_server_name, opts.link_rtt_ms, opts.link_mbps)
                    for _ in range(n)]
        try:
            await asyncio.wait_for(asyncio.gather(*(c.channel_ready() for c in channels)), connect_s)
        except BaseException as e:          # not connected in time, or the session ends meanwhile
            for c in channels:
                await c.close()
            if isinstance(e, asyncio.TimeoutError):
                raise ConnectionLostError(f"{n} lanes to {address}: not all connected within {connect_s:g} s") from None
            raise
        calls = [net.stub(c).Lane(wait_for_ready=False) for c in channels]
        for i, call in enumerate(calls):
            await call.write(wire.site_message(LaneOpen(opts.name, opts.token, i)))
        log.info("site %s: %d lanes open to %s", opts.name, n, address)
        return cls(channels, calls)

    def __len__(self) -> int:
        return len(self.calls)

    async def send(self, lane: int, msg: Manifest | TensorChunk | DeltaParity) -> Item:
        """Write `msg` on lane `lane`; what its ack will name."""
        self.raise_failure()
        item = LaneAck.of(msg)
        if not +self.in_flight:
            self.busy_since, self.busy_bytes = time.perf_counter(), 0
        self.in_flight[item] += 1
        raw = wire.site_message(msg)
        self.sizes[item] = raw.ByteSize()
        async with self.writing[lane]:
            await self.calls[lane].write(raw)
        return item

    async def until_acked(self, item: Item) -> None:
        """Wait for the first ack of `item`."""
        while item not in self.acked:
            self.raise_failure()
            self.changed.clear()
            await self.changed.wait()

    async def settled(self) -> None:
        """Wait until everything written has been acked (ConnectionLostError if a lane failed)."""
        while +self.in_flight:
            self.raise_failure()
            self.changed.clear()
            await self.changed.wait()
        self.raise_failure()

    def _delivered(self, nbytes: int, now: float) -> None:
        """An ack of `nbytes`: the delivery rate is the bytes acked over the time something has been
        in flight (idle time between pushes does not count), once it spans a few milliseconds."""
        self.busy_bytes += nbytes
        if now - self.busy_since > 0.005 and self.busy_bytes > 0:
            self.rate_Bps = self.busy_bytes / (now - self.busy_since)

    def forget(self, round_: int) -> None:
        """A push of `round_` is settled: its acks are no longer asked about (a long run's would pile up)."""
        self.acked = {a for a in self.acked if a.round != round_}
        self.acked_on = {k: t for k, t in self.acked_on.items() if k[1].round != round_}

    def raise_failure(self) -> None:
        """ConnectionLostError (or why the PS refused) if a lane has failed."""
        if self.failure is not None:
            raise self.failure

    async def _read(self, lane: int) -> None:
        try:
            while True:
                raw = await self.calls[lane].read()
                if raw is grpc.aio.EOF:
                    raise ConnectionLostError(f"lane {lane} ended")
                msg = wire.server_message_from_proto(raw)
                if isinstance(msg, ErrorMessage):
                    raise RejectedError(Reject.from_wire(msg.code), f"lane {lane}: {msg.message}")
                if not isinstance(msg, LaneAck) or self.in_flight[msg] <= 0:
                    raise ProtocolError(f"lane {lane}: the PS acknowledged {msg}, which is not in flight on it")
                self.in_flight[msg] -= 1
                now = time.perf_counter()
                self._delivered(self.sizes.get(msg, 0), now)
                if not self.in_flight[msg]:
                    del self.in_flight[msg]
                    self.sizes.pop(msg, None)
                self.acked.add(msg)
                self.acked_on.setdefault((lane, msg), now)
                self.changed.set()
        except asyncio.CancelledError:
            raise
        except grpc.aio.AioRpcError as e:
            self.failure = ConnectionLostError(f"lane {lane} broke: {e.code().name}: {e.details()}")
        except (ConnectionLostError, RejectedError) as e:
            self.failure = e
        except ProtocolError as e:          # the PS's own mistake: this session ends, the site joins again
            self.failure = ConnectionLostError(str(e))
        self.changed.set()

    async def close(self) -> None:
        for task in self.readers:
            task.cancel()
        for task in self.readers:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for c in self.channels:
            await c.close()
