"""The global model at the parameter server: its parameters, outer optimizer and update codec.

A sharded PS (shards.py) holds, aggregates, hashes and sends only its shard's tensors (`views`;
the model's other parameters are emptied), so it cannot evaluate the model.

A round's commit changes it in one call, `apply` (in a worker thread): the pure aggregation of
aggregate.py writes exactly the decoded update into the parameters, then the new hash, norm
and validation loss are taken.
"""

from __future__ import annotations

import dataclasses

import math

import numpy as np
import torch

from ..outer.aggregate import Contribution, aggregate_round
from ..codec import Codec, EncodeStats, ErrorFeedback, plan_chunks
from ..config import RunConfig
from ..data import check_batches, eval_batches
from ..outer.fragments import synced
from ..transport.messages import TensorChunk
from ..models import build_model, count_parameters
from ..outer.nesterov import OuterNesterov
from ..transport.roles import roles_of
from ..models.params import load_flat, named_params, values_hash
from ..outer.screening import l2_norm, parse_key
from ..models.shards import ShardLayout
from .downloads import live_views

__all__ = ["GlobalModel"]


class GlobalModel:
    """The parameters every site starts each round from, and what moves them."""

    def __init__(self, cfg: RunConfig, vocab_size: int, val_tokens, shard: tuple[int, int] = (0, 1)) -> None:
        self.cfg = cfg
        self.model = build_model(cfg.model.preset, vocab_size, cfg.model.seed)
        self.shard = shard
        sharded = shard[1] > 1
        self.val = [] if sharded else eval_batches(val_tokens, cfg.train.batch_size, cfg.model.block_size,
                                                   cfg.train.eval_batches)
        # Held-out batches a commit is checked on (wantrain/outer/checking.py), apart from those reported.
        self.check = check_batches(val_tokens, cfg.train.batch_size, cfg.model.block_size, cfg.robust.check_batches,
                                   cfg.train.eval_batches) if cfg.robust.checks(cfg.num_sites) and not sharded else []
        self.sizes = {k: p.numel() for k, p in named_params(self.model).items()}    # every shard's tensors
        self.layout = ShardLayout.balanced(self.sizes, shard[1])
        self.roles = roles_of({k: tuple(p.shape) for k, p in named_params(self.model).items()})  # the downlink's order
        if sharded:       # the other shards' tensors: never read here, so not held either
            for name, p in named_params(self.model).items():
                if self.layout.shard_of(name) != shard[0]:
                    p.data = torch.empty(0)
        self.views = self.layout.part(live_views(self.model), shard[0])   # what this PS owns, live
        self.shapes = {k: v.size for k, v in self.views.items()}
        self.num_params = sum(self.shapes.values())
        self.plan = plan_chunks(self.shapes, cfg.codec.chunk_elements())   # every delta and update
        self.codec = Codec(cfg.codec.for_update())
        self.codecs = {"": self.codec}      # the update's encodings by mode ("": the run's), made as asked
        self.outer = OuterNesterov(cfg.train.outer_lr, cfg.train.outer_momentum)
        self.feedback = ErrorFeedback() if cfg.codec.error_feedback else None
        self.norm = self.l2_norm()

    def parameters(self) -> int:
        return count_parameters(self.model)

    def hash(self) -> str:
        return values_hash(self.views)

    def l2_norm(self) -> float:
        """L2 norm of the parameters (float64): the scale every delta is bounded against."""
        return l2_norm(self.views.values())

    def apply(self, round_: int, contributions: dict[str, Contribution], side: dict[str, Contribution] | None = None,
              substitute: str = "peer", update_mode: str = "") -> tuple[list[TensorChunk], EncodeStats, str]:
        """Aggregate, take the outer step, encode the update and apply exactly what was encoded;
        returns the update's chunks, its encoding stats and the new hash. (Evaluation is separate:
        a replayed round takes its validation loss from its commit record.) `side`, `substitute`:
        deltas or chunks that missed their round (outer/aggregate.py). `update_mode`: the update's
        encoding this round, where the controller chose one ("": the run's)."""
        robust = self.cfg.robust
        if update_mode not in self.codecs:
            self.codecs[update_mode] = Codec(dataclasses.replace(self.cfg.codec.for_update(), mode=update_mode))
        if side and self.cfg.train.fragments > 1:
            side = {k: self._in_own_fragment(k, c) for k, c in side.items()}
        msgs, stats = aggregate_round(round_, self.plan, self.shapes, self.views, contributions,
                                      self.outer, self.feedback, self.codecs[update_mode], robust.aggregate,
                                      robust.trim_fraction, side, substitute,
                                      synced(self.sizes, self.cfg.train.fragments, round_))
        self.norm = self.l2_norm()
        return msgs, stats, self.hash()

    def _in_own_fragment(self, key: str, late: Contribution) -> Contribution:
        """A late delta (key "site@round") under fragments: only the chunks of the fragment its round
        synchronized (the rest of it is zero at an honest site, and is ignored as a round's is)."""
        late_round = parse_key(key)[1]
        own = synced(self.sizes, self.cfg.train.fragments, late_round) if late_round is not None else None
        assert own is not None, key
        return Contribution([p if spec.tensor in own else None for spec, p in zip(self.plan, late.parts)],
                            late.weight)

    def evaluate(self) -> float:
        """The validation loss (what the run reports)."""
        return self._loss(self.val)

    def check_loss(self) -> float:
        """The loss on the check batches (what a commit is checked on: checking.py)."""
        return self._loss(self.check)

    @torch.no_grad()
    def _loss(self, batches: list) -> float:
        if not batches:
            return math.nan
        self.model.eval()
        losses = [torch.nn.functional.cross_entropy(self.model(x).flatten(0, 1), y.flatten()).item()
                  for x, y in batches]
        self.model.train()
        return float(np.mean(losses))

    def state_dict(self, copy: bool = True) -> dict:
        """Parameters, outer momentum and downlink residual as flat float32 arrays: copies, or
        (copy=False) the live arrays, for a writer that holds the next round off until it is done."""
        if not copy:
            return {"params_np": dict(self.views), "outer_np": dict(self.outer.buf),
                    "feedback_np": dict(self.feedback.residuals) if self.feedback else {}}
        return {"params_np": {k: v.copy() for k, v in self.views.items()}, "outer_np": self.outer.state_dict(),
                "feedback_np": self.feedback.state_dict() if self.feedback else {}}

    def load_state_dict(self, saved: dict) -> None:
        load_flat(self.model, saved["params_np"])
        self.outer.load_state_dict(saved["outer_np"])
        if self.feedback is not None:
            self.feedback.load_state_dict(saved["feedback_np"])
        self.norm = self.l2_norm()
