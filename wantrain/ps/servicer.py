"""The gRPC side of the parameter server: a thin adapter between the wire and `ParameterServer`.

Requests arrive as raw bytes (the handlers are registered without a deserializer) and wire.py
parses them, so a message protobuf cannot parse is refused like any other bad message: the PS
sends an Error message (a `Reject` code and a sentence), ends the stream with the gRPC status
of `STATUS`, writes one log line and one telemetry event (both bounded and rate-limited per
peer address), and nothing else changes. A bug inside the PS ends only that stream, with
INTERNAL and a traceback in the log.

What a peer can hold is bounded here too: streams open at once per IP address, the time a
Session may take to send its Join, reported events per second; Watch, Ping and Report need a
token (auth.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter

import grpc

from ..transport import net, wire
from ..transport.auth import token_from_metadata
from ..errors import CodecError, ProtocolError, Reject, RejectedError
from ..transport.limits import Limits, Throttle, TokenBucket, safe_text
from ..transport.messages import DeltaParity, ErrorMessage, Join, LaneAck, LaneOpen, Manifest, TensorChunk
from .connections import ConnectionGuard
from .downloads import ModelDownload
from .server import ParameterServer
from .sites import check_lane

__all__ = ["Servicer", "STATUS", "add_to_server", "peer_host"]

log = logging.getLogger("wantrain.ps")

DRAIN_S = 2.0       # an ended Session reads what its peer still sends for at most this long (_drain)

STATUS = {
    Reject.PROTOCOL_VERSION: grpc.StatusCode.FAILED_PRECONDITION,
    Reject.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
    Reject.DUPLICATE_SITE: grpc.StatusCode.ALREADY_EXISTS,
    Reject.UNKNOWN_SITE: grpc.StatusCode.PERMISSION_DENIED,
    Reject.RUN_FULL: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Reject.RUN_FINISHED: grpc.StatusCode.FAILED_PRECONDITION,
    Reject.RATE_LIMITED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Reject.INVALID_MESSAGE: grpc.StatusCode.INVALID_ARGUMENT,
    Reject.JOIN_TIMEOUT: grpc.StatusCode.DEADLINE_EXCEEDED,
    Reject.INTERNAL: grpc.StatusCode.INTERNAL,
    Reject.REPLACED: grpc.StatusCode.ABORTED,
}


def peer_host(peer: str) -> str:
    """The address part of a gRPC peer string ("ipv4:1.2.3.4:5678" -> "1.2.3.4", "ipv6:[::1]:9" -> "::1")."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rpartition(":")[0]
    if kind == "ipv6":
        return rest.rpartition(":")[0].strip("[]")
    return peer


class _Ended(Exception):
    """How a stream ends: a Reject code and a sentence (never raised outside this module)."""

    def __init__(self, code: Reject, message: str) -> None:
        super().__init__(message)
        self.code = code


