"""Measurements on real deltas, shared by the benchmarks and the compression tutorial.

`real_delta` trains a model for a few AdamW steps and returns the DiLoCo pseudo-gradient;
`codec_stages` puts it through the codec's two stages as the system does (one Huffman payload
per wire chunk) and reports bits per parameter per stage, the entropy bound and speeds;
`diloco_vs_sync` trains one model two ways in this process, DiLoCo as a wantrain run does it and
per-step synchronous data parallelism, on the same shards, for several seeds (tutorial 00);
`codec_run` trains DiLoCo with one codec both ways and counts every byte it sends, and
`codec_speed` times a codec on a real delta (bench/codec_leaderboard.py).
"""

from __future__ import annotations

import time

import numpy as np

from ..codec import huffman
from ..codec.quantize import dequantize_int8, quantize_int8
from ..config import CodecConfig, DataConfig, RunConfig
from ..runtime.cpu_pool import cores
from ..errors import CodecError

__all__ = ["real_delta", "codec_stages", "best_of", "entropy_bits", "quantize_bits", "diloco_vs_sync", "codec_run",
           "codec_speed"]


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

    from ..config import TrainConfig
    from ..data import BatchSampler, load_run_data
    from ..models import build_model
    from ..site.train import InnerLoop

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


def diloco_vs_sync(cfg: RunConfig, seeds: tuple[int, ...] = (0, 1, 2), threads: int = 1) -> dict:
    """One model trained two ways here, on the same data shards and the same number of gradients, for
    each seed in `seeds` (the model's initial weights and every shard's batch order):

    diloco   what a wantrain run does, in one process: `cfg.num_sites` sites, each a site's inner loop
             (site/train.py: AdamW, the run's learning-rate schedule, its batches of its own shard),
             `cfg.train.inner_steps` steps from the global model; each delta through the run's codec
             with error feedback; the PS's global model (ps/model.py) averages them weighted by the
             tokens they trained, takes the outer Nesterov step and applies the decoded update
    sync     per-step synchronous data parallelism (a datacenter's all-reduce): every step the sites'
             gradients on the same batches are averaged and one AdamW step is taken, with the same
             optimizer, learning rate and schedule; each site would send a gradient every step

    Returns, per seed and arm, the validation loss before training and after each round (every
    inner_steps steps, on the PS's validation batches), and the bytes each site sends: DiLoCo's
    as measured on the wire, synchronous as fp32 gradients."""
    import torch

    from ..data import load_run_data
    from .inprocess import InProcessRun
    from ..runtime.memory import trim_heap
    from ..models import build_model
    from ..site.adamw import InnerAdamW
    from ..site.group import site_sampler
    from ..site.train import lr_at

    torch.set_num_threads(threads)
    tok, corpus = load_run_data(cfg.data)
    t, workers = cfg.train, cfg.num_sites
    out: dict = {"seeds": list(seeds), "workers": workers, "rounds": t.rounds, "inner_steps": t.inner_steps,
                 "diloco_val": [], "sync_val": [], "diloco_wire_bytes": [], "raw_bytes": 0}
    for seed in seeds:
        run = cfg.replace(**{"model.seed": seed, "train.seed": seed})
        ps = InProcessRun(run, tok, corpus)
        val, wire = [ps.evaluate()], 0
        for r in range(t.rounds):
            start = ps.start()
            sent = {name: ps.train(name, r, start)[1] for name in ps.names}
            wire += sum(s.wire_bytes for s in sent.values())
            ps.commit(r, sent)
            val.append(ps.evaluate())
        out["diloco_val"].append(val)
        out["diloco_wire_bytes"].append(wire / workers)
        out["raw_bytes"] = 4 * ps.model.num_params
        val_batches = ps.model.val

        model = build_model(run.model.preset, tok.vocab_size, seed)
        opt = InnerAdamW(model.parameters(), lr=t.inner_lr, betas=(0.9, 0.95), weight_decay=t.inner_weight_decay)
        data = [site_sampler(run, corpus, k) for k in range(workers)]
        sync_val, step = [_val_loss(model, val_batches)], 0
        for r in range(t.rounds):
            for j in range(t.inner_steps):
                opt.lr = lr_at(t, step, r + j / t.inner_steps)
                opt.zero_grad()
                for sampler in data:                        # the average of the sites' gradients
                    x, y = sampler.next()
                    (torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten()) / workers).backward()
                if t.grad_clip > 0:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
                opt.step()
                step += 1
            sync_val.append(_val_loss(model, val_batches))
        out["sync_val"].append(sync_val)
        del ps, model, opt
        trim_heap()
    steps = t.rounds * t.inner_steps
    out["sync_bytes_per_site"] = out["raw_bytes"] * steps         # an fp32 gradient every step
    out["diloco_fp32_bytes_per_site"] = out["raw_bytes"] * t.rounds  # an fp32 delta every round
    return out


