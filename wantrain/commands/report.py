"""`wantrain report`: the HTML report of a run folder."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import DataError

__all__ = ["add_parser", "run"]


def run(args: argparse.Namespace) -> int:
    from ..report import write_report

    if not Path(args.run_dir).exists():
        raise DataError(f"run folder {args.run_dir} does not exist")
    print(write_report(args.run_dir, args.output))
    return 0


def add_parser(sub) -> None:
    r = sub.add_parser("report", help="write the HTML report of a run")
    r.add_argument("run_dir", help="the run's folder (it holds events.jsonl)")
    r.add_argument("-o", "--output", default=None, help="the HTML file to write (default: report.html in the run "
                   "folder)")
    r.set_defaults(func=run)
