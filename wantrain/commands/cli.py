"""The command line: `wantrain demo | ps | worker | host | watch | clear-site | tls-dev | report | place | whatif`.

The dispatcher: each command is a module of commands/. Every error wantrain raises on purpose is
printed as one line that names the problem, with exit code 2 (bad input) or 1 (a failure while
running); tracebacks are for bugs only.
"""

from __future__ import annotations

import argparse
import sys

from . import COMMANDS
from .process import exit_on_sigterm
from ..errors import ConfigError, DataError, WantrainError

__all__ = ["main", "build_parser"]


class _Version(argparse.Action):
    """`wantrain --version`: the package, and the versions a peer must match (the wire protocol,
    the telemetry schema), read only when asked."""

    def __init__(self, option_strings, dest, **kw) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print the version, the wire protocol's and the "
                                                             "telemetry schema's, and exit")

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        import wantrain

        from ..transport.messages import PROTOCOL_VERSION
        from ..telemetry import SCHEMA_VERSION

        print(f"wantrain {wantrain.__version__} (wire protocol {PROTOCOL_VERSION}, telemetry schema {SCHEMA_VERSION})")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="wantrain", description="Train one language model across WAN-separated sites.")
    p.add_argument("--version", action=_Version)
    sub = p.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    exit_on_sigterm()
    try:
        return args.func(args)
    except (ConfigError, DataError) as e:
        print(f"wantrain {args.command}: {e}", file=sys.stderr)
        return 2
    except WantrainError as e:
        print(f"wantrain {args.command}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"wantrain {args.command}: interrupted", file=sys.stderr)
        return 130
