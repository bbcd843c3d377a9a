"""When a site computes: the round schedules of `schedule.mode`.

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

Under sync with train.fragments > 1 (Streaming DiLoCo, wantrain/outer/fragments.py), a round reloads
from the replica only the tensors synchronized since the site last trained (the whole model after a
Welcome, or when it missed a whole cycle of fragments); the others go on from where they were, and
its delta is zero outside its own round's fragment. Where an update moved a tensor outside its
round's fragment (a late delta of the round that synchronized it, applied at a later commit), the
tensor's training moves by as much, as steps ahead do under overlap: its next delta is then the
steps alone, and does not take back the late delta.

Under sync, a round may start before the last update's tail is in (recovery.downlink_budget,
ps/downlink.py): it starts from a copy of the replica, and each tail chunk, added to the
replica as it lands, is added between two inner steps to the parameters being trained and to that
copy alike, so the delta (copy - end) is still the steps taken, never the patch. A site of several
processes (group.py) takes the patches at its next round instead: every rank must step alike.

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

from ..codec import ChunkSpec
from ..outer.fragments import synced
from ..transport.messages import TensorChunk
from ..models.params import flat_copy, load_flat, named_params
from .replica import Replica
from .train import InnerLoop, Segment

__all__ = ["Schedule"]


class Schedule:
    """A site's rounds of inner steps under the sync or overlap schedule (see the module's doc)."""

    def __init__(self, inner: InnerLoop, overlap: bool, budget_s: float, fragments: int = 1) -> None:
        self.inner, self.overlap, self.budget_s, self.fragments = inner, overlap, budget_s, fragments
        self.sizes = {k: p.numel() for k, p in named_params(inner.model).items()}
        self.trained: int | None = None             # the round last trained from the model as it is (fragments)
        self.held: dict[str, np.ndarray] = {}       # and the replica the tensors it did not sync stand on
        self.ahead: Segment | None = None           # the next round's steps, taken before its RoundStart
        self.base: dict[str, np.ndarray] | None = None   # where the steps ahead started (None once moved)
        self._stop = threading.Event()
        self._task: asyncio.Future | None = None
        # The last update's tail (see the module's doc): what came since the round started, not yet
        # in the parameters being trained, and the copy of the replica the round started from.
        self._lock = threading.Lock()
        self._patches: list[tuple[ChunkSpec, np.ndarray]] = []
        self._start: dict[str, np.ndarray] | None = None

    async def round(self, round_: int, train_s: float, replica: Replica, stop: threading.Event | None = None,
                    probe: Callable | None = None) -> tuple[dict[str, np.ndarray], dict]:
        """Round `round_`'s pseudo-gradient against `replica` (the global model it starts from) and its
        figures, with `steps_ahead` and `ahead_s` (compute seconds) taken before this call. Steps taken
        ahead count when they were moved onto that model; otherwise the round starts from it afresh.
        `stop` set ends the round's steps early (after the one under way). `probe(end, delta)` runs
        while the model holds where the round ended (before any step ahead); what it returns is the
        figures' `probe`."""
        seg = self.ahead
        start_hash = replica.promised_hash
        if seg is not None and seg.round == round_ and self.base is None:
            await self._pause()
            seg.train_s = train_s
            ahead = dict(steps_ahead=seg.steps, ahead_s=seg.compute_s)
            start = replica.arrays
        else:
            ahead = dict(steps_ahead=0, ahead_s=0.0)
            await self.discard()
            start = await asyncio.to_thread(self._load, replica, self._reloaded(round_))
            seg = Segment(round_, train_s)
        self.ahead = None
        patch = self._take_patches if self.inner.takes_patches else None
        await asyncio.to_thread(self.inner.train, seg, stop, start_hash, patch)
        end = await asyncio.to_thread(self._end)
        delta, info = await asyncio.to_thread(self.inner.delta, start, end, seg, start_hash)
        self._start = None
        if (fragment := synced(self.sizes, self.fragments, round_)) is not None:
            delta = {k: v if k in fragment else np.zeros_like(v) for k, v in delta.items()}
            self.trained = round_
            self.held = {k: start[k].copy() for k in delta if k not in fragment}
        if probe is not None:
            info["probe"] = await asyncio.to_thread(probe, end, delta)
        if self.overlap:
            self.base = end                   # the steps ahead go on from here
            self.ahead = Segment(round_ + 1, self.budget_s)
            self._resume(start_hash)
        return delta, {**info, **ahead}

    def _reloaded(self, round_: int) -> frozenset[str] | None:
        """Under fragments, the tensors synchronized since the site last trained (None: all)."""
        if self.trained is None or round_ - self.trained >= self.fragments:
            return None
        return frozenset().union(*(synced(self.sizes, self.fragments, r) or () for r in range(self.trained, round_)))

    def reload(self) -> None:
        """A Welcome: the next round starts from the whole replica (fragments)."""
        self.trained, self.held = None, {}

    def _load(self, replica: Replica, only: frozenset[str] | None = None) -> dict[str, np.ndarray]:
        """Load the replica into the model (`only` those tensors); the arrays the round starts from
        (a copy while the last update's tail is still to come: the replica's then change under the round)."""
        with self._lock:
            self._patches.clear()           # already in the replica, so in what is loaded
            self._start = None if replica.whole else {k: v.copy() for k, v in replica.arrays.items()}
            start = replica.arrays if self._start is None else self._start
            load_flat(self.inner.model, start if only is None else {k: start[k] for k in only})
            if only is not None:      # a tensor that trains on moves as the replica moved (a late delta)
                self._move(start, {k: v for k, v in self.held.items() if k not in only})
            return start

    def patch(self, replica: Replica, c: TensorChunk) -> None:
        """A chunk of the last update's tail: into the replica, and (at the next step boundary) into
        the round training from a copy of it, if one is. In a worker thread."""
        with self._lock:
            values = replica.patch(c)
            if self._start is not None:
                self._patches.append((c.spec, values))

    def _take_patches(self) -> None:
        """Between two inner steps (the training thread): the tail chunks come since, into the
        parameters being trained and into the copy the round started from alike."""
        with self._lock:
            if not self._patches or self._start is None:
                return
            params = named_params(self.inner.model)
            with torch.no_grad():
                for spec, values in self._patches:
                    part = slice(spec.offset, spec.offset + spec.length)
                    self._start[spec.tensor][part] += values
                    params[spec.tensor].view(-1)[part] += torch.from_numpy(values).to(params[spec.tensor].device)
            self._patches.clear()

    def _end(self) -> dict[str, np.ndarray]:
        """Where the round ended, with the tail chunks come during its last step."""
        if self.inner.takes_patches:
            self._take_patches()
        with self._lock:             # a patch after this is in the replica, and in the next round's start
            return flat_copy(self.inner.model)

    async def moved_to(self, replica: dict[str, np.ndarray]) -> None:
        """The replica now holds the global model the steps ahead belong to: move them onto it."""
        if self.ahead is None or self.base is None:
            return
        await self._pause()
        await asyncio.to_thread(self._move, replica, self.base)
        self.base = None
        self._resume("")

    def _move(self, replica: dict[str, np.ndarray], base: dict[str, np.ndarray]) -> None:
        """The parameters of `base`'s tensors move by replica - base: steps taken from `base` go on
        from the global model the replica now holds."""
        params = named_params(self.inner.model)
        with torch.no_grad():
            for name, was in base.items():
                shift = replica[name] - was
                if shift.any():   # under fragments a round leaves most tensors where they were: no copy to the device
                    p = params[name]
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
