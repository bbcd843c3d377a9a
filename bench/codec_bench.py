"""Codec benchmark on real deltas: bits per parameter per stage, entropy bound, MB/s per core.

Trains a model for a few AdamW steps (a real DiLoCo pseudo-gradient), then codes its int8
symbols with our Huffman stage and, side by side on the same bytes, with zstd level 1; raw fp32
and bf16 are the baselines. Encode/decode speeds are single-threaded (per core), best of 5.

    python bench/codec_bench.py [--preset small] [--steps 30 100]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import save, single_core

single_core()

import numpy as np  # noqa: E402
import zstandard  # noqa: E402

from wantrain.config import CodecConfig  # noqa: E402
from wantrain.study import best_of, codec_stages, real_delta  # noqa: E402


def measure(flat: np.ndarray, cfg: CodecConfig) -> dict:
    """The codec's stages (wantrain.study) and, side by side on the same int8 bytes, zstd level 1."""
    r = codec_stages(flat, cfg)
    n, sym = r["params"], r.pop("symbols")
    r.pop("payloads")
    scale_bits = r["bits_per_param"]["int8"] - 8
    zc = zstandard.ZstdCompressor(level=1)
    zd = zstandard.ZstdDecompressor()
    raw = sym.tobytes()
    z = zc.compress(raw)
    t_zenc = best_of(lambda: zc.compress(raw))
    t_zdec = best_of(lambda: zd.decompress(z))
    mb = n / 1e6
    r["bits_per_param"]["int8+zstd1"] = 8 * len(z) / n + scale_bits
    r["MBps_per_core"] = {**r.pop("MBps"), "zstd1 compress": mb / t_zenc, "zstd1 decompress": mb / t_zdec}
    r["speed_vs_zstd1"] = {"encode": r["MBps_per_core"]["huffman encode"] / (mb / t_zenc),
                           "decode": r["MBps_per_core"]["huffman decode"] / (mb / t_zdec)}
    return r


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="small")
    ap.add_argument("--steps", type=int, nargs="+", default=[30, 100])
    args = ap.parse_args()
    cfg = CodecConfig()
    results = {}
    for steps in args.steps:
        d = real_delta(args.preset, steps)
        r = measure(d["flat"], cfg)
        r["train"] = {"preset": args.preset, "inner_steps": steps, "train_s": d["train_s"], "final_loss": d["final_loss"]}
        results[f"{args.preset}-{steps}steps"] = r
        b = r["bits_per_param"]
        s = r["MBps_per_core"]
        print(f"\n== {args.preset}, {d['params'] / 1e6:.1f} M params, delta after {steps} AdamW steps ==")
        print("bits per parameter: " + ", ".join(f"{k} {v:.3f}" for k, v in b.items()))
        print(f"Huffman: {r['huffman_bits_per_symbol']:.3f} bits/symbol, entropy bound {r['entropy_bits_per_symbol']:.3f} "
              f"(+{r['huffman_minus_entropy']:.3f}); Huffman stage gain {r['huffman_stage_gain']:.3f}x; "
              f"total {r['ratio_vs_fp32']:.2f}x vs fp32")
        print("MB/s per core: " + ", ".join(f"{k} {v:.0f}" for k, v in s.items()))
        print(f"Huffman speed relative to zstd level 1: encode {r['speed_vs_zstd1']['encode']:.2f}x, "
              f"decode {r['speed_vs_zstd1']['decode']:.2f}x")
    print("\nwrote", save("codec", {"config": cfg.__dict__, "results": results}))


if __name__ == "__main__":
    main()
