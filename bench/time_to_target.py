"""Time to a target loss: the same scenario, seeds and target under several ways of training.

Each arm is a whole run (a real PS and three real site processes, the links emulated from the
scenario's traces by the embedded testbed), stopped once a round's validation loss reaches the
target or when the arm's wall-clock cap is spent. Figures per arm (wantrain.telemetry.compare): time from
round 0's start to the target (the median over seeds and their range), the bytes it took both ways,
the work it took (every site's inner steps, tokens and seconds of compute), and each site's
compute utilization.

Arms:
    sync-dp              every inner step through the PS: 1 step a round, fp32 both ways, outer SGD
                         with lr 1 and no momentum (the global model moves by the average of the
                         sites' AdamW steps), as many rounds as DiLoCo takes inner steps
    diloco-fp32          DiLoCo, fixed inner steps, no compression
    diloco-int8          ... int8 deltas and updates
    diloco-int8-huffman  ... int8 + Huffman (the default codec)
    time-budget          ... rounds of a fixed compute time: fast sites take more steps
    overlap              ... time-budgeted, and sites train the next round while the delta and the
                         update are in transit (schedule.mode = "overlap")
    controller           ... time-budgeted, each site's budget set by the PS's controller from what
                         its link costs (schedule.controller = "adaptive", wantrain/ps/controller.py)
    min-quorum           DiLoCo whose round closes once two thirds of its sites delivered, after an
                         adaptive grace (schedule.quorum_share, as Decoupled DiLoCo has); later deltas
                         count in a later round (the default late policy)
    async                asynchronous DiLoCo with staleness-aware merging, in the manner of HALoS:
                         a round closes as soon as one site delivered (and half a second more),
                         every other delta counts when it lands, its weight halved per round it is
                         late (late_policy "stale"); three times the rounds of the others, each
                         about a third of their work
    streaming            Streaming DiLoCo's fragments (train.fragments = 4, wantrain/outer/fragments.py):
                         round r synchronizes a quarter of the tensors, the rest train on at the
                         sites; four times the rounds of a quarter of the inner steps, so each
                         fragment is synchronized every DiLoCo round's steps (its overlap of a
                         fragment's sync with the next steps is not built)

How an arm's settings are chosen, never tuned to a scenario: DiLoCo arms take the size's inner
steps; a time budget is the time the scenario's median site takes for those steps (this machine's
step time, wantrain.models.step_seconds, times the median speed factor); every
arm is read on the same wall-clock grid (`cadence_s`, wantrain.telemetry.compare): the global model's
loss every cadence_s from round 0's start, so an arm of many short rounds is not looked at more
often than one of few long rounds.

    python bench/time_to_target.py [--quick] [--seeds 3] [--arms overlap,time-budget] [--scenario S]

`--quick` (CI runs it, tests/test_time_to_target.py) is one seed of short runs; the default is
three seeds of the `make demo` scenario.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import save_to

from wantrain.telemetry.compare import Outcome, time_to_target
from wantrain.config import RunConfig
from wantrain.models import step_seconds
from wantrain.launch.run import Run, describe_scenario

ARMS: dict[str, dict] = {
    "sync-dp": {"codec.mode": "fp32", "train.outer_lr": 1.0, "train.outer_momentum": 0.0},
    "diloco-fp32": {"codec.mode": "fp32"},
    "diloco-int8": {"codec.mode": "int8"},
    "diloco-int8-huffman": {},
    "time-budget": {"budget": True},
    "overlap": {"budget": True, "schedule.mode": "overlap"},
    "controller": {"budget": True, "schedule.controller": "adaptive"},
    "min-quorum": {"schedule.quorum_share": 0.67},
    "async": {"schedule.quorum_share": 0.01, "schedule.grace_factor": 0.0, "recovery.late_policy": "stale",
              "rounds_per_site": True},
    "streaming": {"train.fragments": 4},
}
EXTRA_ARMS: dict[str, dict] = {     # not in the default set: for looking closer (--arms)
    "overlap-steps": {"schedule.mode": "overlap"},
    # the controller's budgets and codec under the overlap schedule (the schedule as a lever, measured)
    "controller-overlap": {"budget": True, "schedule.controller": "adaptive", "schedule.mode": "overlap"},
    "trusted": {"robust.trust": "trusted"},    # diloco-int8-huffman without comparing deltas (issue 26's cost)
    # codecs below 8 bits (docs/codecs.md, bench/codec_leaderboard.py): top-k deltas of 1/64 each block,
    # the update as top-k too, or in 4 or 8 bits
    "diloco-topk": {"codec.mode": "topk", "codec.topk_value_bits": 1},
    "diloco-topk-int4-down": {"codec.mode": "topk", "codec.topk_value_bits": 1, "codec.update_mode": "int4-huffman"},
    "diloco-topk-int8-down": {"codec.mode": "topk", "codec.topk_value_bits": 1, "codec.update_mode": "int8-huffman"},
    "diloco-ternary": {"codec.mode": "ternary-huffman"},
    "diloco-ternary-no-ef": {"codec.mode": "ternary-huffman", "codec.error_feedback": False},
    "diloco-ternary-t1-no-ef": {"codec.mode": "ternary-huffman", "codec.ternary_threshold": 1.0,
                                "codec.error_feedback": False},
    "diloco-int4": {"codec.mode": "int4-huffman"},
}

# quick: short runs that still separate the arms; full: the `make demo` run.
SIZES = {
    "quick": dict(rounds=3, inner_steps=8, target=3.3, cap_s=20.0, seeds=1, cadence_s=0.5),
    "full": dict(rounds=12, inner_steps=25, target=2.6, cap_s=150.0, seeds=3, cadence_s=2.0),
}
MARKS = ("budget", "rounds_per_site")     # an arm's settings that are not config fields


def budget_s(size: dict, speed_factors: list[float], step: float) -> float:
    """A time-budgeted arm's compute budget: the time the scenario's median site takes for the
    fixed-step arms' inner steps."""
    return round(size["inner_steps"] * step * statistics.median(speed_factors), 2)


