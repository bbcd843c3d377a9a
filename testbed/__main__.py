"""`python -m testbed links | describe`: the link emulator as its own process."""

from __future__ import annotations

import argparse
import json
import sys

from .scenario import ScenarioError, load_scenario
from .trace import TraceError


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m testbed")
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("describe", help="print a scenario's plan (sites, regions, RTTs, speed factors) as JSON")
    d.add_argument("--scenario", required=True)
    ln = sub.add_parser("links", help="run a scenario's site links as proxies to TARGET")
    ln.add_argument("--scenario", required=True)
    ln.add_argument("--target", required=True, help="HOST:PORT of the parameter server")
    ln.add_argument("--plan-file", required=True, help="written once every proxy listens")
    ln.add_argument("--log", default=None, help="JSONL file of link telemetry")
    ln.add_argument("--control", default=None, help="file of JSON commands, one per line (outage now)")
    sub.add_parser("cleanup", help="remove namespaces, links and nftables tables left by a killed kernel backend")
    args = p.parse_args(argv)
    try:
        if args.command == "cleanup":
            from .kernel import cleanup_all
            print("\n".join(cleanup_all()) or "nothing to remove")
            return 0
        if args.command == "describe":
            from .links import plan_of
            print(json.dumps(plan_of(load_scenario(args.scenario)), indent=2))
            return 0
        from .links import main_links
        return main_links(args)
    except (ScenarioError, TraceError) as e:
        print(f"testbed {args.command}: {e}", file=sys.stderr)
        return 2


raise SystemExit(main())
