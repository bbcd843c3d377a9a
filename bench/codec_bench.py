"""Codec benchmark on real deltas: bits per parameter per stage, entropy bound, MB/s per core.

Trains a model for a few AdamW steps (a real DiLoCo pseudo-gradient), then codes its int8
symbols with our Huffman stage and, side by side on the same bytes, with the numpy coder it
replaced (bench/baseline_huffman.py: same format, payloads checked identical) and zstd level 1;
raw fp32 and bf16 are the baselines. Speeds are per core (one thread), best of 5, except the
decode "all threads" figure (the PS decodes a payload's blocks on every core). Then every codec
mode (config.CODEC_MODES, top-k at 1 and 2 value bits), whole, as a site runs it (error feedback
included): bits per parameter (scales, tables and headers counted) and MB/s of float32 input per
core, beside zstd level 1 on the same float32 bytes.

    python bench/codec_bench.py [--preset small] [--steps 30 100]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import save, single_core

single_core()

import numpy as np  # noqa: E402
import zstandard  # noqa: E402
from baseline_huffman import decode_many as numpy_decode_many  # noqa: E402
from baseline_huffman import encode as numpy_encode  # noqa: E402

from wantrain.codec import Codec, ErrorFeedback, encode_arrays  # noqa: E402
from wantrain.studies.compression import best_of, codec_speed, codec_stages, real_delta  # noqa: E402
from wantrain.config import CODEC_MODES, CodecConfig  # noqa: E402


def measure(flat: np.ndarray, cfg: CodecConfig) -> dict:
    """The codec's stages (wantrain.studies.compression) and, side by side on the same int8 bytes, the numpy
    coder of before and zstd level 1."""
    r = codec_stages(flat, cfg)
    n, sym, payloads = r["params"], r.pop("symbols"), r.pop("payloads")
    step = cfg.chunk_elements()
    parts = [sym[i:i + step] for i in range(0, n, step)]          # the payloads' chunks, as codec_stages cut them
    if [numpy_encode(p, cfg.huffman_block) for p in parts] != payloads:
        raise SystemExit("the compiled coder's payloads differ from the numpy coder's")
    t_nenc = best_of(lambda: [numpy_encode(p, cfg.huffman_block) for p in parts])
    t_ndec = best_of(lambda: numpy_decode_many(payloads))
    scale_bits = r["bits_per_param"]["int8"] - 8
    zc = zstandard.ZstdCompressor(level=1)
    zd = zstandard.ZstdDecompressor()
    raw = sym.tobytes()
    z = zc.compress(raw)
    t_zenc = best_of(lambda: zc.compress(raw))
    t_zdec = best_of(lambda: zd.decompress(z))
    mb = n / 1e6
    speed = r.pop("MBps")
    r["bits_per_param"]["int8+zstd1"] = 8 * len(z) / n + scale_bits
    r["MBps_per_core"] = {**speed, "numpy huffman encode (before)": mb / t_nenc,
                          "numpy huffman decode (before)": mb / t_ndec,
                          "zstd1 compress": mb / t_zenc, "zstd1 decompress": mb / t_zdec}
    r["speed_vs_numpy_before"] = {"encode": speed["huffman encode"] * t_nenc / mb,
                                  "decode": speed["huffman decode"] * t_ndec / mb}
    r["speed_vs_zstd1"] = {"encode": speed["huffman encode"] * t_zenc / mb,
                           "decode": speed["huffman decode"] * t_zdec / mb}
    return r


def every_codec(delta: dict[str, np.ndarray]) -> dict[str, dict]:
    """Per codec mode: bits per parameter and encode / decode MB/s of float32 input on one core;
    and zstd level 1 on the same float32 bytes."""
    n = sum(v.size for v in delta.values())
    cores = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cores)})                   # one core: the decode pool sizes itself by it
    try:
        out = {}
        for mode in CODEC_MODES:
            for bits in ((1, 2) if mode == "topk" else (0,)):
                cfg = dataclasses.replace(CodecConfig(), mode=mode, **({"topk_value_bits": bits} if bits else {}))
                chunks, _ = encode_arrays(delta, Codec(cfg), ErrorFeedback())
                name = f"{mode}, {bits}-bit values" if bits else mode
                out[name] = {"bits_per_param": 8 * sum(e.wire_bytes for _, e in chunks) / n,
                             **codec_speed(delta, cfg, repeats=5)}
        raw = b"".join(v.astype("<f4").tobytes() for v in delta.values())
        z = zstandard.ZstdCompressor(level=1).compress(raw)
        out["zstd level 1 (fp32 bytes)"] = {
            "bits_per_param": 8 * len(z) / n,
            "encode_mb_s": len(raw) / 1e6 / best_of(lambda: zstandard.ZstdCompressor(level=1).compress(raw)),
            "decode_mb_s": len(raw) / 1e6 / best_of(lambda: zstandard.ZstdDecompressor().decompress(z))}
        return out
    finally:
        os.sched_setaffinity(0, cores)


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
        print(f"Huffman speed relative to the numpy coder of before: encode {r['speed_vs_numpy_before']['encode']:.2f}x, "
              f"decode {r['speed_vs_numpy_before']['decode']:.2f}x")
        print(f"Huffman speed relative to zstd level 1: encode {r['speed_vs_zstd1']['encode']:.2f}x, "
              f"decode {r['speed_vs_zstd1']['decode']:.2f}x")
        r["codecs"] = every_codec(d["delta"])
        print(f"{'codec (one core, float32 in)':<30} {'bits/param':>10} {'encode MB/s':>12} {'decode MB/s':>12}")
        for name, c in r["codecs"].items():
            print(f"{name:<30} {c['bits_per_param']:>10.3f} {c['encode_mb_s']:>12.0f} {c['decode_mb_s']:>12.0f}")
    print("\nwrote", save("codec", {"config": cfg.__dict__, "results": results}))


if __name__ == "__main__":
    main()
