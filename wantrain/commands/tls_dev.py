"""`wantrain tls-dev`: a development CA, a PS certificate and client certificates."""

from __future__ import annotations

import argparse

__all__ = ["add_parser", "run"]


def run(args: argparse.Namespace) -> int:
    from ..transport.tls import make_dev_certs

    certs = make_dev_certs(args.folder, hosts=tuple(args.host or ("localhost", "127.0.0.1")), clients=tuple(args.client))
    print(f"development CA and certificates in {certs.folder}:")
    print(f"  PS:    wantrain ps --tls-cert {certs.server_cert} --tls-key {certs.server_key}"
          + (f" --tls-client-ca {certs.ca}" if args.client else ""))
    for name, (cert, key) in certs.clients.items():
        print(f"  {name}: wantrain worker --site {name} --tls-ca {certs.ca} --tls-cert {cert} --tls-key {key}")
    if not args.client:
        print(f"  sites: wantrain worker --tls-ca {certs.ca} ...")
    print("for development only: the CA's key is in the same folder")
    return 0


def add_parser(sub) -> None:
    t = sub.add_parser("tls-dev", help="create a development CA, a PS certificate and client certificates")
    t.add_argument("folder", help="where the CA, the PS's certificate and key, and client certificates go")
    t.add_argument("--host", action="append", default=None, help="name or IP the PS is reached at (repeatable; "
                   "default localhost and 127.0.0.1)")
    t.add_argument("--client", action="append", default=[], help="make a client certificate for this site")
    t.set_defaults(func=run)
