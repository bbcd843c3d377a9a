"""A run in this process: the PS's gRPC server on port 0 and each site's session as asyncio tasks of
one event loop, speaking real gRPC over loopback sockets.

For the integration tests that need no process death (killing a process is tests/cluster.py's
job). It runs the code `wantrain ps` and `wantrain worker` run (ps/serve.py with its Servicer,
site/session.py's Site) without paying, for every party, a Python process, a torch import and a
model build: on a loaded 2-core machine that is most of a short test. What stays real: the wire
(protobuf over HTTP/2 on a socket, credentials checked), each site's own model, optimizer, codec
and error feedback, the PS's screen, journal and events file. What is shared: torch's thread pool
and the allocator, so nothing here measures speed.

    async with InProcessCluster(cfg, tmp_path / "run") as c:
        c.start_sites()
        events = await c.finish()
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from wantrain.config import RunConfig
from wantrain.ps import ParameterServer
from wantrain.ps.serve import serve
from wantrain.launch.relay import EventRelay, shard_relay
from wantrain.site import Site, SiteOptions
from wantrain.telemetry import read_events

SITE_DEFAULTS = {"device": "cpu", "threads": 0, "probe_interval_s": 0.0, "connect_timeout_s": 30.0}


class InProcessCluster:
    """The PS of `cfg` (its keyword options in `ps_options`) and the sites started on it, as tasks.
    With `shards` > 1, a sharded PS as `wantrain ps --shard i/n` runs it: shard i in its own run
    folder `run_dir`/shard-i, every shard after the first reporting its events to shard 0."""

    def __init__(self, cfg: RunConfig, run_dir: Path, shards: int = 1, **ps_options) -> None:
        self.cfg, self.run_dir = cfg, run_dir
        self.run_dirs = [run_dir] if shards == 1 else [run_dir / f"shard-{i}" for i in range(shards)]
        if shards > 1:
            ps_options = {"run_id": "sharded-run", **ps_options}
        self.ps_options = ps_options
        self.shards: list[ParameterServer] = []
        self.sites: dict[str, Site] = {}
        self.address = ""                  # the --ps of a site: each shard's address, in shard order
        self._servers: list[asyncio.Task] = []
        self._site_tasks: list[asyncio.Task] = []
        self._relays: list[EventRelay] = []

    @property
    def ps(self) -> ParameterServer:
        return self.shards[0]

    async def __aenter__(self) -> InProcessCluster:
        addresses = []
        for i, run_dir in enumerate(self.run_dirs):
            run_dir.mkdir(parents=True, exist_ok=True)
            if i:                                           # before the shard's first event
                self._relays.append(shard_relay(addresses[0], "", run_dir / "events.jsonl", i))
            ps = ParameterServer(self.cfg, run_dir=run_dir, shard=(i, len(self.run_dirs)), **self.ps_options)
            self.shards.append(ps)
            port_file = run_dir / "ps.port"
            server = asyncio.create_task(serve(ps, port=0, port_file=port_file, linger_s=0.2, straggler_wait_s=5.0))
            self._servers.append(server)
            while not port_file.exists():
                if server.done():
                    server.result()          # raises what stopped it
                    raise RuntimeError("the PS stopped before it listened")
                await asyncio.sleep(0.01)
            addresses.append(f"127.0.0.1:{int(port_file.read_text())}")
        self.address = ",".join(addresses)
        return self

    async def __aexit__(self, *exc) -> None:
        tasks = [*self._servers, *self._site_tasks]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for relay in self._relays:
            await asyncio.to_thread(relay.close)

    def start_site(self, name: str, **options) -> Site:
        """A site session on the PS, as `wantrain worker --site name` runs it (the CPU, no RTT probes
        unless `options`, SiteOptions fields, say otherwise: `ps` for another address)."""
        site = self.sites[name] = Site(SiteOptions(**{"ps": self.address, "name": name, **SITE_DEFAULTS, **options}))
        self._site_tasks.append(asyncio.create_task(site.run(), name=f"site {name}"))
        return site

    def start_sites(self, **options) -> None:
        """One site per name of the config (site0, site1, ... when it names none)."""
        for name in self.cfg.sites or [f"site{i}" for i in range(self.cfg.num_sites)]:
            self.start_site(name, **options)

    async def finish(self, timeout_s: float = 120) -> list[dict]:
        """Wait until the PS and every site have ended (a site's failure is raised); the run's events
        (of shard 0: `events(i)` reads shard i's)."""
        await asyncio.wait_for(asyncio.gather(*self._servers, *self._site_tasks), timeout_s)
        for relay in self._relays:
            await asyncio.to_thread(relay.close)        # it has sent what its shard wrote
        return self.events(0)

    def events(self, shard: int) -> list[dict]:
        return read_events(self.run_dirs[shard])


def run_in_process(cfg: RunConfig, run_dir: Path, timeout_s: float = 120, site_options: dict | None = None,
                   shards: int = 1, **ps_options) -> tuple[list[dict], InProcessCluster]:
    """Run `cfg` to its end with a site per name of the config; its events (shard 0's), and the
    cluster (the PS's shards and the sites, with their replicas) for a look afterwards."""
    async def go() -> tuple[list[dict], InProcessCluster]:
        async with InProcessCluster(cfg, run_dir, shards, **ps_options) as c:
            c.start_sites(**(site_options or {}))
            return await c.finish(timeout_s), c
    return asyncio.run(go())


@contextlib.contextmanager
def link_proxy(port: int) -> Iterator[tuple[int, Callable[[], int]]]:
    """A userspace link (5 ms, unlimited rate) in front of the PS at `port`, on its own event loop:
    yields the port to dial and a function that resets every connection through it (returns how many)."""
    from testbed.proxy import LinkProxy
    from testbed.trace import Trace

    loop = asyncio.new_event_loop()
    proxy = LinkProxy(("127.0.0.1", port), Trace.constant(5, math.inf))
    threading.Thread(target=loop.run_forever, daemon=True).start()

    async def reset() -> int:
        return proxy.reset()
    try:
        yield (asyncio.run_coroutine_threadsafe(proxy.start(), loop).result(10),
               lambda: asyncio.run_coroutine_threadsafe(reset(), loop).result(10))
    finally:
        asyncio.run_coroutine_threadsafe(proxy.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)


def reset_b_while_it_pushes(cfg: RunConfig, run_dir: Path, stall: str, seconds: float) -> tuple[list[dict], float]:
    """Run `cfg` (sites a, b, c) with a and c dialing the PS and b dialing through a link proxy; b
    stalls at `stall` for `seconds` (for example "push@2", 3: after its first delta chunk of round 2)
    and the proxy resets b's connection there. Returns the run's events and the time of the reset."""
    async def go() -> tuple[list[dict], float]:
        async with InProcessCluster(cfg, run_dir) as c:
            with link_proxy(int(c.address.rpartition(":")[2])) as (proxy_port, reset):
                c.start_site("a"), c.start_site("c")
                loop, stalled = asyncio.get_running_loop(), asyncio.Event()
                b = c.start_site("b", ps=f"127.0.0.1:{proxy_port}", stalls=((stall, seconds),))
                b.stalls.on_stall = lambda *_: loop.call_soon_threadsafe(stalled.set)   # from any thread
                await asyncio.wait_for(stalled.wait(), 120)
                assert await asyncio.to_thread(reset) >= 1
                t_reset = time.time()
                return await c.finish(), t_reset
    return asyncio.run(go())
