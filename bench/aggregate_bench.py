"""Aggregation benchmark: the PS round's compute (average 3 int8 deltas, Nesterov outer step,
downlink error feedback, int8+Huffman encode of the update, apply) for a real preset's tensors.

Side by side in one run, from the same state and deltas: `wantrain.outer.aggregate.aggregate_round`
(compiled element loops) and the numpy step it replaced (bench/baseline_aggregate.py), both on
the process's CPU pool. The two must give the same parameters and the same update bytes; the
bench checks that before it reports times.

    python bench/aggregate_bench.py [--preset gpt2] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import baseline_aggregate
from common import save

from wantrain.outer.aggregate import Contribution, aggregate_round
from wantrain.codec import Codec, ErrorFeedback, plan_chunks
from wantrain.config import RunConfig
from wantrain.runtime.cpu_pool import cores
from wantrain.models import build_model
from wantrain.outer.nesterov import OuterNesterov
from wantrain.models.params import named_params
from wantrain.outer.screening import gram


def deltas(shapes: dict[str, int], codec: Codec, plan, seed: int) -> list:
    """One site's delta as the PS keeps it: int8 chunks (generated a chunk at a time)."""
    rng = np.random.default_rng(seed)
    return [codec.compress((rng.standard_normal(s.length) * 1e-3).astype(np.float32))[1] for s in plan]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="gpt2")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    cfg = RunConfig().replace(**{"model.preset": a.preset})
    model = build_model(a.preset, 50257, 0, "meta")
    shapes = {k: p.numel() for k, p in named_params(model).items()}
    n = sum(shapes.values())
    codec = Codec(cfg.codec)
    plan = plan_chunks(shapes, cfg.codec.chunk_elements())
    print(f"{a.preset}: {n / 1e6:.1f} M parameters, {len(plan)} chunks, {cores()} cores; generating 3 deltas",
          flush=True)
    sites = {name: deltas(shapes, codec, plan, i) for i, name in enumerate(("a", "b", "c"))}
    contributions = {k: Contribution(v, w) for (k, v), w in zip(sites.items(), (700.0, 2000.0, 1300.0))}
    rng = np.random.default_rng(9)
    start = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}

    params = {k: v.copy() for k, v in start.items()}
    outer, feedback = OuterNesterov(cfg.train.outer_lr, cfg.train.outer_momentum), ErrorFeedback()
    base_params = {k: v.copy() for k, v in start.items()}
    base_buf = {k: np.zeros(s, np.float32) for k, s in shapes.items()}
    base_res = {k: np.zeros(s, np.float32) for k, s in shapes.items()}
    times: dict[str, list[float]] = {"compiled": [], "numpy": []}
    for r in range(a.rounds):
        t0 = time.perf_counter()
        msgs, _ = aggregate_round(r, plan, shapes, params, contributions, outer, feedback, codec)
        times["compiled"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        base = baseline_aggregate.aggregate_round(r, plan, shapes, base_params, contributions, base_buf, base_res,
                                                  cfg.train.outer_lr, cfg.train.outer_momentum, cfg.codec)
        times["numpy"].append(time.perf_counter() - t0)
        same = all(m.data == b.data for m, b in zip(msgs, base)) and all(
            params[k].tobytes() == base_params[k].tobytes() for k in shapes)
        if not same:
            sys.exit(f"round {r}: the compiled step and the numpy step differ")
        print(f"round {r}: compiled {times['compiled'][-1]:.2f} s, numpy {times['numpy'][-1]:.2f} s "
              f"(same parameters and update bytes)", flush=True)
    times["screen"] = []            # what the default screen adds before the commit: every pair's dot product
    for _ in range(a.rounds):
        t0 = time.perf_counter()
        gram(list(sites.values()), [1.0] * len(sites))      # the norms are known: only the pairs
        times["screen"].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"aggregate + outer step + encode + apply, {a.preset}, 3 sites: compiled {med['compiled']:.2f} s, "
          f"numpy {med['numpy']:.2f} s; ratio {med['numpy'] / med['compiled']:.2f}x")
    print(f"the screen's angles between the 3 deltas (robust.trust untrusted): {med['screen']:.2f} s, "
          f"{med['screen'] / med['compiled']:.0%} of the compiled aggregate")
    save("aggregate", {"preset": a.preset, "params": n, "cores": cores(), "seconds": times, "median_s": med,
                       "speedup": med["numpy"] / med["compiled"], "screen_share": med["screen"] / med["compiled"]})


if __name__ == "__main__":
    main()
