"""`wantrain place`: where to put the parameter server, before paying for the GPUs.

For every region the testbed knows (its published RTT table), the round time the scenario's sites
would see with the PS there, fastest first, with what sets each (wantrain.launch.ps_regions). What each
site's round costs comes from a recorded run of the scenario (`--from-run`), or else from an inner
step of the model timed on this machine, the scenario's speed factors and the codec's typical
size (bench/codec_leaderboard.py's figures).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import ConfigError, DataError
from ..launch.ps_regions import TYPICAL_BITS, costs_from_run, costs_from_step, rank

__all__ = ["add_parser", "run"]


def run(args: argparse.Namespace) -> int:
    from ..config import RunConfig
    from ..launch.emulator import describe_placements, describe_scenario

    plans = describe_placements(args.scenario)
    here = describe_scenario(args.scenario)
    if args.from_run:
        if not Path(args.from_run).is_dir():
            raise DataError(f"run folder {args.from_run} does not exist")
        c = costs_from_run(Path(args.from_run))
        if set(c["sites"]) != set(here.names):
            raise ConfigError(f"the run's sites {sorted(c['sites'])} are not the scenario's {sorted(here.names)}")
        source = f"measured in {args.from_run}"
    else:
        cfg = RunConfig().replace(**{"model.preset": args.preset, "train.inner_steps": args.inner_steps,
                                     "codec.mode": args.codec})
        c, source = costs_from_step(here, cfg)
    ranking = rank(plans, c)
    print(f"PS placement for scenario {here.scenario} ({len(here.sites)} sites: "
          + ", ".join(f"{s.name} in {s.region}" for s in here.sites) + f"); costs {source}")
    print(f"{'':2} {'PS region':<20} {'round s':>8}  what sets it")
    for i, (region, p) in enumerate(ranking, 1):
        mark = " (the scenario's)" if region == here.ps_region else ""
        print(f"{i:>2} {region:<20} {p.round_s:>8.2f}  {p.reason()}{mark}")
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("place", help="rank the regions where the parameter server could run, by predicted round time")
    p.add_argument("--scenario", required=True, help="testbed scenario (built-in name or TOML file): the sites, "
                   "their regions, links and speed factors")
    p.add_argument("--from-run", default=None, metavar="RUN_DIR", help="take each site's compute, codec and PS "
                   "times and the bytes from a recorded run of the scenario")
    p.add_argument("--preset", default="tiny", help="without --from-run: the model whose inner step is timed here")
    p.add_argument("--inner-steps", type=int, default=25, help="without --from-run: inner steps a round")
    p.add_argument("--codec", default="int8-huffman", choices=sorted(TYPICAL_BITS),
                   help="without --from-run: the codec (its typical bits per parameter)")
    p.set_defaults(func=run)
