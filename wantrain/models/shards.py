"""How a model's tensors are split among parameter-server shards, and the hash of a sharded model.

A run may spread its global model over N PS processes (shards), each its own gRPC endpoint that
receives, aggregates and sends only its own tensors, so the PS's ingest grows with N. Every party
derives the same split from the tensor sizes alone (`ShardLayout.balanced`): the tensors go,
largest first, to the shard that holds the fewest elements so far, and each shard keeps its
tensors in the run's tensor order. One shard (N = 1) is the unsharded PS.

The hash of a sharded model combines the shards' hashes (each `values_hash` of its own tensors);
with one shard it is that shard's hash, so an unsharded run's hashes are what they always were.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from ..errors import ConfigError
from ..transport.messages import HASH_HEX_DIGITS
from .params import values_hash

__all__ = ["ShardLayout", "combine_hashes", "parse_shard"]

MAX_SHARDS = 64


def combine_hashes(hashes: list[str] | tuple[str, ...]) -> str:
    """The model hash of a sharded model from its shards' hashes, in shard order."""
    if len(hashes) == 1:
        return hashes[0]
    return hashlib.sha256(("shards:" + ",".join(hashes)).encode()).hexdigest()[:HASH_HEX_DIGITS]


def parse_shard(text: str) -> tuple[int, int]:
    """`"i/n"` (shard i of n, from 0) as given on a command line; ConfigError names what is wrong."""
    index, sep, count = text.partition("/")
    try:
        i, n = int(index), int(count)
    except ValueError:
        raise ConfigError(f"--shard must look like 1/4 (this PS is shard 1 of 4, counting from 0), got {text!r}") \
            from None
    if not sep or not 1 <= n <= MAX_SHARDS or not 0 <= i < n:
        raise ConfigError(f"--shard {text!r}: need 0 <= index < count <= {MAX_SHARDS}")
    return i, n


@dataclass(frozen=True)
class ShardLayout:
    """Which tensors each shard owns (`tensors[i]`, in the tensor order)."""

    tensors: tuple[tuple[str, ...], ...]
    _owner: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_owner", {t: i for i, names in enumerate(self.tensors) for t in names})

    @classmethod
    def balanced(cls, sizes: dict[str, int], count: int) -> ShardLayout:
        """Split `sizes` (tensor -> elements, in the tensor order) into `count` shards balanced by bytes."""
        if not 1 <= count <= min(MAX_SHARDS, len(sizes)):
            raise ConfigError(f"cannot split a model of {len(sizes)} tensors into {count} shards "
                              f"(1..{min(MAX_SHARDS, len(sizes))})")
        load, owner = [0] * count, {}
        for name in sorted(sizes, key=lambda t: -sizes[t]):          # stable: ties keep the tensor order
            i = min(range(count), key=lambda k: (load[k], k))
            owner[name] = i
            load[i] += sizes[name]
        return cls(tuple(tuple(t for t in sizes if owner[t] == i) for i in range(count)))

    @property
    def count(self) -> int:
        return len(self.tensors)

    def shard_of(self, tensor: str) -> int:
        return self._owner[tensor]

    def part(self, values: dict[str, np.ndarray], i: int) -> dict[str, np.ndarray]:
        """Shard i's tensors of `values` (the same arrays, no copy), in the tensor order."""
        return {t: values[t] for t in self.tensors[i]}

    def hashes(self, values: dict[str, np.ndarray]) -> list[str]:
        return [values_hash(self.part(values, i)) for i in range(self.count)]
