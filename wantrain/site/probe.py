"""How much each role's part of a delta matters: a sensitivity probe on held-out batches.

`role_sensitivity(model, end, delta, roles, batches)` takes the loss of the parameters a round
ended with (`end`, which the model holds), then, role by role, of those parameters with that
role's change undone (its tensors back where the round started, end + delta): the rise is what
losing that role's chunks would cost the site's step. `role_weights(sensitivity, energy)` turns it
into a manifest's role weights (manifest.py: importance = role weight x energy share), so that
each role's share of a delta's importance is its share of the sensitivity, smoothed so that no
role drops to nothing on one noisy probe.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ..models.params import named_params
from ..transport.manifest import DEFAULT_ROLE_WEIGHTS

__all__ = ["role_sensitivity", "role_energy", "role_weights"]

SMOOTHING = 0.1       # each role's share of the importance gets this share of the mean on top


def _loss(model: torch.nn.Module, batches: Sequence[tuple[torch.Tensor, torch.Tensor]], device: torch.device) -> float:
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext())
    total = 0.0
    for x, y in batches:
        with autocast:
            logits = model(x.to(device))                                  # (B, T, vocab)
        total += F.cross_entropy(logits.float().flatten(0, 1), y.to(device).flatten()).item()
    return total / len(batches)


@torch.no_grad()
def role_sensitivity(model: torch.nn.Module, end: dict[str, np.ndarray], delta: dict[str, np.ndarray],
                     roles: dict[str, str], batches: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, float]:
    """Per role: the held-out loss with the role's change undone, less the loss at `end` (>= 0).
    The model holds `end` before and, bit for bit, after (its tensors are put back from `end`)."""
    params = named_params(model)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        base = _loss(model, batches, device)
        out = {}
        for role in sorted(set(roles.values())):
            names = [n for n, r in roles.items() if r == role]
            for n in names:                       # back where the round started
                p = params[n]
                p.copy_(torch.from_numpy(end[n] + delta[n]).view(p.shape))
            try:
                out[role] = max(0.0, _loss(model, batches, device) - base)
            finally:
                for n in names:
                    p = params[n]
                    p.copy_(torch.from_numpy(end[n]).view(p.shape))
        return out
    finally:
        model.train(was_training)


def role_energy(delta: dict[str, np.ndarray], roles: dict[str, str]) -> dict[str, float]:
    """Each role's share of the delta's energy (sum of squares)."""
    sums: dict[str, float] = {}
    for name, v in delta.items():
        x = v.astype(np.float64, copy=False)
        sums[roles[name]] = sums.get(roles[name], 0.0) + float(np.dot(x, x))
    total = sum(sums.values())
    return {r: s / total for r, s in sums.items()} if total > 0 else {}


def role_weights(sensitivity: dict[str, float], energy: dict[str, float]) -> dict[str, float]:
    """Role weights that give each role (with energy) its share of the sensitivity as its share of
    the importance, smoothed (SMOOTHING); the defaults (all 1: energy alone) without a signal."""
    roles = [r for r, e in energy.items() if e > 0]
    total = sum(max(0.0, sensitivity.get(r, 0.0)) for r in roles)
    if not roles or not total > 0:
        return dict(DEFAULT_ROLE_WEIGHTS)
    share = {r: (max(0.0, sensitivity.get(r, 0.0)) + SMOOTHING * total / len(roles)) / (total * (1 + SMOOTHING))
             for r in roles}
    return {**DEFAULT_ROLE_WEIGHTS, **{r: share[r] / energy[r] for r in roles}}
