"""Events of a run that happen outside the PS, relayed into its telemetry (the Report RPC).

The link emulator appends what its links do to links.jsonl; `Run` injects faults on purpose; each
shard but the first of a sharded PS writes its own events.jsonl. An `EventRelay` thread sends
them to the PS (shard 0), in order, so its log and Watch stream hold every event of the run and
a watcher anywhere (a dashboard given only the PS's address) sees them. While the PS is away (a
restart) events wait and go when it is back.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

import grpc

from ..transport import net
from .plan import JsonlTail
from ..transport.tls import TLSClient
from ..telemetry.watch import report_events
from ..transport.wire import MAX_REPORTED_EVENTS

__all__ = ["EventRelay", "shard_relay"]

log = logging.getLogger("wantrain.run")


class EventRelay:
    """Tails a JSONL log and takes single events (`add`); reports them to the PS every `interval_s`."""

    def __init__(self, open_channel: Callable[[], grpc.Channel], token: str, tail: str | Path | None = None,
                 interval_s: float = 0.25, wrap: Callable[[dict], dict] | None = None) -> None:
        self.open_channel, self.token, self.interval_s, self.wrap = open_channel, token, interval_s, wrap
        self.tail = JsonlTail(tail)
        self.pending: list[dict] = []
        self.sent = 0
        self.dropped = 0              # events the PS refused (malformed): logged, never retried
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._channel: grpc.Channel | None = None

    def add(self, event: dict) -> None:
        with self._lock:
            self.pending.append(event)

    def start(self) -> EventRelay:
        self._thread = threading.Thread(target=self._loop, name="wantrain-relay", daemon=True)
        self._thread.start()
        return self

    def close(self, flush_s: float = 3.0) -> None:
        """Send what is waiting (for at most flush_s), then stop."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(flush_s + 5 * self.interval_s)
        self._thread = None

    def _loop(self) -> None:
        try:
            while not self._stop.wait(self.interval_s):
                self.flush()
            self.flush()
        finally:
            if self._channel is not None:
                self._channel.close()

    def flush(self) -> None:
        """Report everything waiting now; on failure it waits for the next try (a fresh channel then)."""
        with self._lock:
            self.pending.extend(map(self.wrap, self.tail.read()) if self.wrap else self.tail.read())
        while True:
            with self._lock:
                batch = self.pending[:MAX_REPORTED_EVENTS]
            if not batch:
                return
            if self._channel is None:
                self._channel = self.open_channel()
            try:
                report_events(self._channel, self.token, batch)
            except grpc.RpcError as e:
                if e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                                grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.CANCELLED):
                    self._channel.close()          # the PS is away: dial afresh next time
                    self._channel = None
                    return
                log.warning("the parameter server refused %d relayed event(s): %s: %s", len(batch), e.code().name,
                            e.details())
                self.dropped += len(batch)
            else:
                self.sent += len(batch)
            with self._lock:
                del self.pending[:len(batch)]


def shard_relay(address: str, token: str, events: Path, index: int, tls_ca: str | None = None) -> EventRelay:
    """A started relay of shard `index`'s events (its `events` file) to shard 0 at `address`: each
    as the `event` of a `shard` event at the same time. A restarted shard reports only what it writes
    from now on (its earlier life reported the rest)."""
    tls = TLSClient(tls_ca) if tls_ca else None
    relay = EventRelay(lambda: net.observer_channel(address, tls), token, events,
                       wrap=lambda e: {"kind": "shard", "t": e.get("t"), "shard": index, "event": e})
    relay.tail.skip()
    return relay.start()
