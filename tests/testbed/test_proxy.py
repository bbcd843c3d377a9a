"""Emulation accuracy of the proxy backend, measured on real TCP through it."""

import asyncio
import math
import time

import pytest

from testbed import LinkProxy, Trace
from testbed.proxy import mathis_rate_bps


async def echo_server():
    async def handle(r, w):
        while data := await r.read(65536):
            w.write(data)
            await w.drain()
        w.close()
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def sink_server(received: list):
    async def handle(r, w):
        while data := await r.read(65536):
            received.append((time.monotonic(), len(data)))
        w.close()
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def ping(r, w, n=1):
    t0 = time.monotonic()
    w.write(b"x" * n)
    await w.drain()
    await r.readexactly(n)
    return time.monotonic() - t0


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("one_way_ms", [5, 40, 120])
def test_rtt_matches_the_set_delay(one_way_ms):
    async def go():
        server, port = await echo_server()
        proxy = LinkProxy(("127.0.0.1", port), Trace.constant(one_way_ms, math.inf))
        await proxy.start()
        r, w = await asyncio.open_connection("127.0.0.1", proxy.port)
        rtts = [await ping(r, w) * 1000 for _ in range(9)]
        w.close()
        await proxy.stop()
        server.close()
        return rtts
    rtts = run(go())
    expected = 2 * one_way_ms
    # Never faster than the set delay; a busy machine only adds to a ping (a late timer, a
    # descheduled process), so the fastest of nine shows what the proxy itself adds.
    assert min(rtts) >= expected - 0.5, (rtts, expected)
    assert min(rtts) - expected <= max(0.1 * expected, 2.0), (rtts, expected)


async def rate_through(trace: Trace, total: int, flows: int = 1) -> float:
    """Bytes/s a sink receives through a proxy with `trace` from `flows` connections at once, each
    sending `total` bytes, over the steady part (first to last byte)."""
    received = []
    server, port = await sink_server(received)
    proxy = LinkProxy(("127.0.0.1", port), trace)
    await proxy.start()
    writers = [(await asyncio.open_connection("127.0.0.1", proxy.port))[1] for _ in range(flows)]
    for w in writers:
        w.write(b"\0" * total)
    for w in writers:
        await w.drain()
    while sum(n for _, n in received) < flows * total:
        await asyncio.sleep(0.01)
    for w in writers:
        w.close()
    await proxy.stop()
    server.close()
    return sum(n for _, n in received[1:]) / (received[-1][0] - received[0][0])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mbps", [8, 40])
def test_throughput_matches_the_set_rate(mbps):
    total = int(mbps * 1e6 / 8 * 2)          # two seconds' worth
    measured = run(rate_through(Trace.constant(10, mbps), total)) * 8 / 1e6
    # Tight above (the shaper caps), looser below: a busy machine can make the proxy late but
    # never early (tests/testbed/test_backends.py: test_rate).
    assert 0.8 * mbps <= measured <= 1.1 * mbps, measured


@pytest.mark.timeout(60)
def test_scheduled_outage_stalls_for_its_duration():
    trace = Trace.from_rows([(0, 5, math.inf, 0), (1.0, 5, 0, 0), (3.0, 5, math.inf, 0)])

    async def go():
        received = []
        server, port = await sink_server(received)
        proxy = LinkProxy(("127.0.0.1", port), trace)
        await proxy.start()
        r, w = await asyncio.open_connection("127.0.0.1", proxy.port)
        for _ in range(400):                       # a message every 10 ms for 4 s
            w.write(b"m")
            await w.drain()
            await asyncio.sleep(0.01)
        w.close()
        await asyncio.sleep(0.1)
        await proxy.stop()
        server.close()
        times = [t for t, _ in received]
        return max(b - a for a, b in zip(times, times[1:])), proxy.stats.stalled_s
    gap, stalled = run(go())
    assert abs(gap - 2.0) <= 0.2 and abs(stalled - 2.0) <= 0.2, (gap, stalled)


@pytest.mark.timeout(60)
def test_trace_changes_are_followed_in_time():
    trace = Trace.from_rows([(0, 10, math.inf, 0), (1.0, 60, math.inf, 0), (2.0, 25, math.inf, 0)])

    async def go():
        server, port = await echo_server()
        proxy = LinkProxy(("127.0.0.1", port), trace)
        await proxy.start()
        r, w = await asyncio.open_connection("127.0.0.1", proxy.port)
        samples = []
        while proxy.elapsed() < 3.0:
            t = proxy.elapsed()
            samples.append((t, await ping(r, w) * 1000))
        w.close()
        await proxy.stop()
        server.close()
        return samples
    samples = run(go())
    def fastest_in(a, b):           # as above: load only adds, so the fastest ping shows the set delay
        return min(rtt for t, rtt in samples if a <= t < b)
    assert 19.5 <= fastest_in(0.1, 0.8) <= 22.0
    assert 119.5 <= fastest_in(1.1, 1.8) <= 132.0
    assert 49.5 <= fastest_in(2.1, 2.8) <= 55.0


@pytest.mark.timeout(60)
def test_loss_caps_throughput_at_the_mathis_bound():
    rate = mathis_rate_bps(0.1, 0.01)             # 100 ms RTT, 1% loss: about 1.4 Mbit/s
    assert 1.3e6 < rate * 8 < 1.5e6
    measured = run(rate_through(Trace.constant(50, 1000, 0.01), int(rate * 1.5)))
    assert abs(measured - rate) <= 0.1 * rate


@pytest.mark.timeout(60)
def test_connections_share_the_link_s_bandwidth_and_each_has_its_own_loss_bound():
    # Three connections at once through an 8 Mbit/s link carry 8 Mbit/s in all, not 8 each.
    mbps = 8
    measured = run(rate_through(Trace.constant(10, mbps), int(mbps * 1e6 / 8 * 2 / 3), flows=3)) * 8 / 1e6
    assert 0.8 * mbps <= measured <= 1.1 * mbps, measured
    # On a lossy path with room to spare, each is held by its own Mathis bound: two carry twice one's.
    rate = mathis_rate_bps(0.1, 0.01)
    measured = run(rate_through(Trace.constant(50, 1000, 0.01), int(rate * 1.5), flows=2))
    assert 1.8 * rate <= measured <= 2.2 * rate, (measured, rate)


@pytest.mark.timeout(60)
def test_reset_aborts_connections():
    async def go():
        server, port = await echo_server()
        proxy = LinkProxy(("127.0.0.1", port), Trace.constant(1, math.inf))
        await proxy.start()
        r, w = await asyncio.open_connection("127.0.0.1", proxy.port)
        await ping(r, w)
        assert proxy.reset() == 1
        with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
            await ping(r, w)
            await ping(r, w)
        await proxy.stop()
        server.close()
        return proxy.stats.resets
    assert run(go()) == 1
