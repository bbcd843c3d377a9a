"""The command line's commands, one module each: `add_parser(sub)` adds its arguments to the
`wantrain` parser and `run(args)` does it. cli.py dispatches; each command imports what it needs
(torch, numba, grpc) inside `run`, so `wantrain --help` and the notebook's kernel load none of it."""

from . import clear_site, demo, host, place, ps, report, tls_dev, watch, whatif, worker

__all__ = ["COMMANDS"]

COMMANDS = (demo, ps, worker, host, watch, clear_site, tls_dev, report, place, whatif)     # in the order `wantrain --help` lists them
