"""Running a parameter server: listen, serve until the run is done, let every site hear of it."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from ..transport import net
from ..transport.limits import raise_open_file_limit
from ..transport.tls import TLSServer
from .server import ParameterServer
from .servicer import Servicer, add_to_server

__all__ = ["serve"]

log = logging.getLogger("wantrain.ps")


async def serve(ps: ParameterServer, host: str = "127.0.0.1", port: int = 0,
                port_file: str | Path | None = None, linger_s: float = 1.0, straggler_wait_s: float = 20.0,
                tls: TLSServer | None = None) -> None:
    """Run the PS until the run is done (if exit_when_done) or forever; port 0 picks a free port.

    After the last round it waits (up to straggler_wait_s) for sites that were away at the end
    (a reset, an outage) to reconnect and be told the run is over, so none retries in vain.
    """
    soft, _ = raise_open_file_limit()
    server = net.new_server(ps.limits)
    servicer = Servicer(ps)
    add_to_server(servicer, server)
    bound = net.bind(server, host, port, tls)
    await server.start()
    servicer.guard.start(bound)
    log.info("parameter server %s listening on %s:%d (%s; at most %d connections, open-file limit %d)", ps.ledger.run_id,
             host, bound, "plaintext" if tls is None else "TLS, client certificates required" if tls.client_ca
             else "TLS", ps.limits.connection_cap(), soft)
    if port_file:
        tmp = Path(str(port_file) + ".tmp")
        tmp.write_text(f"{bound}\n")
        tmp.replace(port_file)
    try:
        if ps.exit_when_done:
            await ps.done.wait()
            deadline = time.time() + 30
            while ps.sites.links and time.time() < deadline:   # let sites receive the last result
                await asyncio.sleep(0.05)
            deadline = time.time() + straggler_wait_s
            while set(ps.ledger.registry) - ps.sites.told_finished and time.time() < deadline:
                await asyncio.sleep(0.05)
            deadline = time.time() + linger_s             # and watchers the last events
            while not servicer.watchers_caught_up() and time.time() < deadline:
                await asyncio.sleep(0.02)
        else:
            await server.wait_for_termination()
    finally:
        await servicer.guard.stop()
        ps.closing.set()            # watchers get their last events and end their streams
        deadline = time.time() + 1.0
        while servicer.watchers and time.time() < deadline:
            await asyncio.sleep(0.02)
        await server.stop(grace=1.0)
        if ps.checkpoints is not None:
            await ps.checkpoints.settled()    # a full checkpoint still being written
        ps.recorder.close()
