"""The order a delta's chunks go on the wire, with their protection, and what a set of lost
transmissions leaves missing.

`transmissions(manifest)` lists what a site sends, in order: each critical chunk twice (on two
connections, so one stalled connection cannot hold it), then the protected chunks group by group,
each group followed by its XOR parity (parity.py), then the other chunks, most important first.
`still_missing(manifest, order, lost)` says which chunks the PS cannot have when the transmissions
at positions `lost` did not arrive: a critical chunk only if both its copies are lost, a protected
one only if its group lost two or more of its members and its parity, another chunk when it is lost.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from .manifest import Manifest

__all__ = ["Transmission", "transmissions", "still_missing", "overhead_bytes"]


@dataclass(frozen=True)
class Transmission:
    kind: str        # "chunk", "copy" (a critical chunk's second copy) or "parity"
    index: int       # the chunk's index, or the parity group's number


def transmissions(manifest: Manifest) -> list[Transmission]:
    critical = [c.index for c in manifest.chunks if c.role == "critical"]
    groups: dict[int, list[int]] = {}
    for c in sorted(manifest.chunks, key=lambda c: (-c.importance, c.index)):
        if c.group >= 0 and c.role != "critical":
            groups.setdefault(c.group, []).append(c.index)
    rest = [c.index for c in sorted(manifest.chunks, key=lambda c: (-c.importance, c.index))
            if c.role != "critical" and c.group < 0]
    out = [t for i in critical for t in (Transmission("chunk", i), Transmission("copy", i))]
    for g, members in sorted(groups.items()):
        out += [Transmission("chunk", i) for i in members] + [Transmission("parity", g)]
    return out + [Transmission("chunk", i) for i in rest]


def still_missing(manifest: Manifest, order: list[Transmission], lost: Collection[int]) -> frozenset[int]:
    """The chunks the PS cannot have (see the module's docstring); `lost`: positions in `order`."""
    gone = [order[p] for p in lost if p < len(order)]
    copies_lost: dict[int, int] = {}
    for t in gone:
        if t.kind in ("chunk", "copy"):
            copies_lost[t.index] = copies_lost.get(t.index, 0) + 1
    parity_lost = {t.index for t in gone if t.kind == "parity"}
    by_group: dict[int, list[int]] = {}
    for c in manifest.chunks:
        if c.group >= 0:
            by_group.setdefault(c.group, []).append(c.index)
    missing = set()
    for c in manifest.chunks:
        if c.index not in copies_lost:
            continue
        if c.role == "critical":
            if copies_lost[c.index] >= 2:
                missing.add(c.index)
        elif c.group >= 0:
            lost_members = sum(1 for i in by_group[c.group] if i in copies_lost)
            if lost_members + (c.group in parity_lost) >= 2:
                missing.add(c.index)
        else:
            missing.add(c.index)
    return frozenset(missing)


def overhead_bytes(manifest: Manifest) -> int:
    """Bytes sent beyond the delta's own: a copy of each critical chunk, a parity per group (as long
    as the group's longest member)."""
    groups: dict[int, int] = {}
    for c in manifest.chunks:
        if c.group >= 0:
            groups[c.group] = max(groups.get(c.group, 0), c.nbytes)
    return sum(c.nbytes for c in manifest.chunks if c.role == "critical") + sum(groups.values())
