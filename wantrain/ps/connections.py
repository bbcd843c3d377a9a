"""The PS's TCP connections, per peer address: how many have never carried an authenticated call.

gRPC offers no per-peer connection limit (only one for the whole server, which one address can
fill). `ConnectionGuard` looks at the process's own sockets every `SWEEP_S`: each one accepted on
the PS's port, by its peer address. A connection becomes *authenticated* when a call on it passes
its token check (the servicer says so). When one address holds more than
`limits.max_unauthenticated_per_peer` connections that never did, the oldest of those are shut
down (their file descriptors stay gRPC's, which closes them on the EOF), and the PS reports what
it shed, per address, at most every `LOG_EVERY_S`, for as long as it goes on: a log line and a
`shed` telemetry event each time. A new connection that is still in its TLS handshake is
the youngest, so a real site from an address that floods is shed last; one from another address,
never. Linux (/proc/self/fd) or /dev/fd; where neither lists sockets, the guard does nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable

from ..transport.limits import Limits

__all__ = ["ConnectionGuard", "peer_address"]

log = logging.getLogger("wantrain.ps")

SWEEP_S = 0.5
LOG_EVERY_S = 10.0
FD_DIRS = ("/proc/self/fd", "/dev/fd")

Peer = tuple[str, int]          # (address, port) of the far end


def peer_address(peer: str) -> Peer | None:
    """A gRPC peer string as (address, port): "ipv4:1.2.3.4:5678", "ipv6:[::1]:9"; None otherwise."""
    kind, _, rest = peer.partition(":")
    host, _, port = rest.rpartition(":")
    if kind not in ("ipv4", "ipv6") or not port.isdigit():
        return None
    return _plain(host.strip("[]").replace("%5B", "").replace("%5D", "")), int(port)


def _plain(host: str) -> str:
    """An IPv4 peer of a dual-stack socket is "::ffff:1.2.3.4": the address is 1.2.3.4."""
    return host[7:] if host.startswith("::ffff:") and "." in host else host


class ConnectionGuard:
    """Sheds the oldest never-authenticated connections of an address over its cap."""

    def __init__(self, limits: Limits, report: Callable[..., object] | None = None) -> None:
        """`report(peer=, connections=, shed=, cap=)`: what was shed from one address since it last said."""
        self.cap = limits.max_unauthenticated_per_peer
        self.report = report
        self.port = 0
        self.authenticated: set[Peer] = set()
        self.first_seen: dict[Peer, float] = {}
        self.shed: dict[str, int] = {}              # per address, since it was last reported
        self.held: dict[str, int] = {}              # per address, the most unauthenticated it held since
        self.logged_at: dict[str, float] = {}
        self.total_shed = 0
        self._task: asyncio.Task | None = None

    def passed(self, peer: str) -> None:
        """A call on this connection passed its token check."""
        if (p := peer_address(peer)) is not None:
            self.authenticated.add(p)

    def start(self, port: int) -> None:
        self.port = port
        if any(os.path.isdir(d) for d in FD_DIRS):
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_S)
            try:
                self.sweep()
            except Exception:               # the guard must never take the PS down
                log.exception("connection guard sweep failed")

    def connections(self) -> dict[Peer, int]:
        """The PS's accepted TCP connections on its port: peer -> file descriptor."""
        folder = next(d for d in FD_DIRS if os.path.isdir(d))
        out = {}
        for name in os.listdir(folder):
            fd = int(name)
            with contextlib.suppress(OSError, ValueError):
                if folder == FD_DIRS[0] and not os.readlink(f"{folder}/{name}").startswith("socket:"):
                    continue
                with socket.socket(fileno=os.dup(fd)) as s:
                    if s.family not in (socket.AF_INET, socket.AF_INET6) or s.type != socket.SOCK_STREAM \
                            or s.getsockname()[1] != self.port:
                        continue
                    host, port = s.getpeername()[:2]            # the listening socket has none: OSError
                    out[(_plain(host), port)] = fd
        return out

    def sweep(self, now: float | None = None) -> int:
        """One look at the connections; returns how many were shed."""
        now = time.monotonic() if now is None else now
        open_ = self.connections()
        self.authenticated &= open_.keys()
        self.first_seen = {p: self.first_seen.get(p, now) for p in open_}
        waiting: dict[str, list[Peer]] = {}
        for p in open_:
            if p not in self.authenticated:
                waiting.setdefault(p[0], []).append(p)
        shed = 0
        for host, peers in waiting.items():
            if len(peers) <= self.cap:
                continue
            peers.sort(key=lambda p: self.first_seen[p])           # oldest first
            self.held[host] = max(self.held.get(host, 0), len(peers))
            for p in peers[: len(peers) - self.cap]:
                if self._shut(open_[p], p):
                    shed += 1
                    self.shed[host] = self.shed.get(host, 0) + 1
        for host in [h for h, n in self.shed.items() if n and now - self.logged_at.get(h, -LOG_EVERY_S) >= LOG_EVERY_S]:
            count, held = self.shed.pop(host), self.held.pop(host, 0)
            log.warning("%s held up to %d connections that never carried an authenticated call; shed %d "
                        "(limits.max_unauthenticated_per_peer %d)", host, held, count, self.cap)
            if self.report is not None:
                self.report(peer=host, connections=held, shed=count, cap=self.cap)
            self.logged_at[host] = now
        self.total_shed += shed
        return shed

    @staticmethod
    def _shut(fd: int, peer: Peer) -> bool:
        """Shut the connection down if `fd` still is the one to `peer` (the fd may have been reused)."""
        with contextlib.suppress(OSError):
            with socket.socket(fileno=os.dup(fd)) as s:
                if (_plain(s.getpeername()[0]), s.getpeername()[1]) == peer:
                    s.shutdown(socket.SHUT_RDWR)
                    return True
        return False
