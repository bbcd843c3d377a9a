"""The flight recorder, end to end: a run through a scenario, its links recorded as it measured them
(`python -m testbed record`), and the same run again over the recording. Reports both runs' round
times (each round's start to the next's) and how far apart they are: a recording that replays its
run should give the same rounds.

    python bench/replay.py [--scenario three-sites] [--rounds 8] [--inner-steps 10] [--out replay]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import save_to


def round_times(run_dir: Path) -> list[float]:
    from wantrain.telemetry import read_events, round_windows

    return [t1 - t0 for r, (t0, t1) in sorted(round_windows(read_events(run_dir)).items()) if r > 0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--scenario", default="three-sites")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--inner-steps", type=int, default=10)
    p.add_argument("--out", default="replay")
    args = p.parse_args()

    from wantrain.config import RunConfig
    from wantrain.launch.run import Run

    times = {}
    with tempfile.TemporaryDirectory() as tmp:
        scenario: str | Path = args.scenario
        for arm in ("recorded", "replayed"):
            cfg = RunConfig().replace(**{"train.rounds": args.rounds, "train.inner_steps": args.inner_steps})
            folder = Path(tmp) / arm
            with Run(cfg.replace(num_sites=3), run_dir=folder, site_threads=1, scenario=scenario) as run:
                for _ in run.follow(timeout_s=900):
                    pass
            times[arm] = round_times(folder)
            print(f"{arm}: rounds after the first " + ", ".join(f"{t:.2f}" for t in times[arm]) + " s", flush=True)
            if arm == "recorded":
                r = subprocess.run([sys.executable, "-m", "testbed", "record", str(folder)], capture_output=True,
                                   text=True, check=True)
                scenario = r.stdout.strip()
    med = {arm: statistics.median(ts) for arm, ts in times.items()}
    per_round = [100 * (b / a - 1) for a, b in zip(times["recorded"], times["replayed"])]
    print(f"median round: recorded {med['recorded']:.2f} s, replayed {med['replayed']:.2f} s "
          f"({100 * (med['replayed'] / med['recorded'] - 1):+.1f} %); per round "
          + ", ".join(f"{d:+.1f}" for d in per_round) + " %")
    path = save_to(args.out, {"scenario": args.scenario, "rounds": args.rounds, "inner_steps": args.inner_steps,
                              "round_s": times, "median_s": med, "per_round_pct": per_round})
    print(f"results: {path}")


if __name__ == "__main__":
    main()
