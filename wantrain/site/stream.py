"""The session's transport: domain messages to and from the parameter server.

session.py speaks to one PS through `send`, `receive` and `close`. `SingleStream` is one gRPC
Session stream, with lanes beside it where the run asks (lanes.py: extra connections for a
delta's chunks); `ShardedStream` (sharded.py) is one stream per shard of a sharded PS, merged so
that the session sees one PS (no lanes). `session_stream` picks by the number of addresses.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Protocol

import grpc

from ..transport import net, wire
from ..transport.auth import bearer
from ..errors import ConnectionLostError
from .lanes import Lanes
from .sharded import CLOSE_S, ShardedStream

__all__ = ["Stream", "SingleStream", "addresses", "session_stream", "probe_rtt"]


def addresses(ps: str) -> list[str]:
    """The PS's address, or a sharded PS's shard addresses in shard order (comma-separated)."""
    return [a.strip() for a in ps.split(",") if a.strip()]


class Stream(Protocol):
    protects: bool      # may a delta go with critical copies and parity (docs/protocol.md 4a)?

    async def lanes(self, n: int) -> Lanes | None: ...
    async def send(self, msg) -> None: ...
    async def receive(self): ...
    async def close(self) -> None: ...
    def stop(self) -> None: ...


class SingleStream:
    """One Session stream to an unsharded PS, and the lanes beside it (lanes.py) once asked for."""

    protects = True

    def __init__(self, call, address: str = "", opts=None) -> None:
        self.call = call
        self.sending = asyncio.Lock()    # one write at a time: a delta's tail goes beside the next round
        self.address, self.opts = address, opts
        self._lanes: Lanes | None = None
        self._opening = asyncio.Lock()

    async def lanes(self, n: int) -> Lanes | None:
        """The session's `n` lanes, opened on the first call (the run's config says how many)."""
        async with self._opening:
            if self._lanes is None and n > 0 and self.opts is not None:
                self._lanes = await Lanes.open(n, self.address, self.opts)
        return self._lanes

    async def close_lanes(self) -> None:
        if self._lanes is not None:
            await self._lanes.close()

    async def send(self, msg) -> None:
        async with self.sending:
            await self.call.write(wire.site_message(msg))

    async def receive(self):
        raw = await self.call.read()
        if raw is grpc.aio.EOF:
            raise ConnectionLostError("the stream ended")
        return wire.server_message_from_proto(raw)

    async def close(self) -> None:
        """Half-close, then read to the PS's end of the stream: closing the channel at once cancels
        the call, and the PS may then drop what was written last (the final HashReport, which it
        waits for before it exits: serve.py)."""
        await self.call.done_writing()
        await to_end(self.call)

    def stop(self) -> None:
        """Nothing runs beside the call (the channel's closing ends it)."""


async def to_end(call, timeout_s: float | None = None) -> None:
    """Read `call` to its end (what still comes is of no use), for at most `timeout_s` (CLOSE_S)."""
    async def read_all() -> None:
        while await call.read() is not grpc.aio.EOF:
            pass
    with contextlib.suppress(asyncio.TimeoutError, grpc.aio.AioRpcError):
        await asyncio.wait_for(read_all(), CLOSE_S if timeout_s is None else timeout_s)


@contextlib.asynccontextmanager
async def session_stream(site) -> AsyncIterator[tuple[Stream, object]]:
    """Channels and Session calls to the PS or to each of its shards (`site.addresses`), as one
    stream, and a stub of the first for pings; everything is closed on the way out."""
    opts = site.opts
    channels = [net.site_channel(a, opts.tls, opts.tls_server_name, opts.link_rtt_ms, opts.link_mbps)
                for a in site.addresses]
    try:
        stubs = [net.stub(c) for c in channels]
        calls = [s.Session(wait_for_ready=False) for s in stubs]
        stream = (SingleStream(calls[0], site.addresses[0], opts) if len(calls) == 1
                  else ShardedStream(calls, opts.name, site.replica, site.shard_memory))
        try:
            yield stream, stubs[0]
        finally:
            stream.stop()
            if isinstance(stream, SingleStream):
                await stream.close_lanes()
    finally:
        for c in channels:
            await c.close()


async def probe_rtt(stub, opts, samples: list[tuple[float, float]]) -> None:
    """Time a Ping on the site's own channel every `opts.probe_interval_s` (through the real path);
    appends (Unix time, RTT ms) to `samples` until cancelled."""
    while True:
        await asyncio.sleep(opts.probe_interval_s)
        t0 = time.perf_counter()
        try:
            await stub.Ping(wire.ping_request(opts.name), metadata=bearer(opts.token),
                            timeout=max(30.0, 10 * opts.probe_interval_s))
        except grpc.aio.AioRpcError:
            continue
        samples.append((time.time(), (time.perf_counter() - t0) * 1000))
