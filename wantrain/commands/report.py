"""`wantrain report`: the HTML report of a run folder."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import DataError

__all__ = ["add_parser", "run"]


def run(args: argparse.Namespace) -> int:
    from ..telemetry.report import write_report

    if not Path(args.run_dir).exists():
        raise DataError(f"run folder {args.run_dir} does not exist")
    print(write_report(args.run_dir, args.output))
    if args.tensorboard:
        from ..telemetry.tensorboard import export
        print(f"TensorBoard event files in {export(args.run_dir, args.tensorboard)}: tensorboard --logdir "
              f"{args.tensorboard}")
    return 0


def add_parser(sub) -> None:
    r = sub.add_parser("report", help="write the HTML report of a run")
    r.add_argument("run_dir", help="the run's folder (it holds events.jsonl)")
    r.add_argument("-o", "--output", default=None, help="the HTML file to write (default: report.html in the run "
                   "folder)")
    r.add_argument("--tensorboard", default=None, metavar="DIR", help="also write the run's telemetry as TensorBoard "
                   "event files in DIR (needs the tensorboard package: pip install 'wantrain[tensorboard]')")
    r.set_defaults(func=run)
