"""The one client of the PS's Watch RPC: a run's telemetry events, replayed from a sequence number
and then live. `Run.follow()` (the CLI demo, the notebook) and `wantrain watch` read through it."""


from __future__ import annotations

import json
from collections.abc import Iterator

import grpc

from . import net, wire
from .auth import bearer
from .errors import ConnectionLostError, RejectedError
from .tls import TLSClient

__all__ = ["watch_events", "print_events"]


def watch_events(channel: grpc.Channel, token: str = "", from_seq: int = 0, **call_options) -> Iterator[tuple[int, str]]:
    """(sequence number, JSON line) of each event, until the PS ends the stream; grpc.RpcError if it
    refuses (UNAUTHENTICATED without the observer token) or the connection breaks."""
    watch = wire.pb_grpc.ParameterServerStub(channel).Watch
    for ev in watch(wire.pb.WatchRequest(from_seq=from_seq), metadata=bearer(token), **call_options):
        yield ev.seq, ev.json


def print_events(address: str, token: str, tls: TLSClient | None = None, server_name: str = "", from_seq: int = 0,
                 follow: bool = False, timeout_s: float = 0.0) -> None:
    """`wantrain watch`: print each event as a JSON line until the run ends (or `timeout_s` passes);
    waits for a PS that is not up yet."""
    with net.observer_channel(address, tls, server_name) as channel:
        try:
            for _, line in watch_events(channel, token, from_seq, wait_for_ready=True, timeout=timeout_s or None):
                print(line, flush=True)
                if json.loads(line).get("kind") == "run_end" and not follow:
                    return
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.UNAUTHENTICATED:
                raise RejectedError("unauthenticated", f"{address} refused to show its telemetry: {e.details()}") \
                    from None
            if e.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                raise ConnectionLostError(f"watching {address} failed: {e.code().name}: {e.details()}") from None
