"""The site's retry policy (wantrain/site/retry.py): how long it keeps trying, and from when."""

import asyncio

import pytest

from wantrain.errors import ConnectionLostError
from wantrain.site import retry as retry_mod
from wantrain.site.retry import Reconnect


@pytest.fixture
def clock(monkeypatch):
    """time.time under the test's control, and no real sleeping."""
    now = [1000.0]
    monkeypatch.setattr(retry_mod.time, "time", lambda: now[0])

    async def no_sleep(_):
        return None

    monkeypatch.setattr(retry_mod.asyncio, "sleep", no_sleep)
    return now


def test_a_session_the_ps_welcomed_starts_a_new_streak(clock):
    """Found in a busy `make test`: a site that failed once at a PS restart, rejoined and trained for
    two minutes, then lost its stream, gave up at the first retry ("not reachable for 120 s"): the
    streak had been counted from before the session that worked."""
    r = Reconnect("127.0.0.1:1", "a", timeout_s=120.0)
    lost = ConnectionLostError("the stream ended")
    assert asyncio.run(r.failed(lost, joined_before=True)) is False       # the PS restarting
    clock[0] += 200.0                                                      # a welcomed session, then lost
    assert asyncio.run(r.failed(lost, joined_before=True, welcomed=True)) is False
    clock[0] += 60.0
    assert asyncio.run(r.failed(lost, joined_before=True)) is False       # 60 s into the new streak
    clock[0] += 61.0
    with pytest.raises(ConnectionLostError, match="not reachable for 120 s"):
        asyncio.run(r.failed(lost, joined_before=True))                    # 121 s without a session: over