def set_budget(size: dict, plan) -> float:
    """Put a time-budgeted arm's budget for the scenario `plan` into `size`; this machine's step time."""
    base = RunConfig()
    step = step_seconds(base.model.preset, base.train.batch_size, base.model.block_size)
    size["budget_s"] = budget_s(size, [s.speed_factor for s in plan.sites], step)
    return step


def arm_config(arm: str, size: dict, seed: int, sites: list[str]) -> RunConfig:
    """`size` holds what the harness chose for this scenario: its budget_s too, where an arm needs it."""
    spec = {**ARMS, **EXTRA_ARMS}[arm]
    changes = {k: v for k, v in spec.items() if k not in MARKS}
    steps = size["inner_steps"]
    if arm == "sync-dp":
        changes.update({"train.rounds": size["rounds"] * steps, "train.inner_steps": 1})
    elif (fragments := spec.get("train.fragments", 1)) > 1:     # each fragment synced every `steps` steps
        changes.update({"train.rounds": size["rounds"] * fragments,
                        "train.inner_steps": max(1, round(steps / fragments))})
    elif spec.get("rounds_per_site"):
        changes.update({"train.rounds": size["rounds"] * len(sites), "train.inner_steps": steps})
    else:
        changes.update({"train.rounds": size["rounds"], "train.inner_steps": steps})
    if spec.get("budget"):
        changes["train.round_budget_s"] = size["budget_s"]
    return RunConfig().replace(num_sites=len(sites), sites=sites, **{"train.seed": seed, "model.seed": seed,
                                                                     "schedule.quorum_wait_s": 60.0, **changes})


STARTUP_S = 600.0    # processes, the first model download (over a lossy link: minutes) and round 0's start


def run_arm(arm: str, size: dict, seed: int, scenario: str, folder: Path) -> tuple[Outcome | None, float]:
    """One arm's run, stopped at the target or `cap_s` after round 0 started. Start-up is not
    measured and not capped by `cap_s` (a busy machine, or a slow lossy link's first model
    download, stretches it): the run gives up STARTUP_S after its start if round 0 has not
    started; (outcome, None if no round committed; wall seconds)."""
    t0 = time.time()
    events = run_events(arm, size, seed, scenario, folder)
    return time_to_target(events, size["target"], size["cadence_s"]), time.time() - t0


def run_events(arm: str, size: dict, seed: int, scenario: str, folder: Path, name: str = "") -> list[dict]:
    """`run_arm`'s run in the folder `name` (default: arm-seed) under `folder`: its events, the
    links' rows included (bench/peers.py reads their bytes)."""
    sites = describe_scenario(scenario).names
    cfg = arm_config(arm, size, seed, sites)
    t0 = time.time()
    started = None
    with Run(cfg, run_dir=folder / (name or f"{arm}-{seed}"), site_threads=1, scenario=scenario) as run:
        try:
            for ev in run.follow(timeout_s=STARTUP_S + size["cap_s"] + 60):   # link events come every 0.5 s
                if started is None and time.time() - t0 > STARTUP_S:
                    break
                if ev["kind"] == "round_end" and ev["val_loss"] <= size["target"]:
                    break
                if ev["kind"] == "round_start" and ev["round"] == 0:
                    started = time.time()
                if started is not None and time.time() - started > size["cap_s"]:
                    break
        finally:
            events = list(run.events)
    return events


