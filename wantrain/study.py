"""Measurements on real deltas, shared by the benchmarks and the compression tutorial.

`real_delta` trains a model for a few AdamW steps and returns the DiLoCo pseudo-gradient;
`codec_stages` puts it through the codec's two stages as the system does (one Huffman payload
per wire chunk) and reports bits per parameter per stage, the entropy bound and speeds.
"""

from __future__ import annotations

import time

import numpy as np

from .codec import huffman
from .cpu import cores
from .codec.quantize import dequantize_int8, quantize_int8
from .config import CodecConfig, DataConfig
from .errors import CodecError

__all__ = ["real_delta", "codec_stages", "best_of", "entropy_bits"]


def entropy_bits(counts: np.ndarray) -> float:
    """Empirical entropy in bits per symbol of a count histogram."""
    counts = np.asarray(counts, dtype=np.float64)
    total = counts.sum()
    if total == 0:
        return 0.0
    p = counts[counts > 0] / total
    return float(-(p * np.log2(p)).sum())


def best_of(fn, repeats: int = 5) -> float:
    """The fastest of `repeats` runs of fn(), in seconds (the least disturbed by a noisy machine)."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def real_delta(preset: str = "small", steps: int = 30, batch: int = 8, block: int = 128, seed: int = 0,
               threads: int = 2, data: DataConfig | None = None) -> dict:
    """A real DiLoCo pseudo-gradient: `steps` AdamW steps of `preset` (Shakespeare, byte tokens by default).

    Returns delta (name -> float32 array), flat (all of it, concatenated), params, train_s, final_loss."""
    import torch

    from .config import TrainConfig
    from .data import BatchSampler, load_run_data
    from .models import build_model
    from .site.train import InnerLoop

    torch.set_num_threads(threads)
    tok, corpus = load_run_data(data or DataConfig())
    model = build_model(preset, tok.vocab_size, seed)
    train = TrainConfig(inner_steps=steps, batch_size=batch, inner_lr=1e-3, warmup_steps=0, min_lr_ratio=1.0)
    loop = InnerLoop(model, BatchSampler(corpus.shard(0, 1), batch, block, seed), train, block, torch.device("cpu"))
    delta, info = loop.run(0)
    n = sum(v.size for v in delta.values())
    return {"delta": delta, "params": n, "train_s": info["compute_s"], "final_loss": info["last_train_loss"],
            "flat": np.concatenate(list(delta.values()))}


def codec_stages(flat: np.ndarray, cfg: CodecConfig | None = None, repeats: int = 5) -> dict:
    """Bits per parameter after each stage, the Huffman stage against its entropy bound, the
    int8 error, and single-call speeds (MB/s of int8 symbols; quantize counts fp32 input)."""
    cfg = cfg or CodecConfig()
    n = flat.size
    q, scales = quantize_int8(flat, cfg.quant_block)
    scale_bits = 32 * scales.size / n
    sym = q.view(np.uint8)
    step = cfg.chunk_elements()                    # one payload per wire chunk, as the system sends them
    parts = [sym[i:i + step] for i in range(0, n, step)]
    payloads = [huffman.encode(p, cfg.huffman_block) for p in parts]
    if not all(np.array_equal(a, b) for a, b in zip(huffman.decode_many(payloads), parts)):
        raise CodecError("Huffman round trip changed the symbols")
    huff_bits = 8 * sum(len(p) for p in payloads) / n
    entropy = sum(entropy_bits(np.bincount(p, minlength=256)) * p.size for p in parts) / n
    err = dequantize_int8(q, scales, cfg.quant_block) - flat
    mb = n / 1e6
    t_quant = best_of(lambda: quantize_int8(flat, cfg.quant_block), repeats)
    t_enc = best_of(lambda: [huffman.encode(p, cfg.huffman_block) for p in parts], repeats)
    t_dec = best_of(lambda: huffman.decode_many(payloads, threads=1), repeats)
    t_dec_all = best_of(lambda: huffman.decode_many(payloads), repeats)
    return {
        "params": n,
        "bits_per_param": {"fp32": 32.0, "bf16": 16.0, "int8": 8 + scale_bits, "int8+huffman": huff_bits + scale_bits},
        "huffman_bits_per_symbol": huff_bits,
        "entropy_bits_per_symbol": entropy,
        "huffman_minus_entropy": huff_bits - entropy,
        "huffman_stage_gain": 8 / huff_bits,
        "ratio_vs_fp32": 32 / (huff_bits + scale_bits),
        "int8_relative_error": float(np.linalg.norm(err)) / max(float(np.linalg.norm(flat)), 1e-30),
        "MBps": {"quantize (fp32 in)": 4 * mb / t_quant, "huffman encode": mb / t_enc, "huffman decode": mb / t_dec,
                  f"huffman decode, {cores()} threads": mb / t_dec_all},
        "symbols": sym, "payloads": payloads,
    }
