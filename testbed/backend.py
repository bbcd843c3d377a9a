"""Link backends behind one interface: how a site's connection to the PS gets its WAN.

    handle = await backend.open(site, target=(ps_host, ps_port), up=trace, down=trace)
    handle.connect        (host, port) the site dials instead of the PS
    handle.exec_prefix    what to put before the site's command line (e.g. `ip netns exec ...`)
    handle.proxy          the LinkProxy in the path (byte counts, resets)
    handle.state(t)       the trace state in force
    await handle.close()

`proxy` (default, no root): a LinkProxy on 127.0.0.1 does delay, rate, outages and resets.
`kernel` (root, Linux): the site runs in its own network namespace; htb and nftables do rate,
loss and outages, following the trace; netem does delay where the kernel has it, else a
LinkProxy on the host end of the veth adds the delay line (and still counts bytes, resets).
The tcconfig backend shapes an interface of a real host instead (tcconfig_backend.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from dataclasses import dataclass, field

import numpy as np

from .kernel import KernelLink
from .proxy import LinkProxy
from .trace import LinkState, Trace

__all__ = ["LinkHandle", "ProxyBackend", "KernelBackend", "BACKENDS", "get_backend", "without_rate"]


@dataclass
class LinkHandle:
    site: str
    connect: tuple[str, int]
    proxy: LinkProxy
    up: Trace
    exec_prefix: list[str] = field(default_factory=list)
    kernel: KernelLink | None = None
    _follower: asyncio.Task | None = None

    def state(self, t: float) -> LinkState:
        return self.proxy.state(self.up, t)

    async def close(self) -> None:
        if self._follower:
            self._follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._follower
        await self.proxy.stop()
        if self.kernel:
            await asyncio.to_thread(self.kernel.destroy)


class ProxyBackend:
    name = "proxy"

    async def open(self, site: str, target: tuple[str, int], up: Trace, down: Trace) -> LinkHandle:
        proxy = LinkProxy(target, up, down, name=site)
        port = await proxy.start()
        return LinkHandle(site, ("127.0.0.1", port), proxy, up)


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
        handle = LinkHandle(site, (link.host_ip, port), proxy, up, link.exec_prefix(), link)
        handle._follower = asyncio.create_task(self._follow(handle))
        return handle

    async def _follow(self, h: LinkHandle) -> None:
        assert h.kernel is not None          # a kernel link's handle always has one
        kernel = h.kernel
        loop = asyncio.get_running_loop()
        t0 = h.proxy.t0
        current = None
        while True:
            st = h.state(loop.time() - t0)
            want = (st.bandwidth_mbps if not st.down else kernel.rate_mbps, st.loss,
                    kernel.delay_ms if kernel.needs_proxy_delay else st.delay_ms, st.down)
            if want != current:
                await asyncio.to_thread(kernel.apply, *want)
                current = want
            await asyncio.sleep(self.step_s)


BACKENDS = {"proxy": ProxyBackend, "kernel": KernelBackend}


def get_backend(name: str):
    if name not in BACKENDS:
        raise ValueError(f"unknown link backend {name!r} (known: {', '.join(BACKENDS)})")
    return BACKENDS[name]()
