"""The order a delta's chunks go on the wire, with their protection, and what a set of lost
transmissions leaves missing.

`transmissions(manifest, copies)` lists what a site sends, in order: the critical chunks, then (with
`copies`) each of them again, so that one loss, or one short burst, cannot take a critical chunk;
then the protected chunks group by group, each group followed by its XOR parity (parity.py), then
the other chunks, most important first. `still_missing(manifest, order, lost)` says which chunks the
PS cannot have when the transmissions at positions `lost` did not arrive: a chunk whose every copy
is lost, unless it is in a parity group whose other members and parity all arrived.
`to_resend(manifest, order, lost)` is what the site sends again: those chunks, in sending order,
less one of each group whose parity arrived (the PS rebuilds it once the others come).
`ProtectionGauge` sizes a site's parity and copies by the loss its link showed.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from ..codec import ChunkSpec, Encoded
from ..config import RecoveryConfig
from .manifest import Manifest
from .parity import xor_parity

__all__ = ["Transmission", "transmissions", "still_missing", "to_resend", "overhead_bytes", "MAX_HEDGES",
           "ProtectionGauge", "PROTECT_FULL_AT", "group_parities"]

MAX_HEDGES = 3      # times a site hedges one chunk at most (site/sender.py); the PS takes that many repeats


@dataclass(frozen=True)
class Transmission:
    kind: str        # "chunk", "copy" (a critical chunk's second copy) or "parity"
    index: int       # the chunk's index, or the parity group's number


def transmissions(manifest: Manifest, copies: bool = True) -> list[Transmission]:
    ranked = sorted(manifest.chunks, key=lambda c: (-c.importance, c.index))
    critical = [c.index for c in manifest.chunks if c.role == "critical"]
    groups: dict[int, list[int]] = {}
    for c in ranked:
        if c.group >= 0 and c.role != "critical":
            groups.setdefault(c.group, []).append(c.index)
    rest = [c.index for c in ranked if c.role != "critical" and c.group < 0]
    out = [Transmission("chunk", i) for i in critical]
    if copies:
        out += [Transmission("copy", i) for i in critical]
    for g, members in sorted(groups.items()):
        out += [Transmission("chunk", i) for i in members] + [Transmission("parity", g)]
    return out + [Transmission("chunk", i) for i in rest]


def still_missing(manifest: Manifest, order: list[Transmission], lost: Collection[int]) -> frozenset[int]:
    """The chunks the PS cannot have (see the module's docstring); `lost`: positions in `order`."""
    sent: dict[int, int] = {}
    for t in order:
        if t.kind in ("chunk", "copy"):
            sent[t.index] = sent.get(t.index, 0) + 1
    gone: dict[int, int] = {}
    parity_lost = set()
    for p in lost:
        if p >= len(order):
            continue
        t = order[p]
        if t.kind == "parity":
            parity_lost.add(t.index)
        else:
            gone[t.index] = gone.get(t.index, 0) + 1
    lost_chunks = {i for i, n in gone.items() if n >= sent[i]}
    members: dict[int, list[int]] = {}
    for c in manifest.chunks:
        if c.group >= 0:
            members.setdefault(c.group, []).append(c.index)
    has_parity = {t.index for t in order if t.kind == "parity"}
    missing = set()
    for i in lost_chunks:
        g = manifest.chunks[i].group
        if g >= 0 and g in has_parity and g not in parity_lost and \
                sum(m in lost_chunks for m in members[g]) == 1:
            continue                    # rebuilt from the group's parity
        missing.add(i)
    return frozenset(missing)


def to_resend(manifest: Manifest, order: list[Transmission], lost: Collection[int]) -> list[int]:
    """The chunks to send again (see the module's docstring); `lost`: positions in `order`."""
    missing = still_missing(manifest, order, lost)
    resend = list(dict.fromkeys(t.index for t in order if t.kind != "parity" and t.index in missing))
    gone = set(lost)
    parity_in = {t.index for n, t in enumerate(order) if t.kind == "parity" and n not in gone}
    last_of: dict[int, int] = {}                  # a group whose parity is in -> its last missing member
    for i in resend:
        if (g := manifest.chunks[i].group) in parity_in:
            last_of[g] = i
    return [i for i in resend if i not in last_of.values()]


def group_parities(manifest: Manifest, chunks: list[tuple[ChunkSpec, Encoded]]) -> dict[int, bytes]:
    """Each parity group's XOR parity over its members' scales and payloads (docs/protocol.md 4a)."""
    groups: dict[int, list[bytes]] = {}
    for c in manifest.chunks:
        if c.group >= 0:
            enc = chunks[c.index][1]
            groups.setdefault(c.group, []).append(enc.scales + enc.payload)
    return {g: xor_parity(members) for g, members in groups.items()}


def overhead_bytes(manifest: Manifest) -> int:
    """Bytes sent beyond the delta's own: a copy of each critical chunk, a parity per group (as long
    as the group's longest member)."""
    groups: dict[int, int] = {}
    for c in manifest.chunks:
        if c.group >= 0:
            groups[c.group] = max(groups.get(c.group, 0), c.nbytes)
    return sum(c.nbytes for c in manifest.chunks if c.role == "critical") + sum(groups.values())


# recovery.protection_adapts: a delta gets all of recovery.parity_share's parity once this share of a push's
# chunks was lost lately (bench/loss_recovery.py measured parity's gain at 1-10 % of chunks lost).
PROTECT_FULL_AT = 0.02


class ProtectionGauge:
    """How much protection a site's deltas carry on the wire, by the loss its link showed (one per
    uplink). With recovery.protection_adapts: parity over recovery.parity_share of a delta's importance in
    proportion to the share of its chunks the link lost lately (hedged or sent again), all of it from
    PROTECT_FULL_AT, none below a tenth of that; and the critical chunks' copies
    (recovery.critical_copies) while there is any parity. The loss seen falls to a quarter with each
    clean push, and counts as PROTECT_FULL_AT until the first. A clean link then pays for
    protection on its first two pushes only (a parity costs a group's longest chunk however few
    chunks the share covers; a copy of the small critical tensors costs each its chunk's headers and
    code tables, about 0.09 bit a parameter of `tiny`), and a loss brings it back on the next push;
    what goes unprotected meanwhile is hedged over the lanes once it looks lost."""

    def __init__(self, recovery: RecoveryConfig) -> None:
        self.most, self.adapts, self.copying = recovery.parity_share, recovery.protection_adapts, recovery.critical_copies
        self.loss_seen = PROTECT_FULL_AT

    def saw_loss(self, share: float) -> None:
        """A push's chunks its link lost (hedged, or sent again late), as a share of its chunks."""
        self.loss_seen = max(share, self.loss_seen / 4)

    def share(self) -> float:
        if not self.adapts:
            return self.most
        scale = min(1.0, self.loss_seen / PROTECT_FULL_AT)
        return self.most * scale if scale >= 0.1 else 0.0

    def copies(self) -> bool:
        """Do the critical chunks go twice?"""
        if not self.adapts:
            return self.copying
        return self.copying and self.loss_seen >= PROTECT_FULL_AT / 10
