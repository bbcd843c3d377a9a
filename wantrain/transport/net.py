"""Every gRPC server, channel and stub wantrain opens, with one set of options each.

(wire.py turns messages into domain objects and back; this module is the only other one that
touches the generated code: the service's stub and name.)

The options encode what was measured about gRPC on a WAN: the HTTP/2 ping that detects a
dead connection waits behind queued data (so its timeout must exceed the slowest transfer of
one message), clients must not ping faster than the server permits, and reconnect backoff must
suit interactive use. On the server side they also bound what an outsider can hold: no second
server on the same port (gRPC sets SO_REUSEPORT by default and would split the sites between
two PS processes), a handshake timeout, an idle timeout, a cap on connections below the
open-file limit, and a cap on streams per connection (limits.py holds the numbers).
"""

from __future__ import annotations

import socket

import grpc

from ..errors import ConfigError
from .limits import Limits
from .proto.v1 import ps_pb2, ps_pb2_grpc
from .tls import TLSClient, TLSServer

__all__ = ["server_options", "channel_options", "new_server", "bind", "channel", "observer_channel", "site_channel",
           "stub", "add_service", "explain_unreachable"]

MAX_STREAMS_PER_CONNECTION = 16     # a site uses two at once (Session and Ping), an observer one (Watch)
# A site's link may go dark for up to 200 s (the testbed's longest outage) and its connection must outlive that: the
# site rides the outage on its stream and never downloads the model again. gRPC ends a connection
# whose HTTP/2 ping is not answered within the ping timeout, and uses the keepalive timeout as the
# socket's TCP_USER_TIMEOUT (data unacknowledged, or a closed window, for that long), so both
# exceed the longest outage. A dead peer is found later for it, and costs nothing meanwhile: the
# round deadline goes on without it and the PS stops counting on it after one missed deadline.
OUTAGE_TOLERANCE_MS = 300_000


def server_options(limits: Limits) -> list[tuple[str, int]]:
    return [
        ("grpc.so_reuseport", 0),
        ("grpc.max_receive_message_length", limits.max_message_bytes),
        ("grpc.max_send_message_length", limits.max_message_bytes),
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.keepalive_timeout_ms", OUTAGE_TOLERANCE_MS),
        ("grpc.http2.ping_timeout_ms", OUTAGE_TOLERANCE_MS),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", 5_000),
        ("grpc.http2.max_ping_strikes", 0),
        ("grpc.server_handshake_timeout_ms", int(limits.handshake_timeout_s * 1000)),
        ("grpc.max_connection_idle_ms", int(limits.idle_connection_s * 1000)),
        ("grpc.max_allowed_incoming_connections", limits.connection_cap()),
        ("grpc.max_concurrent_streams", MAX_STREAMS_PER_CONNECTION),
    ]


def channel_options(link_rtt_ms: float = 0.0, link_mbps: float = 0.0,
                    max_message_bytes: int = Limits.max_message_bytes) -> list[tuple[str, int]]:
    """Client channel options: message caps, keepalive the PS permits, quick reconnects.

    The HTTP/2 ping that detects a dead connection waits behind queued data, so its timeout
    must exceed the time the largest message takes on the slowest link (plus a few RTTs), or
    healthy transfers are killed, and the longest outage a link rides out (OUTAGE_TOLERANCE_MS).
    """
    transfer_s = max_message_bytes * 8 / (link_mbps * 1e6) if link_mbps > 0 else 0.0
    ping_timeout_ms = int(max(OUTAGE_TOLERANCE_MS, 1000 * (4 * transfer_s) + 8 * link_rtt_ms))
    keepalive_ms = int(max(30_000, 20 * link_rtt_ms))
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", keepalive_ms),
        ("grpc.keepalive_timeout_ms", ping_timeout_ms),
        ("grpc.http2.ping_timeout_ms", ping_timeout_ms),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.initial_reconnect_backoff_ms", 200),
        # gRPC also uses this as the time a connection attempt may take (TCP + TLS handshake +
        # HTTP/2 settings, several RTTs): too small and every attempt over a long link fails.
        ("grpc.min_reconnect_backoff_ms", int(max(5_000, 12 * link_rtt_ms))),
        ("grpc.max_reconnect_backoff_ms", 2_000),
        ("grpc.use_local_subchannel_pool", 1),
    ]


def new_server(limits: Limits) -> grpc.aio.Server:
    return grpc.aio.server(options=server_options(limits))


def bind(server: grpc.aio.Server, host: str, port: int, tls: TLSServer | None) -> int:
    """Listen on host:port (0: any free port) and return the port; ConfigError that says why not."""
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound = (server.add_secure_port(address, tls.credentials()) if tls is not None
                 else server.add_insecure_port(address))
    except RuntimeError:
        bound = 0
    if bound == 0:
        raise ConfigError(f"cannot listen on {address} (--host/--port): {_why_not_bindable(host, port)}")
    return bound


