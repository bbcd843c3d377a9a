"""A site's delta for one round as it arrives, and the checks it passes before it counts.

`check_manifest` runs on a delta's manifest, if the site sends one (before the chunks: does it
describe this run's chunk plan, is the weight it claims allowed); `check_chunk` runs on every
delta chunk (does it belong to this run's chunk plan, is it sized like one, is it the chunk the
manifest described); a chunk that passes is decoded at once on the process's CPU pool (`extract_chunk`),
so a delta is decoded while it arrives and its wire bytes are dropped as soon as they are (a member
of a parity group keeps its bytes until its group is whole); `check_parity` runs on a group's XOR
parity, and `Upload.rebuilt_chunk` makes the one member a group lacks from it; `assemble`
runs once the site's metrics say the delta is complete (every chunk decodable and finite, the whole
not out of all proportion to the model); `assemble_part` checks the same of the chunks in at a
deadline, for a round that counts them (recovery.partial_deltas). They raise ProtocolError or a quarantine error for the
one site and change nothing else.
"""

from __future__ import annotations

import asyncio
import math
import time
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np

from ..runtime import cpu_pool
from ..codec import ChunkSpec, Codec, Encoded, Extracted
from ..codec.quantize import num_blocks
from ..config import CodecConfig, RunConfig
from ..errors import CodecError, DeltaRejectedError, NonFiniteDeltaError, ProtocolError, WantrainError
from ..transport.messages import DELTA, DeltaParity, Manifest, RoundMetrics, TensorChunk
from ..transport.manifest import checksum
from ..transport.sending import MAX_HEDGES
from ..transport.parity import rebuild
from ..outer.screening import check_weight, max_delta_scale, sum_of_squares

__all__ = ["Upload", "check_manifest", "check_chunk", "check_parity", "rebuild_member", "extract_chunk", "assemble", "assemble_part"]

Checked = tuple[Extracted, float]           # a decoded chunk and its squared L2 norm


