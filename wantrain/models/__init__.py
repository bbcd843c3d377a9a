"""Model families (GPT-2, Llama) in plain torch, and the named presets a run picks from.

Every party of a run builds the same model from (preset, vocabulary, seed), so initial
weights never travel except when a site joins a run already in progress.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ..errors import ConfigError
from ..config.presets import PRESETS
from .gpt import GPT, GPTConfig
from .llama import Llama, LlamaConfig

__all__ = ["PRESETS", "build_model", "preset_config", "count_parameters", "step_seconds", "GPT", "GPTConfig", "Llama",
           "LlamaConfig"]

_FAMILIES = {"gpt": GPTConfig, "llama": LlamaConfig}


def preset_config(preset: str, vocab_size: int) -> GPTConfig | LlamaConfig:
    """The architecture of a preset; presets with a fixed vocabulary ignore `vocab_size`."""
    if preset not in PRESETS:
        raise ConfigError(f"unknown model preset {preset!r} (known: {', '.join(sorted(PRESETS))})")
    family, kw = PRESETS[preset]
    cfg_cls, kw = _FAMILIES[family], dict(kw)
    if kw["vocab_size"] is None:
        kw["vocab_size"] = vocab_size
    return cfg_cls(**kw)


def build_model(preset: str, vocab_size: int, seed: int = 0, device: str | torch.device = "cpu") -> nn.Module:
    """The preset's model with deterministic initial weights (fp32)."""
    cfg = preset_config(preset, vocab_size)
    def make() -> nn.Module:
        return GPT(cfg) if isinstance(cfg, GPTConfig) else Llama(cfg)

    with torch.device(device):
        if torch.device(device).type == "meta":
            return make()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return make()


def count_parameters(model: nn.Module) -> int:
    """Number of distinct parameters (tied weights counted once)."""
    return sum(p.numel() for p in model.parameters())


def step_seconds(preset: str, batch: int, block: int, repeats: int = 5) -> float:
    """Seconds of one training step (forward, backward, AdamW) of `preset` on one CPU thread here,
    on a batch of random bytes: the median of `repeats` after one to warm up. What `wantrain place`
    and the time-to-target harness scale a site's compute from (its speed factor times this)."""
    import statistics
    import time

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = build_model(preset, 256, 0)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        x = torch.randint(0, 256, (batch, block), generator=torch.Generator().manual_seed(0))
        times = []
        for _ in range(repeats + 1):
            t0 = time.perf_counter()
            loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten())
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            times.append(time.perf_counter() - t0)
        return statistics.median(times[1:])
    finally:
        torch.set_num_threads(threads)
