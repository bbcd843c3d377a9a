"""Where to put the parameter server: what each site's round costs, and the round time the sites
would see with the PS in each region (wantrain.launch.round_model), fastest first.

What a round costs comes from a recorded run (`costs_from_run`: its measured compute, codec and
PS times and its bytes, medians over the rounds after the first), or from an inner step of the
model timed on this machine, each site's speed factor and the codec's typical size
(`costs_from_step`). `wantrain place`, `wantrain whatif` and the panel read the same figures.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from ..errors import DataError
from .round_model import Prediction, SiteCost, predict_round

__all__ = ["TYPICAL_BITS", "costs_from_run", "costs_from_step", "predict_plan", "rank"]

# Bits per parameter each codec typically puts on the wire, every byte counted (docs/codecs.md's
# leaderboard on tiny, 2026-12-06: manifests, copies and parity included; int8 not run there: its
# 8.01 with int8 + Huffman's 0.09 of protection).
TYPICAL_BITS = {"fp32": 32.3, "int8": 8.1, "int8-huffman": 7.23, "int4-huffman": 3.04, "ternary-huffman": 1.76,
                "sign": 1.09, "topk": 0.21}


def costs_from_run(run_dir: Path) -> dict:
    """What each site's round cost in a recorded run: per site `compute_s`, `encode_s`, `apply_s`
    (medians over its rounds after the first), and `up_bytes`, `down_bytes`, `ps_s`, `lanes`."""
    from ..telemetry.round_time import round_splits
    from ..telemetry import on_wire, read_events, rows

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
            "up_bytes": statistics.median(on_wire(e) for e in rows(events, "site_round")),
            "down_bytes": statistics.median(on_wire(e) for e in rows(events, "round_end")),
            "lanes": config.get("recovery", config["train"])["lanes"] > 0}   # (before the split: in train)


def predict_plan(plan, costs: dict, compute_scale: float = 1.0, bytes_scale: float = 1.0) -> Prediction:
    """round_model's prediction for the sites of `plan` (a RunPlan: their RTTs to its PS region and
    their bandwidths) at `costs` (`costs_from_run`'s form), computing `compute_scale` times as long
    and sending `bytes_scale` times the bytes."""

    sites = [SiteCost(s.name, costs["sites"][s.name]["compute"] * compute_scale, s.rtt_ms / 1e3, s.bandwidth_mbps,
                      costs["sites"][s.name]["encode"], costs["sites"][s.name]["apply"]) for s in plan.sites]
    return predict_round(sites, costs["up_bytes"] * bytes_scale, costs["down_bytes"] * bytes_scale, costs["ps_s"],
                         costs["lanes"])


def costs_from_step(plan, cfg) -> tuple[dict, str]:
    """What each site of `plan` (a RunPlan) would spend a round of `cfg` (a RunConfig), from an inner
    step of its model timed here: under a time budget every site computes the budget, otherwise
    its inner steps at its speed factor; the codec's typical size each way. Also a sentence that
    says where the figures came from."""
    from ..models import build_model, count_parameters, step_seconds

    t, codec = cfg.train, cfg.codec.mode
    n = count_parameters(build_model(cfg.model.preset, 256, 0, "meta"))
    size = n * TYPICAL_BITS[codec] / 8
    encode_s, decode_s = codec_seconds(cfg.codec, n)
    if t.round_budget_s:
        compute = {s.name: t.round_budget_s for s in plan.sites}
        source = f"every site computing its {t.round_budget_s:g} s budget"
    else:
        step_s = step_seconds(cfg.model.preset, t.batch_size, cfg.model.block_size)
        compute = {s.name: t.inner_steps * step_s * s.speed_factor for s in plan.sites}
        source = (f"{t.inner_steps} inner steps of {cfg.model.preset} at {step_s * 1e3:.0f} ms a step here, times "
                  f"each site's speed factor")
    # A site encodes its delta and decodes the update; the PS, once the last delta is in, decodes
    # it and encodes the update (aggregation itself is a small part beside them).
    costs = {"sites": {name: {"compute": c, "encode": encode_s, "apply": decode_s} for name, c in compute.items()},
             "ps_s": encode_s + decode_s, "up_bytes": size, "down_bytes": size, "lanes": cfg.recovery.lanes > 0}
    return costs, (f"{source}; {size / 1e6:.2f} MB each way ({codec}, typical), encoded in {encode_s:.2f} s and "
                   f"decoded in {decode_s:.2f} s on one core here")


def codec_seconds(codec_cfg, num_params: int) -> tuple[float, float]:
    """Seconds to encode, and to decode, a delta of `num_params` values with `codec_cfg` on one core
    here (one pass each over a normal sample, up to 16 M values, scaled to the whole)."""
    import time

    import numpy as np

    from ..codec import Codec, encode_arrays, load_kernels

    n = min(num_params, 1 << 24)
    load_kernels([codec_cfg.mode])                 # numba's first call is not the codec's time
    x = {"delta": np.random.default_rng(0).standard_normal(n, dtype=np.float32) * 1e-3}
    codec = Codec(codec_cfg)
    t0 = time.perf_counter()
    chunks, _ = encode_arrays(x, codec, None)
    t1 = time.perf_counter()
    Codec.decode_many([e for _, e in chunks])
    t2 = time.perf_counter()
    return (t1 - t0) * num_params / n, (t2 - t1) * num_params / n


def rank(plans: dict, costs: dict) -> list[tuple[str, Prediction]]:
    """(region, prediction) for each of `plans` (region -> RunPlan with its PS there), fastest first."""
    return sorted(((region, predict_plan(plan, costs)) for region, plan in plans.items()), key=lambda rp: rp[1].round_s)