@dataclass
class Upload:
    """A site's delta for one round, as it arrives."""

    round: int
    train_s: float = 0.0           # the compute budget its RoundStart gave (0: fixed inner steps)
    whole_only: bool = False       # its site was not in the round before (it joined, rejoined, came back):
                                   # the delta counts whole or not at all (no loss tolerated)
    count: int = -1
    decoding: dict[int, Future[Checked]] = field(default_factory=dict)   # chunk index -> extract_chunk
    wire_bytes: int = 0
    metrics: RoundMetrics | None = None
    delta: list[Extracted] | None = None   # checked; int8 symbols + scales: a quarter of fp32
    norm: float = 0.0
    journaled: asyncio.Future | None = None   # its write into the PS's journal (journal.py)
    first_chunk_at: float = 0.0    # when its first chunk arrived (perf_counter)
    last_chunk_at: float = 0.0     # and its latest: once the last is in, the PS holds it all
    share: float = 0.0             # late_policy zero-outside: its share of the round that committed without it
    manifest: Manifest | None = None   # what the site said the delta holds, before its chunks
    counted: frozenset[int] = frozenset()   # chunks its round counted before the rest came (partial_deltas)
    importance_in: float = 0.0     # of the manifest's importance, what the chunks in so far hold
    critical_missing: int = 0      # the manifest's critical chunks not in yet
    groups: dict[int, tuple[int, ...]] = field(default_factory=dict)   # parity group -> its members (manifest)
    parities: dict[int, bytes] = field(default_factory=dict)   # a group's parity, until the group is whole
    parity_seen: set[int] = field(default_factory=set)         # groups whose parity came
    member_bytes: dict[int, bytes] = field(default_factory=dict)   # scales + payload of members of such groups
    rebuilt: set[int] = field(default_factory=set)     # chunks made from their group's parity and never
                                                       # come themselves: lost (a parity that overtook its
                                                       # member on another lane rebuilt nothing lost)
    repeats: dict[int, int] = field(default_factory=dict)   # chunk -> times it came again (a copy, a hedge)
    protection_bytes: int = 0      # copies and parity: bytes beyond the delta's own
    parity_bytes: int = 0          # of which parity
    framed_bytes: int = 0          # every message of this delta as it came over gRPC (manifest, chunks,
                                   # copies, hedges, parities, metrics: serialized, with gRPC's prefix)
    encoding: str = ""             # its chunks' encoding, from its first (one delta, one encoding)

    @property
    def checked(self) -> list[Extracted]:
        """The delta once checked: only complete, checked uploads reach a commit."""
        assert self.delta is not None
        return self.delta

    def add(self, site: str, c: TensorChunk, rebuilt: bool = False) -> None:
        """Take a checked chunk and start decoding it (the pool's thread holds the wire bytes until then)."""
        self.last_chunk_at = time.perf_counter()
        if not self.decoding:
            self.first_chunk_at = self.last_chunk_at
        self.count = c.count
        self.encoding = c.data.encoding
        self.decoding[c.index] = cpu_pool.submit(extract_chunk, site, c)
        if self.manifest is not None:
            entry = self.manifest.chunks[c.index]
            self.importance_in += entry.importance
            self.critical_missing -= entry.role == "critical"
            if entry.group in self.groups:
                self.member_bytes[c.index] = c.data.scales + c.data.payload
                self._settle_group(entry.group)
        if rebuilt:
            self.rebuilt.add(c.index)
        self.wire_bytes += c.data.wire_bytes

    def came(self, nbytes: int) -> None:
        """A message of this delta came, `nbytes` on the wire (serialized, with gRPC's prefix)."""
        self.framed_bytes += nbytes

    def add_repeat(self, c: TensorChunk) -> None:
        """A chunk that came again (check_chunk allowed it): counted as bytes, nothing else. The first
        coming of a chunk its group's parity rebuilt is not a repeat: it was not lost after all."""
        if c.index in self.rebuilt:
            self.rebuilt.discard(c.index)      # its bytes are the delta's own, counted when it was rebuilt
            return
        self.repeats[c.index] = self.repeats.get(c.index, 0) + 1
        self.protection_bytes += c.data.wire_bytes

    def take_parity(self, p: DeltaParity) -> None:
        """A group's parity (checked: check_parity)."""
        self.parities[p.group] = p.payload
        self.parity_seen.add(p.group)
        self.protection_bytes += len(p.payload)
        self.parity_bytes += len(p.payload)
        self._settle_group(p.group)

    def lacks(self, group: int) -> list[int]:
        """The members of `group` not in yet."""
        return [i for i in self.groups[group] if i not in self.decoding]

    def _settle_group(self, group: int) -> None:
        """A group whose every member is in needs neither its parity nor its members' bytes."""
        if not self.lacks(group):
            self.parities.pop(group, None)
            for i in self.groups[group]:
                self.member_bytes.pop(i, None)

    def rebuilt_chunk(self, group: int, plan: list[ChunkSpec], quant_block: int) -> TensorChunk | None:
        """The one member `group` lacks, made from its parity and the others, once they are all in
        (None before), in the others' encoding. It is what the site would have sent if the rebuild is
        right: check_chunk compares it with the manifest's CRC-32 and size."""
        lacking = self.lacks(group)
        if len(lacking) != 1 or group not in self.parities:
            return None
        i = lacking[0]
        assert self.manifest is not None
        entry = self.manifest.chunks[i]
        present = [self.member_bytes[m] for m in self.groups[group] if m != i]
        try:
            raw = rebuild(self.parities[group], present, entry.nbytes)
        except WantrainError as e:
            raise ProtocolError(f"the parity of group {group} of round {self.round} cannot rebuild chunk {i}: "
                                f"{e}") from None
        mode = self.encoding
        n_scales = 0 if mode == "fp32" else 4 * num_blocks(entry.length, quant_block)
        data = Encoded(mode, entry.length, 0 if mode == "fp32" else quant_block, raw[:n_scales], raw[n_scales:])
        try:
            data.check()
        except CodecError as e:
            raise ProtocolError(f"the parity of group {group} of round {self.round} rebuilds chunk {i} as no chunk "
                                f"of this run: {e}") from None
        return TensorChunk(DELTA, self.round, i, len(plan), plan[i], data)

    @property
    def all_chunks_in(self) -> bool:
        """Every chunk is in and its metrics are yet to be checked (on_metrics): about to complete."""
        return self.metrics is None and self.count > 0 and len(self.decoding) == self.count

    @property
    def counts_in_part(self) -> bool:
        """May a round count the chunks in of this delta without the rest (recovery.partial_deltas)? It
        has a manifest and some chunks, and its site tolerates loss (not `whole_only`)."""
        return self.manifest is not None and bool(self.decoding) and not self.whole_only

    @property
    def missing_importance(self) -> float | None:
        """The share of the delta's importance in chunks not yet in (None without a manifest)."""
        return None if self.manifest is None else max(0.0, 1.0 - self.importance_in)

    def take_manifest(self, m: Manifest) -> None:
        """The delta's manifest (checked: check_manifest), before any chunk."""
        self.manifest, self.critical_missing = m, len(m.critical())
        groups: dict[int, list[int]] = {}
        for e in m.chunks:
            if e.group >= 0:
                groups.setdefault(e.group, []).append(e.index)
        self.groups = {g: tuple(members) for g, members in groups.items()}

    @property
    def upload_s(self) -> float:
        """From the first chunk's arrival to the last's: the delta's time on the wire, as the site sends
        its smallest chunk first (less the link's one-way delay, which the first chunk took too)."""
        return self.last_chunk_at - self.first_chunk_at