def codec_run(cfg: RunConfig, seed: int, threads: int = 1, progress=None) -> dict:
    """DiLoCo as `diloco_vs_sync` runs it, with `cfg.codec` for the sites' deltas and the PS's update
    alike. Returns the validation loss before training and after each round, and per round the bits
    per parameter each way as gRPC messages (wire.framed_bytes: payload, scales, every header and
    table, the chunk's framing): up, the mean over the sites of one site's delta with what a site
    sends beside it on a clean link (manifest, critical copies, parity: InProcessRun.protection); down, the update
    every site downloads. `progress(round)` is called after every round."""
    import torch

    from ..data import load_run_data
    from .inprocess import InProcessRun

    torch.set_num_threads(threads)
    run = cfg.replace(**{"model.seed": seed, "train.seed": seed})
    tok, corpus = load_run_data(run.data)
    ps = InProcessRun(run, tok, corpus)
    n = ps.model.num_params
    val, up = [ps.evaluate()], []
    masks: dict[str, np.ndarray] = {}
    pairs = np.zeros((2, 2), np.int64)          # (kept last round, kept now): counts over sites and rounds
    for r in range(run.train.rounds):
        start = ps.start()
        sent = {name: ps.train(name, r, start)[1] for name in ps.names}
        up.append(8 * float(np.mean([s.on_wire for s in sent.values()])) / n)
        for name, s in sent.items():
            assert s.values is not None
            mask = np.concatenate([v != 0 for v in s.values.values()])
            if name in masks:
                pairs += np.bincount(2 * masks[name] + mask, minlength=4).reshape(2, 2)
            masks[name] = mask
        ps.commit(r, sent)
        val.append(ps.evaluate())
        if progress:
            progress(r)
    return {"val": val, "up_bits": up, "down_bits": [8 * b / n for b in ps.update_framed_bytes], "params": n,
            "mask_bits": mask_entropy(pairs)}


def mask_entropy(pairs: np.ndarray) -> dict:
    """Bits a parameter that which-elements-are-sent costs at best: alone (order 0), and given the
    same site's mask of the round before (which both ends hold: what a context-coded position
    stream could reach). `pairs[a, b]` counts elements sent last round (a) and now (b)."""
    total = pairs.sum()
    if total == 0:
        return {"order0": 0.0, "given_last": 0.0, "kept_again": 0.0}
    order0 = entropy_bits(pairs.sum(axis=0))
    given = sum(pairs[a].sum() / total * entropy_bits(pairs[a]) for a in (0, 1))
    return {"order0": order0, "given_last": given,
            "kept_again": float(pairs[1, 1] / pairs[1].sum()) if pairs[1].sum() else 0.0}


def codec_speed(delta: dict[str, np.ndarray], cfg: CodecConfig, repeats: int = 3) -> dict:
    """MB/s of float32 input a codec encodes (error feedback included) and decodes, the fastest of
    `repeats`, on this process's cores (a caller pins it to one for per-core figures)."""
    from ..codec import Codec, ErrorFeedback, encode_arrays

    codec = Codec(cfg)
    mb = 4 * sum(v.size for v in delta.values()) / 1e6
    chunks, _ = encode_arrays(delta, codec, ErrorFeedback())        # compiles what it needs, once
    encoded = [e for _, e in chunks]
    return {"encode_mb_s": mb / best_of(lambda: encode_arrays(delta, codec, ErrorFeedback()), repeats),
            "decode_mb_s": mb / best_of(lambda: Codec.decode_many(encoded), repeats)}


def _val_loss(model, batches) -> float:
    import torch

    with torch.no_grad():
        model.eval()
        losses = [torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten()).item() for x, y in batches]
        model.train()
    return float(np.mean(losses))
