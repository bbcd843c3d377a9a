"""`wantrain worker`: one site, one process or (with --nproc N) a torch.distributed group of N."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys

from ..config import CODEC_MODES
from ..errors import ConfigError
from ..runtime.faults import parse_stalls

__all__ = ["add_parser", "run"]

ARGV_VARIABLE = "WANTRAIN_WORKER_ARGV"     # a group's ranks: the `wantrain worker` arguments, as JSON


def run(args: argparse.Namespace) -> int:
    from ..runtime.memory import limit_malloc_arenas

    limit_malloc_arenas()              # before any thread allocates: see memory.py
    import torch

    from ..transport.auth import read_secret
    from ..transport.tls import TLSClient
    from ..site import Site, SiteOptions, default_device
    from ..site.group import follow, group_rank, join_group, leave

    if args.nproc < 1:
        raise ConfigError(f"--nproc must be at least 1, got {args.nproc}")
    if args.nproc > 1 and "RANK" not in os.environ:   # start the group: this command again under torchrun
        # The arguments go in the environment: torchrun's own parser would take some of them.
        os.environ[ARGV_VARIABLE] = json.dumps(sys.argv[1:])
        os.execv(sys.executable, [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                  f"--nproc-per-node={args.nproc}", "-m", "wantrain.commands.worker"])
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    rank, world = group_rank()
    device = default_device() if args.device == "auto" else args.device
    if world > 1 and device == "cuda":
        device = f"cuda:{os.environ.get('LOCAL_RANK', rank)}"      # one GPU a rank
    if args.threads:
        torch.set_num_threads(args.threads)
    join_group(torch.device(device))
    # The codec's compiled loops, before the Join: loaded from numba's cache (an install on a host
    # writes it: launch/install.py), or compiled here, rather than in the first round's encode
    # and decode, where a fresh host spent 13 s "encoding" and 6 s "applying".
    from ..codec import load_kernels
    from ..config import CODEC_MODES

    load_kernels(CODEC_MODES)
    if rank > 0:                     # only rank 0 speaks to the PS; the others follow it
        leave(follow(torch.device(device)))
    token = read_secret(args.token_file) if args.token_file else ""
    if (args.tls_cert or args.tls_key) and not args.tls_ca:
        raise ConfigError("a TLS client certificate needs --tls-ca as well")
    if (tls := TLSClient(args.tls_ca, args.tls_cert, args.tls_key) if args.tls_ca else None) is not None:
        tls.credentials()
    site = Site(SiteOptions(token=token, tls=tls, tls_server_name=args.tls_server_name,
                            stalls=tuple(parse_stalls(args.stall).items()), ps=args.ps, name=args.site, device=device,
                            threads=args.threads, connect_timeout_s=args.connect_timeout,
                            speed_factor=args.speed_factor, probe_interval_s=args.probe_interval,
                            link_rtt_ms=args.link_rtt_ms, link_mbps=args.link_mbps,
                            chunk_loss=(args.chunk_loss, args.chunk_burst, args.chunk_late_s), codec=args.codec))
    asyncio.run(site.run())
    logging.getLogger("wantrain.site").info("site %s finished after %d rounds", args.site, site.round)
    if world > 1:     # (on an error rank 0 just exits: torchrun then stops the other ranks)
        leave(0)
    return 0


def add_parser(sub) -> None:
    w = sub.add_parser("worker", help="run one site")
    w.add_argument("--ps", required=True,
                   help="HOST:PORT of the parameter server; of a sharded one, every shard's, in order, with commas")
    w.add_argument("--site", required=True, help="this site's name, unique within the run")
    w.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    w.add_argument("--nproc", type=int, default=1,
                   help="processes of this site (one a GPU): a torch.distributed group under torchrun, DDP inner "
                        "steps, one replica (gloo on CPU, NCCL on CUDA)")
    w.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    w.add_argument("--codec", default="", choices=("", *CODEC_MODES), metavar="MODE",
                   help="this site's delta encoding (default: the run's codec.mode); any that fits the run's "
                        "chunk plan: fp32 only where the run's codec or update is fp32")
    w.add_argument("--connect-timeout", type=float, default=120.0, help="seconds to keep retrying an absent PS")
    w.add_argument("--speed-factor", type=float, default=1.0, help="> 1 pads each inner step to emulate a slower GPU")
    w.add_argument("--probe-interval", type=float, default=1.0, help="seconds between RTT probes (0: none)")
    w.add_argument("--link-rtt-ms", type=float, default=0.0, help="known RTT of the link (sizes gRPC timeouts)")
    w.add_argument("--link-mbps", type=float, default=0.0, help="known bandwidth of the link (sizes gRPC timeouts)")
    w.add_argument("--chunk-loss", type=float, default=0.0,
                   help="lose this fraction of the delta's chunks on purpose (seeded by the run's seed and the site's name): each is "
                        "sent --chunk-late-s after the others")
    w.add_argument("--chunk-burst", type=float, default=1.0, help="mean run of lost chunks (1: i.i.d.)")
    w.add_argument("--chunk-late-s", type=float, default=30.0, help="seconds a lost chunk comes after the others")
    w.add_argument("--token-file", default=None, help="file holding this site's token (or the run's shared secret)")
    w.add_argument("--tls-ca", default=None, help="PEM CA that signed the PS's certificate: connect with TLS")
    w.add_argument("--tls-cert", default=None, help="PEM client certificate (when the PS requires one)")
    w.add_argument("--tls-key", default=None, help="PEM private key of --tls-cert")
    w.add_argument("--tls-server-name", default="", help="name to check the PS's certificate against")
    w.add_argument("--stall", action="append", metavar="PHASE=SECONDS",
                   help="fault injection for tests: sleep in train, push (after chunk 0) or download")
    w.set_defaults(func=run)


if __name__ == "__main__":        # a rank of a group, started by torchrun (see run)
    from ..errors import WantrainError

    parser = argparse.ArgumentParser(prog="wantrain")
    add_parser(parser.add_subparsers(dest="command", required=True))
    try:
        sys.exit(run(parser.parse_args(json.loads(os.environ[ARGV_VARIABLE]))))
    except WantrainError as e:    # one line, as `wantrain worker` prints it (cli.py)
        print(f"wantrain worker (rank {os.environ.get('RANK')}): {e}", file=sys.stderr)
        sys.exit(2 if isinstance(e, ConfigError) else 1)