def max_chunk_bytes(length: int) -> int:
    """The most scales and payload bytes a delta chunk of `length` elements may carry: float32's, and
    a Huffman payload's code tables and block index (docs/protocol.md section 7)."""
    return 4 * length + 65536


def check_manifest(cfg: RunConfig, up: Upload, m: Manifest, plan: list[ChunkSpec]) -> None:
    """Does manifest `m` describe the delta `up` will hold? It comes before the delta's first chunk,
    once, lists the plan's chunks, and claims a weight the round allowed (screening.check_weight)."""
    if up.manifest is not None:
        raise ProtocolError(f"the manifest of round {m.round} arrived twice")
    if up.decoding or up.metrics is not None:
        raise ProtocolError(f"the manifest of round {m.round} came after its delta's first chunk: it comes first")
    if len(m.chunks) != len(plan):
        raise ProtocolError(f"a delta comes in {len(plan)} chunks here, the manifest of round {m.round} lists "
                            f"{len(m.chunks)}")
    for e, spec in zip(m.chunks, plan):
        if (e.tensor, e.offset, e.length) != (spec.tensor, spec.offset, spec.length):
            raise ProtocolError(f"manifest entry {e.index} covers {e.tensor!r}[{e.offset}:{e.offset + e.length}], "
                                f"the plan says {spec.tensor!r}[{spec.offset}:{spec.offset + spec.length}]")
        if not 1 <= e.nbytes <= max_chunk_bytes(e.length):      # it sizes a parity and a rebuilt chunk
            raise ProtocolError(f"manifest entry {e.index} says its chunk has {e.nbytes} bytes; a chunk of "
                                f"{e.length} elements has 1 to {max_chunk_bytes(e.length)}")
    check_weight(cfg, f"the manifest of round {m.round}", m.steps, m.tokens, up.train_s)


# Of one protected chunk: itself, its critical copy, its hedges (docs/protocol.md 4a, 4b); of any
# other, where sites hedge every chunk: itself and its hedges.
MAX_ARRIVALS = 2 + MAX_HEDGES
MAX_HEDGED_ARRIVALS = 1 + MAX_HEDGES


