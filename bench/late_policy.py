"""What to do with a delta, or chunks of it, that miss their round, on the transformer: today's
whole-site "drop" against zero + error feedback outside the outer momentum, and the arms that tell
why (issue 28, item 2; the arms: wantrain/studies/late.py).

Each run is wantrain's own code in this process (wantrain.studies.inprocess: every site's inner loop and
codec with error feedback, the PS's global model and outer Nesterov step). In every round after the
first, each site is late with probability `--late`, or (`--chunk-loss`) each site's link loses
chunks of its delta at that rate, in bursts of mean length `--burst`; seeded, the same for every arm
of a seed. The table gives each arm's final validation loss (the mean of the last three
evaluations, then over seeds) and its gap to the run where nothing is late, seed by seed.

    python bench/late_policy.py [--quick] [--late 0.1,0.3] [--chunk-loss 0.01,0.1] [--burst 4]
                                [--seeds 3] [--arms drop,zero-ef-outside] [--outer-lr 0.5,0.7,0.9]

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
    "full": dict(preset="tiny", sites=4, rounds=20, inner_steps=15, block_size=128, seeds=3, late=(0.1, 0.3)),
}
LAST = 3                # evaluations averaged for the final loss


def one_run(arm: str, condition: tuple[str, float], seed: int, outer_lr: float, size: dict) -> dict:
    single_core()
    from wantrain.config import RunConfig
    from wantrain.studies.late import run_arm

    cfg = RunConfig().replace(num_sites=size["sites"], **{
        "model.preset": size["preset"], "model.block_size": size["block_size"], "train.rounds": size["rounds"],
        "train.inner_steps": size["inner_steps"], "train.outer_lr": outer_lr})
    t0 = time.perf_counter()
    kind, rate = condition
    x = run_arm(cfg, arm, seed, **({"late": rate} if kind == "late" else {"chunk_loss": rate, "burst": size["burst"]}))
    return {**x, "condition": label(condition), "outer_lr": outer_lr, "final": float(np.mean(x["val"][-LAST:])),
            "seconds": time.perf_counter() - t0}


def label(condition: tuple[str, float]) -> str:
    kind, rate = condition
    return "nothing late" if rate == 0 else f"{rate:.0%} sites" if kind == "late" else f"{rate:.0%} chunks"


def summarize(runs: list[dict]) -> list[dict]:
    """Per (condition, arm, outer lr): mean final loss, its spread over seeds, the gap to on-time (same
    seed and outer lr), and whether this outer lr is the arm's best in that condition."""
    base = {(x["seed"], x["outer_lr"]): x["final"] for x in runs if x["arm"] == "on-time"}
    conditions = list(dict.fromkeys(x["condition"] for x in runs if x["arm"] != "on-time")) or ["nothing late"]
    groups: dict[tuple, list[dict]] = {}
    for x in runs:
        for c in ([x["condition"]] if x["arm"] != "on-time" else conditions):
            groups.setdefault((c, x["arm"], x["outer_lr"]), []).append(x)
    rows = []
    for (condition, arm, lr), xs in sorted(groups.items(), key=lambda kv: (conditions.index(kv[0][0]), arm_order(kv[0][1]),
                                                                       kv[0][2])):
        finals = [x["final"] for x in xs]
        gaps = [x["final"] / base[(x["seed"], lr)] - 1 for x in xs if (x["seed"], lr) in base]
        rows.append({"condition": condition, "arm": arm, "outer_lr": lr, "final": statistics.mean(finals),
                     "spread": max(finals) - min(finals), "gap": statistics.mean(gaps) if gaps else float("nan"),
                     "gap_min": min(gaps) if gaps else float("nan"), "gap_max": max(gaps) if gaps else float("nan"),
                     "seeds": len(xs)})
    for row in rows:
        same = [r["final"] for r in rows if r["condition"] == row["condition"] and r["arm"] == row["arm"]]
        row["best_lr"] = row["final"] == min(same)
    return rows


def arm_order(arm: str) -> int:
    from wantrain.studies.late import ARMS
    return ARMS.index(arm)


