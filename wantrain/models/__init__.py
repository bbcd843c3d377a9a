"""Model families (GPT-2, Llama) in plain torch, and the named presets a run picks from.

Every party of a run builds the same model from (preset, vocabulary, seed), so initial
weights never travel except when a site joins a run already in progress.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ..errors import ConfigError
from ..presets import PRESETS
from .gpt import GPT, GPTConfig
from .llama import Llama, LlamaConfig

__all__ = ["PRESETS", "build_model", "preset_config", "count_parameters", "GPT", "GPTConfig", "Llama", "LlamaConfig"]

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
