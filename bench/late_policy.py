"""What to do with a delta that misses its round, on the transformer: today's whole-site "drop"
against zero + error feedback outside the outer momentum, and the arms that tell why (issue 28,
item 2; the arms: wantrain/late_study.py).

Each run is wantrain's own code in this process (wantrain.inprocess: every site's inner loop and
codec with error feedback, the PS's global model and outer Nesterov step). In every round after the
first, each site is late with probability `--late` (seeded; the same sites for every arm of a
seed). The table gives each arm's final validation loss (the mean of the last three evaluations,
then over seeds) and its gap to the run where nobody is late, seed by seed.

    python bench/late_policy.py [--quick] [--late 0.1,0.3] [--seeds 3] [--arms drop,zero-ef-outside]
                                [--outer-lr 0.5,0.7,0.9] [--jobs 2]

`--outer-lr` runs every arm at each outer learning rate (a zero substitute is an implicit cut of
it by the late fraction: compare arms at their own best). One core per run, `--jobs` at a time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import save_to, single_core

SIZES = {
    "quick": dict(preset="tiny", sites=4, rounds=4, inner_steps=5, block_size=64, seeds=1, late=(0.3,)),
    "full": dict(preset="tiny", sites=4, rounds=24, inner_steps=15, block_size=128, seeds=3, late=(0.1, 0.3)),
}
LAST = 3                # evaluations averaged for the final loss


def one_run(arm: str, late: float, seed: int, outer_lr: float, size: dict) -> dict:
    single_core()
    from wantrain.config import RunConfig
    from wantrain.late_study import run_arm

    cfg = RunConfig().replace(num_sites=size["sites"], **{
        "model.preset": size["preset"], "model.block_size": size["block_size"], "train.rounds": size["rounds"],
        "train.inner_steps": size["inner_steps"], "train.outer_lr": outer_lr})
    t0 = time.perf_counter()
    x = run_arm(cfg, arm, late, seed)
    return {**x, "outer_lr": outer_lr, "final": float(np.mean(x["val"][-LAST:])), "seconds": time.perf_counter() - t0}


def summarize(runs: list[dict]) -> list[dict]:
    """Per (late, arm, outer lr): mean final loss, its spread over seeds, the gap to on-time (same
    seed and outer lr), and whether this outer lr is the arm's best at that late fraction."""
    base = {(x["seed"], x["outer_lr"]): x["final"] for x in runs if x["arm"] == "on-time"}
    groups: dict[tuple, list[dict]] = {}
    for x in runs:
        if x["arm"] != "on-time":
            groups.setdefault((x["late"], x["arm"], x["outer_lr"]), []).append(x)
    for x in runs:
        if x["arm"] == "on-time":
            for late in {k[0] for k in groups} or {0.0}:
                groups.setdefault((late, "on-time", x["outer_lr"]), []).append(x)
    rows = []
    for (late, arm, lr), xs in sorted(groups.items(), key=lambda kv: (kv[0][0], arm_order(kv[0][1]), kv[0][2])):
        finals = [x["final"] for x in xs]
        gaps = [x["final"] / base[(x["seed"], lr)] - 1 for x in xs if (x["seed"], lr) in base]
        rows.append({"late": late, "arm": arm, "outer_lr": lr, "final": statistics.mean(finals),
                     "spread": max(finals) - min(finals), "gap": statistics.mean(gaps) if gaps else float("nan"),
                     "gap_min": min(gaps) if gaps else float("nan"), "gap_max": max(gaps) if gaps else float("nan"),
                     "seeds": len(xs)})
    for row in rows:
        same = [r["final"] for r in rows if r["late"] == row["late"] and r["arm"] == row["arm"]]
        row["best_lr"] = row["final"] == min(same)
    return rows


def arm_order(arm: str) -> int:
    from wantrain.late_study import ARMS
    return ARMS.index(arm)


def table(rows: list[dict]) -> str:
    lines = [f"{'late':>5} {'arm':<16} {'outer lr':>8} {'final loss':>10} {'spread':>7} {'vs on-time':>10} "
             f"{'per seed':>17}"]
    for r in rows:
        star = "*" if r["best_lr"] and len({x["outer_lr"] for x in rows}) > 1 else " "
        lines.append(f"{r['late']:>5.0%} {r['arm']:<16} {r['outer_lr']:>7.2f}{star} {r['final']:>10.4f} "
                     f"{r['spread']:>7.4f} {r['gap']:>+10.2%} {r['gap_min']:>+8.2%}..{r['gap_max']:>+7.2%}")
    return "\n".join(lines)


def main() -> None:
    from wantrain.late_study import ARMS

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="one seed of four short rounds (tests)")
    p.add_argument("--late", help="comma-separated late fractions (full: 0.1,0.3)")
    p.add_argument("--seeds", type=int, help="seeds per arm (quick: 1, full: 3)")
    p.add_argument("--rounds", type=int, help="rounds per run (full: 24)")
    p.add_argument("--arms", help=f"comma-separated, of {', '.join(ARMS)} (default: all)")
    p.add_argument("--outer-lr", default="0.7", help="comma-separated outer learning rates (default 0.7)")
    p.add_argument("--jobs", type=int, default=2, help="runs at a time, one core each")
    p.add_argument("--out", default="late_policy", help="result name under bench/results, or a path ending in .json")
    args = p.parse_args()
    size = dict(SIZES["quick" if args.quick else "full"])
    if args.rounds:
        size["rounds"] = args.rounds
    arms = args.arms.split(",") if args.arms else list(ARMS)
    if unknown := set(arms) - set(ARMS):
        p.error(f"unknown arms {sorted(unknown)}; choose from {', '.join(ARMS)}")
    lates = [float(x) for x in args.late.split(",")] if args.late else list(size["late"])
    lrs = [float(x) for x in args.outer_lr.split(",")]
    seeds = range(args.seeds or size["seeds"])
    runs = [(a, 0.0 if a == "on-time" else f, s, lr) for lr in lrs for s in seeds for a in arms
            for f in (lates[:1] if a == "on-time" else lates)]
    t0 = time.time()
    results = []
    with ProcessPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(one_run, a, f, s, lr, size) for a, f, s, lr in runs]
        for i, fut in enumerate(futures):
            x = fut.result()
            results.append(x)
            print(f"[{i + 1}/{len(runs)} {time.time() - t0:.0f} s] {x['arm']}, late {x['late']:.0%}, seed {x['seed']}, "
                  f"outer lr {x['outer_lr']}: final loss {x['final']:.4f} ({x['seconds']:.0f} s)", flush=True)
    rows = summarize(results)
    print()
    print(f"{size['preset']}, {size['sites']} sites, {size['rounds']} rounds of {size['inner_steps']} inner steps; "
          f"final loss: mean of the last {LAST} evaluations, then over {len(seeds)} seed(s); vs on-time: the same "
          f"seed and outer lr with nobody late")
    print(table(rows))
    save_to(args.out, {"size": "quick" if args.quick else "full", **size, "late": lates, "arms": arms,
                       "outer_lr": lrs, "seeds": len(seeds), "rows": rows, "runs": results})


if __name__ == "__main__":
    main()
