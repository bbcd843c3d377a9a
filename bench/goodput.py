"""Goodput under a scripted mix of site kills and 200 s outages, unscaled: how much of a clean run's
useful training a run keeps while its sites crash and go dark, and whether its loss stays stable.

Two runs of the same config and seed over the same wall time (three-sites, three real site
processes, the links emulated; DiLoCo with the time-to-target harness's inner steps and the
default recovery settings): `clean`, and `faults`, where this script, counting from round 0's
start, does what a bad day on a WAN does:

     30 s   ap-southeast's link goes dark for 200 s
     60 s   eu-west is killed (SIGKILL); 20 s later it is started again and rejoins
    250 s   us-west's link goes dark for 200 s
    300 s   ap-southeast is killed; 20 s later started again

Figures (wantrain.telemetry.compare.counted_tokens: tokens of deltas that reached the global model in
time, counted in their round or deferred to a later commit):

    goodput            counted tokens of `faults` over those of `clean`, in the same window
    of what was left   the same over the share of site-seconds the script left available (a dark
                       or dead site cannot contribute, whatever the system does): how well the
                       run used the sites it still had
    loss               both runs' last validation loss, and the worst after the first fault

Decoupled DiLoCo reports 88 % goodput under its failure model; the goal here is the same figure.

    python bench/goodput.py [--window 480] [--seed 0] [--keep DIR]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import save_to
from time_to_target import SIZES

from wantrain.config import RunConfig
from wantrain.launch.run import Run, describe_scenario
from wantrain.telemetry.compare import counted_tokens
from wantrain.telemetry import rows

SCENARIO = "three-sites"
# (seconds after round 0's start, action, site, argument): the faults run's script
SCRIPT = [(30.0, "outage", "ap-southeast", 200.0), (60.0, "kill", "eu-west", 20.0),
          (250.0, "outage", "us-west", 200.0), (300.0, "kill", "ap-southeast", 20.0)]


def unavailable_s(window_s: float) -> float:
    """Site-seconds within the window the script takes away (dark links, dead processes)."""
    return sum(max(0.0, min(at + seconds, window_s) - at) for at, _, _, seconds in SCRIPT if at < window_s)


def one_run(faults: bool, window_s: float, seed: int, folder: Path) -> list[dict]:
    sites = describe_scenario(SCENARIO).names
    size = SIZES["full"]
    cfg = RunConfig().replace(num_sites=len(sites), sites=sites, **{
        "train.seed": seed, "model.seed": seed, "train.inner_steps": size["inner_steps"],
        "train.rounds": 1000})    # the window ends the run, not its rounds; a missing site is waited for 5 s
    todo = sorted(SCRIPT) if faults else []
    restarts: list[tuple[float, str]] = []
    with Run(cfg, run_dir=folder / ("faults" if faults else "clean"), site_threads=1, scenario=SCENARIO) as run:
        started = None
        for ev in run.follow(timeout_s=window_s + 300):
            if ev["kind"] == "round_start" and ev["round"] == 0:
                started = time.time()
            if started is None:
                continue
            now = time.time() - started
            while todo and todo[0][0] <= now:
                _, action, site, seconds = todo.pop(0)
                print(f"  {now:6.1f} s: {action} {site}" + (f" for {seconds:.0f} s" if action == "outage" else ""),
                      flush=True)
                if action == "outage":
                    run.outage(site, seconds)
                else:
                    run.kill_site(site)
                    restarts.append((now + seconds, site))
            for due, site in [r for r in restarts if r[0] <= now]:
                print(f"  {now:6.1f} s: start {site} again", flush=True)
                run.start_site(site)
                restarts.remove((due, site))
            if now > window_s:
                break
        return list(run.events)


def summary(events: list[dict], window_s: float) -> dict:
    t0 = min(e["t"] for e in rows(events, "round_start"))
    ends = [e for e in rows(events, "round_end") if e["t"] - t0 <= window_s]
    first_fault = SCRIPT[0][0]
    return {"tokens": counted_tokens(events, window_s), "rounds": len(ends),
            "val_loss": ends[-1]["val_loss"],
            "worst_after_first_fault": max(e["val_loss"] for e in ends if e["t"] - t0 >= first_fault),
            "best_before_first_fault": min((e["val_loss"] for e in ends if e["t"] - t0 < first_fault), default=None),
            "curve": [(round(e["t"] - t0, 1), round(e["val_loss"], 4)) for e in ends]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--window", type=float, default=480.0, help="seconds of each run, from round 0's start")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="goodput", help="result name under bench/results, or a path ending in .json")
    ap.add_argument("--keep", type=Path, help="keep the two run folders here (clean/, faults/) to look at after")
    args = ap.parse_args()
    results = {}
    with tempfile.TemporaryDirectory(prefix="wantrain-goodput-") as tmp:
        for faults in (False, True):
            name = "faults" if faults else "clean"
            print(f"{name}: {args.window:.0f} s", flush=True)
            results[name] = summary(one_run(faults, args.window, args.seed, args.keep or Path(tmp)), args.window)
    clean, hurt = (sum(results[k]["tokens"].values()) for k in ("clean", "faults"))
    left = 1 - unavailable_s(args.window) / (3 * args.window)
    goodput = hurt / clean
    print(f"\ngoodput {goodput:.1%} ({hurt / 1e6:.2f} of {clean / 1e6:.2f} Mtokens counted); the script left "
          f"{left:.1%} of the site-seconds: {goodput / left:.1%} of what was left")
    for name, r in results.items():
        print(f"{name:>6}: {r['rounds']} rounds, last validation loss {r['val_loss']:.4f}, worst after "
              f"{SCRIPT[0][0]:.0f} s {r['worst_after_first_fault']:.4f}, per site Mtokens "
              + ", ".join(f"{s} {t / 1e6:.2f}" for s, t in sorted(r["tokens"].items())))
    save_to(args.out, {"window_s": args.window, "seed": args.seed, "script": SCRIPT, "goodput": goodput,
                       "available": left, "goodput_of_available": goodput / left, "runs": results})


if __name__ == "__main__":
    main()
