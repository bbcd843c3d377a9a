"""`wantrain ps`: a parameter server (or one shard of one) in this process, until its run ends."""

from __future__ import annotations

import argparse
import asyncio
import logging
from pathlib import Path

from ..errors import ConfigError
from ..runtime.faults import parse_stalls
from .process import setup_logging

__all__ = ["add_parser", "run"]


def run(args: argparse.Namespace) -> int:
    from ..runtime.memory import limit_malloc_arenas

    limit_malloc_arenas()              # before any thread allocates: see memory.py
    from ..transport.auth import Authenticator, new_secret_file
    from ..config import RunConfig
    from ..transport.limits import Limits
    from ..ps import ParameterServer
    from ..ps import serve
    from ..launch.relay import shard_relay
    from ..launch.run import new_run_dir
    from ..models.shards import parse_shard
    from ..transport.tls import TLSServer

    setup_logging()
    log = logging.getLogger("wantrain.ps")
    cfg = RunConfig.load(args.config) if args.config else RunConfig()
    # The codec's and the round's compiled loops, before the first site joins: from numba's cache
    # (an install writes it) in a fraction of a second, rather than in the first commit.
    from ..outer.kernels import load as load_round_loops
    from ..codec import load_kernels
    from ..config import CODEC_MODES

    load_kernels(CODEC_MODES)
    load_round_loops()
    limits = Limits(max_connections=args.max_connections, max_streams_per_peer=args.max_streams_per_peer,
                    handshake_timeout_s=args.handshake_timeout, join_timeout_s=args.join_timeout)
    run_dir = Path(args.run_dir) if args.run_dir else new_run_dir()
    observer_file = args.observer_token_file
    if not observer_file and (args.tokens or args.shared_secret_file):
        # Telemetry names the sites, their losses and errors: with sites authenticated, watchers are too.
        run_dir.mkdir(parents=True, exist_ok=True)
        observer_file = run_dir / "observer-token"
        if not observer_file.exists():
            new_secret_file(observer_file)
        log.info("observers (Watch, Report) need the token in %s (wantrain watch --observer-token-file ...)", observer_file)
    auth = Authenticator.from_files(args.tokens, args.shared_secret_file, observer_file, args.sites_may_observe)
    tls = None
    if args.tls_cert or args.tls_key:
        if not (args.tls_cert and args.tls_key):
            raise ConfigError("TLS needs both --tls-cert and --tls-key")
        tls = TLSServer(args.tls_cert, args.tls_key, args.tls_client_ca)
        tls.credentials()        # fail now, with the file's name, not on the first connection
    elif args.tls_client_ca:
        raise ConfigError("--tls-client-ca needs --tls-cert and --tls-key")
    elif args.host not in ("127.0.0.1", "localhost", "::1"):
        log.warning(
            "serving plaintext on %s: sites' tokens and deltas cross the network unencrypted; "
            "use --tls-cert/--tls-key (wantrain tls-dev makes a development CA)", args.host)
    if (shard := parse_shard(args.shard))[1] > 1 and not args.run_id:
        raise ConfigError("a sharded PS needs --run-id, the same for every shard of the run")
    relay = shard_relay(args.report_to, auth.observer_token or auth.shared_secret, run_dir / "events.jsonl",
                        shard[0], args.report_tls_ca) if args.report_to else None   # before the first event
    ps = ParameterServer(cfg, run_dir=run_dir, run_id=args.run_id, exit_when_done=not args.keep_running, auth=auth,
                         stalls=parse_stalls(args.stall), limits=limits, shard=shard)
    try:
        asyncio.run(serve(ps, args.host, args.port, args.port_file, tls=tls))
    finally:
        if relay is not None:
            relay.close()
    return 0


def add_parser(sub) -> None:
    s = sub.add_parser("ps", help="run a parameter server")
    s.add_argument("--config", default=None, help="RunConfig JSON file (default: the built-in defaults)")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface; then serve TLS)")
    s.add_argument("--port", type=int, default=50051, help="0 picks a free port")
    s.add_argument("--port-file", default=None, help="write the bound port here once listening")
    s.add_argument("--run-dir", default=None, help="telemetry folder for events.jsonl (default runs/<time>)")
    s.add_argument("--keep-running", action="store_true", help="keep serving after the last round")
    s.add_argument("--report-to", metavar="HOST:PORT", help="a shard after the first: report its events to shard "
                   "0 there (with --observer-token-file: the token of shard 0's observers)")
    s.add_argument("--report-tls-ca", default=None, help="PEM CA of shard 0's certificate, if it serves TLS")
    s.add_argument("--run-id", default=None, help="the run's identifier (default: the time and a random suffix)")
    s.add_argument("--shard", default="0/1", metavar="I/N", help="serve shard I of N of the model's tensors (from 0; "
                   "each shard its own process, port and run folder; sites list all shards' addresses in order)")
    s.add_argument("--tokens", default=None, help="JSON file: site name -> token; only these sites may join")
    s.add_argument("--shared-secret-file", default=None, help="file holding one secret every site must present")
    s.add_argument("--tls-cert", default=None, help="PEM certificate: serve TLS (see `wantrain tls-dev`)")
    s.add_argument("--tls-key", default=None, help="PEM private key of --tls-cert")
    s.add_argument("--tls-client-ca", default=None, help="PEM CA: require client certificates signed by it")
    s.add_argument("--observer-token-file", default=None,
                   help="file holding the token observers (Watch, Report) must present (default with --tokens or "
                        "--shared-secret-file: a new one in the run folder)")
    s.add_argument("--sites-may-observe", action="store_true",
                   help="let a site's token or the shared secret also watch the run's telemetry and report events "
                        "into its log (default: only the observer token may)")
    s.add_argument("--max-connections", type=int, default=0,
                   help="TCP connections at once (default 0: 80%% of the open-file limit)")
    s.add_argument("--max-streams-per-peer", type=int, default=32, help="Session and Watch calls at once per IP")
    s.add_argument("--handshake-timeout", type=float, default=10.0, metavar="SECONDS",
                   help="close a connection that has not finished TLS and HTTP/2 setup by then")
    s.add_argument("--join-timeout", type=float, default=10.0, metavar="SECONDS",
                   help="end a Session that has not sent its Join by then")
    s.add_argument("--stall", action="append", metavar="PHASE=SECONDS",
                   help="fault injection for tests: sleep in aggregate or checkpoint (before the rename)")
    s.set_defaults(func=run)
