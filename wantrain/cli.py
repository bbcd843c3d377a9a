"""The command line: `wantrain demo | ps | worker | host | watch | tls-dev | report | place | whatif`.

The dispatcher: each command is a module of commands/. Every error wantrain raises on purpose is
printed as one line that names the problem, with exit code 2 (bad input) or 1 (a failure while
running); tracebacks are for bugs only.
"""

from __future__ import annotations

import argparse
import sys

from .commands import COMMANDS
from .commands.process import exit_on_sigterm
from .errors import ConfigError, DataError, WantrainError

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="wantrain", description="Train one language model across WAN-separated sites.")
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