def summary(outcomes: list[Outcome]) -> dict:
    reached = [o for o in outcomes if o.reached]
    # a site that reported no round in a seed (dark to the target) computed nothing that counted: 0 there
    sites = sorted({s for o in outcomes for s in o.utilization})
    util = {s: statistics.mean(o.utilization.get(s, 0.0) for o in outcomes) for s in sites}
    return {
        "reached": f"{len(reached)}/{len(outcomes)}",
        "time_s": statistics.median(o.time_s for o in reached) if reached else None,
        "time_s_all": [round(o.time_s, 2) for o in outcomes],
        "rounds": [o.round + 1 for o in outcomes],
        "val_loss": [round(o.val_loss, 4) for o in outcomes],
        "mb": statistics.median(o.mb for o in outcomes),
        "uplink_mb": statistics.median(o.uplink_mb for o in outcomes),
        "steps": statistics.median(o.steps for o in outcomes),
        "tokens": statistics.median(o.tokens for o in outcomes),
        "compute_s": statistics.median(o.compute_s for o in outcomes),
        "time_s_range": [min(o.time_s for o in reached), max(o.time_s for o in reached)] if reached else None,
        "utilization": util,
        "curves": [o.curve for o in outcomes],
    }


def table(results: dict, target: float, slowest: str) -> str:
    lines = [f"time to validation loss <= {target} (median over the seeds that reached it)",
             f"{'arm':<20} {'reached':>7} {'time s':>8} {'range s':>11} {'rounds':>10} {'MB':>8} {'steps':>6} "
             f"{'Mtokens':>7} {'compute s':>9} {'min util':>8} {'util ' + slowest:>{6 + len(slowest)}}"]
    for arm, r in results.items():
        t = f"{r['time_s']:.1f}" if r["time_s"] is not None else "-"
        spread = "{:.1f}-{:.1f}".format(*r["time_s_range"]) if r.get("time_s_range") else "-"
        util = r["utilization"]
        lines.append(f"{arm:<20} {r['reached']:>7} {t:>8} {spread:>11} {','.join(map(str, r['rounds'])):>10} "
                     f"{r['mb']:>8.2f} {r['steps']:>6.0f} {r['tokens'] / 1e6:>7.2f} {r['compute_s']:>9.1f} "
                     f"{min(util.values()):>8.1%} {util.get(slowest, 0.0):>{6 + len(slowest)}.1%}")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="one seed of short runs (what CI runs)")
    p.add_argument("--seeds", type=int, help="seeds per arm (quick: 1, full: 3)")
    p.add_argument("--arms", default=",".join(ARMS),
                   help=f"comma-separated, of {', '.join(ARMS)} (and {', '.join(EXTRA_ARMS)})")
    p.add_argument("--target", type=float, help="target validation loss")
    p.add_argument("--scenario", default="three-sites")
    p.add_argument("--out", default="time_to_target",
                   help="result name under bench/results, or a path ending in .json")
    args = p.parse_args()
    size = dict(SIZES["quick" if args.quick else "full"])
    if args.target is not None:
        size["target"] = args.target
    arms = args.arms.split(",")
    unknown = set(arms) - set(ARMS) - set(EXTRA_ARMS)
    if unknown:
        p.error(f"unknown arms {sorted(unknown)}; choose from {', '.join(ARMS)}")
    seeds = range(args.seeds or size["seeds"])
    plan = describe_scenario(args.scenario)
    slowest = plan.names[-1]     # the scenario lists its slowest link last
    step = set_budget(size, plan)
    print(f"{args.scenario}: an inner step takes {step * 1e3:.0f} ms here; time budget {size['budget_s']:.2f} s "
          f"({size['inner_steps']} steps of the median site); loss read every {size['cadence_s']} s", flush=True)
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="wantrain-ttt-") as tmp:
        for arm in arms:
            outcomes = []
            for seed in seeds:
                outcome, wall = run_arm(arm, size, seed, args.scenario, Path(tmp))
                if outcome is None:
                    raise SystemExit(f"{arm}, seed {seed}: no round committed within {wall:.0f} s")
                outcomes.append(outcome)
                print(f"{arm} seed {seed}: {'reached' if outcome.reached else 'did not reach'} {size['target']} "
                      f"at round {outcome.round} after {outcome.time_s:.1f} s (val loss {outcome.val_loss:.4f}), "
                      f"{outcome.mb:.2f} MB, utilization " + ", ".join(f"{s} {u:.1%}" for s, u in
                                                                       outcome.utilization.items()), flush=True)
            results[arm] = summary(outcomes)
    print()
    print(table(results, size["target"], slowest))
    result = {"size": "quick" if args.quick else "full", "scenario": args.scenario, "slowest_site": slowest,
              "target": size["target"], "seeds": len(seeds), "step_s": step, "budget_s": size["budget_s"],
              "cadence_s": size["cadence_s"], "arms": results}
    save_to(args.out, result)


if __name__ == "__main__":
    main()
