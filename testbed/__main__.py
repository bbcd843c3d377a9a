"""`python -m testbed links | describe | record | shape | cleanup`: the link emulator as its own process, and its tools."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from wantrain.launch.plan import PlanError, RunPlan

from .scenario import ScenarioError, load_scenario, scenario_from_plan
from .trace import TraceError


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m testbed")
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("describe", help="print a scenario's plan (sites, regions, RTTs, speed factors) as JSON")
    which = d.add_mutually_exclusive_group(required=True)
    which.add_argument("--scenario", help="a built-in scenario's name or a scenario file")
    which.add_argument("--plan", help="a run plan (JSON), as this prints it (wantrain's Run.move_ps)")
    d.add_argument("--ps-region", default=None, help="the plan with the PS in this region instead; 'all': a JSON "
                   "object of every known region's plan (wantrain place)")
    ln = sub.add_parser("links", help="run the site links of a run plan (or a scenario) to TARGET")
    what = ln.add_mutually_exclusive_group(required=True)
    what.add_argument("--plan", help="a run plan (JSON, wantrain.launch.plan.RunPlan), as `describe` prints it")
    what.add_argument("--scenario", help="a built-in scenario's name or a scenario file")
    ln.add_argument("--target", required=True, help="HOST:PORT of the parameter server")
    ln.add_argument("--listening", required=True, help="the plan, with where each site dials, written once every "
                                                       "link listens")
    ln.add_argument("--log", default=None, help="JSONL file of link telemetry")
    ln.add_argument("--control", default=None, help="file of JSON commands, one per line (outage now)")
    ln.add_argument("--backend", default=None, choices=("proxy", "kernel", "kernel-relay"),
                    help="instead of the scenario's (kernel-relay, root: each site in its own namespace, every "
                         "packet delayed by the testbed's relay, no proxy; for peers that connect to each other)")
    sh = sub.add_parser("shape", help="shape one site's link on this host with tcconfig or htb (its plan entry "
                                      "names the backend and the interface), until stopped")
    sh.add_argument("--plan", required=True)
    sh.add_argument("--site", required=True)
    sh.add_argument("--dry-run", action="store_true", help="print the tc commands instead of running them")
    rec = sub.add_parser("record", help="write a run's links, as it measured them, as a scenario to replay")
    rec.add_argument("run_dir", help="the run's folder (a run through the testbed: plan.json, events.jsonl)")
    rec.add_argument("--out", default=None, help="folder for the traces and replay.toml (default RUN_DIR/replay)")
    sub.add_parser("cleanup", help="remove namespaces, links and nftables tables left by a killed kernel backend")
    args = p.parse_args(argv)
    try:
        if args.command == "cleanup":
            from .kernel import cleanup_all
            print("\n".join(cleanup_all()) or "nothing to remove")
            return 0
        if args.command == "shape":
            from .shape import main_shape
            return main_shape(args)
        if args.command == "record":
            from .record import record
            print(record(args.run_dir, args.out))
            return 0
        if args.command == "describe":
            from .links import plan_of
            from .regions import regions
            sc = load_scenario(args.scenario) if args.scenario else scenario_from_plan(RunPlan.read(args.plan), args.plan)
            if args.ps_region == "all":
                print(json.dumps({r: json.loads(plan_of(dataclasses.replace(sc, ps_region=r)).to_json())
                                  for r in regions()}))
                return 0
            if args.ps_region is not None and args.ps_region not in regions():
                raise ScenarioError(f"--ps-region must be 'all' or one of the known regions ({', '.join(regions())}), "
                                    f"got {args.ps_region!r}")
            print(plan_of(dataclasses.replace(sc, ps_region=args.ps_region or sc.ps_region)).to_json())
            return 0
        from .links import main_links
        return main_links(args)
    except (ScenarioError, TraceError, PlanError) as e:
        print(f"testbed {args.command}: {e}", file=sys.stderr)
        return 2


raise SystemExit(main())
