"""`wantrain whatif RUN_DIR`: a recorded run's round time and time to target under other settings.

From what the run measured (each site's compute, codec and apply times, the PS's time, the bytes:
`ps_regions.costs_from_run`) and its links (the run's plan: RTTs and bandwidths), round_model predicts
its round time as recorded, which says how far to trust it, and with the settings changed: more or
fewer inner steps (compute scales with them), another codec (bytes scale with its typical bits per
parameter), the PS in another region (RTTs from the testbed's table). The time to a target loss
is the recorded rounds to it times the predicted round: right for a move of the PS, an assumption
for the others (more inner steps or a smaller codec change how fast the loss falls too).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from pathlib import Path

from ..errors import ConfigError, DataError
from ..launch.ps_regions import TYPICAL_BITS, costs_from_run, predict_plan

__all__ = ["add_parser", "run"]


def run(args: argparse.Namespace) -> int:
    from ..launch.emulator import describe_scenario
    from ..launch.plan import RunPlan
    from ..telemetry import read_events, round_windows, rows

    run_dir = Path(args.run_dir)
    if not (run_dir / "plan.json").is_file():
        raise DataError(f"{run_dir} is not the folder of a run through the testbed (no plan.json): its links are "
                        f"not known")
    plan = RunPlan.from_json((run_dir / "plan.json").read_text())
    costs = costs_from_run(run_dir)
    events = read_events(run_dir)
    start = rows(events, "run_start")[0]
    config = start["config"]
    windows = round_windows(events)
    measured = statistics.median(t1 - t0 for r, (t0, t1) in windows.items() if r > 0 or len(windows) == 1)
    before = predict_plan(plan, costs)

    inner = config["train"]["inner_steps"]
    compute_scale = args.inner_steps / inner if args.inner_steps else 1.0
    bits_now = 8 * costs["up_bytes"] / start["num_params"]
    bytes_scale = TYPICAL_BITS[args.codec] / bits_now if args.codec else 1.0
    changed = plan
    if args.ps_region:
        try:
            changed = describe_scenario(args.scenario or plan.scenario, ps_region=args.ps_region)
        except ConfigError as e:
            raise ConfigError(f"{e} (give the run's scenario file with --scenario)") from None
        if sorted(changed.names) != sorted(plan.names):
            raise ConfigError(f"scenario {args.scenario or plan.scenario} has sites {changed.names}, the run "
                              f"{plan.names}")
        rtt = {s.name: s.rtt_ms for s in changed.sites}      # the run's own links, at the new RTTs
        changed = dataclasses.replace(plan, ps_region=changed.ps_region,
                                      sites=tuple(dataclasses.replace(s, rtt_ms=rtt[s.name]) for s in plan.sites))
    after = predict_plan(changed, costs, compute_scale, bytes_scale)

    what = ", ".join(filter(None, [f"{args.inner_steps} inner steps (from {inner})" if args.inner_steps else "",
                                   f"codec {args.codec} (from {config['codec']['mode']}, {bits_now:.2f} bits a "
                                   f"parameter)" if args.codec else "",
                                   f"PS in {args.ps_region} (from {plan.ps_region})" if args.ps_region else ""]))
    print(f"run {run_dir}: round {measured:.2f} s measured (median after the first), {before.round_s:.2f} s "
          f"predicted as recorded ({100 * (before.round_s / measured - 1):+.1f} %): {before.reason()}")
    print(f"with {what or 'nothing changed'}: round {after.round_s:.2f} s predicted ({after.round_s / before.round_s:.2f}x "
          f"the recorded prediction): {after.reason()}")
    if args.target is not None:
        ends = rows(events, "round_end")
        hit = next((e for e in ends if e["val_loss"] <= args.target), None)
        if hit is None:
            print(f"the run never reached {args.target}: no time to target to scale")
        else:
            t = hit["t"] - rows(events, "round_start")[0]["t"]
            assumed = "" if not (args.inner_steps or args.codec) else " (assuming the loss falls per round as it did)"
            print(f"time to {args.target}: {t:.1f} s recorded ({hit['round'] + 1} rounds); "
                  f"{t * after.round_s / before.round_s:.1f} s predicted{assumed}")
    if args.json:
        print(json.dumps({"measured_round_s": measured, "predicted_round_s": before.round_s,
                          "whatif_round_s": after.round_s}))
    return 0


def add_parser(sub) -> None:
    w = sub.add_parser("whatif", help="predict a recorded run's round time and time to target under other settings")
    w.add_argument("run_dir", help="the run's folder (a run through the testbed: it holds plan.json)")
    w.add_argument("--inner-steps", type=int, default=None, help="inner steps a round instead of the run's")
    w.add_argument("--codec", default=None, choices=sorted(TYPICAL_BITS), help="another codec (its typical bits "
                   "per parameter)")
    w.add_argument("--ps-region", default=None, help="the PS in this region instead (the testbed's RTT table)")
    w.add_argument("--scenario", default=None, help="the run's scenario file, where it is not a built-in one "
                   "(for --ps-region)")
    w.add_argument("--target", type=float, default=None, help="a validation loss: its time to target, scaled")
    w.add_argument("--json", action="store_true", help="also print the three round times as one JSON line")
    w.set_defaults(func=run)
