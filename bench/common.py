"""Helpers shared by the benchmarks: single-core setup, real deltas, timing, result files."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def single_core() -> None:
    """Per-core figures: one thread everywhere (call before numpy/torch do real work)."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(var, "1")


def real_delta(preset: str = "small", steps: int = 30, batch: int = 8, block: int = 128, seed: int = 0,
               threads: int = 2) -> dict:
    """A real DiLoCo pseudo-gradient: `steps` AdamW steps of `preset` on Shakespeare (byte tokens)."""
    import numpy as np
    import torch

    from wantrain.config import DataConfig
    from wantrain.data import BatchSampler, load_run_data
    from wantrain.models import build_model
    from wantrain.replica import flat_copy

    torch.set_num_threads(threads)
    tok, corpus = load_run_data(DataConfig())
    model = build_model(preset, tok.vocab_size, seed)
    sampler = BatchSampler(corpus.shard(0, 1), batch, block, seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    start = flat_copy(model)
    t0 = time.perf_counter()
    for _ in range(steps):
        x, y = sampler.next()
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    end = flat_copy(model)
    delta = {k: start[k] - end[k] for k in start}
    n = sum(v.size for v in delta.values())
    return {"delta": delta, "params": n, "train_s": time.perf_counter() - t0, "final_loss": loss.item(),
            "flat": np.concatenate(list(delta.values()))}


def best_of(fn, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def save(name: str, result: dict) -> Path:
    RESULTS.mkdir(exist_ok=True)
    result = {"machine": {"python": platform.python_version(), "cpu": platform.processor() or platform.machine(),
                          "cores": os.cpu_count()}, "time": time.strftime("%Y-%m-%d %H:%M:%S"), **result}
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(result, indent=2))
    return path
