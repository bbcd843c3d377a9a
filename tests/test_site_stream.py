"""The site's end of its Session stream, over real gRPC in this process."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from wantrain.site import stream as stream_module
from wantrain.site.stream import SingleStream
from wantrain.transport import net, wire
from wantrain.transport.messages import HashReport


@pytest.mark.timeout(60)
def test_a_closing_site_leaves_its_last_message_to_a_slow_ps_and_waits_a_bounded_time(monkeypatch):
    """A site that writes its last message (the final HashReport), closes its stream and then its
    channel: the PS reads it even when it reads only later (a busy PS); closing cancelled the call
    before, and the report was lost (the PS then waited 20 s for it at the end of a run). Closing
    waits for the PS's end of the stream, and no longer than its bound where the PS never ends it."""
    report = HashReport(3, "0123456789abcdef")
    monkeypatch.setattr(stream_module, "CLOSE_S", 1.0)

    async def scenario():
        got: list[bytes] = []

        async def slow(requests, context):
            await asyncio.sleep(0.5)
            async for raw in requests:
                got.append(raw)

        async def never_ends(requests, context):
            await asyncio.sleep(3600)

        results = []
        for handler in (slow, never_ends):
            server = grpc.aio.server()
            net.add_service(server, {"Session": grpc.stream_stream_rpc_method_handler(handler, None, bytes)})
            port = server.add_insecure_port("127.0.0.1:0")
            await server.start()
            channel = net.site_channel(f"127.0.0.1:{port}", None)
            try:
                stream = SingleStream(net.stub(channel).Session())
                await stream.send(report)
                started = time.monotonic()
                await stream.close()
                results.append(time.monotonic() - started)
            finally:
                await channel.close()
                await server.stop(None)
        return [wire.parse_site_message(raw) for raw in got], results

    got, (slow_close_s, never_close_s) = asyncio.run(scenario())
    assert got == [report]
    assert slow_close_s >= 0.3           # it waited for the PS to read and end the stream
    assert 0.8 <= never_close_s < 20     # the bound (1 s here), with margin for a busy machine
