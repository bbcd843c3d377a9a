"""Every bound on what a peer can make the parameter server do, in one place.

The PS faces the internet. Whatever arrives on its port (a TCP connection that never speaks, a
stream that never joins, a site that sends the same report a thousand times) may cost the PS
only a bounded amount of memory, work, bandwidth and log space. `Limits` holds the numbers
(docs/protocol.md lists them for implementers); `TokenBucket` and `Throttle` enforce rates.
Nothing here imports gRPC or torch.
"""

from __future__ import annotations

import math
import resource
import time
from collections import OrderedDict
from dataclasses import dataclass

from ..errors import ConfigError

__all__ = ["Limits", "TokenBucket", "Throttle", "raise_open_file_limit", "safe_text"]


@dataclass(frozen=True)
class Limits:
    """Caps and timeouts of a parameter server (not part of the run config: they never reach sites)."""

    max_message_bytes: int = 4 << 20      # one gRPC message, either way (a chunk carries <= 1 MiB of payload)
    handshake_timeout_s: float = 10.0     # TCP accepted -> TLS and HTTP/2 settings done (a few RTTs)
    idle_connection_s: float = 30.0       # a connection with no call open is closed after this
    join_timeout_s: float = 10.0          # a Session must send its Join within this
    max_connections: int = 0              # TCP connections at once; 0: 80 % of the open-file limit
    max_streams_per_peer: int = 32        # Session + Watch calls open at once from one IP address
    max_lanes_per_site: int = 8           # Lane calls open at once per site (recovery.lanes; not per address)
    max_unauthenticated_per_peer: int = 64  # connections from one IP address that never carried an
                                          # authenticated call; the oldest beyond this are shut (ps/connections.py)
    probe_messages_burst: int = 64        # LinkProbe messages per site: burst ... (every other message is
    probe_messages_per_s: float = 2.0     # ... bounded by the protocol: once a round or once a download)
    probe_samples_burst: int = 2000       # RTT samples in LinkProbes: burst ...
    probe_samples_per_s: float = 50.0     # ... and sustained rate (a site probes at most every 0.05 s)
    downloads_per_site: int = 10          # model downloads (joins and resyncs) per site within the window,
    download_bytes_per_site: int = 1 << 30  # or more while they add up to at most this (small models) ...
    download_window_s: float = 600.0      # ... the window, in seconds
    rejected_events_per_s: float = 1.0    # telemetry and log lines about refused peers, per peer
    rejected_events_burst: int = 20
    reported_events_burst: int = 5000     # events reported from outside the PS (Report), for the whole PS:
    reported_events_per_s: float = 200.0  # a link emulator logs about 2 per link per second, plus its events

    def __post_init__(self) -> None:
        for name in ("handshake_timeout_s", "idle_connection_s", "join_timeout_s", "probe_messages_per_s",
                     "probe_samples_per_s", "download_window_s", "rejected_events_per_s",
                     "reported_events_per_s"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise ConfigError(f"limits.{name} must be a positive number, got {v!r}")
        for name in ("max_message_bytes", "max_streams_per_peer", "max_lanes_per_site", "max_unauthenticated_per_peer",
                     "probe_messages_burst", "probe_samples_burst",
                     "downloads_per_site", "download_bytes_per_site", "rejected_events_burst",
                     "reported_events_burst"):
            if getattr(self, name) < 1:
                raise ConfigError(f"limits.{name} must be >= 1, got {getattr(self, name)!r}")
        if self.max_connections < 0:
            raise ConfigError(f"limits.max_connections must be >= 0 (0: derived), got {self.max_connections!r}")

    def downloads_allowed(self, model_bytes: int) -> int:
        """Model downloads a site may start within `download_window_s`."""
        return max(self.downloads_per_site, self.download_bytes_per_site // max(1, model_bytes))

    def connection_cap(self) -> int:
        """TCP connections the PS accepts at once: below the open-file limit, so that a flood of
        connections can never leave the PS unable to open its checkpoint or its log."""
        if self.max_connections:
            return self.max_connections
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            return 65536
        return max(16, int(soft * 0.8) - 64)


class TokenBucket:
    """`burst` tokens, refilled at `per_s`; `take(n)` says whether n tokens were there (and takes them)."""

    def __init__(self, burst: float, per_s: float, clock=time.monotonic) -> None:
        self.burst, self.per_s, self.clock = float(burst), float(per_s), clock
        self.tokens, self.at = float(burst), clock()

    def take(self, n: float = 1.0) -> bool:
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.per_s)
        self.at = now
        if n > self.tokens:
            return False
        self.tokens -= n
        return True


class Throttle:
    """A token bucket per key (a peer address, a site name), for at most `keys` keys at once.

    Used for what refused peers may cause: an unauthenticated peer that retries a bad Join
    forever must not fill the event log or the PS's log file. `allow` returns False while a
    key is over its rate, and counts what was suppressed so that the next allowed line can say so."""

    def __init__(self, burst: float, per_s: float, keys: int = 4096, clock=time.monotonic) -> None:
        self.burst, self.per_s, self.keys, self.clock = burst, per_s, keys, clock
        self.buckets: OrderedDict[str, TokenBucket] = OrderedDict()
        self.suppressed: dict[str, int] = {}

    def allow(self, key: str) -> bool:
        bucket = self.buckets.get(key)
        if bucket is None:
            bucket = self.buckets[key] = TokenBucket(self.burst, self.per_s, self.clock)
            if len(self.buckets) > self.keys:
                old, _ = self.buckets.popitem(last=False)
                self.suppressed.pop(old, None)
        self.buckets.move_to_end(key)
        if bucket.take():
            return True
        self.suppressed[key] = self.suppressed.get(key, 0) + 1
        return False

    def take_suppressed(self, key: str) -> int:
        """How many were suppressed for `key` since it was last asked (and reset the count)."""
        return self.suppressed.pop(key, 0)


def raise_open_file_limit() -> tuple[int, int]:
    """Lift the soft open-file limit to the hard one (many shells start at 1024); returns (soft, hard)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft, hard


def safe_text(s: str, limit: int = 200) -> str:
    """A string from a peer, fit for one log line or event: control characters escaped, length bounded."""
    out = s.encode("unicode_escape", "backslashreplace").decode("ascii") if not s.isprintable() else s
    return out if len(out) <= limit else out[:limit] + f"... ({len(s)} characters)"
