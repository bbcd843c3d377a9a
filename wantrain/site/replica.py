"""This site's replica of the global model: what it holds, at which round, and its hash.

The replica is flat float32 arrays, one per tensor, kept apart from the parameters the site
trains (schedule.py): the PS's model chunks are placed into it and its updates added to it,
exactly (docs/protocol.md section 6), and it is what the site hashes and reports. The session
(session.py) and the stream to a sharded PS (sharded.py, which sends each shard its part's
hash) both read it here; nothing else writes it.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import torch

from ..codec import Codec, check_coverage, check_fits, join_chunks
from ..errors import CodecError, CorruptModelError, ProtocolError, ReplicaMismatchError
from ..transport.messages import RoundResult, TensorChunk
from ..models.params import add_update, flat_copy
from ..models.shards import ShardLayout, combine_hashes

__all__ = ["Replica"]

log = logging.getLogger("wantrain.site")


class Replica:
    """The global model as this site holds it. One owner for the session and, with a sharded PS, the
    stream that splits its messages per shard (sharded.py reads the layout and the part hashes); it
    is empty until the first Welcome builds it from the site's model (`build`)."""

    def __init__(self, site: str = "site") -> None:
        self.site = site
        self.arrays: dict[str, np.ndarray] = {}
        self.sizes: dict[str, int] = {}
        self.layout = ShardLayout(())       # which shard owns which tensors
        self.chunk_elements = 0             # elements per chunk of the run's chunk plan
        self.round = 0                  # committed rounds the arrays hold
        self.part_hashes: list[str] = []   # the hash of each shard's part (one: the hash)
        self.hash = ""
        self.expected_hash = ""         # what the download under way, or the update's tail, must hash to
        self.decode_s = 0.0             # the last update's decode and add
        self.incoming: list[TensorChunk] = []   # the next update's chunks, until its result comes
        self.incoming_at = 0.0          # perf_counter: the first of them came
        self.download_s = 0.0           # the last update applied: its first chunk to its result
        self.update_began: float | None = None   # perf_counter: that first chunk, until a round takes it
        self.tail: set[int] = set()     # update chunks of round `round - 1` still to come (patched in)

    def build(self, model: torch.nn.Module, shards: int, chunk_elements: int) -> None:
        """Hold a copy of `model`'s parameters, split among `shards` as the PS splits them."""
        self.arrays = flat_copy(model)
        self.sizes = {k: int(v.size) for k, v in self.arrays.items()}
        self.layout = ShardLayout.balanced(self.sizes, shards)
        self.chunk_elements = chunk_elements

    @property
    def built(self) -> bool:
        return bool(self.arrays)

    @property
    def whole(self) -> bool:
        """Does it hold every chunk of the last update (no tail still to come)?"""
        return not self.tail

    @property
    def promised_hash(self) -> str:
        """The hash of the global model it holds, or will once the update's tail is in."""
        return self.hash if self.whole else self.expected_hash

    def expect(self, round_: int, model_hash: str) -> None:
        """A model of `round_` is on its way (or, on a catch-up, the one held is that round's)."""
        self.round, self.expected_hash = round_, model_hash
        self.tail = set()

    def place(self, c: TensorChunk) -> None:
        """One chunk of a model download, straight into the arrays (never a second copy of the model)."""
        (values,) = Codec.decode_many([c.data])
        try:
            check_fits(c.spec, values, self.sizes)
        except CodecError as e:
            raise ProtocolError(f"model chunk from the PS: {e}") from None
        if not np.all(np.isfinite(values)):
            raise CorruptModelError(f"the model the parameter server sent (round {self.round}) holds NaN or Inf in "
                                    f"{c.spec.tensor!r}: the global model is corrupt; this site will not train on it")
        self.arrays[c.spec.tensor][c.spec.offset: c.spec.offset + c.spec.length] = values

    def finish_download(self, specs: list) -> None:
        try:
            check_coverage(specs, self.sizes)
        except CodecError as e:
            raise ProtocolError(f"model download from the PS: {e}") from None
        self._rehash()
        if self.hash != self.expected_hash:
            raise ReplicaMismatchError(f"downloaded model hashes to {self.hash}, the PS says {self.expected_hash}")
        log.info("site %s: model at round %d loaded (%s)", self.site, self.round, self.hash)

    def new_session(self) -> None:
        """A new session: the chunks of an update the last one did not finish go (the PS sends what
        this replica misses again), and so does the time an update began to arrive."""
        self.incoming, self.update_began = [], None

    def receive(self, c: TensorChunk) -> None:
        """A chunk of the next update, held until its result (`apply_received`)."""
        if not self.incoming:
            self.incoming_at = time.perf_counter()
        self.incoming.append(c)

    def apply_received(self, result: RoundResult) -> None:
        """Apply the update received since the last (`receive`), now that its result is in; timed:
        `download_s` from its first chunk to its result (taken here, in the worker thread)."""
        parts, self.incoming = self.incoming, []
        self.download_s = time.perf_counter() - self.incoming_at if parts else 0.0
        if parts:
            self.update_began = self.incoming_at
        self.apply(parts, result)

    def take_update_began(self) -> float | None:
        """When the update a round starts from began to arrive (perf_counter), once; None if no update
        came since the last round took it."""
        began, self.update_began = self.update_began, None
        return began

    def apply(self, parts: list[TensorChunk], result: RoundResult) -> None:
        """Add a round's update, exactly as decoded; the replica moves to the next round. With a tail
        (`result.tail_chunks`), `parts` is the update's head: the rest is patched in as it lands
        (`patch`), and the hash waits for it."""
        if result.round != self.round:
            raise ProtocolError(f"result for round {result.round}, this replica is at round {self.round}")
        if not self.whole:
            raise ProtocolError(f"result for round {result.round} before the last {len(self.tail)} chunk(s) of "
                                f"round {self.round - 1}'s update")
        t0 = time.perf_counter()
        parts = sorted(parts, key=lambda c: c.index)
        count = parts[0].count if parts else 0
        indices = {c.index for c in parts}
        if (not parts or len(indices) != len(parts) or len(parts) + result.tail_chunks != count
                or any(c.round != result.round or c.count != count for c in parts)):
            raise ProtocolError(f"round {result.round}: got {len(parts)} update chunks and {result.tail_chunks} to "
                                f"follow, expected {count or 'some'} in all")
        values = Codec.decode_many([c.data for c in parts])
        if result.tail_chunks:       # the head: chunks placed one by one (join_chunks wants every one)
            for c, v in zip(parts, values):
                self._add(c, v)
        else:
            try:
                update = join_chunks([c.spec for c in parts], values, self.sizes)
            except CodecError as e:
                raise ProtocolError(f"from the PS: {e}") from None
            for name, u in update.items():
                self._check_finite(result.round, name, u)
            add_update(self.arrays, update)
        self.decode_s = time.perf_counter() - t0
        self.round = result.round + 1
        self.tail = set(range(count)) - indices
        self.expected_hash = result.model_hash
        if self.whole:
            self._rehash()
            self._compare(result.round)
        else:
            self.hash = ""          # not a committed model's until the tail is in

    def patch(self, c: TensorChunk) -> np.ndarray:
        """One chunk of the last update's tail, added in place; returns its decoded values (which the
        parameters being trained take too: schedule.py). The hash once the last is in."""
        if c.round != self.round - 1 or c.index not in self.tail:
            raise ProtocolError(f"update chunk {c.index} of round {c.round} is not one this site awaits "
                                f"(round {self.round - 1}'s tail: {len(self.tail)} chunk(s) to come)")
        (values,) = Codec.decode_many([c.data])
        self._add(c, values)
        self.tail.discard(c.index)
        if self.whole:
            self._rehash()
            self._compare(c.round)
        return values

    def _add(self, c: TensorChunk, values: np.ndarray) -> None:
        try:
            check_fits(c.spec, values, self.sizes)
        except CodecError as e:
            raise ProtocolError(f"update chunk from the PS: {e}") from None
        self._check_finite(c.round, c.spec.tensor, values)
        self.arrays[c.spec.tensor][c.spec.offset: c.spec.offset + c.spec.length] += values

    @staticmethod
    def _check_finite(round_: int, name: str, values: np.ndarray) -> None:
        if not np.all(np.isfinite(values)):
            raise CorruptModelError(f"the update of round {round_} from the parameter server holds NaN "
                                    f"or Inf in {name!r}: the global model is corrupt; this site stops here")

    def _compare(self, round_: int) -> None:
        if self.hash != self.expected_hash:
            log.error("site %s: replica hash %s differs from the PS's %s after round %d", self.site,
                      self.hash, self.expected_hash, round_)

    def _rehash(self) -> None:
        self.part_hashes = self.layout.hashes(self.arrays)
        self.hash = combine_hashes(self.part_hashes)