def check_chunk(up: Upload, c: TensorChunk, plan: list[ChunkSpec], shapes: dict[str, int], modes: tuple[str, ...],
                quant_block: int, hedge_all: bool = False) -> bool:
    """Does chunk `c` belong in `up`? Caps it so that one upload holds at most one model's worth of
    delta in the PS's memory: the chunks are exactly the plan's, each at most fp32-sized (+ headers),
    each index once, but that a protected chunk (critical, in a parity group, or rebuilt from
    parity) may come up to MAX_ARRIVALS times in all: a critical copy, hedges on other lanes
    (docs/protocol.md 4a, 4b); with `hedge_all` (recovery.hedge_all), any other chunk of a delta with
    a manifest MAX_HEDGED_ARRIVALS times: itself and its hedges. A repeat is counted, not kept.
    (A site has one upload per round it still owes: at most a few.) A delta's chunks share one of
    `modes` (codec.delta_modes: a site's codec is its own setting), quantized in blocks of the run's
    `quant_block` (which sizes what decoding allocates). True for a chunk not in yet;
    False for such a repeat."""
    if c.kind != DELTA:
        raise ProtocolError(f"sites send delta chunks only, got a {c.kind} chunk")
    if up.metrics is not None:
        raise ProtocolError(f"delta chunk {c.index} of round {c.round} after the round's metrics")
    if c.count != len(plan):
        raise ProtocolError(f"a delta comes in {len(plan)} chunks here, this one says {c.count}")
    numel = shapes.get(c.spec.tensor)
    if numel is None:
        raise ProtocolError(f"delta chunk names unknown tensor {c.spec.tensor!r}")
    if c.spec.offset + c.spec.length > numel:
        raise ProtocolError(f"delta chunk [{c.spec.offset}, {c.spec.offset + c.spec.length}) is outside "
                            f"tensor {c.spec.tensor!r} of {numel} elements")
    spec = plan[c.index]
    if c.spec != spec:
        raise ProtocolError(f"delta chunk {c.index} covers {c.spec.tensor!r}[{c.spec.offset}:"
                            f"{c.spec.offset + c.spec.length}], the plan says "
                            f"{spec.tensor!r}[{spec.offset}:{spec.offset + spec.length}]")
    if c.data.encoding not in modes:
        raise ProtocolError(f"delta chunk {c.index} is encoded {c.data.encoding}; this run's deltas may be "
                            f"{', '.join(modes)} (those that fit the chunk plan of its codec.mode)")
    if c.data.encoding != "fp32" and c.data.quant_block != quant_block:
        raise ProtocolError(f"delta chunk {c.index} is quantized in blocks of {c.data.quant_block} elements; this "
                            f"run's codec.quant_block is {quant_block}")
    if up.encoding and c.data.encoding != up.encoding:
        raise ProtocolError(f"delta chunk {c.index} of round {c.round} is encoded {c.data.encoding}, the delta's "
                            f"first {up.encoding} (a delta is in one encoding)")
    said = up.manifest.chunks[c.index] if up.manifest is not None else None
    if c.index in up.decoding:
        protected = said is not None and (said.role == "critical" or said.group >= 0 or c.index in up.rebuilt)
        arrivals = MAX_ARRIVALS if protected else MAX_HEDGED_ARRIVALS if said is not None and hedge_all else 1
        if (times := up.repeats.get(c.index, 0) + 2) > arrivals:
            said_times = "twice" if times == 2 else f"{times} times"
            raise ProtocolError(f"delta chunk {c.index} of round {c.round} arrived {said_times} (only a protected "
                                f"chunk: critical, in a parity group or rebuilt from parity, may come again, "
                                f"{MAX_ARRIVALS} times in all; with recovery.hedge_all, any other {MAX_HEDGED_ARRIVALS} "
                                f"times)")
    if c.data.wire_bytes > max_chunk_bytes(c.spec.length):
        raise ProtocolError(f"delta chunk {c.index} carries {c.data.wire_bytes} bytes for {c.spec.length} elements")
    if said is not None and (said.crc32, said.nbytes) != (checksum(c.data), c.data.wire_bytes):
        raise ProtocolError(f"delta chunk {c.index} of round {c.round} is not the chunk its manifest described "
                            f"(CRC-32 and bytes differ)")
    return c.index not in up.decoding


def check_parity(up: Upload, p: DeltaParity) -> None:
    """Does parity `p` belong in `up`? Its delta has a manifest with group `p.group`, it comes once,
    before the metrics, as long as the group's longest member."""
    what = f"the parity of group {p.group} of round {p.round}"
    if up.manifest is None:
        raise ProtocolError(f"{what} came without a manifest: parity groups are the manifest's")
    if up.metrics is not None:
        raise ProtocolError(f"{what} came after the round's metrics")
    if p.group not in up.groups:
        raise ProtocolError(f"{what} names a group its manifest does not have")
    if p.group in up.parity_seen:
        raise ProtocolError(f"{what} arrived twice")
    longest = max(up.manifest.chunks[i].nbytes for i in up.groups[p.group])
    if len(p.payload) != longest:
        raise ProtocolError(f"{what} has {len(p.payload)} bytes; its group's longest member {longest}")


