"""Link backends behind one interface: how a site's connection to the PS gets its WAN.

    handle = await backend.open(site, target=(ps_host, ps_port), up=trace, down=trace)
    handle.connect        (host, port) the site dials instead of the PS
    handle.exec_prefix    what to put before the site's command line (e.g. `ip netns exec ...`)
    handle.proxy          the LinkProxy in the path (byte counts, resets), if there is one
    handle.state(t)       the trace state in force
    await handle.close()

`proxy` (default, no root): a LinkProxy on 127.0.0.1 does delay, rate, outages and resets.
`kernel` (root, Linux): the site runs in its own network namespace; htb and nftables do rate,
loss and outages, following the trace; netem does delay where the kernel has it, else a
LinkProxy on the host end of the veth adds the delay line (and still counts bytes, resets).
`kernel-relay` (root, Linux): the kernel backend with no proxy at all; the delay relay (a TUN
device per namespace, delay_relay.py) delays every packet the site sends, and the host forwards
between sites: for systems whose sites connect to each other or speak anything but one TCP
stream to a server (gloo, libp2p). The site dials the target itself, at the host's address on
its veth when the target is on the host's loopback (the target must listen there too).
The tcconfig backend shapes an interface of a real host instead (tcconfig_backend.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from dataclasses import dataclass, field

import numpy as np

from .kernel import KernelLink
from .proxy import LinkProxy, LinkStats
from .trace import LinkState, Trace

__all__ = ["LinkHandle", "ProxyBackend", "KernelBackend", "KernelRelayBackend", "BACKENDS", "get_backend", "without_rate"]


@dataclass
class LinkHandle:
    """One site's open link: where the site dials, what it runs under, and the link's state and counts
    (from its proxy, or for a proxy-less kernel-relay link from its traces and the kernel's counters)."""

    site: str
    connect: tuple[str, int]
    proxy: LinkProxy | None
    up: Trace
    exec_prefix: list[str] = field(default_factory=list)
    kernel: KernelLink | None = None
    down: Trace | None = None
    t0: float = 0.0                 # the loop time the link's traces start at (no proxy)
    _follower: asyncio.Task | None = None
    _forced_down: tuple[float, float] | None = None     # (from, until) in link seconds (no proxy)

    def state(self, t: float) -> LinkState:
        """The uplink's state at link time t."""
        return self.states(t)[0]

    def states(self, t: float) -> tuple[LinkState, LinkState]:
        """(up, down) at link time t: the traces', unless an outage was forced."""
        down_trace = self.down or self.up
        if self.proxy:
            return self.proxy.state(self.up, t), self.proxy.state(down_trace, t)
        up, down = self.up.at(t), down_trace.at(t)
        if self._forced_down is not None and self._forced_down[0] <= t < self._forced_down[1]:
            up, down = LinkState(up.delay_ms, 0.0, up.loss), LinkState(down.delay_ms, 0.0, down.loss)
        return up, down

    def elapsed(self) -> float:
        return asyncio.get_running_loop().time() - (self.proxy.t0 if self.proxy else self.t0)

    def force_outage(self, duration_s: float) -> None:
        """Take the link down now for duration_s seconds (both directions), on top of its traces."""
        if self.proxy:
            return self.proxy.force_outage(duration_s)
        if not 0 < duration_s <= 200:
            raise ValueError(f"an outage lasts (0, 200] s, got {duration_s}")
        now = self.elapsed()
        self._forced_down = (now, now + duration_s)

    def reset(self) -> int:
        """Abort the link's connections (a proxy's); a kernel-relay link has none of its own: 0."""
        return self.proxy.reset() if self.proxy else 0

    def stats(self) -> LinkStats:
        """Bytes each way and connections: the proxy's (payload), or the kernel's (IP packets, seen
        on the receiving side of each direction)."""
        if self.proxy:
            return self.proxy.stats
        assert self.kernel is not None          # a link has a proxy or a kernel link
        counts = self.kernel.counters("bytes")
        return LinkStats(bytes_up=counts["uplink"][0], bytes_down=counts["downlink"][0])

    def retrace(self, up: Trace, down: Trace) -> None:
        """Follow these traces from now on (the PS moved)."""
        if self.proxy:
            self.proxy.up, self.proxy.down = up, down
        self.up, self.down = up, down

    async def close(self) -> None:
        if self._follower:
            self._follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._follower
        if self.proxy:
            await self.proxy.stop()
        if self.kernel:
            await asyncio.to_thread(self.kernel.destroy)


class ProxyBackend:
    name = "proxy"

    async def open(self, site: str, target: tuple[str, int], up: Trace, down: Trace) -> LinkHandle:
        proxy = LinkProxy(target, up, down, name=site)
        port = await proxy.start()
        return LinkHandle(site, ("127.0.0.1", port), proxy, up, down=down)


def without_rate(t: Trace) -> Trace:
    """The same trace with no rate limit but its outages (the rate is done elsewhere: htb on the site's host)."""
    return Trace(t.t_s, t.delay_ms, np.where(t.bandwidth_mbps > 0, math.inf, 0.0), t.loss, t.loop, t.time_scale,
                 t.name, t.events)


def _delay_only(t: Trace) -> Trace:
    """The same trace with rate, loss and outages removed (the kernel does those)."""
    return Trace(t.t_s, t.delay_ms, np.full(t.t_s.size, math.inf), np.zeros(t.t_s.size), t.loop, t.time_scale,
                 t.name, t.events)


class KernelBackend:
    """Network namespace per site; follows the trace's rate, loss and outages every `step_s`."""

    name = "kernel"

    def __init__(self, step_s: float = 0.1) -> None:
        self.step_s = step_s

    async def open(self, site: str, target: tuple[str, int], up: Trace, down: Trace) -> LinkHandle:
        st = up.at(0)
        link = KernelLink(site, rate_mbps=st.bandwidth_mbps if st.bandwidth_mbps > 0 else math.inf, loss=st.loss,
                          delay_ms=st.delay_ms)
        await asyncio.to_thread(link.create)
        try:
            # Delay: netem in the kernel if it has one (then the proxy adds none), else the proxy.
            if link.needs_proxy_delay:
                up_p, down_p = _delay_only(up), _delay_only(down)
            else:
                up_p = down_p = Trace.constant(0, math.inf)
            proxy = LinkProxy(target, up_p, down_p, listen=(link.host_ip, 0), name=site)
            port = await proxy.start()
        except Exception:
            await asyncio.to_thread(link.destroy)
            raise
        handle = LinkHandle(site, (link.host_ip, port), proxy, up, link.exec_prefix(), link, down)
        handle._follower = asyncio.create_task(self._follow(handle))
        return handle

    async def _follow(self, h: LinkHandle) -> None:
        assert h.kernel is not None          # a kernel link's handle always has one
        kernel = h.kernel
        current = None
        while True:
            st, st_down = h.states(h.elapsed())
            if h.proxy is None:              # the relay carries both directions' delay
                delay = (st.delay_ms + st_down.delay_ms) / 2
            else:
                delay = kernel.delay_ms if kernel.needs_proxy_delay else st.delay_ms
            want = (st.bandwidth_mbps if not st.down else kernel.rate_mbps, st.loss, delay, st.down)
            if want != current:
                await asyncio.to_thread(kernel.apply, *want)
                current = want
            await asyncio.sleep(self.step_s)


class KernelRelayBackend(KernelBackend):
    """The kernel backend with the delay relay in place of a proxy: nothing between the site and
    what it dials but its own namespace's kernel, so any protocol and any peer is shaped."""

    name = "kernel-relay"

    async def open(self, site: str, target: tuple[str, int], up: Trace, down: Trace) -> LinkHandle:
        st, st_down = up.at(0), down.at(0)
        link = KernelLink(site, rate_mbps=st.bandwidth_mbps if st.bandwidth_mbps > 0 else math.inf, loss=st.loss,
                          delay_ms=(st.delay_ms + st_down.delay_ms) / 2, relay=True, peer_to_peer=True)
        await asyncio.to_thread(link.create)
        host, port = target
        connect = (link.host_ip if host in ("127.0.0.1", "localhost") else host, port)
        handle = LinkHandle(site, connect, None, up, link.exec_prefix(), link, down,
                            asyncio.get_running_loop().time())
        handle._follower = asyncio.create_task(self._follow(handle))
        return handle


BACKENDS = {"proxy": ProxyBackend, "kernel": KernelBackend, "kernel-relay": KernelRelayBackend}


def get_backend(name: str):
    if name not in BACKENDS:
        raise ValueError(f"unknown link backend {name!r} (known: {', '.join(BACKENDS)})")
    return BACKENDS[name]()
