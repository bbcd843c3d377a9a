"""`wantrain clear-site`: an operator's word that a site the commit check excluded is fixed."""

from __future__ import annotations

import argparse

__all__ = ["add_parser", "run"]


def run(args: argparse.Namespace) -> int:
    from ..transport import net
    from ..transport.auth import read_secret
    from ..config import check_site_name
    from ..errors import ConfigError
    from ..transport.tls import TLSClient
    from ..telemetry.watch import report_events

    if why := check_site_name(args.site):
        raise ConfigError(f"--site: {why}")
    token = read_secret(args.observer_token_file) if args.observer_token_file else ""
    tls = TLSClient(args.tls_ca, args.tls_cert, args.tls_key) if args.tls_ca else None
    import grpc

    from ..errors import WantrainError

    with net.observer_channel(args.ps, tls, args.tls_server_name) as channel:
        try:
            seq = report_events(channel, token, [{"kind": "clear_site", "site": args.site}], args.timeout)
        except grpc.RpcError as e:
            raise WantrainError(f"the parameter server at {args.ps} did not take it: {e.code().name}: "
                                f"{e.details()}") from None
    print(f"cleared {args.site} at {args.ps} (event {seq}): the commit check counts its deltas again")
    return 0


def add_parser(sub) -> None:
    o = sub.add_parser("clear-site", help="count again a site the commit check excluded (robust.exclude_after)")
    o.add_argument("--ps", required=True, help="HOST:PORT of the parameter server")
    o.add_argument("--site", required=True, help="the site's name")
    o.add_argument("--observer-token-file", default=None, help="file holding the PS's observer token")
    o.add_argument("--tls-ca", default=None, help="PEM CA that signed the PS's certificate: connect with TLS")
    o.add_argument("--tls-cert", default=None, help="PEM client certificate (when the PS requires one)")
    o.add_argument("--tls-key", default=None, help="PEM private key of --tls-cert")
    o.add_argument("--tls-server-name", default="", help="name to check the PS's certificate against")
    o.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the PS")
    o.set_defaults(func=run)
