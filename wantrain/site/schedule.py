"""When a site computes: the round schedules of `train.schedule`.

The site keeps the global model as a replica of flat float32 arrays (the PS's updates are added to
it, and it is what is hashed); the model itself holds the parameters being trained.

    sync     a round starts from the replica at its RoundStart; between its push and the next
             RoundStart (upload, the PS's commit, the update's download) the site is idle.
    overlap  as soon as a round's delta is taken, the site trains the next round ahead while the
             delta goes up and the update comes down, going on from where its last round ended.
             When the update has been applied to the replica, the steps taken so far are moved onto
             the new global model (parameters += new global - where they started) and the round
             goes on from there; its delta is, as in every round, the global model it belongs to
             minus where it ended. Starting the steps ahead from the global model the site holds
             instead (or from it moved again by the last update, a guess of the next one) made the
             validation loss rise after two rounds in the quick time-to-target runs: the outer
             Nesterov momentum amplifies deltas that are a round late, and steps that go on from
             the site's own end point lean the way the next model moves.

The replicas the PS and the sites compare are the same in both (only the sites' training differs),
so the hash checks hold bit for bit. A round never takes more than its budget of steps or compute:
a site whose update arrives later than a whole round of compute waits for it, so the training is
never more than one round ahead of the global model.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import numpy as np
import torch

from ..replica import flat_copy, load_flat, named_params
from .train import InnerLoop, Segment

__all__ = ["Schedule"]


class Schedule:
    """A site's rounds of inner steps under the sync or overlap schedule (see the module's doc)."""

    def __init__(self, inner: InnerLoop, overlap: bool, budget_s: float) -> None:
        self.inner, self.overlap, self.budget_s = inner, overlap, budget_s
        self.ahead: Segment | None = None           # the next round's steps, taken before its RoundStart
        self.base: dict[str, np.ndarray] | None = None   # where the steps ahead started (None once moved)
        self._stop = threading.Event()
        self._task: asyncio.Future | None = None

    async def round(self, round_: int, train_s: float, replica: dict[str, np.ndarray], start_hash: str,
                    stop: threading.Event | None = None, probe: Callable | None = None
                    ) -> tuple[dict[str, np.ndarray], dict]:
        """Round `round_`'s pseudo-gradient against `replica` (the global model it starts from) and its
        figures, with `steps_ahead` and `ahead_s` (compute seconds) taken before this call. Steps taken
        ahead count when they were moved onto that model; otherwise the round starts from it afresh.
        `stop` set ends the round's steps early (after the one under way). `probe(end, delta)` runs
        while the model holds where the round ended (before any step ahead); what it returns is the
        figures' `probe`."""
        seg = self.ahead
        if seg is not None and seg.round == round_ and self.base is None:
            await self._pause()
            seg.train_s = train_s
            ahead = dict(steps_ahead=seg.steps, ahead_s=seg.compute_s)
        else:
            ahead = dict(steps_ahead=0, ahead_s=0.0)
            await self.discard()
            await asyncio.to_thread(load_flat, self.inner.model, replica)
            seg = Segment(round_, train_s)
        self.ahead = None
        await asyncio.to_thread(self.inner.train, seg, stop, start_hash)
        end = await asyncio.to_thread(flat_copy, self.inner.model)
        delta, info = await asyncio.to_thread(self.inner.delta, replica, end, seg, start_hash)
        if probe is not None:
            info["probe"] = await asyncio.to_thread(probe, end, delta)
        if self.overlap:
            self.base = end                   # the steps ahead go on from here
            self.ahead = Segment(round_ + 1, self.budget_s)
            self._resume(start_hash)
        return delta, {**info, **ahead}

    async def moved_to(self, replica: dict[str, np.ndarray]) -> None:
        """The replica now holds the global model the steps ahead belong to: move them onto it."""
        if self.ahead is None or self.base is None:
            return
        await self._pause()
        await asyncio.to_thread(self._move, replica)
        self.base = None
        self._resume("")

    def _move(self, replica: dict[str, np.ndarray]) -> None:
        assert self.base is not None
        with torch.no_grad():
            for name, p in named_params(self.inner.model).items():
                shift = replica[name] - self.base[name]          # new global - where the steps started
                p.add_(torch.from_numpy(shift).view(p.shape).to(p.device))

    async def discard(self) -> None:
        """Drop the steps ahead (a new model was loaded, or the run ended)."""
        await self._pause()
        self.ahead = self.base = None

    def _resume(self, start_hash: str) -> None:
        if self.ahead is not None and not self.ahead.done(self.inner.t):
            self._task = asyncio.ensure_future(asyncio.to_thread(self.inner.train, self.ahead, self._stop,
                                                                 start_hash))

    async def _pause(self) -> None:
        """Stop the steps ahead after the one under way (raising what the training raised)."""
        task, self._task = self._task, None
        if task is None:
            return
        self._stop.set()
        try:
            await task
        finally:
            self._stop.clear()
