"""The one client of the PS's telemetry RPCs: Watch (a run's events, replayed from a sequence number
and then live) and Report (events from outside the PS into its log). `Run`, `Dashboard.attach`
and `wantrain watch` read through it; `Run` reports through it."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc

from ..transport import net, wire
from ..transport.auth import bearer, read_secret
from ..errors import ConfigError, ConnectionLostError, Reject, RejectedError
from ..transport.tls import TLSClient

__all__ = ["Observer", "watch_events", "follow_events", "print_events", "report_events"]

_REFUSED = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.PERMISSION_DENIED)


@dataclass(frozen=True)
class Observer:
    """What an observer needs to follow a run: the PS's address, its observer token and, for a PS
    that speaks TLS, the CA that signed it (and the name in its certificate)."""

    address: str
    token: str = ""
    tls: TLSClient | None = None
    server_name: str = ""

    @classmethod
    def of(cls, address: str, token: str | Path = "", ca: str | Path | None = None, server_name: str = "") -> Observer:
        """`token`: the token itself or a file holding it; `ca`: a PEM file (the PS speaks TLS)."""
        if ":" not in address or not address.rsplit(":", 1)[1].isdigit():
            raise ConfigError(f"the PS's address must be HOST:PORT, got {address!r}")
        if isinstance(token, Path) or (token and Path(str(token)).is_file()):
            token = read_secret(token)
        if ca is not None and not Path(ca).is_file():
            raise ConfigError(f"the PS's CA file {str(ca)!r} does not exist")
        return cls(address, str(token), TLSClient(str(ca)) if ca is not None else None,
                   server_name or ("localhost" if ca is not None else ""))

    @classmethod
    def of_run_dir(cls, run_dir: str | Path, host: str = "127.0.0.1") -> Observer:
        """A run started on this machine (by `wantrain demo`, a panel, a script): its folder holds
        the PS's port, the observer token and the run's CA."""
        d = Path(run_dir)
        missing = [n for n in ("ps.port", "observer-token") if not (d / n).is_file()]
        if missing:
            raise ConfigError(f"{d} is not the folder of a run started on this machine (no {', '.join(missing)})")
        ca = d / "tls" / "ca.pem"
        return cls.of(f"{host}:{int((d / 'ps.port').read_text())}", d / "observer-token",
                      ca if ca.is_file() else None)

    def follow(self, **kw) -> Iterator[dict]:
        return follow_events(self.address, self.token, self.tls, self.server_name, **kw)


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
                  keep_trying: Callable[[], bool] | None = None, first_contact_s: float | None = None
                  ) -> Iterator[dict]:
    """Every event of the run at `address` from `from_seq` until run_end, across PS restarts: a PS
    that goes away is dialled again (a fresh channel each time: an old one would wait out gRPC's
    growing reconnect backoff) until it has been away `give_up_s`, `stop` is set, or
    `keep_trying()` says no (its process died); RejectedError if the PS refuses. With
    `first_contact_s`, a PS that has sent nothing after that long is given up on at once, with
    the reason found (ConnectionLostError: nothing listens there, a TLS mismatch, ...), rather
    than after `give_up_s`: attaching to a wrong address says so."""
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
        if first_contact_s is not None and seq == from_seq and time.monotonic() - away_since > first_contact_s:
            why = net.explain_unreachable(address, tls, server_name)
            raise ConnectionLostError(f"no parameter server answered at {address} within {first_contact_s:g} s"
                                      + (f": {why}" if why else ""))
        if time.monotonic() - away_since > give_up_s:
            raise ConnectionLostError(f"the parameter server at {address} has been away for {give_up_s:.0f} s")
        time.sleep(0.2)


def print_events(address: str, token: str, tls: TLSClient | None = None, server_name: str = "", from_seq: int = 0,
                 follow: bool = False, timeout_s: float = 0.0, connect_timeout_s: float = 30.0) -> None:
    """`wantrain watch`: print each event as a JSON line until the run ends (or `timeout_s` passes);
    waits up to `connect_timeout_s` for a PS that is not up yet, then says why it cannot reach it."""
    with net.observer_channel(address, tls, server_name) as channel:
        try:
            connect_timeout_s = min(connect_timeout_s, timeout_s or connect_timeout_s)
            grpc.channel_ready_future(channel).result(timeout=connect_timeout_s)
        except grpc.FutureTimeoutError:
            why = net.explain_unreachable(address, tls, server_name)
            raise ConnectionLostError(f"no parameter server answered at {address} within {connect_timeout_s:g} s"
                                      + (f": {why}" if why else "")) from None
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
