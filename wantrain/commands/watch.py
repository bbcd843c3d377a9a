"""`wantrain watch`: a parameter server's telemetry, printed as JSON lines."""

from __future__ import annotations

import argparse

__all__ = ["add_parser", "run"]


def run(args: argparse.Namespace) -> int:
    from ..transport.auth import read_secret
    from ..transport.tls import TLSClient
    from ..telemetry.watch import print_events

    print_events(args.ps, read_secret(args.observer_token_file) if args.observer_token_file else "",
                 TLSClient(args.tls_ca, args.tls_cert, args.tls_key) if args.tls_ca else None, args.tls_server_name,
                 args.from_seq, args.follow, args.timeout, args.connect_timeout)
    return 0


def add_parser(sub) -> None:
    o = sub.add_parser("watch", help="print a parameter server's telemetry as JSON lines")
    o.add_argument("--ps", required=True, help="HOST:PORT of the parameter server")
    o.add_argument("--observer-token-file", default=None, help="file holding the PS's observer token")
    o.add_argument("--tls-ca", default=None, help="PEM CA that signed the PS's certificate: connect with TLS")
    o.add_argument("--tls-cert", default=None, help="PEM client certificate (when the PS requires one)")
    o.add_argument("--tls-key", default=None, help="PEM private key of --tls-cert")
    o.add_argument("--tls-server-name", default="", help="name to check the PS's certificate against")
    o.add_argument("--from-seq", type=int, default=0, help="start at this event (0: the whole run)")
    o.add_argument("--follow", action="store_true", help="keep watching after the run ends")
    o.add_argument("--timeout", type=float, default=0.0, help="stop after this many seconds (0: never)")
    o.add_argument("--connect-timeout", type=float, default=30.0, metavar="SECONDS",
                   help="fail if no parameter server answers at --ps within this long (it may still be starting)")
    o.set_defaults(func=run)
