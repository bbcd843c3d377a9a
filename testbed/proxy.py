"""The default link backend: a userspace asyncio TCP proxy, one per site link. No root needed.

Each direction of each proxied connection is a pipe:

    read from the sender -> delay line (release = arrival + one-way delay) -> token bucket -> write

The delay line holds data with its release time, so delay does not cap throughput (many bytes
are in flight at once, as on a real long fat pipe). Token buckets pace the bytes: one per link
direction at the trace's bandwidth, which every connection of the link shares (it is the link's
capacity: a site that opens more connections does not get more of it), and one per connection
for loss. A bandwidth of 0 is an outage: the pipes stall, holding what they have, until the link
comes back. `reset()` aborts every connection, as a middlebox or a long outage would.

Loss is not dropped bytes here (TCP would retransmit them): it is modelled by its effect on
TCP, the Mathis bound on one flow's throughput, rate <= MSS / RTT * 1.22 / sqrt(loss), for each
connection on its own (so, as on a real lossy path, several connections carry more than one,
up to the link's bandwidth). Retransmission-timeout stalls are not modelled.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import time
from dataclasses import dataclass, field

from .trace import LinkState, Trace

__all__ = ["LinkProxy", "LinkStats", "TokenBucket", "mathis_rate_bps"]

MSS_BYTES = 1460
READ_BYTES = 64 * 1024
MAX_QUEUED_BYTES = 8 * 1024 * 1024       # per pipe: beyond this the proxy stops reading (backpressure)


def mathis_rate_bps(rtt_s: float, loss: float) -> float:
    """Throughput bound of one TCP flow in bytes/s (inf without loss)."""
    if loss <= 0:
        return math.inf
    return MSS_BYTES / max(rtt_s, 1e-3) * 1.22 / math.sqrt(loss)


@dataclass
class LinkStats:
    bytes_up: int = 0
    bytes_down: int = 0
    connections: int = 0
    resets: int = 0
    stalled_s: float = 0.0                 # time pipes spent held by an outage
    outage_starts: list = field(default_factory=list)


class TokenBucket:
    """Bytes a rate allows, banking 20 ms of it (at least 64 KB): a wake-up that comes late on a busy
    machine is made up for, not lost (with 5 ms, 40 Mbit/s read 10 % low)."""

    def __init__(self) -> None:
        self.tokens = 0.0
        self.last: float | None = None

    def refill(self, now: float, rate: float) -> None:
        if self.last is not None:
            self.tokens = min(max(64 * 1024.0, rate * 0.020), self.tokens + (now - self.last) * rate)
        self.last = now

    def empty(self, now: float) -> None:
        """Nothing banked (after an outage)."""
        self.tokens, self.last = 0.0, now


class _Pipe:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, state, t0: float,
                 stats: LinkStats, up: bool, link: TokenBucket) -> None:
        # state(t) -> LinkState: the trace in force t seconds after the link started (plus forced outages);
        # `link`: the bucket of this direction's bandwidth, shared by every connection of the link
        self.reader, self.writer, self.state, self.t0, self.stats, self.up = reader, writer, state, t0, stats, up
        self.link, self.flow = link, TokenBucket()
        self.queue: collections.deque = collections.deque()
        self.queued = 0
        self.last_release = 0.0
        self.ready = asyncio.Event()
        self.space = asyncio.Event()
        self.space.set()

    async def pump_in(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                data = await self.reader.read(READ_BYTES)
                if not data:
                    break
                now = loop.time()
                st = self.state(now - self.t0)
                release = max(now + st.delay_ms / 1000.0, self.last_release)   # FIFO: no reordering
                self.last_release = release
                self.queue.append((release, data))
                self.queued += len(data)
                self.ready.set()
                while self.queued > MAX_QUEUED_BYTES:
                    self.space.clear()
                    await self.space.wait()
        finally:
            self.queue.append((None, b""))
            self.ready.set()

    async def pump_out(self) -> None:
        loop = asyncio.get_running_loop()
        self.flow.empty(loop.time())
        while True:
            while not self.queue:
                self.ready.clear()
                await self.ready.wait()
            release, data = self.queue.popleft()
            if release is None:
                with contextlib.suppress(OSError, RuntimeError):
                    if self.writer.can_write_eof():
                        self.writer.write_eof()
                return
            wait = release - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            view = memoryview(data)
            while view:
                now = loop.time()
                st = self.state(now - self.t0)
                if st.down:   # outage: hold everything until the link is back
                    self.stats.outage_starts.append(time.time())
                    t_stall = now
                    while self.state(loop.time() - self.t0).down:
                        await asyncio.sleep(0.005)
                    self.stats.stalled_s += loop.time() - t_stall
                    self.flow.empty(loop.time())
                    self.link.empty(loop.time())
                    continue
                paced = [(b, r) for b, r in ((self.link, st.bandwidth_mbps * 1e6 / 8),
                                             (self.flow, mathis_rate_bps(2 * st.delay_ms / 1000, st.loss)))
                         if not math.isinf(r)]
                if not paced:
                    n = len(view)
                else:
                    want = min(len(view), 4096)
                    for bucket, rate in paced:
                        bucket.refill(now, rate)
                    short_s = max((want - bucket.tokens) / rate for bucket, rate in paced)
                    if short_s > 0:
                        await asyncio.sleep(short_s)
                        continue
                    n = min(len(view), int(min(bucket.tokens for bucket, _ in paced)))
                    for bucket, _ in paced:
                        bucket.tokens -= n
                self.writer.write(view[:n])
                if self.up:
                    self.stats.bytes_up += n
                else:
                    self.stats.bytes_down += n
                view = view[n:]
                await self.writer.drain()
            self.queued -= len(data)
            self.space.set()


class LinkProxy:
    """Listens on a local port and forwards every connection to `target`, shaped by two traces."""

    def __init__(self, target: tuple[str, int], up: Trace, down: Trace | None = None,
                 listen: tuple[str, int] = ("127.0.0.1", 0), name: str = "link") -> None:
        self.target, self.up, self.down = target, up, down or up
        self.listen_addr, self.name = listen, name
        self.stats = LinkStats()
        self.port: int | None = None
        self.t0 = 0.0
        self._server: asyncio.base_events.Server | None = None
        self._conns: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._tasks: set[asyncio.Task] = set()
        self._forced_down: tuple[float, float] | None = None   # (from, until) in link seconds
        self._bandwidth = {True: TokenBucket(), False: TokenBucket()}   # up, down: every connection's

    def state(self, trace: Trace, t: float) -> LinkState:
        """The state of one direction at link time t: the trace's, unless an outage was forced."""
        st = trace.at(t)
        if self._forced_down is not None and self._forced_down[0] <= t < self._forced_down[1]:
            return LinkState(st.delay_ms, 0.0, st.loss)
        return st

    def force_outage(self, duration_s: float) -> None:
        """Take the link down now for duration_s seconds (both directions), on top of its trace."""
        if not 0 < duration_s <= 200:
            raise ValueError(f"an outage lasts (0, 200] s, got {duration_s}")
        now = self.elapsed()
        self._forced_down = (now, now + duration_s)

    def elapsed(self) -> float:
        return asyncio.get_running_loop().time() - self.t0

    async def start(self) -> int:
        self.t0 = asyncio.get_running_loop().time()
        self._server = await asyncio.start_server(self._handle, *self.listen_addr)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def _handle(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        try:
            t_reader, t_writer = await asyncio.open_connection(*self.target)
        except OSError:
            c_writer.close()
            return
        self.stats.connections += 1
        pair = (c_writer, t_writer)
        self._conns.add(pair)
        up = _Pipe(c_reader, t_writer, lambda t: self.state(self.up, t), self.t0, self.stats, True, self._bandwidth[True])
        down = _Pipe(t_reader, c_writer, lambda t: self.state(self.down, t), self.t0, self.stats, False,
                     self._bandwidth[False])
        tasks = [asyncio.create_task(p) for p in (up.pump_in(), up.pump_out(), down.pump_in(), down.pump_out())]
        self._tasks.update(tasks)
        try:
            # Done when both directions have delivered everything and closed, or either broke.
            await asyncio.wait([tasks[1], tasks[3]], return_when=asyncio.FIRST_EXCEPTION)
        except (OSError, ConnectionError):
            pass
        finally:
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(asyncio.CancelledError, OSError, ConnectionError):
                    await t
            self._tasks.difference_update(tasks)
            for w in pair:
                w.close()
            self._conns.discard(pair)

    def reset(self) -> int:
        """Abort every proxied connection now (both sides see a reset); returns how many."""
        conns, self._conns = self._conns, set()
        for c, t in conns:
            c.transport.abort()
            t.transport.abort()
        self.stats.resets += len(conns)
        return len(conns)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self.reset()
            for t in list(self._tasks):
                t.cancel()
            await self._server.wait_closed()
            self._server = None
