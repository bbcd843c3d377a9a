"""Model families (GPT-2, Llama) in plain torch, and the named presets a run picks from.

Every party of a run builds the same model from (preset, vocabulary, seed), so initial
weights never travel except when a site joins a run already in progress.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ..errors import ConfigError
from .gpt import GPT, GPTConfig
from .llama import Llama, LlamaConfig

__all__ = ["PRESETS", "build_model", "preset_config", "count_parameters", "GPT", "GPTConfig", "Llama", "LlamaConfig"]

# vocab_size None: taken from the run's tokenizer.
PRESETS: dict[str, tuple[type, dict]] = {
    "tiny": (GPTConfig, dict(n_layer=4, n_head=4, n_embd=128, block_size=256, vocab_size=None)),
    "small": (GPTConfig, dict(n_layer=6, n_head=6, n_embd=384, block_size=512, vocab_size=None)),
    "llama-tiny": (LlamaConfig, dict(n_layer=4, n_head=4, n_kv_head=2, n_embd=128, ffn_hidden=352,
                                     block_size=256, vocab_size=None)),
    "gpt2": (GPTConfig, dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50257)),
    "gpt2-medium": (GPTConfig, dict(n_layer=24, n_head=16, n_embd=1024, block_size=1024, vocab_size=50257)),
    "llama3-1b": (LlamaConfig, dict(n_layer=16, n_head=32, n_kv_head=8, n_embd=2048, ffn_hidden=8192,
                                    block_size=2048, vocab_size=128256)),
}


def preset_config(preset: str, vocab_size: int) -> GPTConfig | LlamaConfig:
    """The architecture of a preset; presets with a fixed vocabulary ignore `vocab_size`."""
    if preset not in PRESETS:
        raise ConfigError(f"unknown model preset {preset!r} (known: {', '.join(sorted(PRESETS))})")
    cfg_cls, kw = PRESETS[preset]
    kw = dict(kw)
    if kw["vocab_size"] is None:
        kw["vocab_size"] = vocab_size
    return cfg_cls(**kw)


def build_model(preset: str, vocab_size: int, seed: int = 0, device: str | torch.device = "cpu") -> nn.Module:
    """The preset's model with deterministic initial weights (fp32)."""
    cfg = preset_config(preset, vocab_size)
    cls = GPT if isinstance(cfg, GPTConfig) else Llama
    with torch.device(device):
        if torch.device(device).type == "meta":
            return cls(cfg)
        g = torch.random.fork_rng(devices=[])
        with g:
            torch.manual_seed(seed)
            return cls(cfg)


def count_parameters(model: nn.Module) -> int:
    """Number of distinct parameters (tied weights counted once)."""
    return sum(p.numel() for p in model.parameters())
