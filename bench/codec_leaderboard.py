"""Codecs on one leaderboard of bits against loss: DiLoCo trained with each, every byte counted.

Each run is wantrain's own code in this process (wantrain.studies.compression.codec_run: three sites' inner
loops on their shards, the codec both ways with error feedback, the PS's outer Nesterov step), the
same seeds, shards and steps for every codec. Per codec and seed it reports the bits per parameter
per round each way as gRPC messages (payload, scales, every header and table, the chunk's framing),
the final validation loss (the mean of the last three evaluations) and its gap to fp32 DiLoCo of
the same seed, and the codec's encode and decode MB/s of float32 input on one core, measured on a
real delta beside zstd level 1 on the same bytes. For the codecs that send some elements and not
others: the least "sent or not" could cost a parameter, its order-0 entropy and its entropy given
the same site's mask of the round before (both ends hold it: what context coding could reach).

    python bench/codec_leaderboard.py [--quick] [--presets tiny,small] [--seeds 3] [--rounds R]
                                      [--codecs fp32,int8-huffman,topk-1b] [--jobs 2] [--out NAME]

The rows go to bench/results/NAME.json (`--out`, or a path ending in .json); beside it, the run
folder NAME/ holds table.md and pareto.html (bits against the loss gap, plotly's script beside it).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import save_to, single_core

TOPK = {"codec.mode": "topk", "codec.topk_density": 1 / 64}
CODECS: dict[str, dict] = {       # config overrides; "fp32" is the reference every gap is taken to
    "fp32": {"codec.mode": "fp32"},
    "int8-huffman": {"codec.mode": "int8-huffman"},                  # the paper's point
    "int4-huffman": {"codec.mode": "int4-huffman"},
    "int4-clip4": {"codec.mode": "int4-huffman", "codec.int4_clip": 4.0},   # a statistical scale
    "ternary-huffman": {"codec.mode": "ternary-huffman"},
    "ternary-no-ef": {"codec.mode": "ternary-huffman", "codec.error_feedback": False},
    "ternary-t1-no-ef": {"codec.mode": "ternary-huffman", "codec.ternary_threshold": 1.0,
                         "codec.error_feedback": False},      # fewer kept: fewer bits
    "sign": {"codec.mode": "sign"},
    "topk-1b": {**TOPK, "codec.topk_value_bits": 1},
    "topk-2b": {**TOPK, "codec.topk_value_bits": 2},
    "topk-3%-1b": {**TOPK, "codec.topk_density": 1 / 32, "codec.topk_value_bits": 1},
    # SparseLoCo's variant: the error-feedback buffer in place of the outer momentum
    "topk-2b-no-momentum": {**TOPK, "codec.topk_value_bits": 2, "train.outer_momentum": 0.0},
    # top-k deltas, a denser update (the sum of three sites' top-k is not sparse at their density)
    "topk-1b-int4-down": {**TOPK, "codec.topk_value_bits": 1, "codec.update_mode": "int4-huffman"},
    "topk-1b-int8-down": {**TOPK, "codec.topk_value_bits": 1, "codec.update_mode": "int8-huffman"},
}
SIZES = {
    "quick": dict(presets=("tiny",), seeds=1, steps={"tiny": (3, 5)}, block_size=64, sites=3,
                  codecs=("fp32", "int8-huffman", "topk-1b")),
    # (rounds, inner steps) per preset: small's steps cost about ten of tiny's on a CPU core
    "full": dict(presets=("tiny", "small"), seeds=3, steps={"tiny": (12, 20), "small": (8, 10)}, block_size=128,
                 sites=3, codecs=tuple(CODECS)),
}
LAST = 3                # evaluations averaged for the final loss


def overrides(spec: str) -> dict:
    """A codec's config overrides. A spec is a name of CODECS, optionally with changed settings after
    "@": "topk-1b@train.outer_lr=1.0@train.outer_momentum=0.5" (values read as JSON where they parse)."""
    from wantrain.config import settings_from_text

    name, *changes = spec.split("@")
    return {**CODECS[name], **settings_from_text(changes, f"{spec!r}: ")}


def one_run(codec: str, preset: str, seed: int, size: dict) -> dict:
    single_core()
    from wantrain.studies.compression import codec_run
    from wantrain.config import RunConfig

    cfg = RunConfig().replace(num_sites=size["sites"], **{
        "model.preset": preset, "model.block_size": size["block_size"], "train.rounds": size["steps"][preset][0],
        "train.inner_steps": size["steps"][preset][1], **overrides(codec)})
    t0 = time.perf_counter()
    x = codec_run(cfg, seed)
    return {"codec": codec, "preset": preset, "seed": seed, "params": x["params"], "val": x["val"],
            "final_val_loss": float(np.mean(x["val"][-LAST:])), "bits_per_param": float(np.mean(x["up_bits"])),
            "downlink_bits_per_param": float(np.mean(x["down_bits"])), "mask_bits": x["mask_bits"],
            "seconds": time.perf_counter() - t0}


def speeds(codecs: list[str], preset: str, steps: int) -> dict[str, dict]:
    """Per codec, encode and decode MB/s on one core, on one real delta of `preset`; and zstd level
    1 on that delta's float32 bytes ("zstd-1")."""
    single_core()
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})         # one core: the pools size by it
    import zstandard

    from wantrain.studies.compression import best_of, codec_speed, real_delta
    from wantrain.config import RunConfig

    delta = real_delta(preset, steps=steps, threads=1)["delta"]
    out = {}
    for codec in codecs:
        fields = {k.split(".", 1)[1]: v for k, v in overrides(codec).items() if k.startswith("codec.")}
        out[codec] = codec_speed(delta, dataclasses.replace(RunConfig().codec, **fields))
    raw = b"".join(v.astype("<f4").tobytes() for v in delta.values())
    packed = zstandard.ZstdCompressor(level=1).compress(raw)
    out["zstd-1"] = {"encode_mb_s": len(raw) / 1e6 / best_of(lambda: zstandard.ZstdCompressor(level=1).compress(raw), 3),
                     "decode_mb_s": len(raw) / 1e6 / best_of(lambda: zstandard.ZstdDecompressor().decompress(packed), 3),
                     "bits_per_param": 8 * len(packed) / (len(raw) / 4)}
    return out


