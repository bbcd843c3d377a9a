"""A delta's manifest: what each of its chunks is and how much it matters, known before they arrive.

A site builds it from the chunks it is about to send (chunk index, tensor, offset, length, role,
energy, importance, bytes, CRC-32 of the payload, parity group) and sends it first, with the
weight the delta claims (tokens, steps), so the PS knows at every moment how much of the delta's
weighted energy it is still missing, and can count the chunks it has (docs/protocol.md, 2b).

    energy       sum of the squares of the chunk's values as the PS will decode them (after
                 quantization: exactly what the PS loses if the chunk does not arrive)
    importance   role weight x energy, as a share of the delta's total (critical chunks count
                 their energy like any other; they are protected by rule, not by share)

`promote` makes chunks critical (a site promotes a chunk its PS did not count two rounds in a row:
it then goes first, twice, and a round does not close early without it). `protect` picks the
chunks worth parity: the smallest set of non-critical chunks, most important
first, that holds a `share` of the importance, in groups of `group_size`.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from dataclasses import dataclass, replace

import numpy as np

from ..codec import ChunkSpec, Encoded
from ..config import Importance

__all__ = ["ChunkEntry", "Manifest", "DEFAULT_ROLE_WEIGHTS", "build_manifest", "protect", "promote", "checksum"]

DEFAULT_ROLE_WEIGHTS = {"critical": 1.0, "embedding": 1.0, "attention": 1.0, "mlp": 1.0, "other": 1.0}


@dataclass(frozen=True)
class ChunkEntry:
    index: int           # the chunk's place in the delta's plan
    tensor: str
    offset: int          # elements
    length: int
    role: str
    energy: float
    importance: float    # share of the delta's weighted energy, sums to 1 over the chunks
    nbytes: int          # on the wire (scales and payload)
    crc32: int           # of scales + payload
    group: int = -1      # parity group, -1 for none


@dataclass(frozen=True)
class Manifest:
    round: int
    chunks: tuple[ChunkEntry, ...]
    tokens: int = 0      # what the delta's RoundMetrics will claim: its weight
    steps: int = 0

    @property
    def total_energy(self) -> float:
        return sum(c.energy for c in self.chunks)

    def missing(self, arrived: Iterable[int]) -> float:
        """The share of the delta's importance in the chunks not in `arrived` (0 when all are in)."""
        have = set(arrived)
        return sum(c.importance for c in self.chunks if c.index not in have)

    def critical(self) -> frozenset[int]:
        return frozenset(c.index for c in self.chunks if c.role == "critical")


def checksum(enc: Encoded) -> int:
    """A chunk's CRC-32 (zlib) of its scales followed by its payload, as its wire message carries it."""
    return zlib.crc32(enc.payload, zlib.crc32(enc.scales))


def build_manifest(round_: int, chunks: list[tuple[ChunkSpec, Encoded]], decoded: dict[str, np.ndarray],
                   roles: dict[str, str], role_weights: dict[str, float] | None = None, tokens: int = 0,
                   steps: int = 0, by: Importance = Importance.ENERGY) -> Manifest:
    """The manifest of a delta encoded as `chunks` (codec.encode_arrays), `decoded` its values as the
    receiver reconstructs them, `roles` each tensor's (roles.roles_of). `by` "size" weighs each chunk
    by its elements alone, blind to what it holds (an ablation: recovery.importance)."""
    weights = role_weights or DEFAULT_ROLE_WEIGHTS
    energies = []
    for spec, _ in chunks:
        v = decoded[spec.tensor][spec.offset: spec.offset + spec.length].astype(np.float64)
        energies.append(float(np.dot(v, v)))
    weighted = ([float(spec.length) for spec, _ in chunks] if by is Importance.SIZE else
                [weights[roles[spec.tensor]] * e for (spec, _), e in zip(chunks, energies)])
    total = sum(weighted)
    entries = tuple(ChunkEntry(i, spec.tensor, spec.offset, spec.length, roles[spec.tensor], e,
                               w / total if total > 0 else 1.0 / len(chunks), enc.wire_bytes, checksum(enc))
                    for i, ((spec, enc), e, w) in enumerate(zip(chunks, energies, weighted)))
    return Manifest(round_, entries, tokens, steps)


def protect(manifest: Manifest, share: float = 0.5, group_size: int = 8) -> Manifest:
    """The manifest with parity groups over the most important non-critical chunks that together hold
    at least `share` of the importance (groups of `group_size`, in order of importance, so a group's
    members are alike in size and worth); none where that is a single chunk (its parity would be
    its copy)."""
    ranked = sorted((c for c in manifest.chunks if c.role != "critical"), key=lambda c: (-c.importance, c.index))
    chosen, held = [], 0.0
    for c in ranked:
        if held >= share:
            break
        chosen.append(c.index)
        held += c.importance
    if len(chosen) < 2:         # a group of one would be its member's copy: no parity
        chosen = []
    group = {index: n // group_size for n, index in enumerate(chosen)}
    if len(chosen) > 1 and len(chosen) % group_size == 1:    # a last group of one would be its own copy
        group[chosen[-1]] = group[chosen[-2]]
    return replace(manifest, chunks=tuple(replace(c, group=group.get(c.index, -1)) for c in manifest.chunks))


def promote(manifest: Manifest, chunks: Iterable[int]) -> Manifest:
    """The manifest with the entries `chunks` made critical (their importance unchanged)."""
    up = set(chunks)
    return replace(manifest, chunks=tuple(replace(c, role="critical") if c.index in up else c for c in manifest.chunks))