def table(rows: list[dict]) -> str:
    lines = [f"{'condition':<12} {'arm':<16} {'outer lr':>8} {'final loss':>10} {'spread':>7} {'vs on-time':>10} "
             f"{'per seed':>17}"]
    for r in rows:
        star = "*" if r["best_lr"] and len({x["outer_lr"] for x in rows}) > 1 else " "
        lines.append(f"{r['condition']:<12} {r['arm']:<16} {r['outer_lr']:>7.2f}{star} {r['final']:>10.4f} "
                     f"{r['spread']:>7.4f} {r['gap']:>+10.2%} {r['gap_min']:>+8.2%}..{r['gap_max']:>+7.2%}")
    return "\n".join(lines)


def main() -> None:
    from wantrain.studies.late import ARMS

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="one seed of four short rounds (tests)")
    p.add_argument("--late", help="comma-separated fractions of sites late (full: 0.1,0.3)")
    p.add_argument("--chunk-loss", help="comma-separated rates of chunks late per link (none by default)")
    p.add_argument("--burst", type=float, default=1.0, help="mean length of a run of late chunks (1: i.i.d.)")
    p.add_argument("--seeds", type=int, help="seeds per arm (quick: 1, full: 3)")
    p.add_argument("--rounds", type=int, help="rounds per run (full: 20)")
    p.add_argument("--inner-steps", type=int, help="inner steps per round (full: 15)")
    p.add_argument("--arms", help=f"comma-separated, of {', '.join(ARMS)} (default: all)")
    p.add_argument("--outer-lr", default="0.7", help="comma-separated outer learning rates (default 0.7)")
    p.add_argument("--jobs", type=int, default=2, help="runs at a time, one core each")
    p.add_argument("--out", default="late_policy", help="result name under bench/results, or a path ending in .json")
    args = p.parse_args()
    size = dict(SIZES["quick" if args.quick else "full"])
    if args.rounds:
        size["rounds"] = args.rounds
    if args.inner_steps:
        size["inner_steps"] = args.inner_steps
    arms = args.arms.split(",") if args.arms else list(ARMS)
    if unknown := set(arms) - set(ARMS):
        p.error(f"unknown arms {sorted(unknown)}; choose from {', '.join(ARMS)}")
    size["burst"] = args.burst
    lates = [float(x) for x in args.late.split(",")] if args.late else [] if args.chunk_loss else list(size["late"])
    losses = [float(x) for x in args.chunk_loss.split(",")] if args.chunk_loss else []
    conditions = [("late", f) for f in lates] + [("chunks", f) for f in losses]
    lrs = [float(x) for x in args.outer_lr.split(",")]
    seeds = range(args.seeds or size["seeds"])
    runs = [(a, ("late", 0.0) if a == "on-time" else c, s, lr) for lr in lrs for s in seeds for a in arms
            for c in (conditions[:1] if a == "on-time" else conditions)]
    t0 = time.time()
    results = []
    with ProcessPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(one_run, a, f, s, lr, size) for a, f, s, lr in runs]
        for i, fut in enumerate(futures):
            x = fut.result()
            results.append(x)
            print(f"[{i + 1}/{len(runs)} {time.time() - t0:.0f} s] {x['arm']}, {x['condition']}, seed {x['seed']}, "
                  f"outer lr {x['outer_lr']}: final loss {x['final']:.4f} ({x['seconds']:.0f} s)", flush=True)
    rows = summarize(results)
    print()
    print(f"{size['preset']}, {size['sites']} sites, {size['rounds']} rounds of {size['inner_steps']} inner steps"
          f"{f', chunk loss in bursts of {args.burst:g}' if losses and args.burst > 1 else ''}; final loss: mean of the "
          f"last {LAST} evaluations, then over {len(seeds)} seed(s); vs on-time: the same seed and outer lr with "
          f"nothing late")
    print(table(rows))
    save_to(args.out, {"size": "quick" if args.quick else "full", **size, "late": lates, "chunk_loss": losses, "arms": arms,
                       "outer_lr": lrs, "seeds": len(seeds), "rows": rows, "runs": results})


if __name__ == "__main__":
    main()