def with_gaps(rows: list[dict]) -> list[dict]:
    """Each row's loss gap to fp32 DiLoCo of its preset and seed, in %."""
    base = {(r["preset"], r["seed"]): r["final_val_loss"] for r in rows if r["codec"] == "fp32"}
    for r in rows:
        ref = base.get((r["preset"], r["seed"]))
        r["loss_gap_pct"] = 100 * (r["final_val_loss"] / ref - 1) if ref else None
    return rows


def summary(rows: list[dict]) -> list[dict]:
    """Per preset and codec: means over seeds (and the gap's sample standard deviation)."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["preset"], r["codec"]), []).append(r)
    out = []
    for (preset, codec), rs in groups.items():
        gaps = [r["loss_gap_pct"] for r in rs if r["loss_gap_pct"] is not None]
        out.append({"preset": preset, "codec": codec, "seeds": len(rs),
                    "bits_per_param": statistics.mean(r["bits_per_param"] for r in rs),
                    "downlink_bits_per_param": statistics.mean(r["downlink_bits_per_param"] for r in rs),
                    "final": statistics.mean(r["final_val_loss"] for r in rs),
                    "gap": statistics.mean(gaps) if gaps else None,
                    "gap_sd": statistics.stdev(gaps) if len(gaps) > 1 else 0.0,
                    "encode_mb_s": rs[0]["encode_mb_s"], "decode_mb_s": rs[0]["decode_mb_s"],
                    "mask_order0": statistics.mean(r["mask_bits"]["order0"] for r in rs),
                    "mask_given_last": statistics.mean(r["mask_bits"]["given_last"] for r in rs)})
    return out


def table(rows: list[dict], speed: dict[str, dict]) -> str:
    lines = ["| preset | codec | seeds | up bits/param | down bits/param | x fewer than fp32 | final loss "
             "| gap to fp32 | encode MB/s | decode MB/s | which-sent floor: alone / given last mask |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for e in summary(rows):
        gap = "-" if e["gap"] is None else f"{e['gap']:+.2f} %" + (f" ±{e['gap_sd']:.2f}" if e["gap_sd"] else "")
        lines.append(f"| {e['preset']} | {e['codec']} | {e['seeds']} | {e['bits_per_param']:.3f} "
                     f"| {e['downlink_bits_per_param']:.3f} | {32 / e['bits_per_param']:.1f} | {e['final']:.4f} "
                     f"| {gap} | {e['encode_mb_s']:.0f} | {e['decode_mb_s']:.0f} "
                     + (f"| {e['mask_order0']:.3f} / {e['mask_given_last']:.3f} |"
                        if overrides(e["codec"]).get("codec.mode") == "topk" else "| - |"))
    if "zstd-1" in speed:
        z = speed["zstd-1"]
        lines.append(f"| (same delta) | zstd level 1 on fp32 | - | {z['bits_per_param']:.3f} | - "
                     f"| {32 / z['bits_per_param']:.1f} | - | - | {z['encode_mb_s']:.0f} | {z['decode_mb_s']:.0f} | - |")
    return "\n".join(lines)


def pareto(rows: list[dict]):
    """Bits per parameter (up, log scale) against the loss gap to fp32, one marker per preset and codec."""
    import plotly.graph_objects as go

    fig = go.Figure()
    entries = [e for e in summary(rows) if e["gap"] is not None]
    for preset in dict.fromkeys(e["preset"] for e in entries):
        mine = [e for e in entries if e["preset"] == preset]
        fig.add_trace(go.Scatter(x=[e["bits_per_param"] for e in mine], y=[e["gap"] for e in mine],
                                 error_y={"type": "data", "array": [e["gap_sd"] for e in mine]},
                                 mode="markers+text", text=[e["codec"] for e in mine], textposition="top center",
                                 name=preset))
    fig.update_xaxes(type="log", title_text="uplink bits per parameter per round (every byte counted)")
    fig.update_yaxes(title_text="final validation loss gap to fp32 DiLoCo (%)")
    fig.update_layout(title="Codecs: bits against loss (lower left is better)", height=600)
    return fig


def main() -> None:
    from wantrain.config import RunConfig

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny, one seed, three short rounds, three codecs (tests)")
    p.add_argument("--presets", help="comma-separated model presets (full: tiny,small)")
    p.add_argument("--seeds", type=int, help="seeds per codec (quick: 1, full: 3)")
    p.add_argument("--rounds", type=int, help="rounds per run, every preset (full: tiny 12, small 8)")
    p.add_argument("--inner-steps", type=int, help="inner steps per round, every preset (full: tiny 20, small 10)")
    p.add_argument("--codecs", help=f"comma-separated, of {', '.join(CODECS)} (full: all; fp32 is always run); "
                   "NAME@KEY=VALUE runs NAME with a setting changed (topk-1b@train.outer_lr=1.0)".replace("%", "%%"))
    p.add_argument("--jobs", type=int, default=2, help="runs at a time, one core each")
    p.add_argument("--out", default="codec_leaderboard", help="result name under bench/results, or a path ending in .json")
    args = p.parse_args()
    size = dict(SIZES["quick" if args.quick else "full"])
    size["seeds"] = args.seeds or size["seeds"]
    presets = args.presets.split(",") if args.presets else list(size["presets"])
    size["steps"] = {pr: (args.rounds or size["steps"].get(pr, (12, 20))[0],
                          args.inner_steps or size["steps"].get(pr, (12, 20))[1]) for pr in presets}
    codecs = args.codecs.split(",") if args.codecs else list(size["codecs"])
    if unknown := {c.split("@")[0] for c in codecs} - set(CODECS):
        p.error(f"unknown codecs {sorted(unknown)}; choose from {', '.join(CODECS)}")
    try:
        for c in codecs:
            RunConfig().replace(**overrides(c))
    except ValueError as e:          # wantrain.errors.ConfigError names the field
        p.error(str(e))
    codecs = ["fp32", *[c for c in codecs if c != "fp32"]]
    runs = [(c, pr, s) for pr in presets for s in range(size["seeds"]) for c in codecs]
    t0 = time.time()
    rows: list[dict] = []
    with ProcessPoolExecutor(args.jobs) as pool:
        # speeds first, alone: a run on the other core would share the memory bus with them
        speed = {pr: pool.submit(speeds, codecs, pr, size["steps"][pr][1]).result() for pr in presets}
        futures = [pool.submit(one_run, c, pr, s, size) for c, pr, s in runs]
        for i, fut in enumerate(futures):
            r = fut.result()
            rows.append(r)
            print(f"[{i + 1}/{len(runs)} {time.time() - t0:.0f} s] {r['preset']}, {r['codec']}, seed {r['seed']}: "
                  f"{r['bits_per_param']:.3f} bits per parameter up, {r['downlink_bits_per_param']:.3f} down, "
                  f"final loss {r['final_val_loss']:.4f} ({r['seconds']:.0f} s)", flush=True)
    for r in rows:
        r.update({k: speed[r["preset"]][r["codec"]][k] for k in ("encode_mb_s", "decode_mb_s")})
    with_gaps(rows)
    path = save_to(args.out, {"size": "quick" if args.quick else "full", "presets": presets, "codecs": codecs,
                              "steps": size["steps"], "sites": size["sites"],
                              "configs": {c: overrides(c) for c in codecs}, "speeds": speed, "rows": rows})
    folder = path.with_suffix("")
    folder.mkdir(parents=True, exist_ok=True)
    text = table(rows, speed[presets[0]])
    header = (f"{size['sites']} sites; " + ", ".join(f"{pr}: {r} rounds of {h} inner steps"
                                                     for pr, (r, h) in size["steps"].items())
              + f"; {size['seeds']} seed(s); speeds on one core, on a real delta of {presets[0]}")
    (folder / "table.md").write_text(f"{header}\n\n{text}\n")
    pareto(rows).write_html(folder / "pareto.html", include_plotlyjs="directory")
    print(f"\n{header}\n\n{text}\n\nresults: {path}; table and plot: {folder}/")


if __name__ == "__main__":
    main()
