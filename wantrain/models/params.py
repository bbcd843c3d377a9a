"""A replica of the global parameters: named flat views, hashing, and applying an update.

The PS and every site hold one. Updates are applied as one float32 add per element of values
that were already decoded (dequantized) on their own, so every replica, CPU or GPU, ends up
with the same bits; `param_hash` checks that each round.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch
import torch.nn as nn

from ..transport.messages import HASH_HEX_DIGITS

__all__ = ["named_params", "param_hash", "values_hash", "flat_copy", "apply_update", "add_update", "load_flat"]


def named_params(model: nn.Module) -> dict[str, torch.Tensor]:
    """Distinct parameters by name, in a fixed order (tied weights once)."""
    return dict(model.named_parameters())


def flat_copy(model: nn.Module) -> dict[str, np.ndarray]:
    """float32 CPU copies of every parameter, flattened."""
    return {k: p.detach().float().cpu().numpy().reshape(-1).copy() for k, p in named_params(model).items()}


def param_hash(model: nn.Module) -> str:
    return values_hash({name: p.detach().float().cpu().contiguous().numpy() for name, p in named_params(model).items()})


def values_hash(values: dict[str, np.ndarray]) -> str:
    """The parameter hash of flat float32 values (the same as `param_hash` of a model holding them)."""
    h = hashlib.sha256()
    for name, v in values.items():
        h.update(name.encode())
        h.update(np.ascontiguousarray(v, np.float32).data)
    return h.hexdigest()[:HASH_HEX_DIGITS]


@torch.no_grad()
def apply_update(model: nn.Module, update: dict[str, np.ndarray]) -> None:
    """params += update, one IEEE float32 add per element (no fused multiply-add)."""
    params = named_params(model)
    for name, u in update.items():
        p = params[name]
        p.add_(torch.from_numpy(u).view(p.shape).to(p.device))


def add_update(values: dict[str, np.ndarray], update: dict[str, np.ndarray]) -> None:
    """values += update for flat float32 replicas: the same one IEEE add per element as `apply_update`."""
    for name, u in update.items():
        np.add(values[name], u, out=values[name])


@torch.no_grad()
def load_flat(model: nn.Module, values: dict[str, np.ndarray]) -> None:
    """Overwrite parameters with flat float32 values (a model download)."""
    params = named_params(model)
    for name, v in values.items():
        p = params[name]
        p.copy_(torch.from_numpy(v).view(p.shape).to(p.device))
