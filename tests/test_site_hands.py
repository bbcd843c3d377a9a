"""The round in hand (site/hand.py): a push that fails ends the session at once (no network)."""

import asyncio

import pytest

from wantrain.errors import ConnectionLostError
from wantrain.site.hand import Hands, RoundInHand


@pytest.mark.timeout(30)
def test_a_push_that_fails_while_the_session_waits_ends_it_at_once_with_its_error():
    """The PS says nothing for as long as the round's deadline; the round's lane breaks meanwhile:
    the session hears of it then, not at the round's result (which would sit out the round)."""
    async def scenario():
        hands = Hands("a")

        async def push(hand):
            await asyncio.sleep(0.05)
            raise ConnectionLostError("lane 2 broke: UNAVAILABLE")

        hands.start(RoundInHand(0, "10 inner steps"), push)
        silent = asyncio.get_running_loop().create_future()          # no message from the PS
        with pytest.raises(ConnectionLostError, match="lane 2 broke"):
            await asyncio.wait_for(hands.until_received(silent), 10)
        assert not silent.done()
        await hands.abandon()                                        # the session's end: nothing left running
        assert hands.current is None

    asyncio.run(scenario())


@pytest.mark.timeout(30)
def test_a_message_comes_through_while_the_push_goes_on_or_after_it_went_well():
    async def scenario():
        hands = Hands("a")
        gate = asyncio.Event()

        async def push(hand):
            await gate.wait()

        hands.start(RoundInHand(0, "10 inner steps"), push)
        loop = asyncio.get_running_loop()
        message = loop.create_future()
        loop.call_later(0.05, message.set_result, "RoundStart")
        await asyncio.wait_for(hands.until_received(message), 10)     # the push still runs
        assert message.result() == "RoundStart" and not hands.current.task.done()
        gate.set()
        await asyncio.sleep(0)
        later = loop.create_future()
        loop.call_later(0.05, later.set_result, "RoundResult")
        await asyncio.wait_for(hands.until_received(later), 10)       # a push done well changes nothing
        await hands.end(None)
        assert hands.current is None

    asyncio.run(scenario())
