"""The updates of recent rounds, kept for sites that come back holding an earlier model.

A site whose stream broke (a link reset, an outage) but whose process lived still holds the
global model of the round it left at, and says so in its Join (`resume_round`, `resume_hash`).
If the PS still has the update messages of every round since, the site gets those instead of the
whole model: a Welcome with no model chunks, then each missed round's update chunks and
RoundResult, exactly as the other sites got them. A compressed update is a fraction of the model
(about 1/4.5 with int8 + Huffman), so the kept rounds are bounded by bytes: never more than
`max_bytes` (by default half the fp32 model), beyond which a full download is as cheap.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from ..transport.messages import Join, RoundResult, TensorChunk

__all__ = ["Catchup"]


@dataclass(frozen=True)
class _Kept:
    round: int
    messages: tuple[TensorChunk | RoundResult, ...]   # the update chunks, then the RoundResult
    wire_bytes: int


class Catchup:
    """The most recent rounds' update messages, oldest first, at most `max_bytes` of them."""

    def __init__(self, next_round: int, max_bytes: int) -> None:
        self.next_round = next_round      # the round whose update is kept next
        self.max_bytes = max_bytes
        self.kept: deque[_Kept] = deque()
        self.bytes = 0

    def add(self, round_: int, chunks: list[TensorChunk], result: RoundResult) -> None:
        """Keep round `round_`'s update (rounds come in order), dropping the oldest beyond the bound."""
        if round_ != self.next_round:       # a gap (cannot happen in one PS): nothing before is usable
            self.kept.clear()
            self.bytes = 0
        nbytes = sum(c.data.wire_bytes for c in chunks)
        self.kept.append(_Kept(round_, (*chunks, result), nbytes))
        self.bytes += nbytes
        self.next_round = round_ + 1
        while self.kept and self.bytes > self.max_bytes:
            self.bytes -= self.kept.popleft().wire_bytes

    def since(self, round_: int) -> list[TensorChunk | RoundResult] | None:
        """The messages of every kept round from `round_` on (empty when the site is up to date), or
        None when one of those rounds is no longer kept (the site needs the whole model)."""
        if round_ == self.next_round:
            return []
        if not self.kept or not self.kept[0].round <= round_ < self.next_round:
            return None
        return [m for k in self.kept if k.round >= round_ for m in k.messages]

    def for_join(self, join: Join, hashes: dict[int, str]) -> list[TensorChunk | RoundResult] | None:
        """What a returning site that says it holds `join.resume_round` needs, if the PS committed that
        round's parameters with the hash it gives; None: the whole model."""
        if not join.resume_hash or hashes.get(join.resume_round) != join.resume_hash:
            return None
        return self.since(join.resume_round)

    def wire_bytes_since(self, round_: int) -> int:
        return sum(k.wire_bytes for k in self.kept if k.round >= round_)
