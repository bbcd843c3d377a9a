"""`wantrain place`: where to put the parameter server, before paying for the GPUs.

For every region the testbed knows (its published RTT table), the round time the scenario's sites
would see with the PS there (wantrain.round_model), fastest first, with what sets each. What each
site's round costs comes from a recorded run of the scenario (`--from-run`: its measured compute,
codec and PS times and its bytes, medians over the rounds after the first), or else from an
inner step of the model timed on this machine, the scenario's speed factors and the codec's
typical size (bench/codec_leaderboard.py's figures).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from ..errors import ConfigError, DataError
from ..round_model import Prediction, SiteCost, predict_round

__all__ = ["add_parser", "run", "costs_from_run", "predict_plan", "TYPICAL_BITS"]

# Bits per parameter each codec typically puts on the wire, every byte counted (docs/codecs.md).
TYPICAL_BITS = {"fp32": 32.0, "int8": 8.01, "int8-huffman": 7.3, "int4-huffman": 2.9, "ternary-huffman": 1.6,
                "sign": 1.03, "topk": 0.19}


def costs_from_run(run_dir: Path) -> dict:
    """What each site's round cost in a recorded run: per site `compute_s`, `encode_s`, `apply_s`
    (medians over its rounds after the first), and `up_bytes`, `down_bytes`, `ps_s`, `lanes`."""
    from ..round_time import round_splits
    from ..telemetry import read_events, rows

    events = read_events(run_dir)
    splits = [s for s in round_splits(events) if s["round"] > 0] or round_splits(events)
    if not splits:
        raise DataError(f"{run_dir}: no round of this run can be split into its parts (a run from before "
                        f"wantrain recorded them, or none committed)")
    sites = {}
    for name in dict.fromkeys(s["site"] for s in splits):
        mine = [s for s in splits if s["site"] == name]
        sites[name] = {k: statistics.median(s[f"{k}_s"] for s in mine) for k in ("compute", "encode", "apply")}
    config = rows(events, "run_start")[0]["config"]
    return {"sites": sites, "ps_s": statistics.median(s["ps_s"] for s in splits),
            "up_bytes": statistics.median(e["wire_bytes"] for e in rows(events, "site_round")),
            "down_bytes": statistics.median(e["wire_bytes"] for e in rows(events, "round_end")),
            "lanes": config["train"]["lanes"] > 0}


def predict_plan(plan, costs: dict, compute_scale: float = 1.0, bytes_scale: float = 1.0) -> Prediction:
    """round_model's prediction for the sites of `plan` (a RunPlan: their RTTs to its PS region and
    their bandwidths) at `costs` (`costs_from_run`'s form), computing `compute_scale` times as long
    and sending `bytes_scale` times the bytes."""

    sites = [SiteCost(s.name, costs["sites"][s.name]["compute"] * compute_scale, s.rtt_ms / 1e3, s.bandwidth_mbps,
                      costs["sites"][s.name]["encode"], costs["sites"][s.name]["apply"]) for s in plan.sites]
    return predict_round(sites, costs["up_bytes"] * bytes_scale, costs["down_bytes"] * bytes_scale, costs["ps_s"],
                         costs["lanes"])


def _measured_step(preset: str, batch: int, block: int) -> tuple[float, int]:
    """Seconds of one inner step (forward, backward, AdamW) of `preset` on one CPU thread here, and
    the model's parameters."""
    import torch

    from ..data import get_tokenizer
    from ..models import build_model, count_parameters

    torch.set_num_threads(1)
    model = build_model(preset, get_tokenizer("byte").vocab_size, 0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, 256, (batch, block))

    def step() -> None:
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    t0 = time.perf_counter()
    for _ in range(3):
        step()
    return (time.perf_counter() - t0) / 3, count_parameters(model)


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
        step_s, params = _measured_step(args.preset, cfg.train.batch_size, cfg.model.block_size)
        size = params * TYPICAL_BITS[args.codec] / 8
        c = {"sites": {s.name: {"compute": args.inner_steps * step_s * s.speed_factor, "encode": 0.0, "apply": 0.0}
                       for s in here.sites},
             "ps_s": 0.0, "up_bytes": size, "down_bytes": size, "lanes": cfg.train.lanes > 0}
        source = (f"{args.inner_steps} inner steps of {args.preset} at {step_s * 1e3:.0f} ms a step here, times each "
                  f"site's speed factor; {size / 1e6:.2f} MB each way ({args.codec}, typical)")
    ranking = sorted(((region, predict_plan(plan, c)) for region, plan in plans.items()),
                     key=lambda rp: rp[1].round_s)
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