def _why_not_bindable(host: str, port: int) -> str:
    """gRPC only says it failed; a plain socket says why."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.bind((host, port))
    except OSError as e:
        if e.errno == 98:
            return "the port is in use (another parameter server, or another program)"
        return e.strerror or str(e)
    return "gRPC refused the address"


def _target_options(tls: TLSClient | None, server_name: str) -> list[tuple[str, str]]:
    return [("grpc.ssl_target_name_override", server_name)] if tls is not None and server_name else []


def channel(address: str, tls: TLSClient | None = None, server_name: str = "", *, aio: bool = False,
            link_rtt_ms: float = 0.0, link_mbps: float = 0.0, max_message_bytes: int = Limits.max_message_bytes):
    """A channel to a PS: blocking (observers, tools, tests) or asyncio (`aio`: sites), plaintext or
    TLS, with `channel_options` (each channel its own connection)."""
    options = [*channel_options(link_rtt_ms, link_mbps, max_message_bytes), *_target_options(tls, server_name)]
    mod = grpc.aio if aio else grpc
    if tls is not None:
        return mod.secure_channel(address, tls.credentials(), options=options)
    return mod.insecure_channel(address, options=options)


def observer_channel(address: str, tls: TLSClient | None = None, server_name: str = "") -> grpc.Channel:
    """A blocking channel for an observer (Watch, Report): large telemetry events."""
    return channel(address, tls, server_name, max_message_bytes=16 << 20)


def site_channel(address: str, tls: TLSClient | None, server_name: str = "", link_rtt_ms: float = 0.0,
                 link_mbps: float = 0.0) -> grpc.aio.Channel:
    return channel(address, tls, server_name, aio=True, link_rtt_ms=link_rtt_ms, link_mbps=link_mbps)


def stub(ch) -> ps_pb2_grpc.ParameterServerStub:
    """The PS's RPCs on a channel (blocking or asyncio)."""
    return ps_pb2_grpc.ParameterServerStub(ch)


def add_service(server: grpc.aio.Server, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
    """Register the PS's RPCs (name -> handler) on a server."""
    name = ps_pb2.DESCRIPTOR.services_by_name["ParameterServer"].full_name
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, handlers),))


def explain_unreachable(address: str, tls: TLSClient | None, server_name: str = "", timeout_s: float = 5.0) -> str:
    """Why a site cannot reach the PS, found by connecting with plain sockets (blocking; a few seconds).

    gRPC reports a failed TLS handshake as "unavailable" and leaves the reason to its own log;
    a site that says "not reachable" when its CA is wrong sends its user looking at the network."""
    if address.startswith("unix:"):              # a reverse forward over SSH (launch/ssh.py)
        path = address[len("unix:"):]
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(timeout_s)
                s.connect(path)
        except OSError as e:
            return f"cannot connect to the socket {path}: {e.strerror or e} (did its SSH connection end?)"
        return f"the socket {path} accepts connections, but no PS answers through it"
    host, _, port_text = address.rpartition(":")
    host = host.strip("[]")
    try:
        port = int(port_text)
    except ValueError:
        return f"{address!r} is not HOST:PORT"
    try:
        raw = socket.create_connection((host, port), timeout=timeout_s)
    except socket.gaierror as e:
        return f"cannot resolve {host!r}: {e.strerror}"
    except ConnectionRefusedError:
        return f"nothing listens on {address} (connection refused)"
    except TimeoutError:
        return f"no answer from {address} within {timeout_s:g} s (a firewall, or the link is down)"
    except OSError as e:
        return f"cannot connect to {address}: {e.strerror or e}"
    import ssl

    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes.fromhex("000000040000000000")   # + empty SETTINGS
    with raw:
        raw.settimeout(timeout_s)
        if tls is None:                  # does the port answer a TLS handshake (trusting anything)?
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
            try:
                with ctx.wrap_socket(raw, server_hostname=host):
                    return "the PS speaks TLS on this port: pass --tls-ca (the CA that signed its certificate)"
            except (ssl.SSLError, OSError):
                return ""
        try:
            ctx = ssl.create_default_context(cafile=tls.ca)
            if tls.cert and tls.key:
                ctx.load_cert_chain(tls.cert, tls.key)
        except (OSError, ssl.SSLError) as e:
            return f"cannot load the TLS files: {e}"
        ctx.set_alpn_protocols(["h2"])
        name = server_name or host
        try:
            with ctx.wrap_socket(raw, server_hostname=name) as s:
                s.sendall(preface)
                if not s.recv(16):  # with TLS 1.3 a refused client shows only now: the PS hangs up
                    return ("the PS refused this site's client certificate: is it signed by the PS's --tls-client-ca?"
                            if tls.cert else "the PS requires a client certificate: pass --tls-cert and --tls-key")
        except ssl.SSLCertVerificationError as e:
            return (f"the PS's certificate is not trusted: {e.verify_message} (is --tls-ca the CA that signed it, "
                    f"and is {name!r} one of its names? --tls-server-name checks another name)")
        except ssl.SSLError as e:
            reason = e.reason or str(e)
            if "CERTIFICATE_REQUIRED" in reason:
                return "the PS requires a client certificate: pass --tls-cert and --tls-key"
            if "UNKNOWN_CA" in reason or "BAD_CERTIFICATE" in reason or "CERTIFICATE_UNKNOWN" in reason:
                return f"the PS refused this site's client certificate ({reason}): is it signed by the PS's --tls-client-ca?"
            if "WRONG_VERSION_NUMBER" in reason or "RECORD_LAYER" in reason:
                return "the PS does not speak TLS on this port (plaintext?): drop --tls-ca, or start the PS with TLS"
            return f"TLS handshake failed: {reason}"
        except OSError:
            return ""
    return ""
