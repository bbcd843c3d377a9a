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
from ..messages import RoundResult, TensorChunk
from ..replica import add_update, flat_copy
from ..shards import ShardLayout, combine_hashes

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
        self.expected_hash = ""         # what the download under way must hash to
        self.decode_s = 0.0             # the last update's decode and add

    def build(self, model: torch.nn.Module, shards: int, chunk_elements: int) -> None:
        """Hold a copy of `model`'s parameters, split among `shards` as the PS splits them."""
        self.arrays = flat_copy(model)
        self.sizes = {k: int(v.size) for k, v in self.arrays.items()}
        self.layout = ShardLayout.balanced(self.sizes, shards)
        self.chunk_elements = chunk_elements

    @property
    def built(self) -> bool:
        return bool(self.arrays)

    def expect(self, round_: int, model_hash: str) -> None:
        """A model of `round_` is on its way (or, on a catch-up, the one held is that round's)."""
        self.round, self.expected_hash = round_, model_hash

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

    def apply(self, parts: list[TensorChunk], result: RoundResult) -> None:
        """Add a round's update, exactly as decoded; the replica moves to the next round."""
        if result.round != self.round:
            raise ProtocolError(f"result for round {result.round}, this replica is at round {self.round}")
        t0 = time.perf_counter()
        parts = sorted(parts, key=lambda c: c.index)
        if not parts or len(parts) != parts[0].count or any(c.round != result.round for c in parts):
            raise ProtocolError(f"round {result.round}: got {len(parts)} update chunks, "
                                f"expected {parts[0].count if parts else 'some'}")
        values = Codec.decode_many([c.data for c in parts])
        try:
            update = join_chunks([c.spec for c in parts], values, self.sizes)
        except CodecError as e:
            raise ProtocolError(f"from the PS: {e}") from None
        for name, u in update.items():
            if not np.all(np.isfinite(u)):
                raise CorruptModelError(f"the update of round {result.round} from the parameter server holds NaN "
                                        f"or Inf in {name!r}: the global model is corrupt; this site stops here")
        add_update(self.arrays, update)
        self.decode_s = time.perf_counter() - t0
        self.round = result.round + 1
        self._rehash()
        if self.hash != result.model_hash:
            log.error("site %s: replica hash %s differs from the PS's %s after round %d", self.site,
                      self.hash, result.model_hash, result.round)

    def _rehash(self) -> None:
        self.part_hashes = self.layout.hashes(self.arrays)
        self.hash = combine_hashes(self.part_hashes)
