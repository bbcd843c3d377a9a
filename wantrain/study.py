"""Measurements on real deltas, shared by the benchmarks and the compression tutorial.

`real_delta` trains a model for a few AdamW steps and returns the DiLoCo pseudo-gradient;
`codec_stages` puts it through the codec's two stages as the system does (one Huffman payload
per wire chunk) and reports bits per parameter per stage, the entropy bound and speeds;
`diloco_vs_sync` trains one model two ways in this process, DiLoCo and per-step synchronous data
parallelism, on the same shards (tutorial 00).
"""

from __future__ import annotations

import time

import numpy as np

from .codec import huffman
from .cpu import cores
from .codec.quantize import dequantize_int8, quantize_int8
from .config import CodecConfig, DataConfig
from .errors import CodecError

__all__ = ["real_delta", "codec_stages", "best_of", "entropy_bits", "quantize_bits", "diloco_vs_sync"]


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


def quantize_bits(flat: np.ndarray, bits: int, block: int = 4096) -> dict:
    """What an absmax quantizer of `bits` bits (one float32 scale per `block` values, as the INT8
    stage) would do to `flat`: its relative L2 error, its symbols' counts (from -levels up) and
    entropy (what an ideal entropy coder would spend), and the bits per parameter that makes with
    the scales."""
    levels = 2 ** (bits - 1) - 1                              # 127 for 8 bits, 7 for 4
    n = flat.size
    padded = np.zeros(-(-n // block) * block, np.float32)
    padded[:n] = flat
    blocks = padded.reshape(-1, block)                        # (blocks, block)
    scale = np.abs(blocks).max(axis=1, keepdims=True) / levels
    scale[scale == 0] = 1.0
    q = np.clip(np.rint(blocks / scale), -levels, levels)
    err = (q * scale).ravel()[:n] - flat
    counts = np.bincount((q.ravel()[:n] + levels).astype(np.int64), minlength=2 * levels + 1)   # symbol -levels first
    entropy = entropy_bits(counts)
    return {"bits": bits, "relative_error": float(np.linalg.norm(err)) / max(float(np.linalg.norm(flat)), 1e-30),
            "entropy_bits": entropy, "bits_per_param": entropy + 32 * blocks.shape[0] / n, "counts": counts}


def diloco_vs_sync(preset: str = "tiny", workers: int = 3, rounds: int = 6, inner_steps: int = 10, batch: int = 8,
                   block: int = 64, lr: float = 1e-3, outer_lr: float = 0.7, outer_momentum: float = 0.9,
                   seed: int = 0, threads: int = 2, eval_batches: int = 4) -> dict:
    """One model, the same data shards and the same number of gradients, trained two ways here:

    sync     per-step synchronous data parallelism (a datacenter's all-reduce): every step the
             workers' gradients are averaged and one AdamW step is taken; each worker sends a
             gradient (4 bytes a parameter in fp32) every step
    diloco   each worker takes `inner_steps` AdamW steps on its own shard from the global model;
             then one outer Nesterov step on the average of their pseudo-gradients (start minus
             end); each worker sends a pseudo-gradient once a round

    Returns the validation loss before training and after each round (every `inner_steps` steps),
    the fp32 bytes each worker sent, and the seconds each took."""
    import torch
    import torch.nn.functional as F

    from .data import BatchSampler, load_run_data
    from .data import eval_batches as fixed_batches
    from .models import build_model
    from .outer import OuterNesterov

    torch.set_num_threads(threads)
    tok, corpus = load_run_data(DataConfig())
    val = fixed_batches(corpus.val, batch, block, eval_batches)

    def loss_of(model, x, y):
        return F.cross_entropy(model(x).flatten(0, 1), y.flatten())        # (B*T, vocab) vs (B*T,)

    @torch.no_grad()
    def evaluate(model) -> float:
        return float(np.mean([loss_of(model, x, y).item() for x, y in val]))

    def shards() -> list:
        return [BatchSampler(corpus.shard(k, workers), batch, block, seed + k) for k in range(workers)]

    sync, data, t0 = build_model(preset, tok.vocab_size, seed), shards(), time.perf_counter()
    opt = torch.optim.AdamW(sync.parameters(), lr=lr)
    sync_val = [evaluate(sync)]
    for _ in range(rounds):
        for _ in range(inner_steps):
            opt.zero_grad(set_to_none=True)
            for s in data:                                    # the average of the workers' gradients
                x, y = s.next()
                (loss_of(sync, x, y) / workers).backward()
            opt.step()
        sync_val.append(evaluate(sync))
    sync_s = time.perf_counter() - t0

    model, data, t0 = build_model(preset, tok.vocab_size, seed), shards(), time.perf_counter()
    replicas = [build_model(preset, tok.vocab_size, seed) for _ in range(workers)]
    inner = [torch.optim.AdamW(m.parameters(), lr=lr) for m in replicas]    # each keeps its own state
    outer = OuterNesterov(outer_lr, outer_momentum)
    diloco_val = [evaluate(model)]
    for _ in range(rounds):
        start = {n: p.detach().clone() for n, p in model.named_parameters()}
        deltas = []
        for m, o, s in zip(replicas, inner, data):
            m.load_state_dict(model.state_dict())
            for _ in range(inner_steps):
                o.zero_grad(set_to_none=True)
                x, y = s.next()
                loss_of(m, x, y).backward()
                o.step()
            deltas.append({n: start[n] - p.detach() for n, p in m.named_parameters()})
        mean = {n: torch.stack([d[n] for d in deltas]).mean(0).numpy().ravel() for n in start}
        update = outer.update(mean)                           # what every replica adds
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.add_(torch.from_numpy(update[n]).view_as(p))
        diloco_val.append(evaluate(model))
    diloco_s = time.perf_counter() - t0

    params = sum(p.numel() for p in model.parameters())
    return {"params": params, "workers": workers, "rounds": rounds, "inner_steps": inner_steps,
            "sync_val": sync_val, "diloco_val": diloco_val, "sync_s": sync_s, "diloco_s": diloco_s,
            "sync_bytes_per_worker": 4 * params * rounds * inner_steps, "diloco_bytes_per_worker": 4 * params * rounds}
