"""The inner optimizer: AdamW, torch's own update, without torch.optim's Optimizer class.

Creating any `torch.optim.Optimizer` imports `torch._dynamo` (about 800 modules: some 70 MB of
memory and a second of start-up in every process), which a site never uses. A Binder session
runs three sites and the PS in 2 GB, so each site steps its parameters through torch's
functional Adam (`torch.optim.adam.adam` with decoupled weight decay: what AdamW runs, the same
kernels and the same bits) and keeps the moments here.
"""

from __future__ import annotations

import torch
from torch.optim.adam import adam

__all__ = ["InnerAdamW"]


class InnerAdamW:
    """AdamW over a fixed list of parameters; `lr` may change before any step (the schedule sets it)."""

    def __init__(self, params, lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.lr, self.betas, self.eps, self.weight_decay = lr, betas, eps, weight_decay
        self.exp_avg = [torch.zeros_like(p, memory_format=torch.preserve_format) for p in self.params]
        self.exp_avg_sq = [torch.zeros_like(p, memory_format=torch.preserve_format) for p in self.params]
        self.steps = [torch.tensor(0.0) for _ in self.params]     # as torch keeps them: a tensor each

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        live = [i for i, p in enumerate(self.params) if p.grad is not None]
        adam([self.params[i] for i in live], [self.params[i].grad for i in live], [self.exp_avg[i] for i in live],
             [self.exp_avg_sq[i] for i in live], [], [self.steps[i] for i in live], amsgrad=False,
             beta1=self.betas[0], beta2=self.betas[1], lr=self.lr, weight_decay=self.weight_decay, eps=self.eps,
             maximize=False, decoupled_weight_decay=True)
