"""The round a site trains and pushes while its session goes on reading (session.py's docstring).

`Hands` owns that round's task and the tails of rounds that counted in part: when the session
starts a round, ends it (its own result, or the next message), abandons it (the session ended),
and when it waits for the PS's next message while the push may fail under it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field

from ..transport.messages import RoundResult

__all__ = ["Hands", "RoundInHand"]

log = logging.getLogger("wantrain.site")


@dataclass(eq=False)
class RoundInHand:
    """The round a site is training or pushing while its session goes on reading from the PS."""

    round: int
    steps_planned: str                  # for the log: "10 inner steps" or "a 2.0 s budget"
    stop: threading.Event = field(default_factory=threading.Event)   # set: no more inner steps
    closed: bool = False                # its result came first: it committed without this delta
    abandoned: bool = False             # the session ended under it
    task: asyncio.Future | None = None
    began_at: float = 0.0               # perf_counter: the first chunk of the update it starts from, or its RoundStart


class Hands:
    """A site's round in hand (at most one) and the tails still pushing beside it."""

    def __init__(self, site: str) -> None:
        self.site = site
        self.current: RoundInHand | None = None
        self.tails: set[asyncio.Future] = set()     # pushes of rounds that counted in part, finishing

    def start(self, hand: RoundInHand, work: Callable[[RoundInHand], Coroutine]) -> None:
        hand.task = asyncio.ensure_future(work(hand))
        self.current = hand

    async def until_received(self, receiving: asyncio.Future) -> None:
        """Wait for the PS's next message; a push that fails meanwhile (a lane broke) ends the session
        at once with its error, not when its round's result comes: that would sit out the round."""
        while True:
            push = self.current.task if self.current is not None else None
            if push is not None and push.done() and not push.cancelled() and push.exception() is not None:
                raise push.exception()      # type: ignore[misc]
            if receiving.done():
                return
            watched = [receiving, push] if push is not None and not push.done() else [receiving]
            await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)

    async def end(self, result: RoundResult | None) -> None:
        """Be done with the round in hand before the next message is taken: wait for its push. With
        its own `result`, the round committed without this site: it stops first. If that round
        counted the chunks it had in, the rest (its tail) goes on in the background, beside the
        next rounds: the PS counts on this site meanwhile (ps/rounds.py)."""
        hand, self.current = self.current, None
        if hand is None or hand.task is None:
            return
        if result is not None and result.round == hand.round:
            hand.closed = True
            hand.stop.set()
            if self.site in dict(result.partial_chunks):
                self.tails.add(hand.task)
                hand.task.add_done_callback(self._tail_done)
                return
        await hand.task

    def _tail_done(self, task: asyncio.Future) -> None:
        self.tails.discard(task)
        if not task.cancelled() and (e := task.exception()) is not None:   # taken, not logged at GC
            log.debug("site %s: a delta's tail ended with its session: %r", self.site, e)

    async def abandon(self) -> None:
        """The session ends (the stream broke, the PS refused): the round in hand stops and pushes
        nothing more, nor does a tail; no training thread outlives the session."""
        for tail in list(self.tails):     # the rest of a delta counted in part: it will not come now
            tail.cancel()
        if self.tails:
            await asyncio.wait(self.tails)
        hand, self.current = self.current, None
        if hand is None or hand.task is None:
            return
        hand.abandoned = True
        hand.stop.set()
        await asyncio.wait([hand.task])       # its failure (a send on a broken stream) is this one's
        if not hand.task.cancelled() and (e := hand.task.exception()) is not None:   # taken, not logged at GC
            log.debug("site %s: round %d ended with its session: %r", self.site, hand.round, e)
