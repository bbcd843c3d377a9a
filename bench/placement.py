"""`wantrain place` against measured rounds: the same scenario run with its PS in several regions.

One run (PS in the first region) is the recording `wantrain place --from-run` reads; every region's
run is then measured: its median round time (each round's start to the next's, the first round
left out: it opens the lanes). Reports each region's predicted and measured round time, the error,
and whether the ranking agrees; then the recording's what-if for twice its inner steps
(`wantrain whatif --inner-steps`) against a run with them.

    python bench/placement.py [--scenario bench/scenarios/placement.toml] [--regions "East US,West Europe,Southeast Asia"]
                              [--rounds 8] [--inner-steps 5] [--out placement]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import save_to

HERE = Path(__file__).resolve().parent


def measured_round_s(run_dir: Path) -> float:
    from wantrain.telemetry import read_events, round_windows

    windows = round_windows(read_events(run_dir))
    return statistics.median(t1 - t0 for r, (t0, t1) in windows.items() if r > 0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--scenario", default=str(HERE / "scenarios" / "placement.toml"))
    p.add_argument("--regions", default="East US,West Europe,Southeast Asia")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--inner-steps", type=int, default=5)
    p.add_argument("--out", default="placement")
    args = p.parse_args()

    from wantrain.launch.ps_regions import costs_from_run, predict_plan
    from wantrain.config import RunConfig
    from wantrain.launch.emulator import describe_placements, describe_scenario
    from wantrain.launch.run import Run

    regions = args.regions.split(",")
    plans = describe_placements(args.scenario)
    measured, runs = {}, {}

    def one_run(region: str, inner_steps: int, folder: Path) -> float:
        plan = describe_scenario(args.scenario, ps_region=region)
        cfg = RunConfig().replace(num_sites=len(plan.sites), **{"train.rounds": args.rounds,
                                                                  "train.inner_steps": inner_steps})
        with Run(cfg, run_dir=folder, site_threads=1, plan=plan) as run:
            for _ in run.follow(timeout_s=600):
                pass
        return measured_round_s(folder)

    with tempfile.TemporaryDirectory() as tmp:
        for region in regions:
            runs[region] = Path(tmp) / region.replace(" ", "-")
            measured[region] = one_run(region, args.inner_steps, runs[region])
            print(f"PS in {region}: median round {measured[region]:.2f} s", flush=True)
        c = costs_from_run(runs[regions[0]])
        doubled = one_run(regions[0], 2 * args.inner_steps, Path(tmp) / "doubled")
    whatif_doubled = predict_plan(plans[regions[0]], c, compute_scale=2.0).round_s
    predicted = {region: predict_plan(plans[region], c).round_s for region in regions}
    rank_measured = sorted(regions, key=measured.get)
    rank_predicted = sorted(regions, key=predicted.get)
    rows = [{"region": r, "measured_s": measured[r], "predicted_s": predicted[r],
             "error_pct": 100 * (predicted[r] / measured[r] - 1)} for r in regions]
    print(f"\n{'PS region':<18} {'measured s':>10} {'predicted s':>11} {'error':>7}")
    for row in rows:
        print(f"{row['region']:<18} {row['measured_s']:>10.2f} {row['predicted_s']:>11.2f} {row['error_pct']:>+6.1f}%")
    print(f"ranking measured: {rank_measured}; predicted (from the {regions[0]} run): {rank_predicted}; "
          f"{'agree' if rank_measured == rank_predicted else 'DISAGREE'}")
    print(f"what if {2 * args.inner_steps} inner steps (PS in {regions[0]}): predicted {whatif_doubled:.2f} s, "
          f"measured {doubled:.2f} s ({100 * (whatif_doubled / doubled - 1):+.1f} %)")
    path = save_to(args.out, {"scenario": args.scenario, "rounds": args.rounds, "inner_steps": args.inner_steps,
                              "recorded_in": regions[0], "rows": rows, "ranks_agree": rank_measured == rank_predicted,
                              "whatif_double_inner_steps": {"predicted_s": whatif_doubled, "measured_s": doubled}})
    print(f"results: {path}")


if __name__ == "__main__":
    main()
