"""The one client of the PS's telemetry RPCs: Watch (a run's events, replayed from a sequence number
and then live) and Report (events from outside the PS into its log). `Run`, `Dashboard.attach`
and `wantrain watch` read through it; `Run` reports through it."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator

import grpc

from . import net, wire
from .auth import bearer
from .errors import ConnectionLostError, Reject, RejectedError
from .tls import TLSClient

__all__ = ["watch_events", "follow_events", "print_events", "report_events"]

_REFUSED = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.PERMISSION_DENIED)


def watch_events(channel: grpc.Channel, token: str = "", from_seq: int = 0, **call_options) -> Iterator[tuple[int, str]]:
    """(sequence number, JSON line) of each event, until the PS ends the stream; grpc.RpcError if it
    refuses (UNAUTHENTICATED without the observer token) or the connection breaks."""
    for ev in net.stub(channel).Watch(wire.watch_request(from_seq), metadata=bearer(token), **call_options):
        yield ev.seq, ev.json


def report_events(channel: grpc.Channel, token: str, events: list[dict], timeout_s: float = 10.0) -> int:
    """Add events to the PS's log (the observer token's right); the sequence number of the first."""
    return net.stub(channel).Report(wire.report_request(events), metadata=bearer(token), timeout=timeout_s).first_seq


def follow_events(address: str, token: str, tls: TLSClient | None = None, server_name: str = "",
                  from_seq: int = 0, give_up_s: float = 300.0, stop: threading.Event | None = None,
                  keep_trying: Callable[[], bool] | None = None) -> Iterator[dict]:
    """Every event of the run at `address` from `from_seq` until run_end, across PS restarts: a PS
    that goes away is dialled again (a fresh channel each time: an old one would wait out gRPC's
    growing reconnect backoff) until it has been away `give_up_s`, `stop` is set, or
    `keep_trying()` says no (its process died); RejectedError if the PS refuses."""
    seq, away_since = from_seq, None
    while not (stop is not None and stop.is_set()):
        with net.observer_channel(address, tls, server_name) as channel:
            try:
                for n, line in watch_events(channel, token, seq):
                    away_since, seq = None, n + 1
                    event = json.loads(line)
                    yield event
                    if event["kind"] == "run_end":
                        return
            except grpc.RpcError as e:
                if e.code() in _REFUSED:
                    raise RejectedError(Reject.UNAUTHENTICATED if e.code() == grpc.StatusCode.UNAUTHENTICATED
                                        else Reject.INVALID_MESSAGE,
                                        f"{address} refused to show its telemetry: {e.details()}") from None
        if (stop is not None and stop.is_set()) or (keep_trying is not None and not keep_trying()):
            return
        away_since = away_since or time.monotonic()
        if time.monotonic() - away_since > give_up_s:
            raise ConnectionLostError(f"the parameter server at {address} has been away for {give_up_s:.0f} s")
        time.sleep(0.2)


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
                raise RejectedError(Reject.UNAUTHENTICATED, f"{address} refused to show its telemetry: "
                                                            f"{e.details()}") from None
            if e.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                raise ConnectionLostError(f"watching {address} failed: {e.code().name}: {e.details()}") from None