class Servicer:
    """Session, Lane, Watch, Ping and Report over one ParameterServer."""

    def __init__(self, ps: ParameterServer, limits: Limits | None = None) -> None:
        self.ps = ps
        self.limits = limits or ps.limits
        self.streams: Counter[str] = Counter()          # open Session + Watch streams per peer address
        self.refusals = Throttle(self.limits.rejected_events_burst, self.limits.rejected_events_per_s)
        self.reports = TokenBucket(self.limits.reported_events_burst, self.limits.reported_events_per_s)
        self.watchers: dict[int, int] = {}    # open Watch streams -> the next sequence number each will send
        self.guard = ConnectionGuard(self.limits, lambda **f: self.ps.recorder.emit("shed", **f))  # serve() starts it

    def watchers_caught_up(self) -> bool:
        """Has every open Watch stream been handed every event recorded so far?"""
        return all(seq >= len(self.ps.recorder.events) for seq in self.watchers.values())

    # ------------------------------------------------------------ accounting

    @contextlib.contextmanager
    def _stream_slot(self, host: str):
        """Count a stream against its peer address; yields False when the peer is over its cap."""
        if self.streams[host] >= self.limits.max_streams_per_peer:
            yield False
            return
        self.streams[host] += 1
        try:
            yield True
        finally:
            self.streams[host] -= 1
            if not self.streams[host]:
                del self.streams[host]

    def _refused(self, host: str, code: Reject, message: str, site: str | None = None) -> None:
        """One log line and one event per refusal, at most `rejected_events_per_s` per peer address."""
        if not self.refusals.allow(host):
            return
        more = self.refusals.take_suppressed(host)
        note = f" ({more} more from {host} not logged)" if more else ""
        log.warning("refused %s%s: %s: %s%s", f"site {safe_text(site, 64)!r} from " if site else "", host, code,
                    safe_text(message, 300), note)
        self.ps.recorder.emit("error", code=str(code), message=safe_text(message, 300) + note, peer=host,
                              **({"site": site} if site else {}))

    @staticmethod
    def _end(context, code: Reject, message: str) -> None:
        context.set_code(STATUS[code])
        context.set_details(safe_text(message, 1000))

    def _refusal(self, context, host: str, code: Reject, message: str, site: str | None = None):
        """Refuse a stream: log it, set its final status, and return the Error message to send first."""
        self._refused(host, code, message, site=site)
        self._end(context, code, message)
        return wire.server_message(ErrorMessage(str(code), message))

    def _over_cap(self, context, host: str) -> None:
        """Refuse a stream from an address with max_streams_per_peer open already."""
        self._refused(host, Reject.RATE_LIMITED, f"more than {self.limits.max_streams_per_peer} streams open")
        self._end(context, Reject.RATE_LIMITED, f"more than {self.limits.max_streams_per_peer} streams are open "
                                                f"from {host}")

    # ------------------------------------------------------------ Session

    async def Session(self, requests, context):
        # An async generator: gRPC writes what we yield, so no write is ever in flight when the
        # handler ends. A reader task feeds the site's messages to the PS.
        try:
            async for reply in self._session(requests, context):
                yield reply
        finally:
            await self._drain(requests)

    @staticmethod
    async def _drain(requests) -> None:
        """Read what the peer still sends, to its end or for at most DRAIN_S: gRPC holds a call whose
        requests were not read to their end, and a connection carries at most 16 calls at once, so
        16 refused Sessions left their connection refusing every call (REFUSED_STREAM) for 20 s."""
        async def to_end() -> None:
            async for _ in requests:
                pass
        with contextlib.suppress(Exception):
            await asyncio.wait_for(to_end(), DRAIN_S)

    async def _session(self, requests, context):
        host = peer_host(context.peer())
        with self._stream_slot(host) as admitted:
            if not admitted:
                self._over_cap(context, host)
                return
            try:
                join = await self._first_message(requests)
                link = self.ps.join(join)
                self.guard.passed(context.peer())
            except _Ended as e:
                yield self._refusal(context, host, e.code, str(e))
                return
            except (RejectedError, ProtocolError) as e:
                code = e.code if isinstance(e, RejectedError) else Reject.INVALID_MESSAGE
                yield self._refusal(context, host, code, str(e), site=join.site)
                return
            except StopAsyncIteration:
                return                          # closed before joining: nobody to answer
            except Exception as e:  # a bug in the PS: this stream ends with INTERNAL, the PS goes on
                log.exception("bug while admitting a site from %s", host)
                self._end(context, Reject.INTERNAL, f"the parameter server failed on this Join "
                                                    f"({type(e).__name__}); see its log")
                return
            ended: list[_Ended] = []
            reader = asyncio.create_task(self._read(requests, link, ended))
            try:
                while True:
                    msg = await link.outbox.get()
                    if msg is None:
                        break
                    if isinstance(msg, ModelDownload):     # chunks encoded one at a time as they go out
                        try:
                            for part in msg.messages():
                                yield wire.server_message(part)
                        finally:
                            msg.finished = True
                        continue
                    yield wire.server_message(msg)
                if link.ended is not None and not ended:      # the PS ended it (a new session replaced it)
                    ended.append(_Ended(*link.ended))
                if ended:
                    yield wire.server_message(ErrorMessage(str(ended[0].code), str(ended[0])))
            finally:
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reader
                self.ps.leave(link, f"rejected: {ended[0]}" if ended else "stream closed by the site")
            if ended:
                self._end(context, ended[0].code, str(ended[0]))

    async def _first_message(self, requests, kind: type = Join, call: str = "Session"):
        try:
            raw = await asyncio.wait_for(anext(requests), self.limits.join_timeout_s)
        except asyncio.TimeoutError:
            raise _Ended(Reject.JOIN_TIMEOUT, f"no {kind.__name__} within {self.limits.join_timeout_s:g} s of "
                                              f"opening the {call}") from None
        try:
            first = wire.parse_site_message(raw)
        except (ProtocolError, CodecError) as e:
            raise _Ended(Reject.INVALID_MESSAGE, f"the first message must be a valid {kind.__name__} ({e})") from None
        if not isinstance(first, kind):
            raise _Ended(Reject.INVALID_MESSAGE, f"the first message must be a {kind.__name__}, not "
                                                 f"{type(first).__name__}")
        return first

    async def _read(self, requests, link, ended: list[_Ended]) -> None:
        """Feed the site's messages to the PS until the stream ends; a violation ends it with a code."""
        try:
            while True:
                try:
                    raw = await anext(requests)
                except StopAsyncIteration:
                    break
                except Exception:              # the connection broke (reset, cancelled by the peer)
                    break
                await self.ps.handle(link, wire.parse_site_message(raw), len(raw) + wire.GRPC_PREFIX_BYTES)
        except (ProtocolError, CodecError) as e:
            ended.append(_Ended(Reject.INVALID_MESSAGE, str(e)))
        except RejectedError as e:
            ended.append(_Ended(Reject(e.code), str(e)))
        except Exception as e:  # a bug in the PS: this stream ends, the PS and the run go on
            log.exception("bug while handling a message from site %s", link.name)
            ended.append(_Ended(Reject.INTERNAL, f"the parameter server failed on this message ({type(e).__name__}); "
                                                 "see its log"))
        finally:
            if ended:
                end = ended[0]
                log.warning("site %s: stream ended: %s: %s", link.name, end.code, safe_text(str(end), 300))
                self.ps.recorder.emit("error", site=link.name, code=str(end.code), message=safe_text(str(end), 300))
            link.outbox.put_nowait(None)

    # ------------------------------------------------------------ Lane

    async def Lane(self, requests, context):
        """An extra connection of a joined site for its deltas (docs/protocol.md 4b): a LaneOpen, then
        manifests, chunks and parities, each taken as on the site's Session and acknowledged."""
        try:
            async for reply in self._lane(requests, context):
                yield reply
        finally:
            await self._drain(requests)

    async def _lane(self, requests, context):
        host = peer_host(context.peer())
        with self._stream_slot(host) as admitted:      # held until the lane says whose it is
            if not admitted:
                self._over_cap(context, host)
                return
            try:
                first = await self._first_message(requests, LaneOpen, "Lane")
                link = check_lane(first, self.ps.auth, self.ps.sites.links, self.limits)
            except StopAsyncIteration:
                return
            except (_Ended, RejectedError) as e:
                yield self._refusal(context, host, Reject(e.code), str(e))
                return
        self.guard.passed(context.peer())
        link.lanes += 1
        self.ps.recorder.emit("lane", site=link.name, lane=first.lane, peer=safe_text(context.peer(), 100))
        try:
            async for reply in self._lane_messages(requests, link, first.lane, host):
                yield reply
        except _Ended as e:
            yield wire.server_message(ErrorMessage(str(e.code), str(e)))
            self._end(context, e.code, str(e))
        finally:
            link.lanes -= 1

    async def _lane_messages(self, requests, link, lane: int, host: str):
        """Take each message of a lane as the site's Session would, and acknowledge it; raises _Ended
        when one breaks a rule (the lane ends; the site's Session and the model are untouched)."""
        while True:
            try:
                raw = await anext(requests)
            except StopAsyncIteration:
                return
            except Exception:                # the connection broke
                return
            if link.closed:
                raise _Ended(Reject.UNKNOWN_SITE, f"site {link.name!r} left; its lane {lane} ends")
            try:
                msg = wire.parse_site_message(raw)
                if not isinstance(msg, (Manifest, TensorChunk, DeltaParity)):
                    raise ProtocolError(f"a lane carries manifests, delta chunks and parities, not "
                                        f"{type(msg).__name__}")
                if isinstance(msg, TensorChunk) and self.ps.rounds.closed_for(link.name, msg.round, self.ps.ledger.round):
                    # A hedge that lost the race to its first copy: the delta is settled without it.
                    log.debug("site %s: chunk %d of round %d on lane %d after its round closed to it: ignored",
                              link.name, msg.index, msg.round, lane)
                else:
                    await self.ps.handle(link, msg, len(raw) + wire.GRPC_PREFIX_BYTES)
            except (ProtocolError, CodecError, RejectedError) as e:
                code = Reject(e.code) if isinstance(e, RejectedError) else Reject.INVALID_MESSAGE
                self._refused(host, code, f"lane {lane}: {e}", site=link.name)
                raise _Ended(code, str(e)) from None
            except Exception as e:  # a bug in the PS: this lane ends, the PS and the run go on
                log.exception("bug while handling a lane message from site %s", link.name)
                raise _Ended(Reject.INTERNAL, f"the parameter server failed on this message ({type(e).__name__}); "
                                              "see its log") from None
            yield wire.server_message(LaneAck.of(msg))

    # ------------------------------------------------------------ Watch, Ping

    async def Ping(self, raw, context):
        try:
            site = wire.parse_ping(raw)
        except ProtocolError as e:
            await context.abort(STATUS[Reject.INVALID_MESSAGE], safe_text(str(e), 300))
        if not self.ps.auth.may_ping(site, token_from_metadata(context.invocation_metadata())):
            self._refused(peer_host(context.peer()), Reject.UNAUTHENTICATED, "Ping without a valid token")
            await context.abort(STATUS[Reject.UNAUTHENTICATED], "Ping needs a site's token or the observer token "
                                                                "(metadata authorization: Bearer TOKEN)")
        self.guard.passed(context.peer())
        return wire.ping_reply(time.time())

    async def Watch(self, raw, context):
        host = peer_host(context.peer())
        try:
            from_seq = wire.parse_watch(raw)
        except ProtocolError as e:
            self._end(context, Reject.INVALID_MESSAGE, str(e))
            return
        if not self.ps.auth.may_watch(token_from_metadata(context.invocation_metadata())):
            self._refused(host, Reject.UNAUTHENTICATED, "Watch without the observer token")
            self._end(context, Reject.UNAUTHENTICATED, "Watch needs the observer token (metadata authorization: "
                                                       "Bearer TOKEN; `wantrain ps --observer-token-file`)")
            return
        self.guard.passed(context.peer())
        with self._stream_slot(host) as admitted:
            if not admitted:
                self._over_cap(context, host)
                return
            async for event in self._events(from_seq):
                yield event

    async def Report(self, raw, context):
        """Events of the run from outside the PS (link emulator, injected faults) into its log."""
        host = peer_host(context.peer())
        if not self.ps.auth.may_watch(token_from_metadata(context.invocation_metadata())):
            self._refused(host, Reject.UNAUTHENTICATED, "Report without the observer token")
            await context.abort(STATUS[Reject.UNAUTHENTICATED], "Report needs the observer token (metadata "
                                                                "authorization: Bearer TOKEN)")
        self.guard.passed(context.peer())
        try:
            events = wire.parse_report(raw)
        except ProtocolError as e:
            self._refused(host, Reject.INVALID_MESSAGE, str(e))
            await context.abort(STATUS[Reject.INVALID_MESSAGE], safe_text(str(e), 300))
        if not self.reports.take(len(events)):
            self._refused(host, Reject.RATE_LIMITED, "reported events too fast")
            await context.abort(STATUS[Reject.RATE_LIMITED], f"more than {self.limits.reported_events_per_s:g} "
                                                             "reported events a second")
        seqs = [self.ps.recorder.record_reported(ev) for ev in events]
        for ev in events:
            if ev["kind"] == "clear_site":      # an operator's word that an excluded site is fixed
                self.ps.clear_site(ev["site"])
        return wire.report_reply(seqs[0] if seqs else len(self.ps.recorder.events))

    async def _events(self, seq: int):
        rec = self.ps.recorder
        loop = asyncio.get_running_loop()
        wake = asyncio.Event()
        def notify() -> None:           # called from whatever thread recorded the event
            loop.call_soon_threadsafe(wake.set)

        unsubscribe = rec.subscribe(notify)
        closing = asyncio.ensure_future(self.ps.closing.wait())
        me = id(closing)
        try:
            while True:
                wake.clear()
                for line in rec.since(seq):
                    yield wire.event_to_proto(seq, line)
                    seq += 1
                    self.watchers[me] = seq
                self.watchers[me] = seq
                if self.ps.closing.is_set():
                    return
                waiter = asyncio.ensure_future(wake.wait())
                await asyncio.wait([waiter, closing], return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
        finally:
            self.watchers.pop(me, None)
            closing.cancel()
            unsubscribe()


def add_to_server(servicer: Servicer, server: grpc.aio.Server) -> None:
    """Register the RPCs, requests as raw bytes (parsed by wire.py), replies serialized by protobuf."""
    reply = lambda m: m.SerializeToString()
    net.add_service(server, {
        "Session": grpc.stream_stream_rpc_method_handler(servicer.Session, None, reply),
        "Lane": grpc.stream_stream_rpc_method_handler(servicer.Lane, None, reply),
        "Watch": grpc.unary_stream_rpc_method_handler(servicer.Watch, None, reply),
        "Ping": grpc.unary_unary_rpc_method_handler(servicer.Ping, None, reply),
        "Report": grpc.unary_unary_rpc_method_handler(servicer.Report, None, reply),
    })