def rebuild_member(up: Upload, site: str, group: int, plan: list[ChunkSpec], shapes: dict[str, int],
                   codec: CodecConfig) -> None:
    """If `group` lacks one member and has its parity and the others, rebuild that member and take it
    as if it had come (check_chunk first: a parity that rebuilds a chunk unlike its manifest entry
    is refused)."""
    if (c := up.rebuilt_chunk(group, plan, codec.quant_block)) is None:
        return
    try:
        check_chunk(up, c, plan, shapes, codec.delta_modes(), codec.quant_block)
    except ProtocolError as e:
        raise ProtocolError(f"the parity of group {group} of round {up.round} rebuilt a chunk that does not "
                            f"belong: {e}") from None
    up.add(site, c, rebuilt=True)


def extract_chunk(site: str, c: TensorChunk) -> Checked:
    """Undo one chunk's lossless stage and check it is finite; returns it with its squared norm.
    Raises what `assemble` will raise for the delta (the first failing chunk in plan order)."""
    if c.data.scales and not np.all(np.isfinite(np.frombuffer(c.data.scales, "<f4"))):
        raise NonFiniteDeltaError(f"delta from {site} has non-finite scales in {c.spec.tensor!r}; "
                                  f"the site is quarantined for round {c.round}")
    try:
        x = Codec.extract_many([c.data])[0]
    except CodecError as e:
        raise ProtocolError(f"delta from {site} cannot be decoded: {e}") from None
    if not x.finite():
        raise NonFiniteDeltaError(f"delta from {site} has non-finite values in {c.spec.tensor!r}; "
                                  f"the site is quarantined for round {c.round}")
    return x, sum_of_squares(x)


def assemble(cfg: RunConfig, site: str, up: Upload, steps: int, param_norm: float,
             num_params: int) -> tuple[list[Extracted], float]:
    """Check a complete delta, its chunks decoded (blocks until the last is): every chunk good,
    the norm not out of all proportion. Keeps it as int8. Runs off the event loop."""
    checked = [up.decoding[i].result() for i in range(up.count)]      # raises the first chunk's error
    parts = [x for x, _ in checked]
    norm = math.sqrt(math.fsum(sq for _, sq in checked))
    _check_norm(cfg, site, norm, steps, param_norm, num_params, up.round)
    return parts, norm


def assemble_part(cfg: RunConfig, site: str, manifest: Manifest, decoding: dict[int, Future[Checked]],
                  param_norm: float, num_params: int) -> tuple[list[Extracted | None], float]:
    """The chunks `decoding` of a delta still coming (as its Upload held them when its round
    closed: the Upload's own dict is emptied if its metrics come meanwhile), checked as `assemble`
    checks a whole one: each decodable and finite, their norm within the bound for the steps
    `manifest` claims; None where a chunk is not taken. Blocks until they are decoded; runs off the
    event loop."""
    parts: list[Extracted | None] = [None] * len(manifest.chunks)
    squares = []
    for i in sorted(decoding):
        parts[i], sq = decoding[i].result()      # raises the chunk's error
        squares.append(sq)
    norm = math.sqrt(math.fsum(squares))
    _check_norm(cfg, site, norm, manifest.steps, param_norm, num_params, manifest.round)
    return parts, norm


def _check_norm(cfg: RunConfig, site: str, norm: float, steps: int, param_norm: float, num_params: int,
                round_: int) -> None:
    scale = max_delta_scale(cfg, param_norm, steps, num_params)
    bound = cfg.robust.max_delta_ratio * scale
    if bound and not norm <= bound:
        raise DeltaRejectedError(f"delta from {site} has norm {norm:.4g}, more than robust.max_delta_ratio "
                                 f"({cfg.robust.max_delta_ratio:g}) x {scale:.4g} (the larger of the global "
                                 f"model's norm and how far {steps} inner steps can move it); the site is "
                                 f"quarantined for round {round_}")
